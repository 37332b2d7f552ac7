//! The `tuixiu-sandbox` library: what the CLI (`src/main.rs`) and the
//! daemon share, usable from integration tests with the real binary.

pub mod acp;
pub mod blocking;
pub mod bwrap;
pub mod egress;
pub mod env;
pub mod exe;
pub mod git;
pub mod hostfs;
pub mod inputs;
pub mod launcher;
pub mod manifest;
pub mod metrics;
pub mod pidfd;
pub mod provider;
pub mod proxy;
pub mod skills;
