//! Skill packages: `SKILL.md`, `assets/runner.json` and the three schemas.
//!
//! A package is checked whole when it is loaded, in the order and with the
//! messages of the upstream package validator (docs/skills.md, "Package
//! validation"): required files, `runner.json` syntax, the manifest's shape
//! (Python `jsonschema` best-match wording), the engine policy (the legacy
//! `unsupport_engine` rejected with its own message), the id, `SKILL.md`'s
//! front-matter name, the identity of directory, id and name, then each schema
//! (present, JSON, meta-validated, and compilable as a JSON Schema). A package
//! that fails is reported with that message, never skipped silently (see
//! [`scan`]).
//!
//! Beyond upstream: schema paths are opened beneath the package directory
//! (a `../` or a symlink out of it is refused), file-input keys must be
//! plain file names, and artifact patterns plain relative paths, since they
//! become paths under `uploads/` and `artifacts/`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::messages::{py_repr, py_str};
use crate::hostfs::beneath::{self as fsio, Links, ReadError};

/// Engines every server knows, in upstream's order.
pub const BUILTIN_ENGINES: [&str; 3] = ["codex", "gemini", "iflow"];
/// Largest runner.json or schema file read.
const MAX_DOC_BYTES: u64 = 1 << 20;

/// Why a package is invalid: one line, upstream's wording. Paths and
/// values from the package are in it as written, so control characters
/// are shown escaped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", escape_controls(.0))]
pub struct PackageError(pub String);

fn escape_controls(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

fn err<T>(message: impl Into<String>) -> Result<T, PackageError> {
    Err(PackageError(message.into()))
}

/// Where a file input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    File,
    Inline,
}

/// One artifact a run is expected to produce under `artifacts/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ArtifactSpec {
    pub role: String,
    pub pattern: String,
    pub mime: Option<String>,
    pub required: bool,
}

/// A schema file: its path in the package, its JSON, its compiled validator.
#[derive(Clone)]
pub struct SchemaDoc {
    pub rel: String,
    pub json: Value,
    pub validator: Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for SchemaDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaDoc").field("rel", &self.rel).finish_non_exhaustive()
    }
}

/// A valid skill package.
#[derive(Clone, Debug)]
pub struct Skill {
    pub id: String,
    /// The package directory on the host (canonical).
    pub dir: PathBuf,
    pub manifest: Value,
    pub version: String,
    pub engines: Vec<String>,
    pub unsupported_engines: Vec<String>,
    pub effective_engines: Vec<String>,
    pub execution_modes: Vec<String>,
    pub artifacts: Vec<ArtifactSpec>,
    pub input: SchemaDoc,
    pub parameter: SchemaDoc,
    pub output: SchemaDoc,
}

impl Skill {
    /// The `SkillManifest` JSON of `GET /v1/skills` (without upstream's
    /// absolute server `path`).
    pub fn to_json(&self) -> Value {
        let m = &self.manifest;
        json!({
            "id": self.id,
            "version": self.version,
            "name": m.get("name").cloned().unwrap_or(Value::Null),
            "description": m.get("description").cloned().unwrap_or(Value::Null),
            "engines": self.engines,
            "unsupported_engines": self.unsupported_engines,
            "effective_engines": self.effective_engines,
            "execution_modes": self.execution_modes,
            "entrypoint": m.get("entrypoint").cloned().unwrap_or_else(|| json!({})),
            "artifacts": self.artifacts,
            "schemas": {
                "input": self.input.rel,
                "parameter": self.parameter.rel,
                "output": self.output.rel,
            },
            "runtime": m.get("runtime").cloned().unwrap_or(Value::Null),
        })
    }

    /// Input keys and where each comes from, in schema order.
    pub fn input_sources(&self) -> Vec<(String, Source)> {
        input_sources(&self.input.json)
    }

    /// Required input keys.
    pub fn input_required(&self) -> Vec<String> {
        required_of(&self.input.json)
    }

    /// Whether the job must wait for an upload before it starts: the skill
    /// has a required file-sourced input.
    pub fn needs_upload(&self) -> bool {
        let required = self.input_required();
        self.input_sources().iter().any(|(k, s)| *s == Source::File && required.contains(k))
    }

