//! `sandbox.pathMapping`: host paths from a backend on another OS.
//!
//! A backend (docs/acp.md, "Host paths from a backend on Windows") on Windows
//! sends host paths such as `D:\repo\x`, while the daemon runs in WSL2, where
//! that directory is `/mnt/d/repo/x`. With `pathMapping = "windows_to_wsl"` the
//! daemon maps every host path of an incoming run message before anything
//! checks it (the allowlist under `workspaceHostRoot`, symlink resolution,
//! existence): the `hostPath` sources of `init.agentInputs`,
//! `init.env.TUIXIU_WORKSPACE`, and a `cwd` given as a Windows path. Paths that
//! are already absolute POSIX paths pass unchanged; UNC and relative drive
//! paths are refused.

use serde_json::Value;

use super::protocol::RunMessage;

/// A host path that cannot be mapped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("{0:?}: UNC paths cannot be mapped to a WSL path")]
    Unc(String),
    #[error("{path:?}: a drive-relative path cannot be mapped (use {drive}:\\...)")]
    DriveRelative { path: String, drive: char },
}

/// A host path of a run message that cannot be mapped: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {source}")]
pub struct PathMapError {
    /// `cwd`, `agentInputs item <id>: source.path`, `init.env.TUIXIU_WORKSPACE`.
    pub field: String,
    pub source: MapError,
}

fn at(field: impl Into<String>) -> impl FnOnce(MapError) -> PathMapError {
    let field = field.into();
    move |source| PathMapError { field, source }
}

/// How host paths from the backend are translated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PathMapping {
    /// Paths are used as sent.
    #[default]
    None,
    /// `X:\a\b` and `X:/a/b` → `<mount_root>/x/a/b` (WSL's drive mounts).
    WindowsToWsl { mount_root: String },
}

impl PathMapping {
    /// Maps one host path; `Ok(None)` when it needs no change.
    pub fn map(&self, path: &str) -> Result<Option<String>, MapError> {
        let PathMapping::WindowsToWsl { mount_root } = self else { return Ok(None) };
        let bytes = path.as_bytes();
        if path.starts_with("\\\\") || path.starts_with("//") {
            return Err(MapError::Unc(path.to_string()));
        }
        let is_drive = bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':';
        if !is_drive {
            return Ok(None);
        }
        let rest = &path[2..];
        if !(rest.is_empty() || rest.starts_with('\\') || rest.starts_with('/')) {
            return Err(MapError::DriveRelative { path: path.to_string(), drive: bytes[0] as char });
        }
        let drive = (bytes[0] as char).to_ascii_lowercase();
        let tail: Vec<&str> = rest.split(['\\', '/']).filter(|c| !c.is_empty()).collect();
        let mut out = format!("{}/{drive}", mount_root.trim_end_matches('/'));
        for component in tail {
            out.push('/');
            out.push_str(component);
        }
        Ok(Some(out))
    }

    /// Maps the host paths of an `acp_open` / `prompt_send` in place.
    pub fn apply(&self, m: &mut RunMessage) -> Result<(), PathMapError> {
        if *self == PathMapping::None {
            return Ok(());
        }
        if let Some(cwd) = m.cwd.as_str()
            && let Some(mapped) = self.map(cwd).map_err(at("cwd"))?
        {
            m.cwd = Value::String(mapped);
        }
        if let Some(items) = m.init.pointer_mut("/agentInputs/items").and_then(Value::as_array_mut) {
            for item in items {
                let id = item.get("id").and_then(Value::as_str).unwrap_or("?").to_string();
                let is_host_path = item.pointer("/source/type").and_then(Value::as_str) == Some("hostPath");
                if let Some(path) = item.pointer_mut("/source/path").filter(|_| is_host_path)
                    && let Some(text) = path.as_str()
                    && let Some(mapped) =
                        self.map(text).map_err(at(format!("agentInputs item {id}: source.path")))?
                {
                    *path = Value::String(mapped);
                }
            }
        }
        if let Some(ws) = m.init.pointer_mut("/env/TUIXIU_WORKSPACE")
            && let Some(text) = ws.as_str()
            && let Some(mapped) = self.map(text).map_err(at("init.env.TUIXIU_WORKSPACE"))?
        {
            *ws = Value::String(mapped);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wsl() -> PathMapping {
        PathMapping::WindowsToWsl { mount_root: "/mnt".into() }
    }

    #[test]
    fn drive_paths_map_to_wsl_mounts() {
        assert_eq!(wsl().map(r"D:\repo\x").unwrap().as_deref(), Some("/mnt/d/repo/x"));
        assert_eq!(wsl().map("C:/Users/a b/ws/").unwrap().as_deref(), Some("/mnt/c/Users/a b/ws"));
        assert_eq!(wsl().map("E:").unwrap().as_deref(), Some("/mnt/e"));
        assert_eq!(wsl().map("/srv/ws").unwrap(), None);
        assert!(wsl().map(r"\\server\share\x").is_err());
        assert_eq!(
            wsl().map("D:repo").unwrap_err().to_string(),
            r#""D:repo": a drive-relative path cannot be mapped (use D:\...)"#
        );
        assert_eq!(
            wsl().map(r"\\server\x").unwrap_err().to_string(),
            r#""\\\\server\\x": UNC paths cannot be mapped to a WSL path"#
        );
        assert_eq!(PathMapping::None.map(r"D:\x").unwrap(), None);
    }

    #[test]
    fn run_messages_are_mapped_before_any_check() {
        let mut m: RunMessage = serde_json::from_value(json!({
            "run_id": "r1",
            "cwd": r"D:\repo\x",
            "init": {
                "env": {"TUIXIU_WORKSPACE": r"D:\repo\x"},
                "agentInputs": {"version": 1, "items": [
                    {"id": "ws", "apply": "bindMount", "source": {"type": "hostPath", "path": r"D:\repo\x"},
                     "target": {"root": "WORKSPACE", "path": "."}},
                    {"id": "z", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": "C:/not/a/path"},
                     "target": {"root": "USER_HOME", "path": "s"}}
                ]}
            }
        }))
        .unwrap();
        wsl().apply(&mut m).unwrap();
        assert_eq!(m.cwd, json!("/mnt/d/repo/x"));
        assert_eq!(m.init["env"]["TUIXIU_WORKSPACE"], json!("/mnt/d/repo/x"));
        assert_eq!(m.init["agentInputs"]["items"][0]["source"]["path"], json!("/mnt/d/repo/x"));
        // Only hostPath sources are paths.
        assert_eq!(m.init["agentInputs"]["items"][1]["source"]["uri"], json!("C:/not/a/path"));

        let mut bad: RunMessage = serde_json::from_value(json!({
            "init": {"agentInputs": {"version": 1, "items": [
                {"id": "u", "apply": "copy", "source": {"type": "hostPath", "path": r"\\srv\share"},
                 "target": {"root": "WORKSPACE", "path": "x"}}]}}
        }))
        .unwrap();
        let err = wsl().apply(&mut bad).unwrap_err().to_string();
        assert!(err.starts_with("agentInputs item u: source.path"), "{err}");
    }
}
