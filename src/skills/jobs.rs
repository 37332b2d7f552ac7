//! The job service: what each endpoint does, independent of HTTP.
//!
//! The HTTP layer ([`super::http`]) and the `skills run` command both drive
//! this. Every answer is JSON, every refusal an [`ApiError`] with the
//! status code and `detail` of the reference (§1.3).
//!
//! Life of a job: `create` checks the skill, engine, options and inline
//! inputs and records the request. A skill with a required file input
//! waits for one `upload` (a zip, extracted by the shared safe extractor
//! into `requests/<id>/uploads`, then moved into the run); any other skill
//! starts at once. Starting means a run id, status `queued`, and a task that
//! waits for a slot (at most `max_concurrent` engines run at a time, at most
//! `max_queue` wait), then runs the engine in its sandbox and records the
//! outcome. A second upload, or an upload to a job that already started,
//! is refused with 409 (upstream silently started a second run).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox::HostIds;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

use super::artifacts::{self, BundleKind, DownloadError};
use super::engines::Engines;
use super::inputs;
use super::package::{self, Skill};
use super::run::{self, JobLimits, Outcome, RunContext, RunPaths};
use super::store::{self, JobRecord, Status, Store};
use super::temp;
use crate::hostfs::beneath as fsio;
use crate::inputs::zip::{ZipError, ZipLimits, extract};

/// A refusal: HTTP status and the `detail` of `{"detail": ...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub detail: Value,
}

impl ApiError {
    pub fn new(status: u16, detail: impl Into<String>) -> ApiError {
        ApiError { status, detail: Value::String(detail.into()) }
    }