    /// The prompt template the skill gives for `engine`, if any.
    pub fn prompt_template(&self, engine: &str) -> Option<&str> {
        self.manifest.get("entrypoint")?.get("prompts")?.get(engine)?.as_str()
    }
}

pub fn input_sources(schema: &Value) -> Vec<(String, Source)> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(k, spec)| {
            // Anything but an explicit "inline" is file-sourced (upstream).
            let source = match spec.get("x-input-source").and_then(Value::as_str) {
                Some("inline") => Source::Inline,
                _ => Source::File,
            };
            (k.clone(), source)
        })
        .collect()
}

pub fn required_of(schema: &Value) -> Vec<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// `SKILL.md` and `assets/runner.json`, read; when either is absent, one
/// error naming every absent one.
fn required_files(root: &OwnedFd) -> Result<(Vec<u8>, Vec<u8>), PackageError> {
    let skill_md = read_doc(root, "SKILL.md");
    let runner = read_doc(root, "assets/runner.json");
    let missing: Vec<&str> = [("SKILL.md", &skill_md), ("assets/runner.json", &runner)]
        .iter()
        .filter(|(_, r)| matches!(r, Err(Missing::Absent)))
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        return err(format!("Skill package missing required files: {}", missing.join(", ")));
    }
    let skill_md = skill_md.map_err(|e| e.into_error("SKILL.md"))?;
    let runner = runner.map_err(|e| e.into_error("assets/runner.json"))?;
    Ok((skill_md, runner))
}

/// Loads and checks the package in `dir`. `engines` is every engine this
/// server knows (built-ins first, then configured ones).
pub fn load(dir: &Path, engines: &[String]) -> Result<Skill, PackageError> {
    let dir_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let root = fsio::open_dir(dir).map_err(|e| {
        PackageError(format!("cannot open the skill directory: {}", sandbox::error::io_error_text(&e)))
    })?;
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());

    // 1. Required files.
    let (skill_md, runner) = required_files(&root)?;

    // 2. runner.json must parse.
    let manifest: Value =
        serde_json::from_slice(&runner).map_err(|_| PackageError("Invalid assets/runner.json".into()))?;

    // 3. The manifest's shape.
    if let Some(message) = manifest_error(&manifest, engines) {
        return err(format!("Invalid runner.json manifest: {message}"));
    }
    let obj = manifest.as_object().expect("checked to be an object");

    // 4. Engine policy.
    let (declared, unsupported, effective) = engine_policy(obj, engines)?;

    // 5. id.
    let id = obj.get("id").and_then(Value::as_str).unwrap_or_default().trim().to_string();
    if id.is_empty() {
        return err("runner.json must define a non-empty id");
    }

    // 6. SKILL.md front matter.
    let Some(name) = front_matter_name(&String::from_utf8_lossy(&skill_md)) else {
        return err("SKILL.md must define frontmatter name");
    };

    // 7. Identity.
    if dir_name != id || name != id {
        return err("Skill identity mismatch: directory, runner.json id, and SKILL.md name must match");
    }

    // 8. The three schemas.
    let Schemas { input, parameter, output, output_order } = schemas(&root, obj)?;

    // 9. execution_modes (already shaped by step 3).
    let execution_modes: Vec<String> = obj["execution_modes"]
        .as_array()
        .expect("checked")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();

    // 10. version, when present.
    let version = match obj.get("version").and_then(Value::as_str) {
        Some(v) if !is_version(v) => return err(format!("Invalid skill version: {v}")),
        Some(v) => v.to_string(),
        None => "1.0.0".to_string(),
    };

    let artifacts = artifacts_of(obj, &output.json, &output_order)?;
    Ok(Skill {
        id,
        dir,
        manifest,
        version,
        engines: declared,
        unsupported_engines: unsupported,
        effective_engines: effective,
        execution_modes,
        artifacts,
        input,
        parameter,
        output,
    })
}

/// A package's input, parameter and output schemas, compiled, and the
/// output's property order as written.
struct Schemas {
    input: SchemaDoc,
    parameter: SchemaDoc,
    output: SchemaDoc,
    output_order: Vec<String>,
}

