//! JSON → [`Manifest`], field by field, so every rejection names its code,
//! the item and the field. Unknown keys are rejected: a typo such as
//! `"acess": "ro"` must not silently give a writable bind.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::error::{Code, ManifestError};
use super::{Access, Apply, EnvPatch, Item, Manifest, Root, Source, Target};

/// Most items one manifest may have.
pub const MAX_ITEMS: usize = 1000;
const MAX_ID_LEN: usize = 200;
const MAX_NAME_LEN: usize = 200;
const MAX_PATH_LEN: usize = 4000;
const MAX_COMPONENT_LEN: usize = 255;

type Result<T> = std::result::Result<T, ManifestError>;

/// Parses and validates a manifest: a bare `agentInputs` object, or any
/// object with an `agentInputs` key (its other keys are ignored).
pub fn parse(bytes: &[u8]) -> Result<Manifest> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ManifestError::new(Code::Invalid, None, format!("not valid JSON: {e}")))?;
    parse_value(&value)
}

/// Like [`parse`], from an already decoded JSON value.
pub fn parse_value(value: &Value) -> Result<Manifest> {
    let Some(outer) = value.as_object() else {
        return Err(ManifestError::new(Code::Invalid, None, "agentInputs must be a JSON object"));
    };
    let obj = match outer.get("agentInputs") {
        Some(Value::Object(inner)) => inner,
        Some(_) => {
            return Err(ManifestError::new(Code::Invalid, None, "agentInputs must be a JSON object"));
        }
        None => outer,
    };

    check_top_level(obj)?;

    let env_patch = match obj.get("envPatch") {
        None | Some(Value::Null) => EnvPatch::default(),
        Some(Value::Object(map)) => env_patch(map)?,
        Some(_) => {
            return Err(ManifestError::new(Code::InvalidEnvPatch, None, "envPatch must be an object"));
        }
    };

    let items = items(obj)?;
    Ok(Manifest { version: 1, env_patch, items })
}

/// The top level's keys (the v1 set; `env` refused with its own reason),
/// then its `version`.
fn check_top_level(obj: &Map<String, Value>) -> Result<()> {
    for key in obj.keys() {
        match key.as_str() {
            "version" | "envPatch" | "items" => {}
            "env" => {
                return Err(ManifestError::new(
                    Code::Invalid,
                    None,
                    "agentInputs must not carry env: the environment comes from init.env \
                     (--env, --env-file); only envPatch with HOME, USER, LOGNAME is allowed",
                ));
            }
            other => {
                return Err(ManifestError::new(
                    Code::Invalid,
                    None,
                    format!("unknown key {other:?} (v1 has version, envPatch, items)"),
                ));
            }
        }
    }

    match obj.get("version") {
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(ManifestError::new(
                Code::UnsupportedVersion,
                None,
                format!("version {v} is not supported (only the integer 1 is)"),
            ));
        }
        None => {
            return Err(ManifestError::new(
                Code::UnsupportedVersion,
                None,
                "version is missing (only the integer 1 is supported)",
            ));
        }
    }
    Ok(())
}

/// `items`: an array of at most `MAX_ITEMS`, each parsed, ids unique.
fn items(obj: &Map<String, Value>) -> Result<Vec<Item>> {
    let raw_items = match obj.get("items") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ManifestError::new(Code::InvalidItems, None, "items must be an array")),
        None => return Err(ManifestError::new(Code::InvalidItems, None, "items is missing")),
    };
    if raw_items.len() > MAX_ITEMS {
        return Err(ManifestError::new(
            Code::InvalidItems,
            None,
            format!("{} items; at most {MAX_ITEMS} are allowed", raw_items.len()),
        ));
    }
    let mut items = Vec::with_capacity(raw_items.len());
    let mut ids = HashSet::new();
    for (i, raw) in raw_items.iter().enumerate() {
        let item = item(i + 1, raw)?;
        if !ids.insert(item.id.clone()) {
            return Err(ManifestError::new(
                Code::InvalidItemId,
                Some(&item.id),
                "duplicate id (ids must be unique within a manifest)",
            ));
        }
        items.push(item);
    }
    Ok(items)
}

