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
//!   `super::signing::Signer`);
//! * `git_push` gets credentials through an askpass helper or an SSH key
//!   file in a private temporary directory, never in argv or logs, runs
//!   with the repository's hooks disabled, refuses a repository whose
//!   config could run programs or redirect credentials, and has a timeout.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value, json};

mod cleanup;
mod fields;
mod git_push;

/// How a signed control is signed (what a backend, or a test, signs with).
pub use super::signing::{canonical_json, hmac_hex};

use cleanup::{gc, orphans, remove_image, remove_via_lane, remove_workspace};
use fields::check_fields;
use git_push::git_push;

use super::config::Config;
use super::gitenv::GitError;
use super::instance::InstanceError;
use super::inventory;
use super::lane::Lane;
use super::protocol::{ControlResult, DeletedWorkspace, InventoryRef, SandboxControl, str_field};
use super::report::Reporter;
use super::shared::{self, RunIdError, Runs, valid_run_id};
use super::signing::{SignatureError, Signer};
use crate::hostfs::under_root::UnderRootError;
use crate::provider::names::{self, NameError};
use crate::provider::{AnyProvider, InstanceInfo, Provider, ProviderError};
use sandbox::error::io_error_text;

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
    /// A destructive control without a valid signature.
    #[error(transparent)]
    Signature(#[from] SignatureError),
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

/// The controls' part: what answering `sandbox_control` needs, and nothing
/// else. The signer is here (and used only by [`admit`]); a run's instance
/// and agent are reached through its [`Lane`].
pub struct ControlPart {
    provider: Arc<AnyProvider>,
    report: Arc<Reporter>,
    /// Checks the signature of a destructive control.
    signer: Signer,
    /// The lanes: `inspect`'s fast path, and removals in a run's order.
    runs: Arc<Runs>,
    pool: Arc<crate::blocking::Pool>,
    /// `sandbox.instancePrefix`: the instances the controls may touch.
    instance_prefix: String,
    /// `workspaceHostRoot`: where workspaces may be removed.
    workspace_host_root: PathBuf,
    git: git_push::GitPushSettings,
}

impl ControlPart {
    pub fn new(
        cfg: &Config,
        provider: Arc<AnyProvider>,
        report: Arc<Reporter>,
        signer: Signer,
        runs: Arc<Runs>,
        pool: Arc<crate::blocking::Pool>,
    ) -> ControlPart {
        ControlPart {
            provider,
            report,
            signer,
            runs,
            pool,
            instance_prefix: cfg.sandbox.instance_prefix.clone(),
            workspace_host_root: cfg.sandbox.workspace_host_root.clone(),
            git: git_push::GitPushSettings::new(cfg),
        }
    }

    fn provider(&self) -> &AnyProvider {
        &self.provider
    }

    fn report(&self) -> &Arc<Reporter> {
        &self.report
    }
}

/// Actions answered in the global lane (they concern many runs, or none).
const GLOBAL_ACTIONS: &[&str] = &["report_inventory", "remove_image", "gc", "prune_orphans"];

/// The lane for a control: its run (from `run_id`, else a managed instance
/// name), or the global lane. An invalid `run_id` is refused here.
pub fn lane_of(d: &ControlPart, c: &SandboxControl) -> Result<String, RunIdError> {
    let action = c.action.as_str().unwrap_or("");
    if GLOBAL_ACTIONS.contains(&action) {
        return Ok(shared::GLOBAL.to_string());
    }
    if !c.run_id.is_null() && c.run_id != Value::String(String::new()) {
        return valid_run_id(&c.run_id);
    }
    let prefix = &d.instance_prefix;
    Ok(str_field(&c.instance_name)
        .and_then(|n| n.strip_prefix(prefix.as_str()))
        .filter(|id| names::validate_run_id(id).is_ok())
        .unwrap_or("")
        .to_string())
}

/// Answers a control that could not be routed.
pub fn reply_error(d: &ControlPart, c: &SandboxControl, error: impl std::fmt::Display) {
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

/// Answers `c` in its lane.
pub async fn handle(d: &ControlPart, lane: &mut Lane, c: SandboxControl) {
    let mut res = ControlResult::for_msg(&c);
    let action = c.action.as_str().unwrap_or("").to_string();
    let outcome = run_action(d, lane, &action, &c, &mut res.fields).await;
    answer(d, &c, res, outcome);
}

/// Answers `c` on the caller's thread (the link's) when it is a read that
/// needs nothing of its lane and its lane has nothing pending: `inspect`
/// of a named instance, with a provider that reads its records in
/// microseconds. `false`: not answered, `c` goes to its lane (which answers
/// it in its run's order). Every other action changes something, or needs
/// the run's state, or is global (`report_inventory` stays ordered with
/// `gc` and `prune_orphans`): docs/architecture.md, "Threading".
pub fn answer_now(d: &ControlPart, key: &str, c: &SandboxControl) -> bool {
    let prefix = &d.instance_prefix;
    if c.action.as_str() != Some("inspect") || key == shared::GLOBAL {
        return false;
    }
    let Ok(Some(name)) = named_instance(c, prefix) else { return false };
    let answered = d.runs.when_idle(key, || {
        let info = d.provider().inspect_now(&name)?;
        let mut res = ControlResult::for_msg(c);
        let outcome = admit("inspect", d, c)
            .and_then(|()| Ok(info?))
            .map(|info| inspected(d, key, c, &info, &mut res.fields));
        answer(d, c, res, outcome);
        Some(())
    });
    answered.flatten().is_some()
}

/// Completes and queues the result of `c`; a failure of a named run's
/// instance is also reported as its `error` status.
fn answer(d: &ControlPart, c: &SandboxControl, mut res: ControlResult, outcome: Result<(), ControlError>) {
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

/// The checks every action shares, before anything is looked at or
/// touched: a known action, its fields well formed (a missing list of
/// expected instances must never read as "none expected"), and the
/// signature of a destructive one.
fn admit(action: &str, d: &ControlPart, c: &SandboxControl) -> Result<(), ControlError> {
    if !super::protocol::CONTROL_ACTIONS.contains(&action) {
        return Err(ControlError::Unsupported);
    }
    check_fields(action, c)?;
    if is_destructive(action, c) {
        d.signer.verify(c)?;
    }
    Ok(())
}

/// The admitted action, by where it acts: on this lane's run, or on the
/// daemon's instances as a whole.
async fn run_action(
    d: &ControlPart,
    lane: &mut Lane,
    action: &str,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    admit(action, d, c)?;
    if GLOBAL_ACTIONS.contains(&action) {
        global_action(d, action, c, out).await
    } else {
        run_scoped(d, lane, action, c, out).await
    }
}

/// What `inspect` answers (and, as the Node proxy, a status update only
/// when the backend named the run).
fn inspected(
    d: &ControlPart,
    run: &str,
    c: &SandboxControl,
    info: &InstanceInfo,
    out: &mut Map<String, Value>,
) {
    if str_field(&c.run_id).is_some() {
        d.report().status(run, info);
    }
    out.insert("status".into(), json!(info.status.as_str()));
    out.insert("details".into(), json!({"created_at": info.created_at}));
}

/// The actions on one run's instance or workspace, in its lane.
async fn run_scoped(
    d: &ControlPart,
    lane: &mut Lane,
    action: &str,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    match action {
        "inspect" => {
            let name = instance_name(d, lane, c)?;
            let info = d.provider().inspect(&name).await?;
            inspected(d, lane.run_id(), c, &info, out);
        }
        "ensure_running" => {
            valid_run_id(&c.run_id)?;
            lane.prepare(&c.instance_name, &Value::Null, &Value::Null).await?;
            let name = instance_name(d, lane, c)?;
            let info = d.provider().inspect(&name).await?;
            out.insert("status".into(), json!(info.status.as_str()));
            out.insert("details".into(), json!({"created_at": info.created_at}));
            lane.persist();
        }
        "stop" => {
            let name = instance_name(d, lane, c)?;
            if lane.state().is_some_and(|s| s.instance_name == name) {
                lane.close_agent("stopped").await;
            }
            let info = d.provider().stop(&name).await?;
            if !lane.run_id().is_empty() {
                d.report().status(lane.run_id(), &info);
            }
            out.insert("status".into(), json!(info.status.as_str()));
        }
        "remove" => {
            let name = instance_name(d, lane, c)?;
            if lane.state().is_some_and(|s| s.instance_name == name) {
                lane.close_agent("removed").await;
            }
            lane.remove_instance(&name).await?;
            if let Ok(inv) = inventory::full(d.provider(), None).await {
                d.report().push(&inv);
            }
            let run_id = if lane.run_id().is_empty() { None } else { Some(lane.run_id().to_string()) };
            d.report().push(&inventory::deleted_instances(
                d.provider(),
                vec![InventoryRef { instance_name: name, run_id, reason: Some("sandbox_control_remove") }],
            ));
            out.insert("status".into(), json!("missing"));
        }
        "remove_workspace" => {
            let run_id = if lane.run_id().is_empty() {
                return Err(ControlError::NoWorkspaceRun);
            } else {
                lane.run_id().to_string()
            };
            let extra = lane.state().map(|s| s.workspace.clone());
            remove_workspace(d, &run_id, extra.as_deref()).await?;
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
        "git_push" => return git_push(d, lane, c, out).await,
        _ => return Err(ControlError::Unsupported),
    }
    Ok(())
}

/// The actions on the daemon's instances (or images) as a whole, in the
/// global lane.
async fn global_action(
    d: &ControlPart,
    action: &str,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    match action {
        "report_inventory" => {
            let expected = expected_instances(c);
            let inv = inventory::full(d.provider(), expected.as_deref()).await?;
            d.report().push(&inv);
        }
        "prune_orphans" => {
            let orphans = orphans(d, c).await?;
            let mut deleted = Vec::new();
            let mut errors = Vec::new();
            for (name, run_id) in orphans {
                match remove_via_lane(d, &name, run_id.as_deref()).await {
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
        "gc" => return gc(d, c, out).await,
        "remove_image" => {
            let image =
                str_field(c.extra.get("image").unwrap_or(&Value::Null)).ok_or(ControlError::NoImage)?;
            names::validate_image(image)?;
            remove_image(d, image).await?;
        }
        _ => return Err(ControlError::Unsupported),
    }
    Ok(())
}

/// The instance a control names: `instance_name` (validated), else the
/// run's, else `<prefix><run_id>`.
fn instance_name(d: &ControlPart, lane: &Lane, c: &SandboxControl) -> Result<String, ControlError> {
    let prefix = &d.instance_prefix;
    match named_instance(c, prefix)? {
        Some(name) => Ok(name),
        None => {
            let name = match lane.state() {
                Some(state) => state.instance_name.clone(),
                None if !lane.run_id().is_empty() => format!("{prefix}{}", lane.run_id()),
                None => return Err(ControlError::NoInstanceName),
            };
            names::validate_instance_name(&name, prefix).map_err(ControlError::Unmanaged)?;
            Ok(name)
        }
    }
}

/// The instance `c` names itself (validated): `None` when its
/// `instance_name` is absent or blank.
fn named_instance(c: &SandboxControl, prefix: &str) -> Result<Option<String>, ControlError> {
    match &c.instance_name {
        Value::String(s) if !s.trim().is_empty() => {
            let name = s.trim().to_string();
            names::validate_instance_name(&name, prefix).map_err(ControlError::Unmanaged)?;
            Ok(Some(name))
        }
        Value::Null | Value::String(_) => Ok(None),
        other => Err(ControlError::InstanceNameNotString(other.clone())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use fields::{check_expected, check_kind};
    use git_push::check_remote;

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
            ControlError::from(SignatureError::Expired).to_string(),
            "signature_expired: signed_at is more than 300 s from now"
        );
        assert_eq!(
            ControlError::ExpectedMissing { action: "gc".into() }.to_string(),
            "expected_instances is missing: gc removes every managed instance that is not in it, so the list \
             is required (send [] to mean none)"
        );
    }
}
