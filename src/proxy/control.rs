//! `sandbox_control`: every action of docs/protocol.md, "sandbox_control", each
//! answered by exactly one `sandbox_control_result` echoing `action`,
//! `request_id`, `run_id` and `instance_name`.
//!
//! Protections (docs/proxy.md, "Protections"):
//! * instance names must carry the configured prefix, and docker refuses
//!   containers without the `acp-proxy.managed=1` label: a foreign
//!   container is never stopped or removed;
//! * run ids are validated before they become paths (`../x` is refused);
//!   workspace paths are resolved inside `workspaceHostRoot`, symlinks
//!   included, before anything is deleted;
//! * with `control_signing_secret`, the destructive actions (`stop`,
//!   `remove`, `prune_orphans`, `gc` without dry run, `remove_workspace`,
//!   `remove_image`, `git_push`) need a valid `signature` (see
//!   [`verify_signature`]);
//! * `git_push` gets credentials through an askpass helper or an SSH key
//!   file in a private temporary directory, never in argv or logs, runs
//!   with the repository's hooks disabled, refuses a repository whose
//!   config could run programs or redirect credentials, and has a timeout.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::gitenv::{GitEnv, GitError, check_branch};
use super::instance::InstanceError;
use super::inventory;
use super::lane::{self, Job, Lane, RunContext, RunIdError, valid_run_id};
use super::protocol::{ControlResult, DeletedWorkspace, InventoryRef, SandboxControl, str_field};
use crate::hostfs::under_root::{UnderRootError, resolve_under_root};
use crate::provider::names::{self, NameError};
use crate::provider::{Provider, ProviderError};
use sandbox::error::io_error_text;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How far `signed_at` may be from now.
const SIGNATURE_WINDOW_SECS: i64 = 300;
/// Tail of git's output kept in the result.
const OUTPUT_TAIL: usize = 8000;

