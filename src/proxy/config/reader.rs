//! Reads declared keys out of the parsed file (with the environment
//! overrides applied), remembering which were used so that unknown keys
//! can be warned about.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::ConfigError;
use super::keys::{IGNORED, Key, Kind, SCHEMA, TABLES, env_name};

pub(super) struct Reader<'a> {
    origin: &'a str,
    table: BTreeMap<(String, String), (Value, bool)>,
    /// Every key asked for, present or not (the tests check that parsing
    /// asks for each declared key).
    #[cfg(test)]
    pub(super) asked: Vec<&'static Key>,
}

impl<'a> Reader<'a> {
    /// The file's keys flattened to `(table, key)` (sub-tables of the
    /// declared tables stay values: `capabilities`, `env`), then the
    /// environment overrides of `env`.
    pub(super) fn new(origin: &'a str, doc: toml::Table, env: &BTreeMap<String, String>) -> Self {
        let mut flat = BTreeMap::new();
        for (key, value) in doc {
            let value = serde_json::to_value(&value).unwrap_or(Value::Null);
            match value {
                Value::Object(map) if TABLES.contains(&key.as_str()) => {
                    for (k, v) in map {
                        flat.insert((key.clone(), k), (v, false));
                    }
                }
                other => {
                    flat.insert((String::new(), key), (other, false));
                }
            }
        }
        for k in SCHEMA {
            if k.kind == Kind::Any {
                continue;
            }
            if let Some(raw) = env.get(&env_name(k.table, k.name)) {
                flat.insert((k.table.to_string(), k.name.to_string()), (env_value(k.kind, raw), false));
            }
        }
        Reader {
            origin,
            table: flat,
            #[cfg(test)]
            asked: Vec::new(),
        }
    }

    pub(super) fn err(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Key { origin: self.origin.to_string(), key: key.to_string(), reason: reason.into() }
    }

    fn key_err(&self, k: &Key, reason: impl Into<String>) -> ConfigError {
        self.err(&k.dotted(), reason)
    }

    /// The raw value of `k`, for the free-form keys.
    pub(super) fn take(&mut self, k: &'static Key) -> Option<Value> {
        #[cfg(test)]
        self.asked.push(k);
        self.table.get_mut(&(k.table.to_string(), k.name.to_string())).map(|(v, used)| {
            *used = true;
            v.clone()
        })
    }

    /// A free-form table (`[sandbox.env]`, `[agent.capabilities]`, ...).
    pub(super) fn table(&mut self, k: &'static Key) -> Result<Option<Map<String, Value>>, ConfigError> {
        debug_assert_eq!(k.kind, Kind::Any, "{}", k.name);
        match self.take(k) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(other) => Err(self.key_err(k, format!("expected a table, got {other}"))),
        }
    }

    /// A trimmed string; empty counts as absent.
    pub(super) fn string(&mut self, k: &'static Key) -> Result<Option<String>, ConfigError> {
        debug_assert_eq!(k.kind, Kind::Str, "{}", k.name);
        match self.take(k) {
            None => Ok(None),
            Some(Value::String(s)) => {
                let s = s.trim().to_string();
                Ok(if s.is_empty() { None } else { Some(s) })
            }
            Some(other) => Err(self.key_err(k, format!("expected a string, got {other}"))),
        }
    }

    /// An integer within the key's bounds, its default when absent.
    pub(super) fn int(&mut self, k: &'static Key) -> Result<u64, ConfigError> {
        let Kind::Int { default, min, max } = k.kind else {
            unreachable!("{} is not an integer key", k.name)
        };
        let v = match self.take(k) {
            None => return Ok(default),
            Some(v) => v,
        };
        let n = match &v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.key_err(k, format!("expected an integer between {min} and {max}, got {v}"))),
        }
    }

    /// [`Reader::int`] for a count or size kept as `usize`.
    pub(super) fn size(&mut self, k: &'static Key) -> Result<usize, ConfigError> {
        self.int(k).map(|n| n as usize)
    }

    /// A boolean, its default when absent.
    pub(super) fn boolean(&mut self, k: &'static Key) -> Result<bool, ConfigError> {
        let Kind::Bool { default } = k.kind else { unreachable!("{} is not a boolean key", k.name) };
        match self.take(k) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" | "" => Ok(false),
                _ => Err(self.key_err(k, format!("expected true or false, got {s:?}"))),
            },
            Some(other) => Err(self.key_err(k, format!("expected true or false, got {other}"))),
        }
    }

    /// A list of strings.
    pub(super) fn list(&mut self, k: &'static Key) -> Result<Option<Vec<String>>, ConfigError> {
        debug_assert_eq!(k.kind, Kind::List, "{}", k.name);
        match self.take(k) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    other => Err(self.key_err(k, format!("expected a list of strings, found {other}"))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.key_err(k, format!("expected a list of strings, got {other}"))),
        }
    }

    /// Keys present but never read: warned about, not fatal.
    pub(super) fn unused(&self) -> Vec<String> {
        self.table
            .iter()
            .filter(|(_, (_, used))| !used)
            .filter(|((t, k), _)| !IGNORED.contains(&(t.as_str(), k.as_str())))
            .map(|((t, k), _)| if t.is_empty() { k.clone() } else { format!("{t}.{k}") })
            .collect()
    }
}

/// An environment value converted to the key's type.
fn env_value(kind: Kind, raw: &str) -> Value {
    match kind {
        Kind::Str | Kind::Int { .. } | Kind::Bool { .. } | Kind::Any => Value::String(raw.to_string()),
        Kind::List => {
            let trimmed = raw.trim();
            if trimmed.starts_with('[')
                && let Ok(Value::Array(items)) = serde_json::from_str::<Value>(trimmed)
            {
                return Value::Array(items);
            }
            Value::Array(
                trimmed
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            )
        }
    }
}