fn env_patch(map: &Map<String, Value>) -> Result<EnvPatch> {
    let mut patch = EnvPatch::default();
    for (raw_key, value) in map {
        let key = raw_key.trim();
        let slot = match key {
            "HOME" => &mut patch.home,
            "USER" => &mut patch.user,
            "LOGNAME" => &mut patch.logname,
            _ => {
                return Err(ManifestError::new(
                    Code::InvalidEnvPatchKey,
                    Some(&key.escape_debug().to_string()),
                    "envPatch may only set HOME, USER, LOGNAME",
                ));
            }
        };
        // Values are not secrets (paths and user names), but keep them out
        // of messages anyway: the message names the key and the rule.
        let Some(text) = value.as_str() else {
            return Err(ManifestError::new(
                Code::InvalidEnvPatch,
                None,
                format!("envPatch.{key} must be a string"),
            ));
        };
        let ok = match key {
            "HOME" => text.starts_with('/') && !text.contains('\0') && !text.split('/').any(|c| c == ".."),
            _ => {
                !text.is_empty()
                    && text.len() <= 32
                    && !text.chars().any(|c| c.is_control() || c.is_whitespace() || c == ':' || c == '/')
            }
        };
        if !ok {
            let rule = if key == "HOME" {
                "an absolute path without '..'"
            } else {
                "a user name (1-32 characters, no whitespace, ':' or '/')"
            };
            return Err(ManifestError::new(
                Code::InvalidEnvPatch,
                None,
                format!("envPatch.{key} must be {rule}"),
            ));
        }
        *slot = Some(text.to_string());
    }
    Ok(patch)
}

fn item(position: usize, raw: &Value) -> Result<Item> {
    let pos = position.to_string();
    let Some(obj) = raw.as_object() else {
        return Err(ManifestError::new(Code::InvalidItem, Some(&pos), "item must be an object"));
    };

    let id = item_id(&pos, obj)?;
    let err = |code: Code, message: String| ManifestError::new(code, Some(id), message);

    for key in obj.keys() {
        if !matches!(key.as_str(), "id" | "name" | "apply" | "access" | "source" | "target") {
            return Err(err(
                Code::InvalidItem,
                format!("unknown key {key:?} (an item has id, name, apply, access, source, target)"),
            ));
        }
    }

    let name = match obj.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= MAX_NAME_LEN && !s.chars().any(char::is_control) => {
            Some(s.clone())
        }
        Some(_) => {
            return Err(err(
                Code::InvalidItem,
                format!("name must be a string of at most {MAX_NAME_LEN} bytes without control characters"),
            ));
        }
    };

    let apply = apply(id, obj.get("apply"))?;

    let access = match obj.get("access") {
        None | Some(Value::Null) => Access::Rw,
        Some(Value::String(s)) if s == "ro" => Access::Ro,
        Some(Value::String(s)) if s == "rw" => Access::Rw,
        Some(_) => return Err(err(Code::InvalidItemAccess, "access must be \"ro\" or \"rw\"".into())),
    };

    let target = target(id, obj.get("target"))?;
    let source = source(id, obj.get("source"))?;

    if source.type_name() != apply.source_type() {
        return Err(err(
            Code::InvalidItemApplySource,
            format!(
                "{} requires source.type {} (got {})",
                apply.as_str(),
                apply.source_type(),
                source.type_name()
            ),
        ));
    }

    Ok(Item { id: id.to_string(), name, apply, access, source, target })
}

/// An item's `id`, trimmed: non-empty, bounded, no control characters
/// (errors name the item by its position).
fn item_id<'a>(pos: &str, obj: &'a Map<String, Value>) -> Result<&'a str> {
    let id = match obj.get("id").and_then(Value::as_str).map(str::trim) {
        Some(id) if !id.is_empty() => id,
        _ => {
            return Err(ManifestError::new(Code::InvalidItemId, Some(pos), "id must be a non-empty string"));
        }
    };
    if id.len() > MAX_ID_LEN || id.chars().any(char::is_control) {
        return Err(ManifestError::new(
            Code::InvalidItemId,
            Some(pos),
            format!("id must be at most {MAX_ID_LEN} bytes without control characters"),
        ));
    }
    Ok(id)
}

