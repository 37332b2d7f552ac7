//! One module per subcommand.

pub mod exec;
pub mod instances;
pub mod relay;
pub mod run;
pub mod run_provider;