/// Why a control failed: the `error` of its `sandbox_control_result`.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("unsupported_action")]
    Unsupported,
    /// The action ran but reported errors in its own fields.
    #[error("{0}")]
    Partial(String),
    #[error(transparent)]
    RunId(#[from] RunIdError),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Instance(#[from] InstanceError),
    #[error("instance_name 为空")]
    NoInstanceName,
    #[error("instance_name must be a string, got {0}")]
    InstanceNameNotString(Value),
    #[error("{0}: only instances managed by this proxy can be controlled")]
    Unmanaged(#[source] NameError),
    #[error(
        "expected_instances is missing: {action} removes every managed instance that is not \
         in it, so the list is required (send [] to mean none)"
    )]
    ExpectedMissing { action: String },
    #[error("expected_instances must be a list of {{instance_name, run_id}}, got {0}")]
    ExpectedNotList(Value),
    #[error("expected_instances[{i}] must be an object, got {got}")]
    ExpectedItem { i: usize, got: Value },
    #[error("expected_instances[{0}].instance_name is missing")]
    ExpectedNameMissing(usize),
    #[error("expected_instances[{i}].instance_name must be a name, got {got}")]
    ExpectedName { i: usize, got: Value },
    #[error("expected_instances[{i}].run_id must be a string or null, got {got}")]
    ExpectedRunId { i: usize, got: Value },
    #[error("gc must be an object, got {0}")]
    GcNotObject(Value),
    /// A field of the wrong kind: `{name} must be {want}, got {got}`.
    #[error("{name} must be {want}, got {got}")]
    Kind { name: String, want: &'static str, got: Value },
    #[error("the run's lane ended")]
    LaneEnded,
    #[error(transparent)]
    Blocking(#[from] crate::blocking::Panicked),
    #[error("remove_workspace needs a run_id (or an instance name tuixiu-run-<id>)")]
    NoWorkspaceRun,
    /// A path that is not under `workspaceHostRoot` (`hostfs`).
    #[error("{0}")]
    Path(#[source] UnderRootError),
    #[error("remove {}: {}", .path.display(), io_error_text(.source))]
    Remove { path: PathBuf, source: std::io::Error },
    #[error("{}: {}", .path.display(), io_error_text(.source))]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("image 为空")]
    NoImage,
    #[error("the {provider} provider has no images: remove_image ({image}) needs provider container_oci")]
    NoImages { provider: &'static str, image: String },
    #[error("{cli}: {}", io_error_text(.source))]
    Docker { cli: String, source: std::io::Error },
    #[error("{cli} image rm {image}: {stderr}")]
    ImageRm { cli: String, image: String, stderr: String },
    #[error("the message cannot be re-encoded")]
    Reencode,
    #[error(
        "signature_required: {action} is destructive and this proxy requires signed controls \
         (control_signing_secret is set)"
    )]
    SignatureRequired { action: String },
    #[error("signature_expired: signed_at is more than {} s from now", SIGNATURE_WINDOW_SECS)]
    SignatureExpired,
    #[error("signature_invalid: signed_at (unix seconds or ISO-8601) is required")]
    NoSignedAt,
    #[error("signature_invalid: not a hex HMAC-SHA256")]
    NotHex,
    #[error("signature_invalid: the signature of {action} does not match")]
    Mismatch { action: String },
    #[error("git_push disabled")]
    GitPushDisabled,
    #[error("branch 为空")]
    NoBranch,
    /// A branch name `gitenv` refuses.
    #[error("{0}")]
    Branch(#[source] GitError),
    #[error("remote {0:?} must be a remote name (letters, digits, '.', '_', '-')")]
    Remote(String),
    #[error("env: {0}")]
    Env(#[source] NameError),
    #[error("git_push needs a run_id")]
    GitPushNoRun,
    #[error("workspace {} is not a git checkout", .0.display())]
    NotCheckout(PathBuf),
    /// The credentials' private directory (`gitenv`).
    #[error("{0}")]
    GitEnv(#[source] GitError),
    #[error("git: {}", io_error_text(.0))]
    GitSpawn(#[source] std::io::Error),
    #[error("git: {0}")]
    Git(#[source] std::io::Error),
    #[error(
        "the workspace's git config sets {0:?}, which could run commands or redirect credentials \
         on this host: refusing git_push"
    )]
    DangerousConfig(String),
    #[error(
        "remote {remote} of the workspace pushes to {url:?}, not to TUIXIU_REPO_URL: refusing to send credentials there"
    )]
    RemoteMismatch { remote: String, url: String },
}

/// Actions answered in the global lane (they concern many runs, or none).
const GLOBAL_ACTIONS: &[&str] = &["report_inventory", "remove_image", "gc", "prune_orphans"];

/// The lane for a control: its run (from `run_id`, else a managed instance
/// name), or the global lane. An invalid `run_id` is refused here.
pub fn lane_of(d: &Arc<RunContext>, c: &SandboxControl) -> Result<String, RunIdError> {
    let action = c.action.as_str().unwrap_or("");
    if GLOBAL_ACTIONS.contains(&action) {
        return Ok(lane::GLOBAL.to_string());
    }
    if !c.run_id.is_null() && c.run_id != Value::String(String::new()) {
        return valid_run_id(&c.run_id);
    }
    let prefix = &d.cfg().sandbox.instance_prefix;
    Ok(str_field(&c.instance_name)
        .and_then(|n| n.strip_prefix(prefix.as_str()))
        .filter(|id| names::validate_run_id(id).is_ok())
        .unwrap_or("")
        .to_string())
}

/// Answers a control that could not be routed.
pub fn reply_error(d: &RunContext, c: &SandboxControl, error: impl std::fmt::Display) {
    let mut res = ControlResult::for_msg(c);
    res.ok = false;
    res.error = Some(d.report().redact(&error.to_string()));
    d.report().push(&res);
}

fn is_destructive(action: &str, c: &SandboxControl) -> bool {
    match action {
        "stop" | "remove" | "prune_orphans" | "remove_workspace" | "remove_image" | "git_push" => true,
        "gc" => dry_run(c) == Some(false),
        _ => false,
    }
}

/// `dry_run`: true unless explicitly false (top level or in `gc`).
fn dry_run(c: &SandboxControl) -> Option<bool> {
    c.extra
        .get("dry_run")
        .or_else(|| c.extra.get("gc").and_then(|g| g.get("dry_run")))
        .and_then(Value::as_bool)
        .or(Some(true))
}

pub async fn handle(lane: &mut Lane, c: SandboxControl) {
    let d = lane.d.clone();
    let mut res = ControlResult::for_msg(&c);
    let action = c.action.as_str().unwrap_or("").to_string();
    let outcome = run_action(lane, &action, &c, &mut res.fields).await;
    match outcome {
        Ok(()) => {}
        Err(ControlError::Unsupported) => {
            res.ok = false;
            res.error = Some(ControlError::Unsupported.to_string());
        }
        Err(ControlError::Partial(e)) => {
            res.ok = false;
            res.error = Some(d.report().redact(&e));
        }
        Err(e) => {
            let e = d.report().redact(&e.to_string());
            if let (Some(run_id), Some(name)) = (str_field(&c.run_id), str_field(&c.instance_name))
                && names::validate_run_id(run_id).is_ok()
            {
                d.report().error_status(run_id, name, &e);
            }
            res.ok = false;
            res.error = Some(e);
        }
    }
    d.report().push(&res);
}

async fn run_action(
    lane: &mut Lane,
    action: &str,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    let d = lane.d.clone();
    if !super::protocol::CONTROL_ACTIONS.contains(&action) {
        return Err(ControlError::Unsupported);
    }
    // Before anything is looked at or touched: a control whose fields are
    // missing or malformed is refused whole (a missing list of expected
    // instances must never read as "none expected").
    check_fields(action, c)?;
    if is_destructive(action, c) {
        verify_signature(&d, c)?;
    }
    match action {
        "inspect" => {
            let name = instance_name(lane, c)?;
            let info = d.provider().inspect(&name).await?;
            // As the Node proxy: a status update only when the backend
            // named the run.
            if str_field(&c.run_id).is_some() {
                d.report().status(&lane.run_id, &info);
            }
            out.insert("status".into(), json!(info.status.as_str()));
            out.insert("details".into(), json!({"created_at": info.created_at}));
        }
        "ensure_running" => {
            valid_run_id(&c.run_id)?;
            lane.prepare(&c.instance_name, &Value::Null, &Value::Null).await?;
            let name = instance_name(lane, c)?;
            let info = d.provider().inspect(&name).await?;
            out.insert("status".into(), json!(info.status.as_str()));
            out.insert("details".into(), json!({"created_at": info.created_at}));
            lane.persist();
        }
        "stop" => {
            let name = instance_name(lane, c)?;
            if lane.state.as_ref().is_some_and(|s| s.instance_name == name) {
                lane.close_agent("stopped").await;
            }
            let info = d.provider().stop(&name).await?;
            if !lane.run_id.is_empty() {
                d.report().status(&lane.run_id, &info);
            }
            out.insert("status".into(), json!(info.status.as_str()));
        }
        "remove" => {
            let name = instance_name(lane, c)?;
            if lane.state.as_ref().is_some_and(|s| s.instance_name == name) {
                lane.close_agent("removed").await;
            }
            lane.remove_instance(&name).await?;
            if let Ok(inv) = inventory::full(d.provider(), None).await {
                d.report().push(&inv);
            }
            let run_id = if lane.run_id.is_empty() { None } else { Some(lane.run_id.clone()) };
            d.report().push(&inventory::deleted_instances(
                d.provider(),
                vec![InventoryRef { instance_name: name, run_id, reason: Some("sandbox_control_remove") }],
            ));
            out.insert("status".into(), json!("missing"));
        }
        "report_inventory" => {
            let expected = expected_instances(c);
            let inv = inventory::full(d.provider(), expected.as_deref()).await?;
            d.report().push(&inv);
        }
        "prune_orphans" => {
            let orphans = orphans(&d, c).await?;
            let mut deleted = Vec::new();
            let mut errors = Vec::new();
            for (name, run_id) in orphans {
                match remove_via_lane(&d, &name, run_id.as_deref()).await {
                    Ok(()) => deleted.push(InventoryRef {
                        instance_name: name,
                        run_id,
                        reason: Some("prune_orphans"),
                    }),
                    Err(e) => errors.push(format!("{name}: {e}")),
                }
            }
            out.insert("deleted_count".into(), json!(deleted.len()));
            if !deleted.is_empty() {
                d.report().push(&inventory::deleted_instances(d.provider(), deleted));
            }
            if !errors.is_empty() {
                return Err(ControlError::Partial(errors.join("; ")));
            }
        }
        "gc" => return gc(&d, c, out).await,
        "remove_workspace" => {
            let run_id = if lane.run_id.is_empty() {
                return Err(ControlError::NoWorkspaceRun);
            } else {
                lane.run_id.clone()
            };
            let extra = lane.state.as_ref().map(|s| s.workspace.clone());
            remove_workspace(&d, &run_id, extra.as_deref()).await?;
            d.report().push(&inventory::deleted_workspaces(
                d.provider(),
                vec![DeletedWorkspace {
                    instance_name: None,
                    run_id,
                    workspace_provider: "host",
                    deleted_at: super::now_iso(),
                    reason: "remove_workspace",
                }],
            ));
        }
        "remove_image" => {
            let image =
                str_field(c.extra.get("image").unwrap_or(&Value::Null)).ok_or(ControlError::NoImage)?;
            names::validate_image(image)?;
            remove_image(&d, image).await?;
        }
        "git_push" => return git_push(lane, c, out).await,
        _ => return Err(ControlError::Unsupported),
    }
    Ok(())
}

/// The instance a control names: `instance_name` (validated), else the
/// run's, else `<prefix><run_id>`.
fn instance_name(lane: &Lane, c: &SandboxControl) -> Result<String, ControlError> {
    let prefix = &lane.d.cfg().sandbox.instance_prefix;
    let name = match &c.instance_name {
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        Value::Null | Value::String(_) => match &lane.state {
            Some(state) => state.instance_name.clone(),
            None if !lane.run_id.is_empty() => format!("{prefix}{}", lane.run_id),
            None => return Err(ControlError::NoInstanceName),
        },
        other => return Err(ControlError::InstanceNameNotString(other.clone())),
    };
    names::validate_instance_name(&name, prefix).map_err(ControlError::Unmanaged)?;
    Ok(name)
}

/// `expected_instances` as sent: `None` when absent (or `null`), else the
/// checked list (see [`check_fields`]).
fn expected_instances(c: &SandboxControl) -> Option<Vec<InventoryRef>> {
    let list = c.extra.get("expected_instances").filter(|v| !v.is_null())?.as_array()?;
    Some(
        list.iter()
            .filter_map(|e| {
                let name = e.get("instance_name").and_then(Value::as_str)?.trim().to_string();
                let run_id = e.get("run_id").and_then(Value::as_str).map(str::to_string);
                (!name.is_empty()).then_some(InventoryRef { instance_name: name, run_id, reason: None })
            })
            .collect(),
    )
}

/// The fields each action needs, checked before the action touches
/// anything: a missing required field or a field of the wrong shape is an
/// error naming it. (Instance names and run ids are checked where they are
/// resolved, also before anything is touched.)
fn check_fields(action: &str, c: &SandboxControl) -> Result<(), ControlError> {
    let field = |k: &str| c.extra.get(k).filter(|v| !v.is_null());
    match action {
        "prune_orphans" | "gc" => {
            let Some(list) = field("expected_instances") else {
                return Err(ControlError::ExpectedMissing { action: action.to_string() });
            };
            check_expected(list)?;
        }
        "report_inventory" => {
            if let Some(list) = field("expected_instances") {
                check_expected(list)?;
            }
        }
        _ => {}
    }
    if action == "gc" {
        check_kind("dry_run", field("dry_run"), Value::is_boolean, "true or false")?;
        if let Some(opts) = field("gc") {
            let Some(opts) = opts.as_object() else {
                return Err(ControlError::GcNotObject(opts.clone()));
            };
            let get = |k: &str| opts.get(k).filter(|v| !v.is_null());
            for k in ["remove_orphans", "remove_workspaces", "dry_run"] {
                check_kind(&format!("gc.{k}"), get(k), Value::is_boolean, "true or false")?;
            }
            check_kind("gc.max_delete_count", get("max_delete_count"), is_count, "a number of deletions")?;
        }
        check_kind("max_delete_count", field("max_delete_count"), is_count, "a number of deletions")?;
    }
    if action == "git_push" {
        check_kind("remote", field("remote"), Value::is_string, "a string")?;
        check_kind("timeout_seconds", field("timeout_seconds"), is_count, "a number of seconds")?;
        check_kind("env", field("env"), Value::is_object, "an object")?;
        check_kind("cwd", field("cwd"), Value::is_string, "a string")?;
    }
    if action == "remove_image" {
        check_kind("image", field("image"), Value::is_string, "a string")?;
    }
    Ok(())
}

fn is_count(v: &Value) -> bool {
    v.as_f64().is_some_and(|n| n.is_finite() && n >= 0.0)
}

fn check_kind(
    name: &str,
    v: Option<&Value>,
    ok: fn(&Value) -> bool,
    want: &'static str,
) -> Result<(), ControlError> {
    match v {
        Some(v) if !ok(v) => Err(ControlError::Kind { name: name.to_string(), want, got: v.clone() }),
        _ => Ok(()),
    }
}

/// `expected_instances`: a list of `{instance_name: string, run_id?: string|null}`.
fn check_expected(list: &Value) -> Result<(), ControlError> {
    let Some(items) = list.as_array() else {
        return Err(ControlError::ExpectedNotList(list.clone()));
    };
    for (i, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            return Err(ControlError::ExpectedItem { i, got: item.clone() });
        };
        match obj.get("instance_name") {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            None | Some(Value::Null) => return Err(ControlError::ExpectedNameMissing(i)),
            Some(other) => return Err(ControlError::ExpectedName { i, got: other.clone() }),
        }
        if let Some(run_id) = obj.get("run_id").filter(|v| !v.is_null() && !v.is_string()) {
            return Err(ControlError::ExpectedRunId { i, got: run_id.clone() });
        }
    }
    Ok(())
}

/// Managed instances the backend does not expect, with their run ids.
async fn orphans(d: &RunContext, c: &SandboxControl) -> Result<Vec<(String, Option<String>)>, ProviderError> {
    let expected: BTreeSet<String> =
        expected_instances(c).unwrap_or_default().into_iter().map(|e| e.instance_name).collect();
    let list = d.provider().list().await?;
    Ok(list
        .into_iter()
        .filter(|i| !expected.contains(&i.name))
        .map(|i| {
            let run_id = inventory::run_id_of(&i.name);
            (i.name, run_id)
        })
        .collect())
}

/// Removes an instance in its run's lane (so it is ordered with that run's
/// messages and the run forgets it), or directly when it has no run.
async fn remove_via_lane(d: &Arc<RunContext>, name: &str, run_id: Option<&str>) -> Result<(), ControlError> {
    let prefix = &d.cfg().sandbox.instance_prefix;
    let lane_run =
        name.strip_prefix(prefix.as_str()).filter(|id| names::validate_run_id(id).is_ok()).or(run_id);
    match lane_run {
        Some(run) => {
            let (tx, rx) = oneshot::channel();
            lane::send(d, run, Job::Remove { name: name.to_string(), done: tx });
            match rx.await {
                Ok(removed) => Ok(removed?),
                Err(_) => Err(ControlError::LaneEnded),
            }
        }
        None => Ok(d.provider().remove(name).await.map(drop)?),
    }
}

async fn gc(
    d: &Arc<RunContext>,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    let opts = c.extra.get("gc").cloned().unwrap_or(Value::Null);
    let remove_orphans = opts.get("remove_orphans").and_then(Value::as_bool) != Some(false);
    let remove_workspaces = opts.get("remove_workspaces").and_then(Value::as_bool) != Some(false);
    let max = opts
        .get("max_delete_count")
        .or_else(|| c.extra.get("max_delete_count"))
        .and_then(Value::as_f64)
        .map_or(500, |n| n.clamp(0.0, 10_000.0) as usize);
    let dry = dry_run(c) != Some(false);
    let mut plan: Vec<Value> = Vec::new();
    for (name, run_id) in orphans(d, c).await? {
        if remove_orphans {
            plan.push(json!({"kind":"instance","instance_name":name,"run_id":run_id}));
        }
        if remove_workspaces && let Some(run_id) = &run_id {
            plan.push(
                json!({"kind":"workspace","workspace_provider":"host","instance_name":name,"run_id":run_id}),
            );
        }
    }
    plan.truncate(max);
    out.insert("planned".into(), json!({"deletes": plan}));
    if dry {
        return Ok(());
    }
    let mut deleted_instances = Vec::new();
    let mut deleted_workspaces = Vec::new();
    let mut errors = Vec::new();
    for item in &plan {
        let name = item["instance_name"].as_str().unwrap_or_default().to_string();
        let run_id = item["run_id"].as_str().map(str::to_string);
        match item["kind"].as_str() {
            Some("instance") => match remove_via_lane(d, &name, run_id.as_deref()).await {
                Ok(()) => {
                    deleted_instances.push(InventoryRef { instance_name: name, run_id, reason: Some("gc") })
                }
                Err(e) => errors.push(
                    json!({"kind":"instance","instance_name":name,"run_id":run_id,"message":d.report().redact(&e.to_string())}),
                ),
            },
            _ => {
                let run = run_id.clone().unwrap_or_default();
                match remove_workspace(d, &run, None).await {
                    Ok(()) => deleted_workspaces.push(DeletedWorkspace {
                        instance_name: Some(name),
                        run_id: run,
                        workspace_provider: "host",
                        deleted_at: super::now_iso(),
                        reason: "gc",
                    }),
                    Err(e) => errors
                        .push(json!({"kind":"workspace","run_id":run_id,"message":d.report().redact(&e.to_string())})),
                }
            }
        }
    }
    out.insert(
        "deleted".into(),
        json!({"instances": deleted_instances.len(), "workspaces": deleted_workspaces.len()}),
    );
    if !deleted_instances.is_empty() {
        d.report().push(&inventory::deleted_instances(d.provider(), deleted_instances));
    }
    if !deleted_workspaces.is_empty() {
        d.report().push(&inventory::deleted_workspaces(d.provider(), deleted_workspaces));
    }
    if let Ok(inv) = inventory::full(d.provider(), None).await {
        d.report().push(&inv);
    }
    let failed = !errors.is_empty();
    out.insert("errors".into(), Value::Array(errors));
    if failed {
        return Err(ControlError::Partial("gc finished with errors (see errors)".into()));
    }
    Ok(())
}

/// Deletes `<root>/run-<id>`, `<root>/home-<id>` and the run's recorded
/// workspace (if another directory under the root), each resolved inside
/// the root first. Missing directories are fine. A workspace may be a
/// large tree: the walk runs on the run's share of the blocking pool.
async fn remove_workspace(d: &RunContext, run_id: &str, recorded: Option<&Path>) -> Result<(), ControlError> {
    names::validate_run_id(run_id)?;
    let root = d.cfg().sandbox.workspace_host_root.clone();
    let (run, recorded) = (run_id.to_string(), recorded.map(Path::to_path_buf));
    d.pool().share(run_id).run(move || remove_workspace_dirs(&root, &run, recorded.as_deref())).await?
}

fn remove_workspace_dirs(root: &Path, run_id: &str, recorded: Option<&Path>) -> Result<(), ControlError> {
    let mut targets = vec![root.join(format!("run-{run_id}")), root.join(format!("home-{run_id}"))];
    if let Some(p) = recorded
        && !targets.iter().any(|t| t == p)
    {
        targets.push(p.to_path_buf());
    }
    for target in targets {
        // A symlink is judged by where it leads; it is never followed for deletion.
        let resolved = under_root(root, &target)?;
        let removed = match std::fs::symlink_metadata(&resolved) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&resolved),
            Ok(_) => std::fs::remove_file(&resolved),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => return Err(ControlError::Stat { path: resolved, source }),
        };
        if let Err(source) = removed {
            return Err(ControlError::Remove { path: resolved, source });
        }
    }
    Ok(())
}

