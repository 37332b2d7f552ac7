//! What removes instances, workspaces and images: `gc`,
//! `prune_orphans`, `remove_workspace`, `remove_image`, and removing a
//! run's instance in that run's lane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::{ControlError, ControlPart, dry_run, expected_instances};
use crate::hostfs::under_root::resolve_under_root;
use crate::provider::names;
use crate::provider::{Provider, ProviderError};
use crate::proxy::inventory;
use crate::proxy::protocol::{DeletedWorkspace, InventoryRef, SandboxControl};
use crate::proxy::shared::{Job, send};

/// Managed instances the backend does not expect, with their run ids.
pub(super) async fn orphans(
    d: &ControlPart,
    c: &SandboxControl,
) -> Result<Vec<(String, Option<String>)>, ProviderError> {
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
pub(super) async fn remove_via_lane(
    d: &ControlPart,
    name: &str,
    run_id: Option<&str>,
) -> Result<(), ControlError> {
    let prefix = &d.instance_prefix;
    let lane_run =
        name.strip_prefix(prefix.as_str()).filter(|id| names::validate_run_id(id).is_ok()).or(run_id);
    match lane_run {
        Some(run) => {
            let (tx, rx) = oneshot::channel();
            send(&d.runs, run, Job::Remove { name: name.to_string(), done: tx });
            match rx.await {
                Ok(removed) => Ok(removed?),
                Err(_) => Err(ControlError::LaneEnded),
            }
        }
        None => Ok(d.provider().remove(name).await.map(drop)?),
    }
}

/// `gc`: the plan (orphaned instances, then workspaces without a run),
/// bounded by `max_delete_count`, then, unless a dry run, the removals in
/// the plan's order ([`gc_remove`]: the plan is what is removed).
pub(super) async fn gc(
    d: &ControlPart,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    let plan = gc_plan(d, c).await?;
    out.insert("planned".into(), json!({"deletes": plan}));
    if dry_run(c) != Some(false) {
        return Ok(());
    }
    let removed = gc_remove(d, &plan).await;
    out.insert(
        "deleted".into(),
        json!({"instances": removed.instances.len(), "workspaces": removed.workspaces.len()}),
    );
    if !removed.instances.is_empty() {
        d.report().push(&inventory::deleted_instances(d.provider(), removed.instances));
    }
    if !removed.workspaces.is_empty() {
        d.report().push(&inventory::deleted_workspaces(d.provider(), removed.workspaces));
    }
    if let Ok(inv) = inventory::full(d.provider(), None).await {
        d.report().push(&inv);
    }
    let failed = !removed.errors.is_empty();
    out.insert("errors".into(), Value::Array(removed.errors));
    if failed {
        return Err(ControlError::Partial("gc finished with errors (see errors)".into()));
    }
    Ok(())
}

/// What `gc` would remove, as its result lists it: each orphaned
/// instance, then its run's workspace (as `gc`'s options allow), at most
/// `max_delete_count` (default 500) deletions.
async fn gc_plan(d: &ControlPart, c: &SandboxControl) -> Result<Vec<Value>, ControlError> {
    let opts = c.extra.get("gc").cloned().unwrap_or(Value::Null);
    let remove_orphans = opts.get("remove_orphans").and_then(Value::as_bool) != Some(false);
    let remove_workspaces = opts.get("remove_workspaces").and_then(Value::as_bool) != Some(false);
    let max = opts
        .get("max_delete_count")
        .or_else(|| c.extra.get("max_delete_count"))
        .and_then(Value::as_f64)
        .map_or(500, |n| n.clamp(0.0, 10_000.0) as usize);
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
    Ok(plan)
}

/// What a `gc` removed, and what it could not (as its result lists them).
struct GcRemoved {
    instances: Vec<InventoryRef>,
    workspaces: Vec<DeletedWorkspace>,
    errors: Vec<Value>,
}

/// Removes the items of `plan` in order: an instance in its run's lane,
/// a workspace on the run's share of the blocking pool.
async fn gc_remove(d: &ControlPart, plan: &[Value]) -> GcRemoved {
    let mut removed = GcRemoved { instances: Vec::new(), workspaces: Vec::new(), errors: Vec::new() };
    for item in plan {
        let name = item["instance_name"].as_str().unwrap_or_default().to_string();
        let run_id = item["run_id"].as_str().map(str::to_string);
        match item["kind"].as_str() {
            Some("instance") => match remove_via_lane(d, &name, run_id.as_deref()).await {
                Ok(()) => removed.instances.push(InventoryRef { instance_name: name, run_id, reason: Some("gc") }),
                Err(e) => removed.errors.push(
                    json!({"kind":"instance","instance_name":name,"run_id":run_id,"message":d.report().redact(&e.to_string())}),
                ),
            },
            _ => {
                let run = run_id.clone().unwrap_or_default();
                match remove_workspace(d, &run, None).await {
                    Ok(()) => removed.workspaces.push(DeletedWorkspace {
                        instance_name: Some(name),
                        run_id: run,
                        workspace_provider: "host",
                        deleted_at: crate::proxy::now_iso(),
                        reason: "gc",
                    }),
                    Err(e) => removed
                        .errors
                        .push(json!({"kind":"workspace","run_id":run_id,"message":d.report().redact(&e.to_string())})),
                }
            }
        }
    }
    removed
}

/// Deletes `<root>/run-<id>`, `<root>/home-<id>` and the run's recorded
/// workspace (if another directory under the root), each resolved inside
/// the root first. Missing directories are fine. A workspace may be a
/// large tree: the walk runs on the run's share of the blocking pool.
pub(super) async fn remove_workspace(
    d: &ControlPart,
    run_id: &str,
    recorded: Option<&Path>,
) -> Result<(), ControlError> {
    names::validate_run_id(run_id)?;
    let root = d.workspace_host_root.clone();
    let (run, recorded) = (run_id.to_string(), recorded.map(Path::to_path_buf));
    d.pool.share(run_id).run(move || remove_workspace_dirs(&root, &run, recorded.as_deref())).await?
}

pub(super) fn remove_workspace_dirs(
    root: &Path,
    run_id: &str,
    recorded: Option<&Path>,
) -> Result<(), ControlError> {
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
pub(super) fn under_root(root: &Path, path: &Path) -> Result<PathBuf, ControlError> {
    resolve_under_root(root, path, false).map_err(ControlError::Path)
}

pub(super) async fn remove_image(d: &ControlPart, image: &str) -> Result<(), ControlError> {
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