/// Reads, checks and compiles the schemas runner.json names (step 8).
fn schemas(root: &OwnedFd, obj: &Map<String, Value>) -> Result<Schemas, PackageError> {
    let schemas = obj.get("schemas").and_then(Value::as_object).expect("checked");
    let mut docs = Vec::new();
    let mut absent = Vec::new();
    for key in ["input", "parameter", "output"] {
        let Some(rel) = schemas.get(key).and_then(Value::as_str).filter(|s| !s.trim().is_empty()) else {
            return err("runner.json schemas must define input, parameter and output");
        };
        match read_doc(root, rel) {
            Ok(bytes) => docs.push((key, rel.to_string(), bytes)),
            Err(Missing::Absent) => absent.push(rel.to_string()),
            Err(e) => return Err(e.into_error(rel)),
        }
    }
    if !absent.is_empty() {
        return err(format!("Skill package missing required files: {}", absent.join(", ")));
    }
    let mut compiled = Vec::new();
    let mut output_order = Vec::new();
    for (key, rel, bytes) in docs {
        if key == "output" {
            output_order = property_order(&bytes);
        }
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|_| PackageError(format!("Invalid {key} schema: not valid JSON")))?;
        if let Some(message) = meta_error(key, &json) {
            return err(format!("Invalid {key} schema: {message}"));
        }
        let validator = jsonschema::validator_for(&json)
            .map_err(|e| PackageError(format!("Invalid {key} schema: {e}")))?;
        compiled.push(SchemaDoc { rel, json, validator: Arc::new(validator) });
    }
    let output = compiled.pop().expect("three schemas");
    let parameter = compiled.pop().expect("three schemas");
    let input = compiled.pop().expect("three schemas");
    Ok(Schemas { input, parameter, output, output_order })
}

/// Why a package file could not be read.
enum Missing {
    Absent,
    Other(String),
}

impl Missing {
    fn into_error(self, rel: &str) -> PackageError {
        match self {
            Missing::Absent => PackageError(format!("Skill package missing required files: {rel}")),
            Missing::Other(why) => PackageError(format!("cannot read {rel} in the skill package: {why}")),
        }
    }
}

fn read_doc(root: &OwnedFd, rel: &str) -> Result<Vec<u8>, Missing> {
    if rel.starts_with('/') {
        return Err(Missing::Other("the path must be relative to the package".into()));
    }
    match fsio::read_beneath(root.as_fd(), rel, Links::Follow, MAX_DOC_BYTES) {
        Ok(bytes) => Ok(bytes),
        Err(ReadError::Open(nix::errno::Errno::ENOENT)) => Err(Missing::Absent),
        Err(ReadError::Open(nix::errno::Errno::EXDEV)) => {
            Err(Missing::Other("the path leads outside the package".into()))
        }
        Err(e @ ReadError::Open(_)) => Err(Missing::Other(format!("openat2 => {e}"))),
        Err(e) => Err(Missing::Other(e.to_string())),
    }
}

/// The first (shallowest) failure of the manifest against upstream's
/// manifest schema, worded as Python `jsonschema`'s best match.
fn manifest_error(m: &Value, engines: &[String]) -> Option<String> {
    let Some(obj) = m.as_object() else {
        return Some(format!("{} is not of type 'object'", py_repr(m)));
    };
    let mut errors: Vec<(usize, String)> = Vec::new();
    for key in ["id", "schemas", "execution_modes"] {
        if !obj.contains_key(key) {
            errors.push((0, format!("{} is a required property", py_str(key))));
        }
    }
    let engine_enum = Value::from(engines.to_vec());
    let modes_enum = json!(["auto", "interactive"]);
    for key in ["id", "version"] {
        if let Some(v) = obj.get(key) {
            non_empty_string(v, 1, &mut errors);
        }
    }
    for (key, allowed) in
        [("engines", &engine_enum), ("unsupported_engines", &engine_enum), ("execution_modes", &modes_enum)]
    {
        if let Some(v) = obj.get(key) {
            enum_list(v, allowed, &mut errors);
        }
    }
    if let Some(v) = obj.get("schemas") {
        match v.as_object() {
            None => errors.push((1, format!("{} is not of type 'object'", py_repr(v)))),
            Some(s) => {
                for key in ["input", "parameter", "output"] {
                    match s.get(key) {
                        None => errors.push((1, format!("{} is a required property", py_str(key)))),
                        Some(v) => non_empty_string(v, 2, &mut errors),
                    }
                }
            }
        }
    }
    if let Some(v) = obj.get("artifacts") {
        match v.as_array() {
            None => errors.push((1, format!("{} is not of type 'array'", py_repr(v)))),
            Some(items) => {
                for item in items {
                    artifact_item(item, &mut errors);
                }
            }
        }
    }
    errors.into_iter().min_by_key(|(depth, _)| *depth).map(|(_, m)| m)
}

