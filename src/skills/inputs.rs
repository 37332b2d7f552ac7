//! Inputs and parameters of a job (docs/skills.md, "Inputs, parameters and the
//! prompt").
//!
//! * At create, only inline inputs are checked: an undeclared key, or a
//!   file-sourced key sent inline, is an error, then the inline values are
//!   validated against the inline part of the input schema.
//! * Before the engine starts, the mixed input context is built: a file
//!   field is found by strict key matching, as the regular file
//!   `uploads/<field_name>` (a directory or a symlink of that name does not
//!   count), and given as the absolute path the engine sees inside the
//!   sandbox; an inline field is its raw JSON value. Missing required files
//!   fail the job before the engine starts. The context is then validated
//!   against the whole input schema, and the parameters against theirs.

use std::os::fd::BorrowedFd;

use nix::sys::stat::SFlag;
use serde_json::{Map, Value, json};

use super::messages::{py_list, py_str, schema_line};
use super::package::{Skill, Source};

/// Failed validation: every message, reported together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Input validation failed: {}", py_list(.0))]
pub struct InputErrors(pub Vec<String>);

/// The create-time check of the request's `input` (inline values only).
pub fn check_inline(skill: &Skill, input: &Map<String, Value>) -> Result<(), InputErrors> {
    let sources = skill.input_sources();
    let mut errors = Vec::new();
    for key in input.keys() {
        match sources.iter().find(|(k, _)| k == key) {
            None => errors.push(format!("input validation error: unknown input key {}", py_str(key))),
            Some((_, Source::File)) => errors.push(format!(
                "input validation error: key {} is file-sourced; upload file via /upload",
                py_str(key)
            )),
            Some((_, Source::Inline)) => {}
        }
    }
    // The inline part of the schema: its properties, and the required keys
    // among them.
    let props = skill.input.json.get("properties").and_then(Value::as_object);
    let inline: Map<String, Value> = props
        .into_iter()
        .flatten()
        .filter(|(k, _)| sources.iter().any(|(s, src)| s == *k && *src == Source::Inline))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let required: Vec<String> =
        skill.input_required().into_iter().filter(|k| inline.contains_key(k)).collect();
    let schema = json!({"type": "object", "properties": inline, "required": required});
    let payload: Map<String, Value> =
        input.iter().filter(|(k, _)| inline.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    match jsonschema::validator_for(&schema) {
        Ok(v) => {
            let payload = Value::Object(payload);
            errors.extend(v.iter_errors(&payload).map(|e| schema_line("input validation error", &e)));
        }
        Err(e) => errors.push(format!("input validation error: {e}")),
    }
    if errors.is_empty() { Ok(()) } else { Err(InputErrors(errors)) }
}

/// The mixed input context and the parameter context, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Contexts {
    pub input: Map<String, Value>,
    pub parameter: Map<String, Value>,
}

/// Builds and validates the contexts just before the engine starts.
/// `uploads` is the run's uploads directory; `guest_uploads` where the
/// sandbox shows it (`/workspace/uploads`).
pub fn build(
    skill: &Skill,
    input: &Map<String, Value>,
    parameter: &Map<String, Value>,
    uploads: BorrowedFd<'_>,
    guest_uploads: &str,
) -> Result<Contexts, InputErrors> {
    // The create-time check again (the skill may have changed since).
    let mut errors = check_inline(skill, input).err().map(|e| e.0).unwrap_or_default();
    let required = skill.input_required();
    let mut context = Map::new();
    let mut missing = Vec::new();
    for (key, source) in skill.input_sources() {
        match source {
            Source::File => {
                if is_regular_file(uploads, &key) {
                    context.insert(key.clone(), Value::String(format!("{guest_uploads}/{key}")));
                } else if required.contains(&key) {
                    missing.push(key);
                }
            }
            Source::Inline => {
                if let Some(v) = input.get(&key) {
                    context.insert(key, v.clone());
                }
            }
        }
    }
    if !missing.is_empty() {
        errors.push(format!("Missing required input files: {}", missing.join(", ")));
    }
    let context_value = Value::Object(context.clone());
    errors.extend(
        skill.input.validator.iter_errors(&context_value).map(|e| schema_line("input validation error", &e)),
    );
    // Parameters: the whole payload against the parameter schema.
    let parameter_value = Value::Object(parameter.clone());
    errors.extend(
        skill
            .parameter
            .validator
            .iter_errors(&parameter_value)
            .map(|e| schema_line("parameter validation error", &e)),
    );
    if !errors.is_empty() {
        return Err(InputErrors(errors));
    }
    // Only declared parameters reach the engine (upstream).
    let declared = skill.parameter.json.get("properties").and_then(Value::as_object);
    let parameter = parameter
        .iter()
        .filter(|(k, _)| declared.is_some_and(|d| d.contains_key(*k)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Contexts { input: context, parameter })
}

/// Strict key matching: `name` directly in `dir`, a regular file, not
/// followed if it is a symlink.
fn is_regular_file(dir: BorrowedFd<'_>, name: &str) -> bool {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::fstatat;
    if !crate::hostfs::beneath::is_plain_name(name) {
        return false;
    }
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG,
        Err(_) => false,
    }
}
