//! The endpoints that only read: skills, engines and models, a job's
//! status, result, artifacts, bundles and logs.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::artifacts::{self, BundleKind, DownloadError};
use super::jobs::{ApiError, ApiResult, Family, Service};
use super::package::{self, Skill};
use super::protocol::truthy;
use super::run;
use super::store::Status;
use crate::hostfs::beneath as fsio;

impl Service {
    pub(super) fn engine_names(&self) -> Vec<String> {
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

    /// `GET /v1/jobs/{id}`. A temporary run waiting for its package is
    /// `queued` with skill `unknown` (upstream); a job waiting for its
    /// upload is 404 `Run not found` (upstream).
    pub fn status(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let r = match family {
            Family::Jobs => self.run_of(family, request_id)?.1,
            Family::Temp => self.job_or_404(family, request_id)?.record(),
        };
        let interaction = r.interaction.as_ref();
        Ok(json!({
            "request_id": r.request_id,
            "status": r.status.map(Status::as_str).unwrap_or("queued"),
            "skill_id": if r.skill_id.is_empty() { "unknown" } else { r.skill_id.as_str() },
            "engine": r.engine,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "warnings": r.warnings,
            "error": r.error,
            "auto_decision_count": interaction.map_or(0, |i| i.auto_decisions().count()),
            "last_auto_decision_at": interaction.and_then(|i| i.auto_decisions().last()).map(|a| a.resolved_at.clone()),
            "pending_interaction_id": interaction.filter(|_| r.status == Some(Status::WaitingUser)).and_then(|i| i.pending_id()),
            "interaction_count": interaction.map_or(0, |i| i.asked),
            "recovery_state": r.recovery_state.as_deref().unwrap_or("none"),
            "recovered_at": r.recovered_at,
            "recovery_reason": r.recovery_reason,
        }))
    }

    /// `GET /v1/jobs/{id}/result`.
    pub async fn result(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (_, r, paths) = self.run_of(family, request_id)?;
        let bytes =
            tokio::fs::read(&paths.result).await.map_err(|_| ApiError::new(404, "Run result not found"))?;
        let result: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(500, format!("result.json unreadable: {e}")))?;
        Ok(json!({"request_id": r.request_id, "result": result}))
    }

    /// `GET /v1/jobs/{id}/artifacts`.
    pub async fn artifacts(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (_, r, paths) = self.run_of(family, request_id)?;
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
        let (_, _, paths) = self.run_of(family, request_id)?;
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

    /// `GET /v1/jobs/{id}/bundle` (`debug` false: debug when the request
    /// asked for `runtime_options.debug`) and `GET .../bundle/debug`
    /// (`debug` true): the bundle file and its name.
    pub async fn bundle(
        &self,
        family: Family,
        request_id: &str,
        debug: bool,
    ) -> ApiResult<(PathBuf, &'static str)> {
        let (_, r, paths) = self.run_of(family, request_id)?;
        if !r.status.is_some_and(Status::is_terminal) {
            return Err(ApiError::new(409, "Run is not finished yet"));
        }
        let kind = if debug || r.runtime_options.get("debug").is_some_and(truthy) {
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
        let (_, r, paths) = self.run_of(family, request_id)?;
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
}