fn non_empty_string(v: &Value, depth: usize, errors: &mut Vec<(usize, String)>) {
    match v.as_str() {
        None => errors.push((depth, format!("{} is not of type 'string'", py_repr(v)))),
        Some("") => errors.push((depth, "'' should be non-empty".into())),
        Some(_) => {}
    }
}

fn enum_list(v: &Value, allowed: &Value, errors: &mut Vec<(usize, String)>) {
    let Some(items) = v.as_array() else {
        errors.push((1, format!("{} is not of type 'array'", py_repr(v))));
        return;
    };
    if items.is_empty() {
        errors.push((1, "[] should be non-empty".into()));
    }
    if items.iter().enumerate().any(|(i, a)| items[..i].contains(a)) {
        errors.push((1, format!("{} has non-unique elements", py_repr(v))));
    }
    let options = allowed.as_array().expect("an array");
    for item in items {
        if !options.contains(item) {
            errors.push((2, format!("{} is not one of {}", py_repr(item), py_repr(allowed))));
        }
    }
}

fn artifact_item(item: &Value, errors: &mut Vec<(usize, String)>) {
    let Some(obj) = item.as_object() else {
        errors.push((2, format!("{} is not of type 'object'", py_repr(item))));
        return;
    };
    match obj.get("pattern") {
        None => errors.push((2, "'pattern' is a required property".into())),
        Some(v) => non_empty_string(v, 3, errors),
    }
    if let Some(v) = obj.get("role") {
        non_empty_string(v, 3, errors);
    }
    if let Some(v) = obj.get("required").filter(|v| !v.is_boolean()) {
        errors.push((3, format!("{} is not of type 'boolean'", py_repr(v))));
    }
    if let Some(v) = obj.get("mime").filter(|v| !v.is_string() && !v.is_null()) {
        errors.push((3, format!("{} is not of type 'string', 'null'", py_repr(v))));
    }
}

/// Declared, unsupported and effective engines.
type EnginePolicy = (Vec<String>, Vec<String>, Vec<String>);

/// Upstream's engine policy.
fn engine_policy(obj: &Map<String, Value>, known: &[String]) -> Result<EnginePolicy, PackageError> {
    if obj.contains_key("unsupport_engine") {
        return err("runner.json field 'unsupport_engine' has been renamed to 'unsupported_engines'");
    }
    let list = |field: &str| -> Result<Vec<String>, PackageError> {
        let items = match obj.get(field) {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(items)) => items,
            Some(_) => return err(format!("runner.json {field} must be a list when provided")),
        };
        let mut out: Vec<String> = Vec::new();
        for item in items {
            let Some(s) = item.as_str().map(str::trim).filter(|s| !s.is_empty()) else {
                return err(format!("runner.json {field} must contain non-empty strings"));
            };
            if !out.iter().any(|o| o == s) {
                out.push(s.to_string());
            }
        }
        Ok(out)
    };
    let declared = list("engines")?;
    let unsupported = list("unsupported_engines")?;
    if declared.iter().chain(&unsupported).any(|e| !known.contains(e)) {
        return err(format!(
            "runner.json engines/unsupported_engines must contain only: {}",
            known.join(", ")
        ));
    }
    let overlap: Vec<&str> =
        declared.iter().filter(|e| unsupported.contains(e)).map(String::as_str).collect();
    if !overlap.is_empty() {
        return err(format!(
            "runner.json engines and unsupported_engines must not overlap: {}",
            overlap.join(", ")
        ));
    }
    let base = if declared.is_empty() { known.to_vec() } else { declared.clone() };
    let effective: Vec<String> = base.into_iter().filter(|e| !unsupported.contains(e)).collect();
    if effective.is_empty() {
        return err("runner.json effective engines must not be empty");
    }
    Ok((declared, unsupported, effective))
}