/// `path` resolved inside `root`, symlinks judged by where they lead.
fn under_root(root: &Path, path: &Path) -> Result<PathBuf, ControlError> {
    resolve_under_root(root, path, false).map_err(ControlError::Path)
}

async fn remove_image(d: &RunContext, image: &str) -> Result<(), ControlError> {
    let crate::provider::AnyProvider::Docker(docker) = d.provider() else {
        return Err(ControlError::NoImages {
            provider: d.report().wire_provider(),
            image: image.to_string(),
        });
    };
    let out = tokio::process::Command::new(docker.cli())
        .args(["image", "rm", "-f", "--", image])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| ControlError::Docker { cli: docker.cli().to_string(), source })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lower = stderr.to_ascii_lowercase();
    if out.status.success() || lower.contains("no such image") || lower.contains("image not known") {
        return Ok(());
    }
    Err(ControlError::ImageRm {
        cli: docker.cli().to_string(),
        image: image.to_string(),
        stderr: stderr.trim().to_string(),
    })
}

// ------------------------------------------------------------- signatures

/// Hex HMAC-SHA256 of `data` with `secret`.
pub fn hmac_hex(secret: &str, data: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(data);
    hex_lower(&mac.finalize().into_bytes())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The canonical form a signature covers: the message without `signature`,
/// members with `null` values omitted, object keys sorted, no whitespace.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> =
                    map.iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k).collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&map[*k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// Checks `signature` (hex HMAC-SHA256, optionally `sha256=`-prefixed, of
/// [`canonical_json`] of the message) and `signed_at` (unix seconds or
/// ISO-8601, within 300 s of now, so a captured command cannot be replayed
/// later). A no-op without `control_signing_secret`.
pub fn verify_signature(d: &RunContext, c: &SandboxControl) -> Result<(), ControlError> {
    let Some(secret) = &d.cfg().control_signing_secret else { return Ok(()) };
    let action = c.action.as_str().unwrap_or("?");
    let Ok(Value::Object(mut msg)) = serde_json::to_value(c) else {
        return Err(ControlError::Reencode);
    };
    let Some(Value::String(sig)) = msg.remove("signature") else {
        return Err(ControlError::SignatureRequired { action: action.to_string() });
    };
    let signed_at = match msg.get("signed_at") {
        Some(Value::Number(n)) => n.as_f64().map(|f| f as i64),
        Some(Value::String(s)) => humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
            .or_else(|_| humantime::parse_rfc3339(s))
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs() as i64),
        _ => None,
    };
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    match signed_at {
        Some(t) if (now - t).abs() <= SIGNATURE_WINDOW_SECS => {}
        Some(_) => return Err(ControlError::SignatureExpired),
        None => return Err(ControlError::NoSignedAt),
    }
    let hex = sig.trim().strip_prefix("sha256=").unwrap_or(sig.trim());
    let Some(bytes) = decode_hex(hex) else {
        return Err(ControlError::NotHex);
    };
    let mut mac = HmacSha256::new_from_slice(secret.expose().as_bytes()).expect("any key length");
    mac.update(canonical_json(&Value::Object(msg)).as_bytes());
    mac.verify_slice(&bytes).map_err(|_| ControlError::Mismatch { action: action.to_string() })
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

// ---------------------------------------------------------------- git_push

fn check_remote(r: &str) -> Result<(), ControlError> {
    let ok = r.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && r.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok { Ok(()) } else { Err(ControlError::Remote(r.to_string())) }
}

fn tail(bytes: &[u8], d: &RunContext) -> String {
    let text = d.report().redact(&String::from_utf8_lossy(bytes));
    if text.len() <= OUTPUT_TAIL {
        return text;
    }
    let mut start = text.len() - OUTPUT_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

async fn git_push(
    lane: &mut Lane,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    let d = lane.d.clone();
    if !d.cfg().sandbox.git_push {
        return Err(ControlError::GitPushDisabled);
    }
    let field = |k: &str| c.extra.get(k).unwrap_or(&Value::Null);
    let branch = str_field(field("branch")).ok_or(ControlError::NoBranch)?.to_string();
    check_branch(&branch).map_err(ControlError::Branch)?;
    let remote = str_field(field("remote")).unwrap_or("origin").to_string();
    check_remote(&remote)?;
    let max = d.cfg().git_push_timeout_max_seconds;
    let timeout =
        field("timeout_seconds").as_f64().filter(|n| n.is_finite()).map_or(300, |n| (n as u64).clamp(5, max));
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(map) = field("env").as_object() {
        for (k, v) in map {
            let v = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| if v.is_null() { String::new() } else { v.to_string() });
            names::validate_env(k, &v).map_err(ControlError::Env)?;
            env.push((k.clone(), v));
        }
    }
    d.report().add_secrets(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let get =
        |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).filter(|v| !v.is_empty());
    if lane.run_id.is_empty() {
        return Err(ControlError::GitPushNoRun);
    }
    let root = &d.cfg().sandbox.workspace_host_root;
    let ws = lane
        .state
        .as_ref()
        .map(|s| s.workspace.clone())
        .unwrap_or_else(|| root.join(format!("run-{}", lane.run_id)));
    let ws = under_root(root, &ws)?;
    if !ws.is_dir() || std::fs::symlink_metadata(ws.join(".git")).is_err() {
        return Err(ControlError::NotCheckout(ws));
    }

    let genv = GitEnv::new(&d.cfg().state_dir, &get).map_err(ControlError::GitEnv)?;
    // The workspace is agent-writable: its config must not get to run
    // commands on the host or redirect the credentials.
    let git = |args: &[&str]| {
        let mut cmd = genv.command(Some(&ws));
        cmd.arg("-C").arg(&ws).args(args);
        cmd
    };
    // Repository config that could run a command on the host or send the
    // credentials elsewhere (per-URL credential helpers survive the
    // `credential.helper=` override above) is refused outright.
    let listed = git(&["config", "--local", "--includes", "--name-only", "--list"])
        .output()
        .await
        .map_err(ControlError::GitSpawn)?;
    if let Some(key) = String::from_utf8_lossy(&listed.stdout).lines().find(|k| dangerous_git_key(k)) {
        return Err(ControlError::DangerousConfig(key.to_string()));
    }
    if let Some(repo_url) = get("TUIXIU_REPO_URL") {
        let got = git(&["remote", "get-url", "--push", &remote]).output().await.map_err(ControlError::Git)?;
        let url = String::from_utf8_lossy(&got.stdout).trim().to_string();
        if !got.status.success() || url != repo_url.trim() {
            return Err(ControlError::RemoteMismatch { remote, url: d.report().redact(&url) });
        }
    }
    let child = git(&["push", "-u", "--", &remote, &branch])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(ControlError::GitSpawn)?;
    let pid = child.id();
    match tokio::time::timeout(Duration::from_secs(timeout), child.wait_with_output()).await {
        Ok(Ok(output)) => {
            use std::os::unix::process::ExitStatusExt;
            out.insert("stdout".into(), json!(tail(&output.stdout, &d)));
            out.insert("stderr".into(), json!(tail(&output.stderr, &d)));
            out.insert("code".into(), json!(output.status.code()));
            out.insert("signal".into(), json!(output.status.signal().map(signal_name)));
            if output.status.success() {
                Ok(())
            } else {
                let mut e =
                    format!("exitCode={}", output.status.code().map_or("null".into(), |c| c.to_string()));
                if let Some(s) = output.status.signal() {
                    e.push_str(&format!(" signal={}", signal_name(s)));
                }
                Err(ControlError::Partial(e))
            }
        }
        Ok(Err(e)) => Err(ControlError::Git(e)),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: kill(2) on the process group we created for git.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            Err(ControlError::Partial(format!("timeout after {timeout}s")))
        }
    }
}

