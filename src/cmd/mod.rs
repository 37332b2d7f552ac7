//! One module per subcommand.

pub mod check;
pub mod exec;
pub mod run;