/// The `name` of `SKILL.md`'s front matter (`---\n...\n---\n` at the very
/// start), as a plain or quoted scalar.
fn front_matter_name(text: &str) -> Option<String> {
    let body = text.strip_prefix("---\n")?;
    let end = body.find("\n---\n").or_else(|| body.strip_suffix("\n---").map(str::len))?;
    body[..end].lines().find_map(|line| {
        let value = line.strip_prefix("name:")?.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// A PEP 440 release with optional pre, post and dev parts (`1.2.0`,
/// `2.0rc1`, `1.0.post2`), or plain dotted numbers.
fn is_version(v: &str) -> bool {
    let v = v.strip_prefix('v').unwrap_or(v);
    let digits_then = |s: &str| -> Option<usize> {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        (n > 0).then_some(n)
    };
    let Some(mut i) = digits_then(v) else { return false };
    while v[i..].starts_with('.') && digits_then(&v[i + 1..]).is_some() {
        i += 1 + digits_then(&v[i + 1..]).unwrap();
    }
    for tag in ["a", "b", "rc"] {
        if let Some(n) = v[i..].strip_prefix(tag).and_then(digits_then) {
            i += tag.len() + n;
            break;
        }
    }
    for tag in [".post", ".dev"] {
        if let Some(n) = v[i..].strip_prefix(tag).and_then(digits_then) {
            i += tag.len() + n;
        }
    }
    i == v.len()
}

/// PEP 440 order of two versions that [`is_version`] accepts (release
/// numbers, trailing zeros ignored; then `.devN` < `aN` < `bN` < `rcN` <
/// the release < `.postN`); `None` when either is not a version.
pub fn version_order(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    Some(version_key(a)?.cmp(&version_key(b)?))
}

type VersionKey = (Vec<u64>, (i8, u64), (i8, u64), (i8, u64));

fn version_key(v: &str) -> Option<VersionKey> {
    if !is_version(v) {
        return None;
    }
    let v = v.strip_prefix('v').unwrap_or(v);
    let b = v.as_bytes();
    let digits_from = |i: usize| i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = digits_from(0);
    while end + 1 < b.len() && b[end] == b'.' && b[end + 1].is_ascii_digit() {
        end = digits_from(end + 1);
    }
    let (release, mut rest) = v.split_at(end);
    let mut nums: Vec<u64> = release.split('.').map(|n| n.parse().unwrap_or(u64::MAX)).collect();
    while nums.len() > 1 && nums.last() == Some(&0) {
        nums.pop();
    }
    let number = |s: &str| -> (u64, usize) {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        (s[..n].parse().unwrap_or(u64::MAX), n)
    };
    let mut pre = None;
    for (rank, tag) in [(0i8, "a"), (1, "b"), (2, "rc")] {
        if let Some(after) = rest.strip_prefix(tag) {
            let (n, len) = number(after);
            pre = Some((rank, n));
            rest = &after[len..];
            break;
        }
    }
    let mut post = None;
    if let Some(after) = rest.strip_prefix(".post") {
        let (n, len) = number(after);
        post = Some(n);
        rest = &after[len..];
    }
    let dev = rest.strip_prefix(".dev").map(|after| number(after).0);
    let pre_key = match (pre, post, dev) {
        (Some((rank, n)), _, _) => (0, (rank as u64) << 32 | n.min(u32::MAX as u64)),
        (None, None, Some(_)) => (-1, 0),
        (None, _, _) => (1, 0),
    };
    let post_key = post.map_or((-1, 0), |n| (0, n));
    let dev_key = dev.map_or((1, 0), |n| (0, n));
    Some((nums, pre_key, post_key, dev_key))
}

/// The meta-validation of one schema (upstream's meta-schemas: docs/skills.md,
/// "Package validation").
fn meta_error(key: &str, schema: &Value) -> Option<String> {
    let Some(obj) = schema.as_object() else {
        return Some(format!("{} is not of type 'object'", py_repr(schema)));
    };
    match obj.get("type") {
        None => return Some("'type' is a required property".into()),
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => return Some("'object' was expected".into()),
    }
    if let Some(required) = obj.get("required") {
        let Some(items) = required.as_array() else {
            return Some(format!("{} is not of type 'array'", py_repr(required)));
        };
        if let Some(bad) = items.iter().find(|v| !v.is_string()) {
            return Some(format!("{} is not of type 'string'", py_repr(bad)));
        }
    }
    let props = obj.get("properties")?;
    let Some(props) = props.as_object() else {
        return Some(format!("{} is not of type 'object'", py_repr(props)));
    };
    for (name, spec) in props {
        let Some(spec) = spec.as_object() else {
            return Some(format!("{} is not of type 'object'", py_repr(spec)));
        };
        match key {
            "input" => {
                if let Some(src) = spec.get("x-input-source")
                    && src != "file"
                    && src != "inline"
                {
                    return Some(format!("{} is not one of ['file', 'inline']", py_repr(src)));
                }
                if let Some(ext) = spec.get("extensions") {
                    match ext.as_array() {
                        None => return Some(format!("{} is not of type 'array'", py_repr(ext))),
                        Some(items) => {
                            if let Some(bad) = items.iter().find(|v| !v.is_string()) {
                                return Some(format!("{} is not of type 'string'", py_repr(bad)));
                            }
                        }
                    }
                }
                let inline = spec.get("x-input-source").and_then(Value::as_str) == Some("inline");
                if !inline && !fsio::is_plain_name(name) {
                    return Some(format!(
                        "file input key {} must be a plain file name (it is matched as uploads/<key>)",
                        py_str(name)
                    ));
                }
            }
            "output" => {
                if let Some(t) = spec.get("x-type")
                    && t != "artifact"
                    && t != "file"
                {
                    return Some(format!("{} is not one of ['artifact', 'file']", py_repr(t)));
                }
                for field in ["x-role", "x-filename"] {
                    if let Some(v) = spec.get(field) {
                        let mut errors = Vec::new();
                        non_empty_string(v, 0, &mut errors);
                        if let Some((_, m)) = errors.pop() {
                            return Some(m);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// The names of a schema's top-level `properties` in the order of its
/// file. `serde_json`'s map is sorted, while upstream (Python) keeps the
/// file's order, and its clients compare the lists built from it. A name
/// given twice keeps its first place, as in a Python dict. Empty when the
/// document has no `properties` object.
fn property_order(bytes: &[u8]) -> Vec<String> {
    struct Keys(Vec<String>);
    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys: Vec<String> = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    #[derive(Deserialize)]
    struct Doc {
        properties: Option<Keys>,
    }
    serde_json::from_slice::<Doc>(bytes).ok().and_then(|d| d.properties).map(|k| k.0).unwrap_or_default()
}

/// `runner.json.artifacts` when it has entries, else inferred from the output
/// schema (docs/skills.md, "Skill packages"), in the order of its properties
/// (`order`, see [`property_order`]): every top-level property with `x-type`
/// artifact|file gives `{role: x-role or "output", pattern: x-filename or the
/// name, required: name in output.required}`.
fn artifacts_of(
    obj: &Map<String, Value>,
    output: &Value,
    order: &[String],
) -> Result<Vec<ArtifactSpec>, PackageError> {
    let declared = obj.get("artifacts").and_then(Value::as_array).filter(|a| !a.is_empty());
    let specs: Vec<ArtifactSpec> = match declared {
        Some(items) => items
            .iter()
            .map(|item| ArtifactSpec {
                role: item.get("role").and_then(Value::as_str).unwrap_or("output").to_string(),
                pattern: item["pattern"].as_str().unwrap_or_default().to_string(),
                mime: item.get("mime").and_then(Value::as_str).map(str::to_string),
                required: item.get("required").and_then(Value::as_bool).unwrap_or(false),
            })
            .collect(),
        None => {
            let required = required_of(output);
            let props = output.get("properties").and_then(Value::as_object);
            order
                .iter()
                .filter_map(|name| Some((name, props?.get(name)?)))
                .filter(|(_, spec)| {
                    matches!(spec.get("x-type").and_then(Value::as_str), Some("artifact" | "file"))
                })
                .map(|(name, spec)| ArtifactSpec {
                    role: spec.get("x-role").and_then(Value::as_str).unwrap_or("output").to_string(),
                    pattern: spec.get("x-filename").and_then(Value::as_str).unwrap_or(name).to_string(),
                    mime: None,
                    required: required.contains(name),
                })
                .collect()
        }
    };
    if let Some(bad) = specs.iter().find(|a| !fsio::is_plain_relative(&a.pattern)) {
        return err(format!(
            "artifact pattern {} must be a relative path inside artifacts/ (no '..', no leading '/')",
            py_str(&bad.pattern)
        ));
    }
    Ok(specs)
}

/// A package that failed to load, for reports.
#[derive(Clone, Debug, Serialize)]
pub struct Invalid {
    pub dir: String,
    pub message: String,
}

/// Every package under `skills_dir` (each non-hidden directory with a
/// `SKILL.md` or an `assets/runner.json`), valid and invalid, sorted by
/// directory name. Invalid ones are logged as warnings.
pub fn scan(skills_dir: &Path, engines: &[String]) -> std::io::Result<(Vec<Skill>, Vec<Invalid>)> {
    let mut names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(skills_dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if name.starts_with('.') || !entry.file_type()?.is_dir() {
            continue;
        }
        let path = entry.path();
        if path.join("SKILL.md").exists() || path.join("assets/runner.json").exists() {
            names.push(name);
        }
    }
    names.sort();
    let (mut valid, mut invalid) = (Vec::new(), Vec::new());
    for name in names {
        match load(&skills_dir.join(&name), engines) {
            Ok(skill) => valid.push(skill),
            Err(e) => {
                tracing::warn!("skill package {name:?} is invalid: {e}");
                invalid.push(Invalid { dir: name, message: e.0 });
            }
        }
    }
    Ok((valid, invalid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_in_pep440_order() {
        use std::cmp::Ordering::*;
        let order = |a, b| version_order(a, b).unwrap();
        assert_eq!(order("1.0.0", "1.0"), Equal);
        assert_eq!(order("1.0.1", "1.0"), Greater);
        assert_eq!(order("1.10", "1.9"), Greater);
        assert_eq!(order("1.0rc1", "1.0"), Less);
        assert_eq!(order("1.0a2", "1.0b1"), Less);
        assert_eq!(order("1.0.dev1", "1.0a1"), Less);
        assert_eq!(order("1.0.post1", "1.0"), Greater);
        assert_eq!(order("v2", "1.9.9"), Greater);
        assert_eq!(version_order("abc", "1"), None);
    }

    fn known() -> Vec<String> {
        BUILTIN_ENGINES.iter().map(|s| s.to_string()).collect()
    }

    fn manifest_msg(m: Value) -> Option<String> {
        manifest_error(&m, &known())
    }

    /// Found by the `skills_request` fuzz target: a schema path from
    /// runner.json with a newline split the error line.
    #[test]
    fn errors_are_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("s");
        std::fs::create_dir_all(pkg.join("assets")).unwrap();
        std::fs::write(pkg.join("SKILL.md"), "---\nname: s\n---\n").unwrap();
        let runner = json!({"id": "s", "execution_modes": ["auto"],
            "schemas": {"input": "assets/i\nput.json", "parameter": "p.json", "output": "o.json"}});
        std::fs::write(pkg.join("assets/runner.json"), runner.to_string()).unwrap();
        let e = load(&pkg, &known()).unwrap_err().to_string();
        assert!(e.starts_with("Skill package missing required files: assets/i\\nput.json"), "{e:?}");
        assert!(!e.contains('\n'), "{e:?}");
    }

    #[test]
    fn manifest_messages_match_upstream() {
        let base = || json!({"id": "x", "execution_modes": ["auto"], "schemas": {"input": "i", "parameter": "p", "output": "o"}});
        let with = |k: &str, v: Value| {
            let mut m = base();
            m[k] = v;
            m
        };
        let mut no_modes = base();
        no_modes.as_object_mut().unwrap().remove("execution_modes");
        assert_eq!(manifest_msg(no_modes).unwrap(), "'execution_modes' is a required property");
        assert_eq!(manifest_msg(with("execution_modes", json!([]))).unwrap(), "[] should be non-empty");
        assert_eq!(
            manifest_msg(with("execution_modes", json!(["batch"]))).unwrap(),
            "'batch' is not one of ['auto', 'interactive']"
        );
        assert_eq!(
            manifest_msg(with("execution_modes", json!(["auto", "auto"]))).unwrap(),
            "['auto', 'auto'] has non-unique elements"
        );
        assert_eq!(
            manifest_msg(with("engines", json!(["opencode"]))).unwrap(),
            "'opencode' is not one of ['codex', 'gemini', 'iflow']"
        );
        assert_eq!(manifest_msg(with("engines", json!([]))).unwrap(), "[] should be non-empty");
        assert_eq!(
            manifest_msg(with("engines", json!("gemini"))).unwrap(),
            "'gemini' is not of type 'array'"
        );
        assert_eq!(
            manifest_msg(with("schemas", json!({"input": "i", "parameter": "p"}))).unwrap(),
            "'output' is a required property"
        );
        assert_eq!(manifest_msg(with("artifacts", json!({}))).unwrap(), "{} is not of type 'array'");
        assert_eq!(manifest_msg(base()), None);
    }

    #[test]
    fn engine_policy_messages() {
        let k = known();
        let policy = |m: Value| engine_policy(m.as_object().unwrap(), &k).map_err(|e| e.0);
        assert_eq!(
            policy(json!({"engines": ["gemini"], "unsupported_engines": ["gemini"]})).unwrap_err(),
            "runner.json engines and unsupported_engines must not overlap: gemini"
        );
        assert_eq!(
            policy(json!({"unsupported_engines": ["codex", "gemini", "iflow"]})).unwrap_err(),
            "runner.json effective engines must not be empty"
        );
        assert_eq!(
            policy(json!({"unsupport_engine": []})).unwrap_err(),
            "runner.json field 'unsupport_engine' has been renamed to 'unsupported_engines'"
        );
        let (d, u, e) = policy(json!({"unsupported_engines": ["gemini"]})).unwrap();
        assert!(d.is_empty());
        assert_eq!(u, ["gemini"]);
        assert_eq!(e, ["codex", "iflow"]);
    }

    #[test]
    fn meta_messages_match_upstream() {
        assert_eq!(
            meta_error("input", &json!({"type": "object", "properties": {"a": {"x-input-source": "url"}}}))
                .unwrap(),
            "'url' is not one of ['file', 'inline']"
        );
        assert_eq!(meta_error("input", &json!({"type": "array"})).unwrap(), "'object' was expected");
        assert_eq!(meta_error("input", &json!({})).unwrap(), "'type' is a required property");
        assert_eq!(
            meta_error("parameter", &json!({"type": "object", "properties": {"a": true}})).unwrap(),
            "True is not of type 'object'"
        );
        assert_eq!(
            meta_error("output", &json!({"type": "object", "properties": {"a": {"x-type": "binary"}}}))
                .unwrap(),
            "'binary' is not one of ['artifact', 'file']"
        );
        assert_eq!(
            meta_error("output", &json!({"type": "object", "properties": {"a": {"x-role": ""}}})).unwrap(),
            "'' should be non-empty"
        );
    }

    #[test]
    fn front_matter_and_versions() {
        assert_eq!(front_matter_name("---\nname: demo\n---\nbody").as_deref(), Some("demo"));
        assert_eq!(front_matter_name("---\nname: \"demo\"\nx: 1\n---\n").as_deref(), Some("demo"));
        assert_eq!(front_matter_name("name: demo\n"), None);
        assert_eq!(front_matter_name("---\nname:\n---\n"), None);
        for ok in ["1", "1.0.0", "2.0rc1", "1.0.post2", "1.2.dev3", "v1.2"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["abc", "1.", "", "1..2", "1.0-beta"] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn inference() {
        let output = json!({"type": "object", "properties": {
            "text": {"type": "string", "x-type": "artifact", "x-filename": "text.md", "x-role": "text"},
            "info_path": {"type": "string", "x-type": "file"},
            "plain": {"type": "string"}
        }, "required": ["text"]});
        let order = property_order(output.to_string().as_bytes());
        let specs = artifacts_of(&Map::new(), &output, &order).unwrap();
        assert_eq!(
            specs,
            [
                ArtifactSpec {
                    role: "output".into(),
                    pattern: "info_path".into(),
                    mime: None,
                    required: false
                },
                ArtifactSpec { role: "text".into(), pattern: "text.md".into(), mime: None, required: true },
            ]
        );
        // The file's order, not the map's; a repeated name keeps its first place.
        let text = br#"{"properties": {"z": {"x-type": "file"}, "a": {"x-type": "file"}, "z": {}}}"#;
        assert_eq!(property_order(text), ["z", "a"]);
        assert_eq!(property_order(br#"{"type": "object"}"#), Vec::<String>::new());
    }
}