    /// FastAPI's request-validation shape (422).
    pub fn field(kind: &str, loc: &[&str], msg: &str) -> ApiError {
        ApiError { status: 422, detail: json!([{"type": kind, "loc": loc, "msg": msg}]) }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Value::String(s) => write!(f, "{s}"),
            other => write!(f, "{other}"),
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

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
    state: watch::Sender<JobRecord>,
    cancel: watch::Sender<bool>,
    persist: tokio::sync::Mutex<()>,
    /// Set while an upload is being taken or once the run started.
    started: AtomicBool,
    /// The package as checked at create (absent after a restart, then
    /// loaded again when the run starts).
    skill: Mutex<Option<Arc<Skill>>>,
}

impl Job {
    fn new(record: JobRecord) -> Arc<Job> {
        let started = record.status.is_some();
        Arc::new(Job {
            state: watch::Sender::new(record),
            cancel: watch::Sender::new(false),
            persist: tokio::sync::Mutex::new(()),
            started: AtomicBool::new(started),
            skill: Mutex::new(None),
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
}

/// A job that found a free slot when it started: its task records it as
/// running and says so through `saved`.
struct Direct {
    permit: OwnedSemaphorePermit,
    saved: oneshot::Sender<()>,
}

pub struct Service {
    cfg: Config,
    store: Store,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    slots: Arc<Semaphore>,
    /// Jobs queued or running.
    active: AtomicUsize,
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

impl Service {
    /// Opens the data directory and loads the jobs of an earlier server;
    /// see [`store`] for what happens to those that were running.
    pub async fn open(cfg: Config) -> Result<Arc<Service>, OpenError> {
        // Uploads, artifacts and logs are private to the server's user
        // (and the sandbox user, which maps onto it).
        for d in ["jobs", "requests", "runs", "tmp"] {
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
        let store = Store::open(&cfg.data_dir)
            .map_err(|source| OpenError::Store { dir: cfg.data_dir.clone(), source })?;
        let records = store.load_all().map_err(OpenError::Load)?;
        let svc = Arc::new(Service {
            slots: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
            cfg,
            store,
            jobs: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
        });
        let mut requeue = Vec::new();
        for mut record in records {
            match record.status {
                Some(Status::Running) => {
                    let now = store::now();
                    record.status = Some(Status::Failed);
                    record.error = Some(json!({
                        "code": "ORCHESTRATOR_RESTART_INTERRUPTED",
                        "message": "the server stopped while the engine was running; the sandbox was killed with it",
                    }));
                    record.recovery_state = Some("failed_reconciled".into());
                    record.recovery_reason = Some("server restarted during execution".into());
                    record.recovered_at = Some(now.clone());
                    record.updated_at = now;
                    svc.store
                        .save(&record)
                        .map_err(|source| OpenError::Save { id: record.request_id.clone(), source })?;
                    if let Some(run_id) = &record.run_id {
                        run::cleanup(&RunPaths::new(&svc.cfg.data_dir, run_id));
                    }
                    tracing::warn!(
                        "job {} was running when the server stopped: marked failed",
                        record.request_id
                    );
                }
                Some(Status::Queued) => requeue.push(record.request_id.clone()),
                _ => {}
            }
            let id = record.request_id.clone();
            svc.jobs.lock().unwrap().insert(id, Job::new(record));
        }
        for id in requeue {
            let job = svc.job(&id).expect("just inserted");
            svc.active.fetch_add(1, Ordering::SeqCst);
            tracing::info!("job {id} was queued when the server stopped: queued again");
            tokio::spawn(Arc::clone(&svc).run_job(job, None));
        }
        Ok(svc)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn job(&self, request_id: &str) -> Option<Arc<Job>> {
        self.jobs.lock().unwrap().get(request_id).cloned()
    }

    fn job_or_404(&self, family: Family, request_id: &str) -> ApiResult<Arc<Job>> {
        if family == Family::Temp {
            self.temp_enabled()?;
        }
        self.job(request_id)
            .filter(|job| job.record().temp == (family == Family::Temp))
            .ok_or_else(|| ApiError::new(404, "Request not found"))
    }

    fn temp_enabled(&self) -> ApiResult<()> {
        if self.cfg.temp_skills {
            Ok(())
        } else {
            Err(ApiError::new(
                403,
                "Temporary skill runs are not enabled on this server (skills serve --temp-skills)",
            ))
        }
    }

    fn request_dir(&self, request_id: &str) -> PathBuf {
        self.cfg.data_dir.join("requests").join(request_id)
    }

    /// The record of a request that has a run.
    fn run_of(&self, family: Family, request_id: &str) -> ApiResult<(JobRecord, RunPaths)> {
        let record = self.job_or_404(family, request_id)?.record();
        let Some(run_id) = &record.run_id else { return Err(ApiError::new(404, "Run not found")) };
        let paths = RunPaths::new(&self.cfg.data_dir, run_id);
        if !paths.dir.is_dir() && record.status != Some(Status::Queued) {
            return Err(ApiError::new(404, "Run not found"));
        }
        Ok((record, paths))
    }

    /// Applies `change` to the job's record, stamps it and writes it.
    async fn update(&self, job: &Job, change: impl FnOnce(&mut JobRecord)) -> JobRecord {
        self.update_after(job, change, None).await
    }

    /// As `update`; `first` is synced before the record is written (a
    /// file the new record refers to), after the change is visible.
    async fn update_after(
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
        let record = job.record();
        let (store, copy) = (self.store.clone(), record.clone());
        let save = move || {
            if let Some(first) = first {
                fsio::sync_file(&first).map_err(|e| {
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

    // ---- skills ----

    fn engine_names(&self) -> Vec<String> {
        self.cfg.engines.names()
    }

    pub async fn list_skills(&self) -> ApiResult<Value> {
        let (dir, engines) = (self.cfg.skills_dir.clone(), self.engine_names());
        let scanned = tokio::task::spawn_blocking(move || package::scan(&dir, &engines))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?
            .map_err(|e| ApiError::new(500, format!("cannot read the skills directory: {e}")))?;
        Ok(Value::Array(scanned.0.iter().map(Skill::to_json).collect()))
    }

    /// Loads skill `id`: 404 when there is no such package, 422 with the
    /// reason when there is one and it is invalid.
    pub async fn load_skill(&self, id: &str, not_found: &str) -> ApiResult<Skill> {
        if !fsio::is_plain_name(id) || id.starts_with('.') {
            return Err(ApiError::new(404, not_found));
        }
        let dir = self.cfg.skills_dir.join(id);
        if !dir.is_dir() {
            return Err(ApiError::new(404, not_found));
        }
        let engines = self.engine_names();
        let loaded = tokio::task::spawn_blocking(move || package::load(&dir, &engines))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?;
        loaded.map_err(|e| ApiError {
            status: 422,
            detail: json!({"code": "SKILL_PACKAGE_INVALID", "message": format!("Skill '{id}' is invalid: {e}")}),
        })
    }

    pub async fn get_skill(&self, id: &str) -> ApiResult<Value> {
        Ok(self.load_skill(id, "Skill not found").await?.to_json())
    }

    // ---- engines ----

    /// `GET /v1/engines`: every engine this server knows (upstream's
    /// `EnginesResponse`; CLI versions are not probed).
    pub fn engines(&self) -> Value {
        let engines: Vec<Value> = self
            .cfg
            .engines
            .names()
            .into_iter()
            .map(|name| json!({"engine": name, "cli_version_detected": null}))
            .collect();
        json!({"engines": engines})
    }

    /// `GET /v1/engines/{engine}/models`: the models the engine's
    /// configuration declares (what a create is checked against), none
    /// when it declares none (then any model is accepted). Upstream's
    /// `EngineModelsResponse`, with the configuration as its source.
    pub fn engine_models(&self, engine: &str) -> ApiResult<Value> {
        let Some(e) = self.cfg.engines.get(engine) else {
            return Err(ApiError::new(404, format!("Unknown engine: {engine}")));
        };
        let models: Vec<Value> = e
            .models
            .iter()
            .flatten()
            .map(|id| {
                json!({"id": id, "display_name": null, "deprecated": false, "notes": null, "supported_effort": null})
            })
            .collect();
        Ok(json!({
            "engine": engine,
            "cli_version_detected": null,
            "snapshot_version_used": "engines_config",
            "source": "engines_config",
            "fallback_reason": null,
            "models": models,
        }))
    }

    // ---- jobs ----

    /// `POST /v1/jobs`.
    pub async fn create(self: &Arc<Self>, body: &Value) -> ApiResult<Value> {
        self.create_with(body, false).await
    }

    /// As `create`; with `hold`, the job waits for its files even when
    /// none is required (`skills run --file`).
    pub async fn create_with(self: &Arc<Self>, body: &Value, hold: bool) -> ApiResult<Value> {
        let req = CreateRequest::parse(body)?;
        let skill = self.load_skill(&req.skill_id, &format!("Skill '{}' not found", req.skill_id)).await?;
        check_engine(&skill, &req.engine)?;
        let options = runtime_options(&req.runtime_options, self.cfg.limits.timeout)?;
        check_mode(&skill, &options)?;
        self.check_model(&req.engine, req.model.as_deref())?;
        inputs::check_inline(&skill, &req.input).map_err(|e| ApiError::new(400, e.to_string()))?;

        let record = req.into_record(skill.id.clone(), options, false);
        let request_id = record.request_id.clone();
        let needs_upload = hold || skill.needs_upload();
        if !needs_upload {
            self.admit()?;
        }
        let job = Job::new(record.clone());
        *job.skill.lock().unwrap() = Some(Arc::new(skill));
        // A job that starts now is recorded once, by `start`, before the
        // answer; one that waits for its upload is recorded here.
        if needs_upload {
            let (store, copy) = (self.store.clone(), record);
            tokio::task::spawn_blocking(move || store.save(&copy))
                .await
                .map_err(|e| ApiError::new(500, e.to_string()))?
                .map_err(|e| ApiError::new(500, format!("cannot record the job: {e}")))?;
        }
        self.jobs.lock().unwrap().insert(request_id.clone(), Arc::clone(&job));
        if needs_upload {
            return Ok(json!({"request_id": request_id, "cache_hit": false, "status": null}));
        }
        job.started.store(true, Ordering::SeqCst);
        if let Err(e) = self.start(job, None).await {
            // Never recorded: the request does not exist.
            self.jobs.lock().unwrap().remove(&request_id);
            return Err(e);
        }
        Ok(json!({"request_id": request_id, "cache_hit": false, "status": "queued"}))
    }

    /// A request's `model`, checked against the engine's list.
    fn check_model(&self, engine: &str, model: Option<&str>) -> ApiResult<()> {
        let Some(model) = model else { return Ok(()) };
        let Some(e) = self.cfg.engines.get(engine) else {
            return Err(ApiError::new(400, format!("Unknown engine: {engine}")));
        };
        match &e.models {
            Some(models) if !models.iter().any(|m| m == model) => {
                Err(ApiError::new(400, format!("Model '{model}' not allowed for engine '{engine}'")))
            }
            _ => Ok(()),
        }
    }

    /// `POST /v1/temp-skill-runs`: a request whose skill package comes
    /// with its upload. Options and model are checked now; the engine,
    /// the mode and inline inputs once the package is known.
    pub async fn temp_create(self: &Arc<Self>, body: &Value) -> ApiResult<Value> {
        self.temp_enabled()?;
        let req = CreateRequest::parse_temp(body)?;
        let options = runtime_options(&req.runtime_options, self.cfg.limits.timeout)?;
        self.check_model(&req.engine, req.model.as_deref())?;
        let record = req.into_record(String::new(), options, true);
        let request_id = record.request_id.clone();
        let (store, copy) = (self.store.clone(), record.clone());
        tokio::task::spawn_blocking(move || store.save(&copy))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?
            .map_err(|e| ApiError::new(500, format!("cannot record the job: {e}")))?;
        self.jobs.lock().unwrap().insert(request_id.clone(), Job::new(record));
        Ok(json!({"request_id": request_id, "status": "queued"}))
    }

    /// `POST /v1/temp-skill-runs/{id}/upload`: the skill package (a zip
    /// with one top-level directory) and, optionally, the inputs zip.
    pub async fn temp_upload(
        self: &Arc<Self>,
        request_id: &str,
        package: std::fs::File,
        inputs: Option<std::fs::File>,
    ) -> ApiResult<Value> {
        let job = self.job_or_404(Family::Temp, request_id)?;
        if job.started.swap(true, Ordering::SeqCst) {
            return Err(ApiError::new(409, "Run already started"));
        }
        let result = self.take_temp_upload(&job, package, inputs).await;
        if result.is_err() {
            job.started.store(false, Ordering::SeqCst);
        }
        result
    }

    async fn take_temp_upload(
        self: &Arc<Self>,
        job: &Arc<Job>,
        package: std::fs::File,
        inputs: Option<std::fs::File>,
    ) -> ApiResult<Value> {
        let record = job.record();
        let (dir, limits, engines) =
            (self.request_dir(&record.request_id), self.cfg.zip, self.engine_names());
        let skill = tokio::task::spawn_blocking(move || temp::stage(&dir, &package, &limits, &engines))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?
            .map_err(|e| match e {
                temp::StageError::Invalid(m) => ApiError::new(400, m),
                e @ temp::StageError::Io(_) => ApiError::new(500, e.to_string()),
            })?;
        check_engine(&skill, &record.engine)?;
        check_mode(&skill, &record.runtime_options)?;
        inputs::check_inline(&skill, &record.input).map_err(|e| ApiError::new(400, e.to_string()))?;
        let (uploads, files) = self.admit_with_uploads(job, inputs).await?;
        let skill_id = skill.id.clone();
        *job.skill.lock().unwrap() = Some(Arc::new(skill));
        // Written with the run's record by `start` (one synced write): a
        // restart before it sees the request still waiting for its package.
        job.state.send_modify(|r| r.skill_id = skill_id);
        self.start(Arc::clone(job), Some(uploads)).await?;
        let record = job.record();
        Ok(json!({
            "request_id": record.request_id,
            "status": record.status.map(Status::as_str),
            "extracted_files": files,
        }))
    }

    /// Admits the job, then extracts its inputs zip (an empty `uploads/`
    /// without one); the admission is taken back when that fails.
    async fn admit_with_uploads(
        &self,
        job: &Job,
        archive: Option<std::fs::File>,
    ) -> ApiResult<(PathBuf, Vec<String>)> {
        self.admit()?;
        let request_dir = self.request_dir(&job.record().request_id);
        let limits = self.cfg.zip;
        let extracted = tokio::task::spawn_blocking(move || match archive {
            Some(archive) => extract_upload(&request_dir, &archive, &limits),
            None => {
                let uploads = request_dir.join("uploads");
                std::fs::create_dir_all(&uploads)
                    .map_err(|e| ApiError::new(500, format!("cannot store the upload: {e}")))?;
                Ok((uploads, Vec::new()))
            }
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()))
        .and_then(|r| r);
        if extracted.is_err() {
            self.active.fetch_sub(1, Ordering::SeqCst);
        }
        extracted
    }

    /// Counts a job in, or refuses it when the queue is full.
    fn admit(&self) -> ApiResult<()> {
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
    async fn start(self: &Arc<Self>, job: Arc<Job>, uploads: Option<PathBuf>) -> ApiResult<()> {
        let run_id = uuid::Uuid::new_v4().to_string();
        let paths = RunPaths::new(&self.cfg.data_dir, &run_id);
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
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                job.state.send_modify(|r| {
                    r.run_id = Some(run_id);
                    r.status = Some(Status::Running);
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
                })
                .await;
                tokio::spawn(Arc::clone(self).run_job(job, None));
            }
        }
        Ok(())
    }

    /// `POST /v1/jobs/{id}/upload`: `archive` is the uploaded zip.
    pub async fn upload(self: &Arc<Self>, request_id: &str, archive: std::fs::File) -> ApiResult<Value> {
        let job = self.job_or_404(Family::Jobs, request_id)?;
        if job.started.swap(true, Ordering::SeqCst) {
            return Err(ApiError::new(409, "Run already started"));
        }
        let result = self.take_upload(&job, archive).await;
        if result.is_err() {
            job.started.store(false, Ordering::SeqCst);
        }
        result
    }

    async fn take_upload(self: &Arc<Self>, job: &Arc<Job>, archive: std::fs::File) -> ApiResult<Value> {
        let t0 = std::time::Instant::now();
        let (uploads, files) = self.admit_with_uploads(job, Some(archive)).await?;
        let t_extracted = t0.elapsed();
        self.start(Arc::clone(job), Some(uploads)).await?;
        let record = job.record();
        tracing::debug!(
            "job {}: upload extracted in {t_extracted:?}, run created and queued in {:?}",
            record.request_id,
            t0.elapsed() - t_extracted
        );
        Ok(json!({
            "request_id": record.request_id,
            "cache_hit": false,
            "extracted_files": files,
            "status": record.status.map(Status::as_str),
        }))
    }

    /// Takes host files as the upload (`skills run --file KEY=PATH`): each
    /// is copied to `uploads/KEY`, then the job starts as after an upload.
    pub async fn upload_files(
        self: &Arc<Self>,
        request_id: &str,
        files: &[(String, PathBuf)],
    ) -> ApiResult<Value> {
        let job = self.job_or_404(Family::Jobs, request_id)?;
        if job.started.swap(true, Ordering::SeqCst) {
            return Err(ApiError::new(409, "Run already started"));
        }
        let request_dir = self.request_dir(request_id);
        let files = files.to_vec();
        let staged = tokio::task::spawn_blocking(move || -> ApiResult<PathBuf> {
            let uploads = request_dir.join("uploads");
            std::fs::create_dir_all(&uploads).map_err(|e| ApiError::new(500, e.to_string()))?;
            for (key, path) in files {
                if !fsio::is_plain_name(&key) {
                    return Err(ApiError::new(
                        400,
                        format!("file input key {key:?} must be a plain file name"),
                    ));
                }
                std::fs::copy(&path, uploads.join(&key))
                    .map_err(|e| ApiError::new(400, format!("--file {key}={}: {e}", path.display())))?;
            }
            Ok(uploads)
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()))
        .and_then(|r| r);
        let uploads = match staged.and_then(|u| self.admit().map(|()| u)) {
            Ok(u) => u,
            Err(e) => {
                job.started.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        self.start(Arc::clone(&job), Some(uploads)).await?;
        Ok(json!({"request_id": request_id, "status": "queued"}))
    }

    /// The job's task: wait for a slot (unless `direct` brings one), run,
    /// record the outcome.
    async fn run_job(self: Arc<Self>, job: Arc<Job>, direct: Option<Direct>) {
        let mut cancel = job.cancel.subscribe();
        let (permit, saved) = match direct {
            Some(Direct { permit, saved }) => (Some(permit), Some(saved)),
            None => {
                let permit = tokio::select! {
                    permit = Arc::clone(&self.slots).acquire_owned() => permit.ok(),
                    _ = cancel.wait_for(|c| *c) => None,
                };
                (permit, None)
            }
        };
        let record = job.record();
        let paths = RunPaths::new(&self.cfg.data_dir, record.run_id.as_deref().unwrap_or("missing"));
        let outcome = match permit {
            None => run::write_canceled(&paths),
            Some(_permit) if record.cancel_requested => run::write_canceled(&paths),
            Some(_permit) => {
                let running = async {
                    let r = self
                        .update(&job, |r| {
                            if r.status == Some(Status::Queued) {
                                r.status = Some(Status::Running);
                            }
                        })
                        .await;
                    if let Some(saved) = saved {
                        let _ = saved.send(());
                    }
                    r
                };
                let skill = job.skill.lock().unwrap().clone();
                self.execute(&record, skill, &paths, cancel, running).await
            }
        };
        self.active.fetch_sub(1, Ordering::SeqCst);
        let result = Some(paths.result.clone());
        self.update_after(
            &job,
            |r| {
                if r.cancel_requested {
                    r.status = Some(Status::Canceled);
                    r.error =
                        Some(json!({"code": "CANCELED_BY_USER", "message": "Canceled by user request"}));
                    return;
                }
                match outcome {
                    Outcome::Succeeded { warnings } => {
                        r.status = Some(Status::Succeeded);
                        r.warnings = warnings;
                        r.error = None;
                    }
                    Outcome::Failed { error, warnings } => {
                        r.status = Some(Status::Failed);
                        r.warnings = warnings;
                        r.error = Some(error);
                    }
                    Outcome::Canceled => {
                        r.status = Some(Status::Canceled);
                        r.error =
                            Some(json!({"code": "CANCELED_BY_USER", "message": "Canceled by user request"}));
                    }
                }
            },
            result,
        )
        .await;
    }

    /// Runs the job's engine. `running` records the job as running; the
    /// engine starts only once it is on disk (a restart must not run it a
    /// second time), but the run is prepared while it is being written.
    async fn execute(
        &self,
        record: &JobRecord,
        skill: Option<Arc<Skill>>,
        paths: &RunPaths,
        cancel: watch::Receiver<bool>,
        running: impl std::future::Future<Output = JobRecord>,
    ) -> Outcome {
        let failed = |m: String| Outcome::Failed { error: json!({"message": m}), warnings: vec![] };
        let t0 = std::time::Instant::now();
        let (running, skill) = match skill {
            Some(skill) => (Some(running), Some(skill)),
            // Loading the package again (after a restart) is rare: in turn.
            None => {
                running.await;
                (None, None)
            }
        };
        let skill = match skill {
            Some(s) => s,
            None if record.temp => {
                let (dir, id, engines) =
                    (self.request_dir(&record.request_id), record.skill_id.clone(), self.engine_names());
                match tokio::task::spawn_blocking(move || temp::load(&dir, &id, &engines)).await {
                    Ok(Ok(s)) => Arc::new(s),
                    Ok(Err(e)) => return failed(e.to_string()),
                    Err(e) => return failed(e.to_string()),
                }
            }
            None => match self
                .load_skill(&record.skill_id, &format!("Skill '{}' not found", record.skill_id))
                .await
            {
                Ok(s) => Arc::new(s),
                Err(e) => return failed(e.to_string()),
            },
        };
        let Some(engine) = self.cfg.engines.get(&record.engine).cloned() else {
            if let Some(running) = running {
                running.await;
            }
            return failed(format!("engine '{}' is not configured on this server", record.engine));
        };
        let (cfg, record2, paths2, skill2, engine2) =
            (self.cfg.clone(), record.clone(), paths.clone(), skill.clone(), engine.clone());
        let prepare = tokio::task::spawn_blocking(move || {
            let cx = RunContext {
                skill: &skill2,
                engine: &engine2,
                record: &record2,
                paths: &paths2,
                limits: &cfg.limits,
                host_ids: cfg.host_ids,
            };
            run::prepare(&cx)
        });
        let prepared = match running {
            Some(running) => tokio::join!(running, prepare).1,
            None => prepare.await,
        };
        let prepared = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(outcome)) => {
                run::cleanup(paths);
                return outcome;
            }
            Err(e) => return failed(e.to_string()),
        };
        let t_prepared = t0.elapsed();
        let epoch_ns =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let spawn_ns = epoch_ns();
        let stop =
            run::execute(&self.cfg.launcher, paths, &prepared, self.cfg.limits.kill_grace, cancel).await;
        let t_ran = t0.elapsed();
        // On the engine's clock too (`date +%s%N`): what the sandbox's start
        // and end add around the engine (docs/benchmarks.md).
        tracing::debug!(
            "job {}: launcher started at {spawn_ns} and reaped at {} (ns since the epoch)",
            record.request_id,
            epoch_ns()
        );
        let (cfg, record2, paths2) = (self.cfg.clone(), record.clone(), paths.clone());
        let outcome = match stop {
            Err(e) => failed(e.to_string()),
            Ok((stop, _elapsed)) => tokio::task::spawn_blocking(move || {
                let cx = RunContext {
                    skill: &skill,
                    engine: &engine,
                    record: &record2,
                    paths: &paths2,
                    limits: &cfg.limits,
                    host_ids: cfg.host_ids,
                };
                run::finish(&cx, stop, prepared.timeout)
            })
            .await
            .unwrap_or_else(|e| failed(e.to_string())),
        };
        run::cleanup(paths);
        tracing::debug!(
            "job {}: prepared in {:?}, engine and sandbox {:?}, finished in {:?}",
            record.request_id,
            t_prepared,
            t_ran - t_prepared,
            t0.elapsed() - t_ran
        );
        outcome
    }

    /// `GET /v1/jobs/{id}`. A temporary run waiting for its package is
    /// `queued` with skill `unknown` (upstream); a job waiting for its
    /// upload is 404 `Run not found` (upstream).
    pub fn status(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let r = match family {
            Family::Jobs => self.run_of(family, request_id)?.0,
            Family::Temp => self.job_or_404(family, request_id)?.record(),
        };
        Ok(json!({
            "request_id": r.request_id,
            "status": r.status.map(Status::as_str).unwrap_or("queued"),
            "skill_id": if r.skill_id.is_empty() { "unknown" } else { r.skill_id.as_str() },
            "engine": r.engine,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "warnings": r.warnings,
            "error": r.error,
            "auto_decision_count": 0,
            "last_auto_decision_at": null,
            "pending_interaction_id": null,
            "interaction_count": 0,
            "recovery_state": r.recovery_state.as_deref().unwrap_or("none"),
            "recovered_at": r.recovered_at,
            "recovery_reason": r.recovery_reason,
        }))
    }

    /// The job handle, for waiting on it (`skills run`).
    pub fn handle(&self, request_id: &str) -> Option<Arc<Job>> {
        self.job(request_id)
    }

    /// `GET /v1/jobs/{id}/result`.
    pub async fn result(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (r, paths) = self.run_of(family, request_id)?;
        let bytes =
            tokio::fs::read(&paths.result).await.map_err(|_| ApiError::new(404, "Run result not found"))?;
        let result: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(500, format!("result.json unreadable: {e}")))?;
        Ok(json!({"request_id": r.request_id, "result": result}))
    }

    /// `GET /v1/jobs/{id}/artifacts`.
    pub async fn artifacts(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (r, paths) = self.run_of(family, request_id)?;
        let list = tokio::task::spawn_blocking(move || artifacts::list(&paths.workspace))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?;
        Ok(json!({"request_id": r.request_id, "artifacts": list}))
    }

    /// `GET /v1/jobs/{id}/artifacts/{path}`: the open file, its size and name.
    pub async fn artifact(
        &self,
        family: Family,
        request_id: &str,
        path: &str,
    ) -> ApiResult<(std::fs::File, u64, String)> {
        let (_, paths) = self.run_of(family, request_id)?;
        let path = path.to_string();
        let opened =
            tokio::task::spawn_blocking(move || artifacts::open_for_download(&paths.workspace, &path))
                .await
                .map_err(|e| ApiError::new(500, e.to_string()))?;
        opened.map_err(|e| match e {
            DownloadError::Empty => ApiError::new(400, "Artifact path is required"),
            DownloadError::Invalid => ApiError::new(400, "Invalid artifact path"),
            DownloadError::NotFound => ApiError::new(404, "Artifact not found"),
        })
    }

    /// `GET /v1/jobs/{id}/bundle`: the bundle file and its name. Debug when
    /// the request asked for `runtime_options.debug`.
    pub async fn bundle(&self, family: Family, request_id: &str) -> ApiResult<(PathBuf, &'static str)> {
        let (r, paths) = self.run_of(family, request_id)?;
        if !r.status.is_some_and(Status::is_terminal) {
            return Err(ApiError::new(409, "Run is not finished yet"));
        }
        let kind = if r.runtime_options.get("debug").is_some_and(truthy) {
            BundleKind::Debug
        } else {
            BundleKind::Normal
        };
        // Upstream's run directory has status.json; ours is the job record.
        let status = serde_json::to_vec(&json!({
            "status": r.status.map(Status::as_str),
            "updated_at": r.updated_at,
            "error": r.error,
            "warnings": r.warnings,
            "effective_session_timeout_sec": null,
        }))
        .expect("plain data");
        let built = tokio::task::spawn_blocking(move || {
            artifacts::bundle(&paths.dir, kind, &[("status.json", status.as_slice())])
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()))?
        .map_err(|e| ApiError::new(500, format!("cannot build the bundle: {e}")))?;
        Ok((built, kind.file_name()))
    }

    /// `GET /v1/jobs/{id}/logs`.
    pub async fn logs(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (r, paths) = self.run_of(family, request_id)?;
        let read = |name: &str| {
            let p = paths.logs.join(name);
            p.exists().then(|| run::tail(&p, 4 << 20))
        };
        Ok(json!({
            "request_id": r.request_id,
            "prompt": read("prompt.txt"),
            "stdout": read("stdout.txt"),
            "stderr": read("stderr.txt"),
        }))
    }

    /// `POST /v1/jobs/{id}/cancel`.
    pub async fn cancel(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let job = self.job_or_404(family, request_id)?;
        let (r, _) = self.run_of(family, request_id)?;
        let answer = |status: &str, accepted: bool, message: &str| json!({"request_id": r.request_id, "run_id": r.run_id, "status": status, "accepted": accepted, "message": message});
        let status = r.status.unwrap_or(Status::Queued);
        if status.is_terminal() {
            return Ok(answer(status.as_str(), false, "Run already in terminal state"));
        }
        if r.cancel_requested {
            return Ok(answer("canceled", false, "Cancel already requested"));
        }
        self.update(&job, |r| {
            r.cancel_requested = true;
        })
        .await;
        job.cancel.send_replace(true);
        Ok(answer("canceled", true, "Cancel request accepted"))
    }

    /// How many jobs are in each status, every status named (`created`:
    /// waiting for its upload), and engine slots free.
    pub fn status_counts(&self) -> (Vec<(&'static str, usize)>, usize) {
        let mut counts: Vec<(&'static str, usize)> = [
            "created",
            Status::Queued.as_str(),
            Status::Running.as_str(),
            Status::Succeeded.as_str(),
            Status::Failed.as_str(),
            Status::Canceled.as_str(),
        ]
        .into_iter()
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

    pub fn tmp_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("tmp")
    }
}

/// Extracts `archive` into `request_dir/uploads` (through a private
/// staging directory renamed into place), and lists the files.
fn extract_upload(
    request_dir: &Path,
    archive: &std::fs::File,
    limits: &ZipLimits,
) -> ApiResult<(PathBuf, Vec<String>)> {
    let io = |e: std::io::Error| ApiError::new(500, format!("cannot store the upload: {e}"));
    std::fs::create_dir_all(request_dir).map_err(io)?;
    let uploads = request_dir.join("uploads");
    if uploads.exists() {
        std::fs::remove_dir_all(&uploads).map_err(io)?;
    }
    let staging = tempfile::Builder::new().prefix(".uploads-").tempdir_in(request_dir).map_err(io)?;
    let dir = fsio::open_dir(staging.path()).map_err(io)?;
    extract(archive, dir.as_fd(), limits).map_err(|e| match e {
        ZipError::Fs(e) => ApiError::new(500, format!("cannot store the upload: {e}")),
        e => ApiError::new(400, format!("Invalid zip file: {e}")),
    })?;
    let walked = artifacts::walk(dir.as_fd(), &[])
        .map_err(|e| ApiError::new(500, format!("cannot list the upload: {e}")))?;
    if walked.too_long > 0 {
        return Err(ApiError::new(
            400,
            format!("Invalid zip file: an entry's path is longer than {} bytes", libc::PATH_MAX - 1),
        ));
    }
    let files: Vec<String> = walked.files.into_iter().map(|f| f.rel).collect();
    drop(dir);
    std::fs::rename(staging.keep(), &uploads).map_err(io)?;
    Ok((uploads, files))
}

fn clear_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

/// The body of `POST /v1/jobs`, checked as FastAPI checks it (422).
struct CreateRequest {
    skill_id: String,
    engine: String,
    input: Map<String, Value>,
    parameter: Map<String, Value>,
    model: Option<String>,
    runtime_options: Map<String, Value>,
}

impl CreateRequest {
    /// The body of `POST /v1/temp-skill-runs`: the same without
    /// `skill_id` (the package names it).
    fn parse_temp(body: &Value) -> ApiResult<CreateRequest> {
        let mut with_id = body.clone();
        if let Some(obj) = with_id.as_object_mut() {
            obj.insert("skill_id".into(), Value::String(String::new()));
        }
        CreateRequest::parse(&with_id)
    }

    /// A new record for this request, not started.
    fn into_record(self, skill_id: String, runtime_options: Map<String, Value>, temp: bool) -> JobRecord {
        let now = store::now();
        JobRecord {
            request_id: uuid::Uuid::new_v4().to_string(),
            skill_id,
            engine: self.engine,
            input: self.input,
            parameter: self.parameter,
            model: self.model,
            runtime_options,
            created_at: now.clone(),
            updated_at: now,
            run_id: None,
            status: None,
            warnings: Vec::new(),
            error: None,
            cancel_requested: false,
            temp,
            recovery_state: None,
            recovered_at: None,
            recovery_reason: None,
        }
    }

    fn parse(body: &Value) -> ApiResult<CreateRequest> {
        let Some(obj) = body.as_object() else {
            return Err(ApiError::field(
                "model_attributes_type",
                &["body"],
                "Input should be a valid dictionary or object to extract fields from",
            ));
        };
        let string = |key: &str| -> ApiResult<Option<String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => {
                    Err(ApiError::field("string_type", &["body", key], "Input should be a valid string"))
                }
            }
        };
        let object = |key: &str| -> ApiResult<Map<String, Value>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(m)) => Ok(m.clone()),
                Some(_) => {
                    Err(ApiError::field("dict_type", &["body", key], "Input should be a valid dictionary"))
                }
            }
        };
        let skill_id = match obj.get("skill_id") {
            None => return Err(ApiError::field("missing", &["body", "skill_id"], "Field required")),
            Some(_) => string("skill_id")?.ok_or_else(|| {
                ApiError::field("string_type", &["body", "skill_id"], "Input should be a valid string")
            })?,
        };
        Ok(CreateRequest {
            skill_id,
            engine: string("engine")?.unwrap_or_else(|| "codex".into()),
            input: object("input")?,
            parameter: object("parameter")?,
            model: string("model")?,
            runtime_options: object("runtime_options")?,
        })
    }
}

/// Upstream's engine policy for one request (400 `SKILL_ENGINE_UNSUPPORTED`).
fn check_engine(skill: &Skill, engine: &str) -> ApiResult<()> {
    if skill.effective_engines.iter().any(|e| e == engine) {
        return Ok(());
    }
    Err(ApiError {
        status: 400,
        detail: json!({
            "code": "SKILL_ENGINE_UNSUPPORTED",
            "message": format!("Skill '{}' does not support engine '{engine}'", skill.id),
            "declared_engines": skill.engines,
            "unsupported_engines": skill.unsupported_engines,
            "effective_engines": skill.effective_engines,
            "requested_engine": engine,
        }),
    })
}

/// The (normalized) `execution_mode` against the skill's modes and this
/// server's: 400 `SKILL_EXECUTION_MODE_UNSUPPORTED` either way.
fn check_mode(skill: &Skill, options: &Map<String, Value>) -> ApiResult<()> {
    let mode = options.get("execution_mode").and_then(Value::as_str).unwrap_or("auto");
    let message = if !skill.execution_modes.iter().any(|m| m == mode) {
        format!("Skill '{}' does not support execution_mode '{mode}'", skill.id)
    } else if mode == "interactive" {
        // Declared by the skill, but this server runs auto jobs only:
        // upstream's refusal, so clients handle both alike.
        format!(
            "Skill '{}' does not support execution_mode 'interactive' on this server (interactive jobs are not implemented)",
            skill.id
        )
    } else {
        return Ok(());
    };
    Err(ApiError {
        status: 400,
        detail: json!({
            "code": "SKILL_EXECUTION_MODE_UNSUPPORTED",
            "message": message,
            "declared_execution_modes": skill.execution_modes,
            "requested_execution_mode": mode,
        }),
    })
}

/// A JSON value as Python's `bool()` of its decoded form: false for
/// `null`, `false`, `0`, `""`, `[]` and `{}`.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Upstream's runtime-options policy: known keys, their types, defaults;
/// `hard_timeout_seconds` only below the server's `job_timeout`. Like
/// upstream, the flags `verbose`, `no_cache`, `debug` and
/// `debug_keep_temp` take any value (its own e2e runner sends `verbose` as
/// a count) and are read as Python truth values ([`truthy`]).
fn runtime_options(given: &Map<String, Value>, job_timeout: Duration) -> ApiResult<Map<String, Value>> {
    const FLAGS: [&str; 4] = ["verbose", "no_cache", "debug", "debug_keep_temp"];
    const BOOLS: [&str; 1] = ["interactive_require_user_reply"];
    const POSITIVE: [&str; 5] = [
        "session_timeout_sec",
        "interactive_wait_timeout_sec",
        "hard_wait_timeout_sec",
        "wait_timeout_sec",
        "hard_timeout_seconds",
    ];
    let mut unknown: Vec<&str> = given
        .keys()
        .map(String::as_str)
        .filter(|k| {
            !FLAGS.contains(k) && !BOOLS.contains(k) && !POSITIVE.contains(k) && *k != "execution_mode"
        })
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ApiError::new(400, format!("Unknown runtime_options: {}", unknown.join(", "))));
    }
    let mut out = given.clone();
    for (k, v) in given {
        if BOOLS.contains(&k.as_str()) {
            if !v.is_boolean() {
                return Err(ApiError::new(400, format!("runtime_options.{k} must be a boolean")));
            }
        } else if POSITIVE.contains(&k.as_str()) {
            if v.as_u64().is_none_or(|n| n == 0) {
                return Err(ApiError::new(400, format!("runtime_options.{k} must be a positive integer")));
            }
        } else if k == "execution_mode" && !matches!(v.as_str(), Some("auto" | "interactive")) {
            return Err(ApiError::new(
                400,
                "runtime_options.execution_mode must be one of: auto, interactive",
            ));
        }
    }
    if let Some(seconds) = given.get("hard_timeout_seconds").and_then(Value::as_u64)
        && Duration::from_secs(seconds) >= job_timeout
    {
        return Err(ApiError::new(
            400,
            format!(
                "runtime_options.hard_timeout_seconds must be less than the server's job timeout ({} seconds)",
                job_timeout.as_secs_f64()
            ),
        ));
    }
    out.entry("execution_mode").or_insert_with(|| json!("auto"));
    out.entry("session_timeout_sec").or_insert_with(|| json!(1200));
    Ok(out)
}
