//! The job service: its state, and how a job's record changes.
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
//! | this module | opening the data directory (and what a restart does), cancel, cleanup |
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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sandbox::HostIds;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use super::cache::Cache;
use super::engines::Engines;
use super::install::Installs;
use super::package::Skill;
use super::run::{self, JobLimits, RunPaths};
use super::store::{self, InteractionState, JobRecord, Profile, Status, Store, TakenReply};
use crate::inputs::zip::ZipLimits;

pub use super::protocol::{ApiError, ApiResult};

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

/// Why the service could not open its data directory.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data dir {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error("data dir {}: {source}", .dir.display())]
    Store { dir: PathBuf, source: std::io::Error },
    #[error("loading jobs: {0}")]
    Load(std::io::Error),
    #[error("saving job {id}: {source}")]
    Save { id: String, source: std::io::Error },
}

/// What a restart does with a job found in the store.
enum Recovery {
    Keep,
    Requeue,
    /// Waiting for its user across the restart: the wait timer again.
    Rewait,
}

impl Service {
    /// Opens the data directory and loads the jobs of an earlier server
    /// (see [`Service::recover`] for what happens to those that were not
    /// finished).
    pub async fn open(cfg: Config) -> Result<Arc<Service>, OpenError> {
        // Uploads, artifacts and logs are private to the server's user
        // (and the sandbox user, which maps onto it).
        for d in ["jobs", "requests", "runs", "tmp", "installs"] {
            let dir = cfg.data_dir.join(d);
            std::fs::create_dir_all(&dir)
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                })
                .map_err(|source| OpenError::DataDir { dir: dir.clone(), source })?;
        }
        // Leftovers of interrupted uploads.
        clear_dir(&cfg.data_dir.join("tmp"));
        let store_error = |source| OpenError::Store { dir: cfg.data_dir.clone(), source };
        let store = Store::open(&cfg.data_dir).map_err(store_error)?;
        let cache = Cache::open(store.dir(), &cfg.data_dir, cfg.cache_entries).map_err(store_error)?;
        let installs = Arc::new(Installs::open(&cfg.data_dir.join("installs")).map_err(store_error)?);
        let records = store.load_all().map_err(OpenError::Load)?;
        let svc = Arc::new(Service {
            slots: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
            cfg,
            store,
            cache,
            jobs: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            stopping: watch::Sender::new(false),
            installs,
        });
        let mut again = Vec::new();
        for mut record in records {
            let recovery = svc.recover(&mut record)?;
            let id = record.request_id.clone();
            svc.jobs.lock().unwrap().insert(id.clone(), Job::new(record));
            again.push((id, recovery));
        }
        for (id, recovery) in again {
            let job = svc.job(&id).expect("just inserted");
            match recovery {
                Recovery::Keep => {}
                Recovery::Requeue => {
                    svc.active.fetch_add(1, Ordering::SeqCst);
                    tracing::info!("job {id} was queued when the server stopped: queued again");
                    tokio::spawn(Arc::clone(&svc).run_job(job, None));
                }
                Recovery::Rewait => {
                    tracing::info!(
                        "job {id} was waiting for its user when the server stopped: still waiting"
                    );
                    svc.arm_wait(job);
                }
            }
        }
        Ok(svc)
    }

    /// A job found at start that was not finished:
    ///
    /// * `queued`: its engine never started; queued again.
    /// * `running`: its sandbox died with the server, and running the
    ///   engine again could repeat what it already did outside (model
    ///   calls, partial artifacts): `failed`,
    ///   `ORCHESTRATOR_RESTART_INTERRUPTED`.
    /// * `waiting_user`, resumable: nothing runs while it waits, and its
    ///   session and home are on disk: still waiting
    ///   (`recovered_waiting`), its wait timer armed for what is left.
    /// * `waiting_user`, sticky: its engine died with the server:
    ///   `failed`, `INTERACTION_PROCESS_LOST` (as upstream).
    fn recover(&self, record: &mut JobRecord) -> Result<Recovery, OpenError> {
        let profile = record.interaction.as_ref().map(|i| i.profile);
        let (code, reason) = match (record.status, profile) {
            (Some(Status::Queued), _) => return Ok(Recovery::Requeue),
            (Some(Status::WaitingUser), Some(Profile::Resumable)) => {
                record.recovery_state = Some("recovered_waiting".into());
                record.recovery_reason = Some("resumable_waiting_preserved".into());
                record.recovered_at = Some(store::now());
                self.store
                    .save(record)
                    .map_err(|source| OpenError::Save { id: record.request_id.clone(), source })?;
                return Ok(Recovery::Rewait);
            }
            (Some(Status::WaitingUser), _) => {
                ("INTERACTION_PROCESS_LOST", "sticky process context cannot survive orchestrator restart")
            }
            (Some(Status::Running), _) => (
                "ORCHESTRATOR_RESTART_INTERRUPTED",
                "the server stopped while the engine was running; the sandbox was killed with it",
            ),
            _ => return Ok(Recovery::Keep),
        };
        let now = store::now();
        record.status = Some(Status::Failed);
        record.error = Some(json!({"code": code, "message": format!("{code}: {reason}")}));
        record.recovery_state = Some("failed_reconciled".into());
        record.recovery_reason = Some(reason.into());
        record.recovered_at = Some(now.clone());
        record.updated_at = now;
        if let Some(i) = record.interaction.as_mut() {
            i.pending = None;
            i.wait_deadline_ms = None;
        }
        self.store
            .save(record)
            .map_err(|source| OpenError::Save { id: record.request_id.clone(), source })?;
        if let Some(run_id) = &record.run_id {
            run::cleanup(&RunPaths::new(&self.cfg.data_dir, run_id));
        }
        tracing::warn!("job {} was not finished when the server stopped: {code}", record.request_id);
        Ok(Recovery::Keep)
    }

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

    /// Applies `change` to the job's record, stamps it and writes it.
    pub(super) async fn update(&self, job: &Job, change: impl FnOnce(&mut JobRecord)) -> JobRecord {
        self.update_after(job, change, None).await
    }

    /// As `update`; `first` is synced before the record is written (a
    /// file the new record refers to), after the change is visible.
    pub(super) async fn update_after(
        &self,
        job: &Job,
        change: impl FnOnce(&mut JobRecord),
        first: Option<PathBuf>,
    ) -> JobRecord {
        let _order = job.persist.lock().await;
        job.state.send_modify(|r| {
            change(r);
            r.updated_at = store::now();
        });
        self.save_now(job.record(), first).await
    }

    /// Decides on the record in turn with every other change: `decide`
    /// sees the current record and either refuses (nothing changes),
    /// leaves it (`Ok(false)`), or changes it (`Ok(true)`: stamped,
    /// written, then returned). Used where an answer depends on the state
    /// (replies, cancel).
    pub(super) async fn update_if(
        &self,
        job: &Job,
        decide: impl FnOnce(&mut JobRecord) -> ApiResult<bool>,
    ) -> ApiResult<JobRecord> {
        let _order = job.persist.lock().await;
        let mut next = job.record();
        if !decide(&mut next)? {
            return Ok(next);
        }
        next.updated_at = store::now();
        job.state.send_replace(next.clone());
        Ok(self.save_now(next, None).await)
    }

    async fn save_now(&self, record: JobRecord, first: Option<PathBuf>) -> JobRecord {
        let (store, copy) = (self.store.clone(), record.clone());
        let save = move || {
            if let Some(first) = first {
                crate::hostfs::beneath::sync_file(&first).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot sync {}: {e}", first.display()))
                })?;
            }
            store.save(&copy)
        };
        match tokio::task::spawn_blocking(save).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("cannot save job {}: {e}", record.request_id),
            Err(e) => tracing::error!("cannot save job {}: {e}", record.request_id),
        }
        record
    }

    /// Writes a new record (not yet in memory) before it is answered.
    pub(super) async fn save_new(&self, record: &JobRecord) -> ApiResult<()> {
        let (store, copy) = (self.store.clone(), record.clone());
        tokio::task::spawn_blocking(move || store.save(&copy))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?
            .map_err(|e| ApiError::new(500, format!("cannot record the job: {e}")))
    }

    /// The job handle, for waiting on it (`skills run`).
    pub fn handle(&self, request_id: &str) -> Option<Arc<Job>> {
        self.job(request_id)
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("tmp")
    }

    /// Counts a job in, or refuses it when the queue is full.
    pub(super) fn admit(&self) -> ApiResult<()> {
        let limit = self.cfg.max_concurrent + self.cfg.max_queue;
        let admitted = self
            .active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
            .is_ok();
        if admitted { Ok(()) } else { Err(ApiError::new(429, "Job queue is full")) }
    }

    /// Creates the run (moving in `uploads` when given), records it and
    /// starts its task; returns once the record is on disk. The job was
    /// admitted. With a free slot the job is recorded once, as `running`,
    /// by its task, while the run is prepared (the engine waits for that
    /// record); otherwise as `queued` here, and as `running` once a slot
    /// frees. Either way the answer follows a synced record, and a restart
    /// requeues only a job whose engine cannot have started.
    pub(super) async fn start(self: &Arc<Self>, job: Arc<Job>, uploads: Option<PathBuf>) -> ApiResult<()> {
        let run_id = uuid::Uuid::new_v4().to_string();
        let paths = self.run_paths(&run_id);
        // The rest of the run directory is made by `run::prepare`.
        let prepared = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&paths.workspace)?;
            if let Some(src) = uploads {
                std::fs::rename(&src, &paths.uploads)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()));
        if let Err(e) =
            prepared.and_then(|r| r.map_err(|e| ApiError::new(500, format!("cannot create the run: {e}"))))
        {
            self.active.fetch_sub(1, Ordering::SeqCst);
            job.started.store(false, Ordering::SeqCst);
            return Err(e);
        }
        let interaction = self.profile_of(&job.record()).map(InteractionState::new);
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                job.state.send_modify(|r| {
                    r.run_id = Some(run_id);
                    r.status = Some(Status::Running);
                    r.error = None;
                    r.interaction = interaction;
                });
                let (saved, recorded) = oneshot::channel();
                tokio::spawn(Arc::clone(self).run_job(job, Some(Direct { permit, saved })));
                // Dropped unsent only when the job ended first (a cancel
                // recorded it).
                let _ = recorded.await;
            }
            Err(_) => {
                self.update(&job, |r| {
                    r.run_id = Some(run_id);
                    r.status = Some(Status::Queued);
                    r.error = None;
                    r.interaction = interaction;
                })
                .await;
                tokio::spawn(Arc::clone(self).run_job(job, None));
            }
        }
        Ok(())
    }

    /// How the engine of an interactive job continues after a question
    /// (`None` for an auto job): resumable when the engine has a resume
    /// command, else sticky.
    pub(super) fn profile_of(&self, record: &JobRecord) -> Option<Profile> {
        if !super::protocol::is_interactive(&record.runtime_options) {
            return None;
        }
        let resumable = self.cfg.engines.get(&record.engine).is_some_and(|e| e.resumable().is_some());
        Some(if resumable { Profile::Resumable } else { Profile::StickyProcess })
    }

    /// `POST /v1/jobs/{id}/cancel`. A job waiting for its user with no
    /// engine running (resumable) is canceled here; otherwise its task
    /// stops the engine and records the outcome.
    pub async fn cancel(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (job, r, paths) = self.run_of(family, request_id)?;
        let answer = |status: &str, accepted: bool, message: &str| json!({"request_id": r.request_id, "run_id": r.run_id, "status": status, "accepted": accepted, "message": message});
        let mut already = None;
        let mut now_canceled = false;
        self.update_if(&job, |rec| {
            let status = rec.status.unwrap_or(Status::Queued);
            if status.is_terminal() {
                already = Some((status.as_str(), "Run already in terminal state"));
                return Ok(false);
            }
            if rec.cancel_requested {
                already = Some(("canceled", "Cancel already requested"));
                return Ok(false);
            }
            rec.cancel_requested = true;
            let idle = status == Status::WaitingUser
                && rec.interaction.as_ref().is_some_and(|i| i.profile == Profile::Resumable);
            if idle {
                run::write_canceled(&paths);
                run::cleanup(&paths);
                rec.status = Some(Status::Canceled);
                rec.error = Some(json!({"code": "CANCELED_BY_USER", "message": "Canceled by user request"}));
                if let Some(i) = rec.interaction.as_mut() {
                    i.pending = None;
                    i.wait_deadline_ms = None;
                }
                now_canceled = true;
            }
            Ok(true)
        })
        .await?;
        if let Some((status, message)) = already {
            return Ok(answer(status, false, message));
        }
        if !now_canceled {
            job.cancel.send_replace(true);
        }
        Ok(answer("canceled", true, "Cancel request accepted"))
    }

    /// `POST /v1/jobs/cleanup`: removes every request that is finished
    /// or still waiting for its upload (its record, its request
    /// directory, its run unless a kept request shares it), and every
    /// result-cache entry. Jobs queued, running or waiting for their
    /// user are kept: their engines may be using their directories
    /// (upstream deletes those too).
    pub async fn cleanup(self: &Arc<Self>) -> ApiResult<Value> {
        let cache_entries = self.cache.clear();
        let mut removed = Vec::new();
        {
            let mut jobs = self.jobs.lock().unwrap();
            jobs.retain(|_, job| {
                let r = job.record();
                let finished = r.status.is_some_and(Status::is_terminal);
                // Claimed, so that no upload can start it meanwhile.
                let idle = r.run_id.is_none() && !job.started.swap(true, Ordering::SeqCst);
                if finished || idle {
                    removed.push(r);
                    return false;
                }
                true
            });
        }
        let kept: std::collections::HashSet<String> =
            self.jobs.lock().unwrap().values().filter_map(|j| j.record().run_id).collect();
        let (store, data_dir) = (self.store.clone(), self.cfg.data_dir.clone());
        let counts = tokio::task::spawn_blocking(move || {
            let mut runs = std::collections::HashSet::new();
            for r in &removed {
                if let Err(e) = store.remove(&r.request_id) {
                    tracing::warn!("cleanup: job record {}: {e}", r.request_id);
                }
                remove_tree(&data_dir.join("requests").join(&r.request_id));
                if let Some(run_id) = &r.run_id
                    && !kept.contains(run_id)
                    && runs.insert(run_id.clone())
                {
                    remove_tree(&data_dir.join("runs").join(run_id));
                }
            }
            (runs.len(), removed.len())
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()))?;
        Ok(
            json!({"runs_deleted": counts.0, "requests_deleted": counts.1, "cache_entries_deleted": cache_entries}),
        )
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

fn remove_tree(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("cleanup: {}: {e}", path.display());
    }
}

pub(super) fn clear_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}
