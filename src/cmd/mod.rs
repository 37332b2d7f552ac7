//! One module per subcommand.

pub mod check;
pub mod docs;
pub mod engine_check;
pub mod error;
pub mod instances;
pub mod manifest;
pub mod relay;
pub mod run;
pub mod run_provider;
pub mod skills;
