//! The job service: its state and lookups; each thing done to a job lives in its own module.
//!
//! The HTTP layer ([`super::http`]) and the `skills run` command both drive
//! it. Every answer is JSON, every refusal an [`ApiError`] with the status
//! code and `detail` of upstream's Skill Runner. What each endpoint does
//! lives with its idea, as more `impl Service` blocks:
//!
//! | module | endpoints and work |
//! |---|---|
//! | [`super::intake`] | create, upload, temporary runs, `skills run`'s files; the cache lookup |
//! | [`super::task`] | the job's task: a slot, the engine's turn in its sandbox, the outcome |
//! | [`super::conversation`] | interactive jobs: pending, reply, the waits |
//! | [`super::queries`] | skills, engines, status, result, artifacts, bundles, logs |
//! | [`open`] | opening the data directory, and what a restart does with unfinished jobs |
//! | [`record`] | how a job's record changes: stamped, written in turn |
//! | [`start`] | admitting a job, its run directory, a slot or the queue |
//! | [`cancel`] | `POST .../cancel` |
//! | [`cleanup`] | `POST /v1/jobs/cleanup` |
//! | this module | the service's state, the job handle, lookups, counts |
//!
//! Life of a job: `create` checks the skill, engine, options and inline
//! inputs and records the request. A skill with a required file input
//! waits for one `upload` (a zip, extracted by the shared safe extractor
//! into `requests/<id>/uploads`, then moved into the run); any other skill
//! starts at once. Either way a job whose inputs match a run that
//! succeeded is answered with that run (the result cache). Starting means
//! a run id, status `queued`, and a task that waits for a slot (at most
//! `max_concurrent` engines run at a time, at most `max_queue` wait), then
//! runs the engine in its sandbox and records the outcome, or the
//! question of an interactive engine (`waiting_user`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use sandbox::HostIds;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use super::cache::Cache;
use super::engines::Engines;
use super::install::Installs;
use super::package::Skill;
use super::run::{JobLimits, RunPaths};
use super::store::{JobRecord, Status, Store, TakenReply};
use crate::inputs::zip::ZipLimits;

pub use super::protocol::{ApiError, ApiResult};
pub use open::OpenError;

mod cancel;
mod cleanup;
mod open;
mod record;
mod start;

/// How the service is set up.
#[derive(Clone, Debug)]
pub struct Config {
    pub skills_dir: PathBuf,
    pub data_dir: PathBuf,
    pub engines: Engines,
    /// The `tuixiu-sandbox` binary (runs `__exec`).
    pub launcher: PathBuf,
    pub limits: JobLimits,
    pub max_concurrent: usize,
    pub max_queue: usize,
    pub max_upload_bytes: u64,
    pub zip: ZipLimits,
    pub host_ids: Option<HostIds>,
    /// Whether `/v1/temp-skill-runs` (client-uploaded packages) is served.
    pub temp_skills: bool,
    /// Whether `/v1/skill-packages/install` is served.
    pub install_skills: bool,
    /// Most result-cache entries kept (least recently used evicted).
    pub cache_entries: usize,
    /// Time a request body may take to arrive.
    pub body_timeout: std::time::Duration,
}

impl Config {
    /// A configuration with the server's defaults for everything but
    /// the directories, the engines and the launcher.
    pub fn new(skills_dir: PathBuf, data_dir: PathBuf, engines: Engines, launcher: PathBuf) -> Config {
        Config {
            skills_dir,
            data_dir,
            engines,
            launcher,
            limits: JobLimits::default(),
            max_concurrent: 8,
            max_queue: 128,
            max_upload_bytes: 100 << 20,
            zip: ZipLimits::default(),
            host_ids: None,
            temp_skills: false,
            install_skills: false,
            cache_entries: 1024,
            body_timeout: std::time::Duration::from_secs(300),
        }
    }
}

/// Which API a request was made through: `/v1/jobs` (an installed skill)
/// or `/v1/temp-skill-runs` (a package uploaded with the run). Each only
/// sees its own requests, as upstream's two stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Jobs,
    Temp,
}

/// One request in memory. `state` is the record; every change is written
/// to the store before the next one starts (`persist`).
pub struct Job {
    pub(super) state: watch::Sender<JobRecord>,
    pub(super) cancel: watch::Sender<bool>,
    pub(super) persist: tokio::sync::Mutex<()>,
    /// Set while an upload is being taken or once the run started.
    pub(super) started: AtomicBool,
    /// The package as checked at create (absent after a restart, then
    /// loaded again when the run starts).
    pub(super) skill: Mutex<Option<Arc<Skill>>>,
    /// A sticky engine's stdin, for the replies, while it runs.
    pub(super) sticky: Mutex<Option<mpsc::Sender<TakenReply>>>,
}