/// An item's `apply` (the snake_case spellings accepted too).
fn apply(id: &str, raw: Option<&Value>) -> Result<Apply> {
    let err = |code: Code, message: String| ManifestError::new(code, Some(id), message);
    Ok(match raw.and_then(Value::as_str) {
        Some("bindMount" | "bind_mount") => Apply::BindMount,
        Some("copy") => Apply::Copy,
        Some("downloadExtract" | "download_extract" | "extract") => Apply::DownloadExtract,
        Some("writeFile" | "write_file") => Apply::WriteFile,
        Some("checkout") => Apply::Checkout,
        Some(other) => {
            return Err(err(
                Code::InvalidItemApply,
                format!(
                    "apply {other:?} is not one of bindMount, copy, downloadExtract, writeFile, checkout"
                ),
            ));
        }
        None => {
            return Err(err(
                Code::InvalidItemApply,
                "apply must be one of bindMount, copy, downloadExtract, writeFile, checkout".into(),
            ));
        }
    })
}

fn target(id: &str, raw: Option<&Value>) -> Result<Target> {
    let err = |code: Code, message: &str| ManifestError::new(code, Some(id), message);
    let Some(obj) = raw.and_then(Value::as_object) else {
        return Err(err(Code::InvalidItemTarget, "target must be an object with root and path"));
    };
    for key in obj.keys() {
        if key != "root" && key != "path" {
            return Err(ManifestError::new(
                Code::InvalidItemTarget,
                Some(id),
                format!("unknown key target.{} (a target has root and path)", key.escape_debug()),
            ));
        }
    }
    let root = match obj.get("root").and_then(Value::as_str) {
        Some("WORKSPACE") => Root::Workspace,
        Some("USER_HOME") => Root::UserHome,
        Some("SCRATCH") => Root::Scratch,
        _ => {
            return Err(err(
                Code::InvalidItemTargetRoot,
                "target.root must be WORKSPACE, USER_HOME or SCRATCH",
            ));
        }
    };
    let path = match obj.get("path") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => {
            normalize_target_path(s).map_err(|why| err(Code::InvalidItemTarget, why))?
        }
        Some(_) => return Err(err(Code::InvalidItemTarget, "target.path must be a string")),
    };
    Ok(Target { root, path })
}

/// Normalizes a relative target path: `\` is read as `/` (the backend may
/// send Windows-style paths), whitespace around it is trimmed, `.` and empty
/// components are dropped. Absolute paths, drive letters, `..` anywhere and
/// NUL are refused.
pub(crate) fn normalize_target_path(raw: &str) -> std::result::Result<String, &'static str> {
    let unified = raw.replace('\\', "/");
    let path = unified.trim();
    if path.contains('\0') {
        return Err("target.path must not contain NUL");
    }
    // The target is shown in log lines and the plan, one line each; ids,
    // host paths and URIs refuse control characters too.
    if path.chars().any(char::is_control) {
        return Err("target.path must not contain control characters");
    }
    let bytes = path.as_bytes();
    let drive = bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':';
    if path.starts_with('/') || drive {
        return Err("target.path must be relative");
    }
    if path.len() > MAX_PATH_LEN {
        return Err("target.path is too long (at most 4000 bytes)");
    }
    let mut parts = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err("target.path must not escape root"),
            c if c.len() > MAX_COMPONENT_LEN => {
                return Err("target.path has a component longer than 255 bytes");
            }
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

