//! `POST /v1/skill-packages/install` and `GET /v1/skill-packages/{id}`:
//! a client installs or updates a skill package under `--skills-dir`
//! (docs/skills.md, "Installing packages"). Served only with
//! `skills serve --install-skills`.
//!
//! The zip is checked as a temporary run's package is: the same safe
//! extractor and caps, exactly one top-level directory, the whole package
//! check with upstream's messages; and `version` is required. `.git`
//! entries are dropped. The package is staged in a private directory
//! under `--skills-dir` and renamed into place, so a job never sees half
//! of it. An update needs a strictly higher version; the installed one is
//! moved to `.archive/<id>/<version>/` first. An installed package that
//! no longer loads is moved to `.invalid/<id>-<time>/`. One install is
//! applied at a time.
//!
//! Each install's state is a JSON record in `<data>/installs/`, written
//! by the atomic writer; an install a restart interrupted is `failed`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::package::{self, version_order};
use super::protocol::{ApiError, ApiResult};
use super::temp::{self, StageError};
use crate::hostfs::atomic::{self, Durability};
use crate::inputs::zip::ZipLimits;

/// One install request (upstream's `SkillInstallStatusResponse`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstallRecord {
    pub request_id: String,
    /// `queued`, `running`, `succeeded`, `failed`.
    pub status: String,
    pub created_at: String,
    pub updated_at: String,
    pub skill_id: Option<String>,
    pub version: Option<String>,
    /// `install` or `update`.
    pub action: Option<String>,
    pub error: Option<String>,
}

/// The install records, and the lock that applies one install at a time.
pub struct Installs {
    dir: PathBuf,
    records: Mutex<HashMap<String, InstallRecord>>,
    apply: Mutex<()>,
}

impl Installs {
    /// Loads the records in `dir`; one that was not finished is failed.
    pub fn open(dir: &Path) -> std::io::Result<Installs> {
        std::fs::create_dir_all(dir)?;
        let installs =
            Installs { dir: dir.to_path_buf(), records: Mutex::new(HashMap::new()), apply: Mutex::new(()) };
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            let Some(mut r) =
                std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<InstallRecord>(&b).ok())
            else {
                continue;
            };
            if matches!(r.status.as_str(), "queued" | "running") {
                r.status = "failed".into();
                r.error = Some("the server stopped during the install; nothing was changed".into());
                r.updated_at = super::store::now();
                installs.save(&r)?;
            }
            installs.records.lock().unwrap().insert(r.request_id.clone(), r);
        }
        Ok(installs)
    }

    fn save(&self, r: &InstallRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(r).expect("plain data");
        atomic::write(&self.dir.join(format!("{}.json", r.request_id)), &bytes, Durability::Synced)?;
        self.records.lock().unwrap().insert(r.request_id.clone(), r.clone());
        Ok(())
    }

    /// Records a new install request of `package`, and applies it on a
    /// blocking thread (`skills_dir`, `limits` and `engines` as the
    /// package check needs them).
    pub fn request(
        self: &Arc<Self>,
        package: std::fs::File,
        skills_dir: PathBuf,
        limits: ZipLimits,
        engines: Vec<String>,
    ) -> ApiResult<Value> {
        if package.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
            return Err(ApiError::new(400, "Uploaded package is empty"));
        }
        let now = super::store::now();
        let record = InstallRecord {
            request_id: uuid::Uuid::new_v4().to_string(),
            status: "queued".into(),
            created_at: now.clone(),
            updated_at: now,
            skill_id: None,
            version: None,
            action: None,
            error: None,
        };
        self.save(&record).map_err(|e| ApiError::new(500, format!("cannot record the install: {e}")))?;
        let (installs, id) = (Arc::clone(self), record.request_id.clone());
        tokio::task::spawn_blocking(move || installs.apply(&id, &package, &skills_dir, &limits, &engines));
        Ok(json!({"request_id": record.request_id, "status": "queued"}))
    }

    /// The state of install `request_id`.
    pub fn status(&self, request_id: &str) -> ApiResult<Value> {
        let record = self.records.lock().unwrap().get(request_id).cloned();
        let record = record.ok_or_else(|| ApiError::new(404, "Install request not found"))?;
        Ok(serde_json::to_value(record).expect("plain data"))
    }

    fn apply(
        &self,
        id: &str,
        package: &std::fs::File,
        skills_dir: &Path,
        limits: &ZipLimits,
        engines: &[String],
    ) {
        self.update(id, |r| r.status = "running".into());
        let _one_at_a_time = self.apply.lock().unwrap_or_else(|e| e.into_inner());
        let done = install(skills_dir, package, limits, engines);
        self.update(id, |r| match done {
            Ok(Installed { skill_id, version, action }) => {
                tracing::info!("skill {skill_id} {version}: {action} (install {id})");
                r.status = "succeeded".into();
                (r.skill_id, r.version, r.action) = (Some(skill_id), Some(version), Some(action.into()));
            }
            Err(e) => {
                tracing::warn!("install {id} failed: {e}");
                r.status = "failed".into();
                r.error = Some(e);
            }
        });
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut InstallRecord)) {
        let Some(mut r) = self.records.lock().unwrap().get(id).cloned() else { return };
        change(&mut r);
        r.updated_at = super::store::now();
        if let Err(e) = self.save(&r) {
            tracing::error!("cannot save install {id}: {e}");
        }
    }
}