impl Job {
    pub(super) fn new(record: JobRecord) -> Arc<Job> {
        let started = record.run_id.is_some();
        Arc::new(Job {
            state: watch::Sender::new(record),
            cancel: watch::Sender::new(false),
            persist: tokio::sync::Mutex::new(()),
            started: AtomicBool::new(started),
            skill: Mutex::new(None),
            sticky: Mutex::new(None),
        })
    }

    pub fn record(&self) -> JobRecord {
        self.state.borrow().clone()
    }

    /// Waits until the job is finished and returns its record.
    pub async fn finished(&self) -> JobRecord {
        let mut rx = self.state.subscribe();
        let r = rx.wait_for(|r| r.status.is_some_and(Status::is_terminal)).await;
        match r {
            Ok(r) => r.clone(),
            Err(_) => self.record(),
        }
    }

    /// The record as it changes.
    pub fn watch(&self) -> watch::Receiver<JobRecord> {
        self.state.subscribe()
    }
}

/// A job that found a free slot when it started: its task records it as
/// running and says so through `saved`.
pub(super) struct Direct {
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) saved: oneshot::Sender<()>,
}

pub struct Service {
    pub(super) cfg: Config,
    pub(super) store: Store,
    pub(super) cache: Cache,
    pub(super) jobs: Mutex<HashMap<String, Arc<Job>>>,
    pub(super) slots: Arc<Semaphore>,
    /// Jobs queued or running (a job waiting for its user is neither,
    /// unless its sticky engine keeps its slot).
    pub(super) active: AtomicUsize,
    /// Set when the server stops: event streams end.
    pub(super) stopping: watch::Sender<bool>,
    /// Skill package installs (`POST /v1/skill-packages/install`).
    pub(super) installs: Arc<Installs>,
}

impl Service {
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Ends the event streams (the server is stopping).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    pub(super) fn job(&self, request_id: &str) -> Option<Arc<Job>> {
        self.jobs.lock().unwrap().get(request_id).cloned()
    }

    pub(super) fn job_or_404(&self, family: Family, request_id: &str) -> ApiResult<Arc<Job>> {
        if family == Family::Temp {
            self.temp_enabled()?;
        }
        self.job(request_id)
            .filter(|job| job.record().temp == (family == Family::Temp))
            .ok_or_else(|| ApiError::new(404, "Request not found"))
    }

    pub(super) fn temp_enabled(&self) -> ApiResult<()> {
        opt_in(self.cfg.temp_skills, "Temporary skill runs", "--temp-skills")
    }

    pub(super) fn request_dir(&self, request_id: &str) -> PathBuf {
        self.cfg.data_dir.join("requests").join(request_id)
    }

    pub(super) fn run_paths(&self, run_id: &str) -> RunPaths {
        RunPaths::new(&self.cfg.data_dir, run_id)
    }

    /// The job and record of a request that has a run.
    pub(super) fn run_of(
        &self,
        family: Family,
        request_id: &str,
    ) -> ApiResult<(Arc<Job>, JobRecord, RunPaths)> {
        let job = self.job_or_404(family, request_id)?;
        let record = job.record();
        let Some(run_id) = &record.run_id else { return Err(ApiError::new(404, "Run not found")) };
        let paths = self.run_paths(run_id);
        if !paths.dir.is_dir() && record.status != Some(Status::Queued) {
            return Err(ApiError::new(404, "Run not found"));
        }
        Ok((job, record, paths))
    }

    /// The job handle, for waiting on it (`skills run`).
    pub fn handle(&self, request_id: &str) -> Option<Arc<Job>> {
        self.job(request_id)
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("tmp")
    }

    /// How many jobs are in each status, every status named (`created`:
    /// waiting for its upload), and engine slots free.
    pub fn status_counts(&self) -> (Vec<(&'static str, usize)>, usize) {
        let mut counts: Vec<(&'static str, usize)> = std::iter::once("created")
            .chain(Status::ALL.iter().map(|s| s.as_str()))
            .map(|s| (s, 0))
            .collect();
        for job in self.jobs.lock().unwrap().values() {
            let status = job.state.borrow().status.map_or("created", Status::as_str);
            if let Some(c) = counts.iter_mut().find(|(s, _)| *s == status) {
                c.1 += 1;
            }
        }
        (counts, self.slots.available_permits())
    }

    /// The result cache's lookups so far (hits, misses) and its entries.
    pub fn cache_counts(&self) -> (u64, u64, usize) {
        let (hits, misses) = self.cache.lookups();
        (hits, misses, self.cache.len())
    }
}

/// 403 for routes a server serves only when started with `flag`.
pub(super) fn opt_in(on: bool, what: &str, flag: &str) -> ApiResult<()> {
    if on {
        Ok(())
    } else {
        Err(ApiError::new(403, format!("{what} are not enabled on this server (skills serve {flag})")))
    }
}
