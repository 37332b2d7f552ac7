//! One module per subcommand.

pub mod exec;
pub mod manifest;
pub mod run;
pub mod run_inputs;
