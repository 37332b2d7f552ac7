//! `sandbox_inventory` and `workspace_inventory` (docs/protocol.md,
//! "Inventories").
//!
//! Instances are the provider's managed ones (configured prefix; docker:
//! label `acp-proxy.managed=1`). `run_id` is derived from `tuixiu-run-`
//! names only, as the backend expects. Timestamps are ISO-8601 UTC.

use std::path::Path;

use super::protocol::{
    DeletedWorkspace, InventoryInstance, InventoryRef, Kind, SandboxInventory, WorkspaceEntry,
    WorkspaceInventory,
};
use crate::provider::{AnyProvider, InstanceInfo, Provider, ProviderError, names};

pub fn run_id_of(name: &str) -> Option<String> {
    names::run_id_from_name(name).map(str::to_string)
}

fn empty(provider: &AnyProvider) -> SandboxInventory {
    SandboxInventory {
        kind: Kind::SANDBOX_INVENTORY,
        inventory_id: uuid::Uuid::new_v4().to_string(),
        provider: provider.kind().wire_name(),
        runtime: provider.runtime().map(str::to_string),
        captured_at: super::now_iso(),
        instances: None,
        missing_instances: None,
        deleted_instances: None,
        deleted_workspaces: None,
    }
}

/// The managed instances now, as inventory entries.
pub fn entries(list: &[InstanceInfo], captured_at: &str) -> Vec<InventoryInstance> {
    list.iter()
        .map(|i| InventoryInstance {
            instance_name: i.name.clone(),
            run_id: run_id_of(&i.name),
            status: i.status.as_str(),
            created_at: i.created_at.clone(),
            last_seen_at: captured_at.to_string(),
        })
        .collect()
}

/// A full inventory, plus `missing_instances` when `expected` is given.
pub async fn full(
    provider: &AnyProvider,
    expected: Option<&[InventoryRef]>,
) -> Result<SandboxInventory, ProviderError> {
    let list = provider.list().await?;
    let mut inv = empty(provider);
    inv.instances = Some(entries(&list, &inv.captured_at));
    if let Some(expected) = expected {
        let missing = expected
            .iter()
            .filter(|e| !list.iter().any(|i| i.name == e.instance_name))
            .map(|e| InventoryRef {
                instance_name: e.instance_name.clone(),
                run_id: e.run_id.clone().or_else(|| run_id_of(&e.instance_name)),
                reason: None,
            })
            .collect();
        inv.missing_instances = Some(missing);
    }
    Ok(inv)
}

/// The full inventory as JSON text, or `None` (logged) if listing failed.
pub async fn sandbox_inventory_text(provider: &AnyProvider) -> Option<String> {
    match full(provider, None).await {
        Ok(inv) => Some(serde_json::to_string(&inv).expect("plain data")),
        Err(e) => {
            tracing::error!("sandbox_inventory: listing instances: {e}");
            None
        }
    }
}

pub fn deleted_instances(provider: &AnyProvider, deleted: Vec<InventoryRef>) -> SandboxInventory {
    let mut inv = empty(provider);
    inv.deleted_instances = Some(deleted);
    inv
}

pub fn deleted_workspaces(provider: &AnyProvider, deleted: Vec<DeletedWorkspace>) -> SandboxInventory {
    let mut inv = empty(provider);
    inv.deleted_workspaces = Some(deleted);
    inv
}

/// One entry per `run-*` directory in `root` (`workspaceHostRoot`).
pub fn workspace_inventory(root: &Path) -> WorkspaceInventory {
    let mut workspaces = Vec::new();
    match std::fs::read_dir(root) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
                let Some(run_id) = name.strip_prefix("run-") else { continue };
                let Ok(meta) = entry.metadata() else { continue };
                if !meta.is_dir() || names::validate_run_id(run_id).is_err() {
                    continue;
                }
                workspaces.push(WorkspaceEntry {
                    workspace_provider: "host",
                    run_id: run_id.to_string(),
                    instance_name: None,
                    host_path: entry.path().display().to_string(),
                    guest_path: None,
                    exists: true,
                    mtime: meta.modified().ok().map(super::iso_from_system),
                    size_bytes: None,
                });
            }
        }
        Err(e) => tracing::error!("workspace_inventory: reading {}: {e}", root.display()),
    }
    workspaces.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    WorkspaceInventory {
        kind: Kind::WORKSPACE_INVENTORY,
        inventory_id: uuid::Uuid::new_v4().to_string(),
        captured_at: super::now_iso(),
        workspace_provider: "host",
        workspaces,
    }
}

pub fn workspace_inventory_text(root: &Path) -> Option<String> {
    Some(serde_json::to_string(&workspace_inventory(root)).expect("plain data"))
}