/// Config keys (lower-cased by git) that make `git push` run a program or
/// talk to another endpoint: credential helpers, ssh/proxy commands, remote
/// helpers and pack programs, includes (which could bring any of these),
/// HTTP proxies.
fn dangerous_git_key(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase();
    let parts: Vec<&str> = k.split('.').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    match first {
        "credential" => last == "helper" || last == "usehttppath",
        "core" => matches!(last, "sshcommand" | "gitproxy" | "askpass" | "hookspath" | "fsmonitor"),
        "remote" => matches!(last, "receivepack" | "uploadpack" | "vcs" | "proxy" | "pushurl"),
        "include" | "includeif" => true,
        "http" => last == "proxy" || last == "proxyauthmethod",
        "url" => last == "pushinsteadof" || last == "insteadof",
        "protocol" => true,
        _ => false,
    }
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| sig.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form() {
        let v = json!({"b":1,"a":{"y":null,"x":[1,"é"]},"n":null});
        assert_eq!(canonical_json(&v), r#"{"a":{"x":[1,"é"]},"b":1}"#);
    }

    #[test]
    fn hmac_known_answer() {
        // RFC 4231 test case 2.
        assert_eq!(
            hmac_hex("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn dangerous_git_keys() {
        for bad in [
            "credential.helper",
            "credential.https://github.com.helper",
            "core.sshcommand",
            "remote.origin.receivepack",
            "remote.origin.vcs",
            "include.path",
            "includeif.gitdir:/x.path",
            "http.proxy",
            "http.https://h.proxy",
            "url.https://evil/.insteadof",
            "protocol.ext.allow",
        ] {
            assert!(dangerous_git_key(bad), "{bad}");
        }
        for ok in ["remote.origin.url", "remote.origin.fetch", "branch.main.remote", "user.name", "core.bare"]
        {
            assert!(!dangerous_git_key(ok), "{ok}");
        }
    }

    #[test]
    fn branches_and_remotes() {
        for ok in ["run/x", "feature/a-b_c.1"] {
            check_branch(ok).unwrap();
        }
        for bad in ["", "-f", "--force", "a..b", "a b", "a:b", "x.lock", "/a", "a/", "a@{1}"] {
            assert!(check_branch(bad).is_err(), "{bad:?}");
        }
        check_remote("origin").unwrap();
        assert!(check_remote("-x").is_err());
        assert!(check_remote("a/b").is_err());
    }

    #[test]
    fn errors_keep_their_texts() {
        assert_eq!(
            check_remote("-x").unwrap_err().to_string(),
            r#"remote "-x" must be a remote name (letters, digits, '.', '_', '-')"#
        );
        assert_eq!(
            check_expected(&json!(3)).unwrap_err().to_string(),
            "expected_instances must be a list of {instance_name, run_id}, got 3"
        );
        assert_eq!(
            check_expected(&json!([{"instance_name": "x", "run_id": 1}])).unwrap_err().to_string(),
            "expected_instances[0].run_id must be a string or null, got 1"
        );
        assert_eq!(
            check_kind("gc.dry_run", Some(&json!(1)), Value::is_boolean, "true or false")
                .unwrap_err()
                .to_string(),
            "gc.dry_run must be true or false, got 1"
        );
        assert_eq!(
            ControlError::SignatureExpired.to_string(),
            "signature_expired: signed_at is more than 300 s from now"
        );
        assert_eq!(
            ControlError::ExpectedMissing { action: "gc".into() }.to_string(),
            "expected_instances is missing: gc removes every managed instance that is not in it, so the list \
             is required (send [] to mean none)"
        );
    }
}