fn source(id: &str, raw: Option<&Value>) -> Result<Source> {
    let err = |code: Code, message: String| ManifestError::new(code, Some(id), message);
    let Some(obj) = raw.and_then(Value::as_object) else {
        return Err(err(Code::InvalidItemSource, "source must be an object with a type".into()));
    };
    let kind = match obj.get("type").and_then(Value::as_str) {
        Some("hostPath" | "host_path") => "hostPath",
        Some("httpZip" | "http_zip") => "httpZip",
        Some("inlineText" | "inline_text") => "inlineText",
        Some("git") => "git",
        _ => {
            return Err(err(
                Code::InvalidItemSourceType,
                "source.type must be hostPath, httpZip, inlineText or git".into(),
            ));
        }
    };
    let allowed: &[&str] = match kind {
        "hostPath" => &["type", "path"],
        "httpZip" => &["type", "uri", "contentHash"],
        "inlineText" => &["type", "text"],
        _ => &["type", "repo", "ref"],
    };
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(err(
                Code::InvalidItemSource,
                format!(
                    "unknown key source.{} for a {kind} source (it has {})",
                    key.escape_debug(),
                    allowed[1..].join(", ")
                ),
            ));
        }
    }
    match kind {
        "hostPath" => match text_field(obj, "path") {
            Some(path) if clean(path) => Ok(Source::HostPath { path: path.to_string() }),
            _ => Err(err(
                Code::InvalidItemSourceHostPath,
                "source.path must be a non-empty path without control characters".into(),
            )),
        },
        "httpZip" => http_zip(id, obj),
        "inlineText" => match obj.get("text") {
            Some(Value::String(text)) => Ok(Source::InlineText { text: text.clone() }),
            _ => Err(err(Code::InvalidItemSourceText, "source.text must be a string".into())),
        },
        _ => git(id, obj),
    }
}

/// A source's string field, trimmed; `None` when absent or blank.
fn text_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty())
}

fn clean(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

/// An `httpZip` source's URI and optional content hash.
fn http_zip(id: &str, obj: &Map<String, Value>) -> Result<Source> {
    let err = |code: Code, message: String| ManifestError::new(code, Some(id), message);
    let uri = match text_field(obj, "uri") {
        Some(uri) if !uri.chars().any(|c| c.is_control() || c.is_whitespace()) => uri.to_string(),
        _ => {
            return Err(err(
                Code::InvalidItemSourceUri,
                "source.uri must be a non-empty URI without whitespace".into(),
            ));
        }
    };
    let content_hash = match obj.get("contentHash") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(content_hash(s).ok_or_else(|| {
            err(
                Code::InvalidItemSourceContentHash,
                "source.contentHash must be a sha256 in hex (64 hex digits, optionally prefixed sha256:)"
                    .into(),
            )
        })?),
        Some(_) => {
            return Err(err(
                Code::InvalidItemSourceContentHash,
                "source.contentHash must be a string".into(),
            ));
        }
    };
    Ok(Source::HttpZip { uri, content_hash })
}

/// A `git` source's repository and optional ref.
fn git(id: &str, obj: &Map<String, Value>) -> Result<Source> {
    let err = |code: Code, message: String| ManifestError::new(code, Some(id), message);
    let repo = match text_field(obj, "repo") {
        Some(repo) if clean(repo) && !repo.starts_with('-') && !repo.contains(char::is_whitespace) => {
            repo.to_string()
        }
        _ => {
            return Err(err(
                Code::InvalidItemSourceRepo,
                "source.repo must be a repository URL or path (no whitespace, not starting with '-')".into(),
            ));
        }
    };
    let git_ref = match obj.get("ref") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if valid_ref(r.trim()) => Some(r.trim().to_string()),
        Some(_) => {
            return Err(err(
                Code::InvalidItemSourceRef,
                "source.ref must be a branch, tag or commit name (letters, digits, '/', '.', '_', '-'; \
                 not starting with '-', no '..')"
                    .into(),
            ));
        }
    };
    Ok(Source::Git { repo, git_ref })
}

/// `sha256:<hex>` or `<hex>`, 64 digits, returned lowercase.
fn content_hash(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let hex = raw.strip_prefix("sha256:").unwrap_or(raw);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hex.to_ascii_lowercase())
}

/// A conservative subset of `git check-ref-format`: enough for branches,
/// tags and commit ids, and never an option or a revision expression.
fn valid_ref(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 255
        && !r.starts_with(['-', '/', '.'])
        && !r.ends_with(['/', '.'])
        && !r.contains("..")
        && !r.contains("//")
        && !r.ends_with(".lock")
        && r.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests;
