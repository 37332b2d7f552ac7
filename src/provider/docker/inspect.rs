//! Reading `inspect` output: a container's state, labels, mounts and
//! environment, mapped onto the instance states the backend knows.

use std::path::PathBuf;

use serde_json::Value;

use super::argv::{LABEL_AGENT_MODE, LABEL_MANAGED, LABEL_RUN_ID};
use crate::provider::{InstanceInfo, InstanceStatus, ProviderError, ProviderKind};

/// What `inspect` says about one container.
pub(super) struct Inspected {
    pub info: InstanceInfo,
    pub managed: bool,
    /// `HOME` of the container's environment: the user view's home.
    pub home: Option<String>,
    pub agent_mode: Option<String>,
    pub paused: bool,
}

/// Parses `inspect` output (a JSON array) into instance infos.
pub(super) fn parse(cli: &str, stdout: &[u8]) -> Result<Vec<Inspected>, ProviderError> {
    let value: Value = serde_json::from_slice(stdout)
        .map_err(|e| ProviderError::InspectOutput { cli: cli.to_string(), source: e })?;
    let items = value.as_array().cloned().unwrap_or_default();
    Ok(items.iter().map(|item| from_json(cli, item)).collect())
}

/// One container of `inspect`'s output; lenient about missing fields
/// (docker, podman and nerdctl differ in what they print).
fn from_json(cli: &str, item: &Value) -> Inspected {
    let s = |v: &Value| v.as_str().map(str::to_string);
    let name = item["Name"].as_str().unwrap_or("").trim_start_matches('/').to_string();
    let labels = &item["Config"]["Labels"];
    let label = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_string);
    let state = item["State"]["Status"].as_str().unwrap_or("").to_ascii_lowercase();
    let (status, mut last_error) = match state.as_str() {
        "running" => (InstanceStatus::Running, None),
        "created" | "configured" | "initialized" | "restarting" => (InstanceStatus::Creating, None),
        "exited" | "stopped" | "paused" | "removing" => (InstanceStatus::Stopped, None),
        "dead" => (InstanceStatus::Error, Some("the container is dead (its removal failed)".to_string())),
        other => (InstanceStatus::Error, Some(format!("unknown container state {other:?}"))),
    };
    if let Some(err) = item["State"]["Error"].as_str().filter(|e| !e.is_empty()) {
        last_error = Some(err.to_string());
    }
    let workspace = item["Mounts"].as_array().and_then(|mounts| {
        mounts
            .iter()
            .find(|m| m["Destination"].as_str() == Some(sandbox::WORKSPACE))
            .and_then(|m| m["Source"].as_str().map(PathBuf::from))
    });
    let home = item["Config"]["Env"].as_array().and_then(|env| {
        env.iter().filter_map(Value::as_str).find_map(|kv| kv.strip_prefix("HOME=").map(str::to_string))
    });
    Inspected {
        managed: label(LABEL_MANAGED).as_deref() == Some("1"),
        home,
        agent_mode: label(LABEL_AGENT_MODE),
        paused: state == "paused",
        info: InstanceInfo {
            name,
            kind: ProviderKind::Docker,
            provider: ProviderKind::Docker.wire_name(),
            runtime: Some(cli.to_string()),
            status,
            created_at: s(&item["Created"]),
            run_id: label(LABEL_RUN_ID),
            id: s(&item["Id"]),
            image: s(&item["Config"]["Image"]).or_else(|| s(&item["ImageName"])),
            workspace,
            last_error,
            egress: None,
        },
    }
}

/// The CLIs' ways of saying that a container does not exist.
pub(super) fn is_no_such(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    ["no such container", "no such object", "does not exist", "not found"].iter().any(|p| s.contains(p))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn no_such_messages() {
        assert!(is_no_such("Error: No such container: tuixiu-run-x"));
        assert!(is_no_such("Error: no such object: \"tuixiu-run-x\""));
        assert!(is_no_such("Error: no container with name or ID \"x\" found: no such container"));
        assert!(!is_no_such("Cannot connect to the Docker daemon at unix:///var/run/docker.sock."));
    }

    #[test]
    fn inspect_states() {
        let json = br#"[{"Id":"abc","Name":"/tuixiu-run-r1","Created":"2026-01-28T10:00:00.123Z",
            "State":{"Status":"exited","Error":""},
            "Config":{"Image":"img","Labels":{"acp-proxy.managed":"1","acp-proxy.run_id":"r1","acp-proxy.agent_mode":"exec"}},
            "Mounts":[{"Source":"/srv/ws","Destination":"/workspace"}]}]"#;
        let found = parse("docker", json).unwrap().remove(0);
        assert!(found.managed);
        assert_eq!(found.info.status, InstanceStatus::Stopped);
        assert_eq!(found.info.name, "tuixiu-run-r1");
        assert_eq!(found.info.run_id.as_deref(), Some("r1"));
        assert_eq!(found.info.created_at.as_deref(), Some("2026-01-28T10:00:00.123Z"));
        assert_eq!(found.info.workspace.as_deref(), Some(Path::new("/srv/ws")));
        for (state, status) in [
            ("running", InstanceStatus::Running),
            ("created", InstanceStatus::Creating),
            ("restarting", InstanceStatus::Creating),
            ("paused", InstanceStatus::Stopped),
            ("dead", InstanceStatus::Error),
            ("weird", InstanceStatus::Error),
        ] {
            let json =
                format!(r#"[{{"Name":"/n","State":{{"Status":"{state}"}},"Config":{{"Labels":null}}}}]"#);
            let found = parse("docker", json.as_bytes()).unwrap().remove(0);
            assert_eq!(found.info.status, status, "{state}");
            assert!(!found.managed);
        }
    }
}
