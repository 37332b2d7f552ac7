//! How jobs come in: `POST /v1/jobs`, its upload, the temporary skill
//! runs and `skills run`'s host files, and the result-cache lookup that
//! may answer them at once (docs/skills.md).
//!
//! A second upload, or an upload to a job that already started, is
//! refused with 409 (upstream silently started a second run).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::artifacts;
use super::cache::{self, KeyParts};
use super::inputs;
use super::jobs::{ApiError, ApiResult, Family, Job, Service, opt_in};
use super::package::Skill;
use super::protocol::{self, CreateRequest, check_engine, check_mode, runtime_options, truthy};
use super::store::{JobRecord, Status};
use super::temp;
use crate::hostfs::beneath as fsio;
use crate::inputs::zip::{ZipError, ZipLimits, extract};

impl Service {
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

        let mut record = req.into_record(skill.id.clone(), options, false);
        let request_id = record.request_id.clone();
        let skill = Arc::new(skill);
        let needs_upload = hold || skill.needs_upload();
        if !needs_upload {
            record.cache_key = self.cache_key(&skill, &record, None).await;
            if let Some(hit) = self.cached(&record) {
                self.save_new(&hit).await?;
                self.jobs.lock().unwrap().insert(request_id.clone(), Job::new(hit));
                return Ok(json!({"request_id": request_id, "cache_hit": true, "status": "succeeded"}));
            }
            self.admit()?;
        }
        let job = Job::new(record.clone());
        *job.skill.lock().unwrap() = Some(skill);
        // A job that starts now is recorded once, by `start`, before the
        // answer; one that waits for its upload is recorded here.
        if needs_upload {
            self.save_new(&record).await?;
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

    /// The result-cache key of `record`'s inputs (`uploads` holds its
    /// files), or `None` for a job that is never cached (interactive).
    /// A key that cannot be computed is logged and the job runs.
    async fn cache_key(
        &self,
        skill: &Arc<Skill>,
        record: &JobRecord,
        uploads: Option<PathBuf>,
    ) -> Option<String> {
        if protocol::is_interactive(&record.runtime_options) {
            return None;
        }
        let (skill, r) = (Arc::clone(skill), record.clone());
        let computed = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let fingerprint = cache::skill_fingerprint(&skill, &r.engine)?;
            let manifest = match uploads {
                Some(dir) => cache::input_manifest(&dir)?,
                None => cache::empty_manifest(),
            };
            Ok(KeyParts {
                skill_id: &r.skill_id,
                engine: &r.engine,
                fingerprint: &fingerprint,
                parameter: &r.parameter,
                model: r.model.as_deref(),
                manifest: &manifest,
                input: &r.input,
            }
            .key())
        })
        .await;
        match computed {
            Ok(Ok(key)) => Some(key),
            Ok(Err(e)) => {
                tracing::warn!("job {}: no cache key ({e}); the job runs", record.request_id);
                None
            }
            Err(e) => {
                tracing::warn!("job {}: no cache key ({e}); the job runs", record.request_id);
                None
            }
        }
    }

    /// `record` answered from the cache: linked to the run that succeeded
    /// for the same key, unless the request said `no_cache`.
    fn cached(&self, record: &JobRecord) -> Option<JobRecord> {
        let key = record.cache_key.as_deref()?;
        if record.runtime_options.get("no_cache").is_some_and(truthy) {
            return None;
        }
        let entry = self.cache.lookup(key)?;
        tracing::debug!("job {}: cache hit, run {}", record.request_id, entry.run_id);
        let mut hit = record.clone();
        hit.run_id = Some(entry.run_id);
        hit.status = Some(Status::Succeeded);
        hit.cache_hit = true;
        hit.warnings = entry.warnings;
        hit.error = None;
        hit.updated_at = super::store::now();
        Some(hit)
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
        self.save_new(&record).await?;
        self.jobs.lock().unwrap().insert(request_id.clone(), Job::new(record));
        Ok(json!({"request_id": request_id, "status": "queued"}))
    }

    /// `POST /v1/temp-skill-runs/{id}/upload`: the skill package (a zip
    /// with one top-level directory) and, optionally, the inputs zip. A
    /// refused upload marks the request `failed` with the reason (as
    /// upstream); a good upload after it still starts it.
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
        if let Err(e) = &result {
            let message = match &e.detail {
                Value::String(s) => s.clone(),
                other => other
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| other.to_string(), str::to_string),
            };
            self.update(&job, |r| {
                r.status = Some(Status::Failed);
                r.error = Some(json!({"message": message}));
            })
            .await;
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
        let record = job.record();
        let skill = job.skill.lock().unwrap().clone();
        let skill = match skill {
            Some(s) => s,
            None => match self
                .load_skill(&record.skill_id, &format!("Skill '{}' not found", record.skill_id))
                .await
            {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    self.active.fetch_sub(1, Ordering::SeqCst);
                    return Err(e);
                }
            },
        };
        let key = self.cache_key(&skill, &record, Some(uploads.clone())).await;
        job.state.send_modify(|r| r.cache_key = key.clone());
        if let Some(hit) = self.cached(&job.record()) {
            self.active.fetch_sub(1, Ordering::SeqCst);
            // The cached run has the same files; these are not needed.
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(uploads)).await;
            self.update(job, |r| *r = hit).await;
            return Ok(json!({
                "request_id": record.request_id,
                "cache_hit": true,
                "extracted_files": files,
                "status": "succeeded",
            }));
        }
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
}

impl Service {
    fn install_enabled(&self) -> ApiResult<()> {
        opt_in(self.cfg.install_skills, "Skill package installs", "--install-skills")
    }

    /// `POST /v1/skill-packages/install`: `package` is the uploaded zip
    /// ([`super::install`]).
    pub fn install(&self, package: std::fs::File) -> ApiResult<Value> {
        self.install_enabled()?;
        self.installs.request(package, self.cfg.skills_dir.clone(), self.cfg.zip, self.engine_names())
    }

    /// `GET /v1/skill-packages/{id}`.
    pub fn install_status(&self, request_id: &str) -> ApiResult<Value> {
        self.install_enabled()?;
        self.installs.status(request_id)
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
