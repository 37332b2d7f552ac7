//! Checking a control's fields before anything runs: each wrong field
//! named, with what it should be.

use serde_json::Value;

use super::ControlError;
use crate::proxy::protocol::SandboxControl;

/// The fields each action needs, checked before the action touches
/// anything: a missing required field or a field of the wrong shape is an
/// error naming it. (Instance names and run ids are checked where they are
/// resolved, also before anything is touched.)
pub(super) fn check_fields(action: &str, c: &SandboxControl) -> Result<(), ControlError> {
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

pub(super) fn is_count(v: &Value) -> bool {
    v.as_f64().is_some_and(|n| n.is_finite() && n >= 0.0)
}

pub(super) fn check_kind(
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
pub(super) fn check_expected(list: &Value) -> Result<(), ControlError> {
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
