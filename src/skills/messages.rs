//! Error wording shared with the upstream Skill Runner.
//!
//! Clients of the Skill Runner protocol match on its messages, which come
//! from Python: values are shown as Python `repr()` (`'text'`, `True`,
//! `None`, `['a', 'b']`) and JSON Schema failures use the wording of the
//! Python `jsonschema` package (`5 is not of type 'string'`). This module
//! renders both, so the runner.json checks and the schema validation of
//! inputs, parameters and outputs read the same here. Failures of keywords
//! without a Python counterpart here fall back to the Rust validator's text.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::Value;

/// A JSON value as Python's `repr()` of its decoded form shows it.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(value, &mut out);
    out
}

fn write_repr(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => out.push_str(&py_str(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&py_str(k));
                out.push_str(": ");
                write_repr(v, out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr()` of a `str`: single quotes unless the text has a single
/// quote and no double quote; backslashes and control characters escaped.
pub fn py_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a list of strings, as in
/// `Input validation failed: ['a', "b 'c'"]`.
pub fn py_list(items: &[String]) -> String {
    let parts: Vec<String> = items.iter().map(|s| py_str(s)).collect();
    format!("[{}]", parts.join(", "))
}

/// The message of one schema failure, worded as Python's `jsonschema`.
pub fn schema_message(error: &jsonschema::ValidationError<'_>) -> String {
    let instance = error.instance();
    let inst = py_repr(instance);
    match error.kind() {
        ValidationErrorKind::Required { property } => format!("{} is a required property", py_repr(property)),
        ValidationErrorKind::Type { kind } => match kind {
            TypeKind::Single(t) => format!("{inst} is not of type {}", py_str(t.as_str())),
            TypeKind::Multiple(set) => {
                let names: Vec<String> = set.iter().map(|t| py_str(t.as_str())).collect();
                format!("{inst} is not of type {}", names.join(", "))
            }
        },
        ValidationErrorKind::Enum { options } => format!("{inst} is not one of {}", py_repr(options)),
        ValidationErrorKind::Constant { expected_value } => {
            format!("{} was expected", py_repr(expected_value))
        }
        ValidationErrorKind::Minimum { limit } => format!("{inst} is less than the minimum of {limit}"),
        ValidationErrorKind::Maximum { limit } => format!("{inst} is greater than the maximum of {limit}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("{inst} is less than or equal to the minimum of {limit}")
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("{inst} is greater than or equal to the maximum of {limit}")
        }
        ValidationErrorKind::MinLength { limit } | ValidationErrorKind::MinItems { limit } if *limit == 1 => {
            format!("{inst} should be non-empty")
        }
        ValidationErrorKind::MinLength { .. } | ValidationErrorKind::MinItems { .. } => {
            format!("{inst} is too short")
        }
        ValidationErrorKind::MaxLength { .. } | ValidationErrorKind::MaxItems { .. } => {
            format!("{inst} is too long")
        }
        ValidationErrorKind::UniqueItems => format!("{inst} has non-unique elements"),
        ValidationErrorKind::Pattern { pattern } => format!("{inst} does not match {}", py_str(pattern)),
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let names: Vec<String> = unexpected.iter().map(|s| py_str(s)).collect();
            let verb = if names.len() == 1 { "was" } else { "were" };
            format!("Additional properties are not allowed ({} {verb} unexpected)", names.join(", "))
        }
        ValidationErrorKind::FalseSchema => format!("False schema does not allow {inst}"),
        ValidationErrorKind::Format { format } => format!("{inst} is not a {}", py_str(format)),
        _ => error.to_string(),
    }
}

/// The JSON path of a failure joined by `/`, as upstream's `(Path: a/0)`;
/// empty at the root.
pub fn schema_path(error: &jsonschema::ValidationError<'_>) -> String {
    error.instance_path().segments().map(|s| s.to_string()).collect::<Vec<_>>().join("/")
}

/// `<prefix>: <message> (Path: <path>)`, upstream's line per failure.
pub fn schema_line(prefix: &str, error: &jsonschema::ValidationError<'_>) -> String {
    format!("{prefix}: {} (Path: {})", schema_message(error), schema_path(error))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn python_reprs() {
        assert_eq!(py_repr(&json!(["auto", "auto"])), "['auto', 'auto']");
        assert_eq!(py_repr(&json!({})), "{}");
        assert_eq!(py_repr(&json!(true)), "True");
        assert_eq!(py_repr(&json!(null)), "None");
        assert_eq!(py_repr(&json!({"a": [1, false]})), "{'a': [1, False]}");
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_str("x\ny"), "'x\\ny'");
        assert_eq!(
            py_list(&["Missing required input files: f".into(), "x 'y' z".into()]),
            "['Missing required input files: f', \"x 'y' z\"]"
        );
    }

    #[test]
    fn schema_messages_read_as_python_jsonschema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "divisor": {"type": "integer", "minimum": 1},
                "mode": {"enum": ["a", "b"]},
                "tags": {"type": "array", "minItems": 1}
            },
            "required": ["query", "need"]
        });
        let v = jsonschema::validator_for(&schema).unwrap();
        let instance = json!({"query": 5, "divisor": 0, "mode": "c", "tags": []});
        let mut lines: Vec<String> = v.iter_errors(&instance).map(|e| schema_line("x", &e)).collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "x: 'c' is not one of ['a', 'b'] (Path: mode)",
                "x: 'need' is a required property (Path: )",
                "x: 0 is less than the minimum of 1 (Path: divisor)",
                "x: 5 is not of type 'string' (Path: query)",
                "x: [] should be non-empty (Path: tags)",
            ]
        );
    }
}
