//! The declarations against the parser and the docs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::*;
use crate::proxy::config::{parse, reader::Reader};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn keys_and_variables_are_unique() {
    let mut keys = BTreeSet::new();
    let mut vars = BTreeSet::new();
    for k in SCHEMA {
        assert!(keys.insert(k.dotted()), "{} declared twice", k.dotted());
        if let Some(var) = k.env() {
            assert!(vars.insert(var.clone()), "{var} names two keys");
        }
        assert!(TABLES.contains(&k.table) || k.table.is_empty(), "{}: unknown table", k.dotted());
        let derived = matches!(k.kind, Kind::Int { .. } | Kind::Bool { .. });
        assert_eq!(k.default.is_empty(), derived, "{}: default text", k.dotted());
        assert!(!k.meaning.is_empty(), "{}: no meaning", k.dotted());
    }
}

/// Parsing a minimal config asks for every declared key (and can ask for
/// no other: [`Reader`] only takes a [`Key`]).
#[test]
fn parsing_reads_every_declared_key() {
    let root = std::env::temp_dir().join(format!("tuixiu-config-keys-{}", std::process::id()));
    let text = format!(
        "orchestrator_url = \"ws://127.0.0.1:1/ws/agent\"\n[sandbox]\nworkspaceHostRoot = {:?}\n",
        root.display().to_string()
    );
    let mut r = Reader::new("proxy.toml", toml::from_str(&text).unwrap(), &BTreeMap::new());
    parse::config(&mut r).unwrap();
    let asked: BTreeSet<String> = r.asked.iter().map(|k| k.dotted()).collect();
    let declared: BTreeSet<String> = SCHEMA.iter().map(|k| k.dotted()).collect();
    assert_eq!(asked, declared);
    assert_eq!(r.asked.len(), SCHEMA.len(), "a key is read twice");
    let _ = std::fs::remove_dir_all(&root);
}

/// Every declared key with a variable is overridden by it.
#[test]
fn every_variable_reaches_its_key() {
    for k in SCHEMA.iter().filter(|k| k.env().is_some()) {
        let env = BTreeMap::from([(k.env().unwrap(), "x".to_string())]);
        let mut r = Reader::new("environment", toml::Table::new(), &env);
        assert!(r.take(k).is_some(), "{}", k.dotted());
        assert!(r.unused().is_empty());
    }
}

const TABLE_START: &str = "<!-- config keys: generated from src/proxy/config/keys.rs -->\n";
const TABLE_END: &str = "<!-- end of config keys -->";

/// docs/proxy.md's key table is [`docs_table`]; `UPDATE_DOCS=1` rewrites it.
#[test]
fn docs_table_is_generated() {
    let path = repo_file("docs/proxy.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let start =
        text.find(TABLE_START).expect("docs/proxy.md: no config keys start marker") + TABLE_START.len();
    let end = start + text[start..].find(TABLE_END).expect("docs/proxy.md: no config keys end marker");
    let want = docs_table();
    if text[start..end] == want {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    panic!(
        "docs/proxy.md's key table differs from the declarations; run \
         `UPDATE_DOCS=1 cargo test --lib proxy::config` to rewrite it. Expected:\n{want}"
    );
}

/// The keys docs/proxy.toml.example shows, set or commented out, as
/// `(table, key, value, commented)`; a table header shows its key too.
fn example_keys(text: &str) -> Vec<(String, String, String, bool)> {
    let mut out = Vec::new();
    let mut table = String::new();
    let mut sub_table = false;
    for line in text.lines() {
        let commented = line.starts_with('#');
        let body = line.trim_start_matches('#').trim();
        if let Some(header) = body.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let header = header.trim_matches(['[', ']']);
            match header.split_once('.') {
                Some((t, k)) => {
                    out.push((t.to_string(), k.to_string(), String::new(), commented));
                    table = t.to_string();
                    sub_table = true;
                }
                None => {
                    table = header.to_string();
                    sub_table = false;
                }
            }
            continue;
        }
        let Some((key, rest)) = body.split_once(" = ") else { continue };
        let is_name = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_name || sub_table || (commented && !line.starts_with("# ")) {
            continue;
        }
        let value = rest.split(" #").next().unwrap_or("").trim().to_string();
        out.push((table.clone(), key.to_string(), value, commented));
    }
    out
}

/// docs/proxy.toml.example shows every declared key and no other, and a
/// number or boolean it leaves commented out is the default.
#[test]
fn example_file_shows_every_key() {
    let text = std::fs::read_to_string(repo_file("docs/proxy.toml.example")).unwrap();
    let shown = example_keys(&text);
    let names: BTreeSet<String> =
        shown.iter().map(|(t, k, _, _)| if t.is_empty() { k.clone() } else { format!("{t}.{k}") }).collect();
    let declared: BTreeSet<String> = SCHEMA.iter().map(|k| k.dotted()).collect();
    let ignored: BTreeSet<String> =
        IGNORED.iter().map(|(t, k)| if t.is_empty() { k.to_string() } else { format!("{t}.{k}") }).collect();
    let missing: Vec<_> = declared.difference(&names).collect();
    let unknown: Vec<_> = names.difference(&declared).filter(|k| !ignored.contains(*k)).collect();
    assert!(missing.is_empty(), "docs/proxy.toml.example does not show {missing:?}");
    assert!(unknown.is_empty(), "docs/proxy.toml.example shows undeclared keys {unknown:?}");
    for (table, key, value, _) in shown.iter().filter(|s| s.3) {
        let Some(k) = SCHEMA.iter().find(|k| k.table == table && k.name == key) else { continue };
        let default = match k.kind {
            Kind::Int { default, .. } => default.to_string(),
            Kind::Bool { default } => default.to_string(),
            _ => continue,
        };
        assert_eq!(
            *value,
            default,
            "docs/proxy.toml.example: commented-out {} is not the default",
            k.dotted()
        );
    }
}

#[test]
fn help_lists_every_variable() {
    let help = help_text();
    for k in SCHEMA {
        let line = help.lines().find(|l| l.trim_start().starts_with(&format!("{} ", k.dotted())));
        let line = line.unwrap_or_else(|| panic!("--help: no line for {}", k.dotted()));
        if let Some(var) = k.env() {
            assert!(line.contains(&var), "{line}");
        }
    }
}
