//! Skill jobs: the Skill Runner input & file protocol (seed 003), with
//! every engine run inside this project's sandbox.
//!
//! | module | job |
//! |---|---|
//! | [`package`] | `runner.json` and the three schemas: load, check (upstream's messages), infer artifacts |
//! | [`inputs`] | inline inputs at create; strict key matching, the mixed context and parameters before the run |
//! | [`prompt`] | prompt templates (`{{ input.x }}`, `{{ parameter.x }}`), defaults, runtime instructions |
//! | [`engines`] | engine command templates (codex, gemini, iflow, configured ones) and reading their answer |
//! | [`run`] | one run: its directory, its sandbox spec, the launcher, timeout and cancel, `result.json` |
//! | [`artifacts`] | listing, the required check, confined download, bundles |
//! | [`store`] | job records that survive a restart |
//! | [`temp`] | temporary skill runs: the uploaded package, staged and checked |
//! | [`jobs`] | the service behind every endpoint |
//! | [`http`] | the axum routes |
//! | [`metrics`] | Prometheus metrics of `skills serve --metrics-listen`: jobs by status, queue depth |

pub mod artifacts;
pub mod engines;
pub use crate::hostfs::beneath as fsio;
pub mod http;
pub mod inputs;
pub mod jobs;
pub mod messages;
pub mod metrics;
pub mod package;
pub mod prompt;
pub mod run;
pub mod store;
pub mod temp;
