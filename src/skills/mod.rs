//! Skill jobs: the Skill Runner input & file protocol, with every engine
//! run inside this project's sandbox (docs/skills.md).
//!
//! | module | job |
//! |---|---|
//! | [`package`] | `runner.json` and the three schemas: load, check (upstream's messages), infer artifacts |
//! | [`inputs`] | inline inputs at create; strict key matching, the mixed context and parameters before the run |
//! | [`prompt`] | prompt templates (`{{ input.x }}`, `{{ parameter.x }}`), defaults, runtime instructions |
//! | [`engines`] | engine command templates (codex, gemini, iflow, configured ones), their answers and sessions |
//! | [`run`] | one turn: its directory, its sandbox spec, the launcher, `result.json` |
//! | [`logcap`] | the engine's stdout and stderr copied to disk, capped |
//! | [`artifacts`] | listing, the required check, confined download, bundles |
//! | [`store`] | job records that survive a restart |
//! | [`cache`] | the result cache: upstream's key, entries, eviction |
//! | [`interaction`] | interactive jobs: questions and replies, as rules |
//! | [`temp`] | temporary skill runs: the uploaded package, staged and checked |
//! | [`install`] | skill package installs into the skills directory |
//! | [`protocol`] | request bodies and refusals, as types |
//! | [`jobs`] | the service: its state, records, restarts, cancel, cleanup |
//! | [`intake`], [`task`], [`conversation`], [`queries`] | the service's endpoints and the job's task, by idea |
//! | [`events`] | a job's live logs and status, as server-sent events |
//! | [`http`], [`listener`] | the axum routes; connections, their limits and shutdown |
//! | [`metrics`] | Prometheus metrics of `skills serve --metrics-listen`: jobs by status, queue depth, the result cache |

pub mod artifacts;
pub mod cache;
pub mod conversation;
pub mod engines;
pub mod events;
pub use crate::hostfs::beneath as fsio;
pub mod http;
pub mod inputs;
pub mod install;
pub mod intake;
pub mod interaction;
pub mod jobs;
pub mod listener;
pub mod logcap;
pub mod messages;
pub mod metrics;
pub mod package;
pub mod prompt;
pub mod protocol;
pub mod queries;
pub mod run;
pub mod store;
pub mod task;
pub mod temp;