struct Installed {
    skill_id: String,
    version: String,
    action: &'static str,
}

/// Checks the package `archive` and puts it in place under `skills_dir`.
fn install(
    skills_dir: &Path,
    archive: &std::fs::File,
    limits: &ZipLimits,
    engines: &[String],
) -> Result<Installed, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {}", sandbox::error::io_error_text(&e));
    let (staging, top) = temp::unpack(skills_dir, archive, limits).map_err(|e| match e {
        StageError::Invalid(m) => m,
        e @ StageError::Io(_) => e.to_string(),
    })?;
    let staged = staging.path().join(&top);
    strip_git(&staged).map_err(|e| io("removing .git from the package", e))?;
    let skill = package::load(&staged, engines).map_err(|e| e.0)?;
    if top.starts_with('.') {
        return Err(format!("Invalid skill id: {top}"));
    }
    if skill.manifest.get("version").and_then(Value::as_str).is_none_or(|v| v.trim().is_empty()) {
        return Err("runner.json must define a non-empty version".into());
    }
    let live = skills_dir.join(&skill.id);
    let action = match installed_version(&live) {
        Some(old) => {
            if version_order(&skill.version, &old) != Some(std::cmp::Ordering::Greater) {
                return Err(format!(
                    "Skill update requires strictly higher version: installed={old}, uploaded={}",
                    skill.version
                ));
            }
            let archive = skills_dir.join(".archive").join(&skill.id).join(&old);
            if archive.exists() {
                return Err(format!("Archive already exists for {} version {old}", skill.id));
            }
            std::fs::create_dir_all(archive.parent().expect("has a parent")).map_err(|e| io("archive", e))?;
            std::fs::rename(&live, &archive).map_err(|e| io("archiving the installed version", e))?;
            if let Err(e) = std::fs::rename(&staged, &live) {
                let _ = std::fs::rename(&archive, &live);
                return Err(io("putting the package in place", e));
            }
            "update"
        }
        None => {
            if live.exists() {
                let invalid =
                    skills_dir.join(".invalid").join(format!("{}-{}", skill.id, super::store::now()));
                std::fs::create_dir_all(invalid.parent().expect("has a parent"))
                    .map_err(|e| io("quarantine", e))?;
                std::fs::rename(&live, &invalid)
                    .map_err(|e| io("moving the invalid installed package", e))?;
            }
            std::fs::rename(&staged, &live).map_err(|e| io("putting the package in place", e))?;
            "install"
        }
    };
    Ok(Installed { skill_id: skill.id, version: skill.version, action })
}

/// The version of the package installed at `dir`, when it loads.
fn installed_version(dir: &Path) -> Option<String> {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("assets/runner.json")).ok()?).ok()?;
    let v = manifest.get("version")?.as_str()?.trim().to_string();
    version_order(&v, &v).map(|_| v)
}

/// Removes every `.git` (directory or file) in the staged package.
fn strip_git(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let kind = e.file_type()?;
        if e.file_name() == ".git" {
            if kind.is_dir() {
                std::fs::remove_dir_all(e.path())?;
            } else {
                std::fs::remove_file(e.path())?;
            }
        } else if kind.is_dir() {
            strip_git(&e.path())?;
        }
    }
    Ok(())
}
