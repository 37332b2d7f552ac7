//! One test per rejection (code, subject, message), plus the accepted shapes.

use serde_json::json;

use super::*;

fn ok(v: Value) -> Manifest {
    parse_value(&v).unwrap_or_else(|e| panic!("rejected: {e}"))
}

/// Parses and returns the error line.
fn rejected(v: Value) -> String {
    match parse_value(&v) {
        Ok(m) => panic!("accepted: {m:?}"),
        Err(e) => e.to_string(),
    }
}

fn item_with(patch: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let mut item = json!({
        "id": "a",
        "apply": "writeFile",
        "source": {"type": "inlineText", "text": "hi"},
        "target": {"root": "WORKSPACE", "path": "notes/a.txt"}
    });
    patch(item.as_object_mut().unwrap());
    json!({"version": 1, "items": [item]})
}

#[test]
fn seed_example_parses_wrapped_and_bare() {
    let inner = json!({
        "version": 1,
        "envPatch": {"HOME": "/home/agent", "USER": "agent", "LOGNAME": "agent"},
        "items": [
            {"id": "workspace", "apply": "bindMount", "access": "rw",
             "source": {"type": "hostPath", "path": "/srv/ws/run-1"},
             "target": {"root": "WORKSPACE", "path": "."}},
            {"id": "skills", "apply": "downloadExtract", "access": "rw",
             "source": {"type": "httpZip", "uri": "/api/acp-proxy/skills/packages/x.zip"},
             "target": {"root": "USER_HOME", "path": ".codex/skills"}}
        ]
    });
    let bare = ok(inner.clone());
    let wrapped = ok(json!({"agentInputs": inner, "env": {"IGNORED": "1"}}));
    assert_eq!(bare, wrapped);
    assert_eq!(bare.items.len(), 2);
    assert_eq!(bare.items[0].target, Target { root: Root::Workspace, path: String::new() });
    assert!(bare.items[0].target.is_root());
    assert_eq!(bare.items[1].apply, Apply::DownloadExtract);
    assert_eq!(
        bare.env_patch.pairs(),
        vec![("HOME", "/home/agent"), ("USER", "agent"), ("LOGNAME", "agent")]
    );
}

#[test]
fn seed_names_are_accepted_as_aliases() {
    let m = ok(json!({"version": 1, "items": [
        {"id": "z", "apply": "extract", "source": {"type": "http_zip", "uri": "/z.zip"},
         "target": {"root": "USER_HOME", "path": "x"}},
        {"id": "t", "apply": "writeFile", "source": {"type": "inline_text", "text": ""},
         "target": {"root": "SCRATCH", "path": "t"}},
        {"id": "h", "apply": "copy", "source": {"type": "host_path", "path": "/srv"},
         "target": {"root": "SCRATCH", "path": "h"}},
        {"id": "g", "apply": "checkout", "source": {"type": "git", "repo": "https://example.org/r.git", "ref": "main"},
         "target": {"root": "WORKSPACE", "path": "."}}
    ]}));
    assert_eq!(m.items[0].source, Source::HttpZip { uri: "/z.zip".into(), content_hash: None });
    assert_eq!(m.items[1].source, Source::InlineText { text: String::new() });
    assert_eq!(m.items[2].source, Source::HostPath { path: "/srv".into() });
    assert_eq!(
        m.items[3].source,
        Source::Git { repo: "https://example.org/r.git".into(), git_ref: Some("main".into()) }
    );
    // Serialized with the backend's names.
    let out = serde_json::to_value(&m).unwrap();
    assert_eq!(out["items"][0]["source"]["type"], "httpZip");
    assert_eq!(out["items"][0]["apply"], "downloadExtract");
    assert_eq!(out["items"][0]["access"], "rw");
    assert_eq!(out["items"][1]["target"]["root"], "SCRATCH");
}

#[test]
fn empty_items_and_null_envpatch_are_fine() {
    let m = ok(json!({"version": 1, "envPatch": null, "items": []}));
    assert!(m.items.is_empty());
    assert!(m.env_patch.is_empty());
}

#[test]
fn not_json() {
    let e = parse(b"{not json").unwrap_err();
    assert_eq!(e.code, Code::Invalid);
    assert!(e.to_string().starts_with("INVALID_AGENT_INPUTS: not valid JSON: "), "{e}");
}

#[test]
fn not_an_object() {
    assert_eq!(rejected(json!([1])), "INVALID_AGENT_INPUTS: agentInputs must be a JSON object");
    assert_eq!(
        rejected(json!({"agentInputs": 3})),
        "INVALID_AGENT_INPUTS: agentInputs must be a JSON object"
    );
}

#[test]
fn env_key_is_refused() {
    let e = rejected(json!({"version": 1, "items": [], "env": {"OPENAI_API_KEY": "x"}}));
    assert!(e.starts_with("INVALID_AGENT_INPUTS: agentInputs must not carry env"), "{e}");
}

#[test]
fn unknown_top_level_key() {
    let e = rejected(json!({"version": 1, "items": [], "itemz": []}));
    assert_eq!(e, "INVALID_AGENT_INPUTS: unknown key \"itemz\" (v1 has version, envPatch, items)");
}

#[test]
fn unsupported_versions() {
    for v in [json!(2), json!(0), json!("1"), json!(1.5), json!(null)] {
        let e = rejected(json!({"version": v, "items": []}));
        assert!(e.starts_with("UNSUPPORTED_AGENT_INPUTS_VERSION: version "), "{e}");
    }
    assert_eq!(
        rejected(json!({"items": []})),
        "UNSUPPORTED_AGENT_INPUTS_VERSION: version is missing (only the integer 1 is supported)"
    );
}

#[test]
fn items_missing_or_not_array_or_too_many() {
    assert_eq!(rejected(json!({"version": 1})), "INVALID_AGENT_INPUTS_ITEMS: items is missing");
    assert_eq!(
        rejected(json!({"version": 1, "items": {}})),
        "INVALID_AGENT_INPUTS_ITEMS: items must be an array"
    );
    let many: Vec<Value> = (0..=MAX_ITEMS).map(|_| json!({})).collect();
    let e = rejected(json!({"version": 1, "items": many}));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEMS: 1001 items"), "{e}");
}

#[test]
fn env_patch_not_object() {
    assert_eq!(
        rejected(json!({"version": 1, "items": [], "envPatch": ["HOME"]})),
        "INVALID_AGENT_INPUTS_ENV_PATCH: envPatch must be an object"
    );
}

#[test]
fn env_patch_key_outside_allowlist() {
    for key in ["TUIXIU_RUN_ID", "GH_TOKEN", "PATH", "LD_PRELOAD"] {
        let e = rejected(json!({"version": 1, "items": [], "envPatch": {key: "x"}}));
        assert_eq!(
            e,
            format!("INVALID_AGENT_INPUTS_ENV_PATCH_KEY:{key}: envPatch may only set HOME, USER, LOGNAME")
        );
    }
}

#[test]
fn env_patch_values_are_checked() {
    let cases = [
        (json!({"HOME": 1}), "envPatch.HOME must be a string"),
        (json!({"HOME": "relative/home"}), "envPatch.HOME must be an absolute path without '..'"),
        (json!({"HOME": "/home/../etc"}), "envPatch.HOME must be an absolute path without '..'"),
        (json!({"USER": ""}), "envPatch.USER must be a user name"),
        (json!({"LOGNAME": "a b"}), "envPatch.LOGNAME must be a user name"),
    ];
    for (patch, want) in cases {
        let e = rejected(json!({"version": 1, "items": [], "envPatch": patch}));
        assert!(e.starts_with(&format!("INVALID_AGENT_INPUTS_ENV_PATCH: {want}")), "{e}");
    }
    // Keys are trimmed, as the Node proxy does.
    let m = ok(json!({"version": 1, "items": [], "envPatch": {" HOME ": "/home/x"}}));
    assert_eq!(m.env_patch.home.as_deref(), Some("/home/x"));
}

#[test]
fn item_not_object_uses_position() {
    let e = rejected(json!({"version": 1, "items": [item_with(|_| {})["items"][0].clone(), "x"]}));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM:2: item must be an object");
}

#[test]
fn item_id_missing_empty_or_bad() {
    for id in [json!(null), json!(""), json!("   "), json!(7)] {
        let e = rejected(item_with(|o| {
            o.insert("id".into(), id.clone());
        }));
        assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_ID:1: id must be a non-empty string");
    }
    let e = rejected(item_with(|o| {
        o.insert("id".into(), json!("a\nb"));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_ID:1: id must be at most 200 bytes"), "{e}");
    let long = "x".repeat(201);
    let e = rejected(item_with(|o| {
        o.insert("id".into(), json!(long));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_ID:1: "), "{e}");
}

#[test]
fn item_ids_are_trimmed_and_unique() {
    let item = item_with(|o| {
        o.insert("id".into(), json!("  a "));
    })["items"][0]
        .clone();
    assert_eq!(ok(json!({"version": 1, "items": [item.clone()]})).items[0].id, "a");
    let e = rejected(json!({"version": 1, "items": [item.clone(), item]}));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_ID:a: duplicate id (ids must be unique within a manifest)");
}

#[test]
fn item_unknown_key() {
    let e = rejected(item_with(|o| {
        o.insert("acess".into(), json!("ro"));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM:a: unknown key \"acess\""), "{e}");
}

#[test]
fn item_name_must_be_short_text() {
    let m = ok(item_with(|o| {
        o.insert("name".into(), json!("My skill"));
    }));
    assert_eq!(m.items[0].name.as_deref(), Some("My skill"));
    let e = rejected(item_with(|o| {
        o.insert("name".into(), json!(5));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM:a: name must be a string"), "{e}");
}

#[test]
fn item_apply_unknown_or_missing() {
    let e = rejected(item_with(|o| {
        o.insert("apply".into(), json!("symlink"));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_APPLY:a: apply \"symlink\" is not one of"), "{e}");
    let e = rejected(item_with(|o| {
        o.remove("apply");
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_APPLY:a: apply must be one of"), "{e}");
}

#[test]
fn item_access() {
    assert_eq!(ok(item_with(|_| {})).items[0].access, Access::Rw);
    let m = ok(item_with(|o| {
        o.insert("access".into(), json!("ro"));
    }));
    assert_eq!(m.items[0].access, Access::Ro);
    let e = rejected(item_with(|o| {
        o.insert("access".into(), json!("readonly"));
    }));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_ACCESS:a: access must be \"ro\" or \"rw\"");
}

/// Keys are the sender's text: a control character in one must not
/// split the error line (found by the `manifest` fuzz target).
#[test]
fn keys_in_errors_are_escaped_to_one_line() {
    let e = rejected(json!({"version": 1, "items": [], "envPatch": {"A\nB": "x"}}));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ENV_PATCH_KEY:A\\nB: envPatch may only set HOME, USER, LOGNAME");
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": "x", "m\rode": 7}));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_TARGET:a: unknown key target.m\\rode ("), "{e}");
    let e = rejected(item_with(|o| {
        o.insert("source".into(), json!({"type": "inlineText", "text": "t", "p\nh": 1}));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE:a: unknown key source.p\\nh for"), "{e}");
}

#[test]
fn target_must_be_object() {
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!("WORKSPACE/x"));
    }));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target must be an object with root and path");
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": "x", "mode": 7}));
    }));
    assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_TARGET:a: unknown key target.mode"), "{e}");
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": 3}));
    }));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target.path must be a string");
}

#[test]
fn target_root_must_be_known() {
    for root in [json!("HOME"), json!("workspace"), json!(null)] {
        let e = rejected(item_with(|o| {
            o.insert("target".into(), json!({"root": root.clone(), "path": "x"}));
        }));
        assert_eq!(
            e,
            "INVALID_AGENT_INPUTS_ITEM_TARGET_ROOT:a: target.root must be WORKSPACE, USER_HOME or SCRATCH"
        );
    }
}

#[test]
fn target_path_escapes_are_refused() {
    let escaping = ["..", "../x", "a/../../b", "a/..", "a\\..\\b", "./.."];
    for path in escaping {
        let e = rejected(item_with(|o| {
            o.insert("target".into(), json!({"root": "WORKSPACE", "path": path}));
        }));
        assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target.path must not escape root", "{path}");
    }
    for path in ["/etc/passwd", "\\etc", "C:/x", "c:x", " /x"] {
        let e = rejected(item_with(|o| {
            o.insert("target".into(), json!({"root": "WORKSPACE", "path": path}));
        }));
        assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target.path must be relative", "{path}");
    }
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": "a\u{0}b"}));
    }));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target.path must not contain NUL");
    // Found by the `manifest` fuzz target: a newline in the path split the
    // plan's and the audit's lines.
    for path in [".cod\nex/skills", "a\u{1b}[31mb", "x\ty"] {
        let e = rejected(item_with(|o| {
            o.insert("target".into(), json!({"root": "USER_HOME", "path": path}));
        }));
        assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:a: target.path must not contain control characters");
    }
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": "x".repeat(256)}));
    }));
    assert!(e.contains("longer than 255 bytes"), "{e}");
    let e = rejected(item_with(|o| {
        o.insert("target".into(), json!({"root": "WORKSPACE", "path": "a/".repeat(2001)}));
    }));
    assert!(e.contains("too long"), "{e}");
}

#[test]
fn target_paths_are_normalized() {
    let cases = [
        ("", ""),
        (".", ""),
        ("./", ""),
        ("a//b/./c/", "a/b/c"),
        ("  .codex\\skills\\x ", ".codex/skills/x"),
        ("..a/b..", "..a/b.."),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_target_path(raw).unwrap(), want, "{raw:?}");
    }
    let m = ok(item_with(|o| {
        o.insert("target".into(), json!({"root": "USER_HOME"}));
    }));
    assert!(m.items[0].target.is_root());
    assert_eq!(m.items[0].target.display(), "USER_HOME/.");
}

#[test]
fn source_must_be_object_with_known_type() {
    let e = rejected(item_with(|o| {
        o.insert("source".into(), json!("hi"));
    }));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_SOURCE:a: source must be an object with a type");
    let e = rejected(item_with(|o| {
        o.insert("source".into(), json!({"type": "ftp", "uri": "x"}));
    }));
    assert_eq!(
        e,
        "INVALID_AGENT_INPUTS_ITEM_SOURCE_TYPE:a: source.type must be hostPath, httpZip, inlineText or git"
    );
    let e = rejected(item_with(|o| {
        o.insert("source".into(), json!({"type": "inlineText", "text": "x", "path": "/etc"}));
    }));
    assert!(
        e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE:a: unknown key source.path for a inlineText source"),
        "{e}"
    );
}

fn with_source(apply: &str, source: Value) -> Value {
    item_with(|o| {
        o.insert("apply".into(), json!(apply));
        o.insert("source".into(), source);
    })
}

#[test]
fn host_path_source() {
    for bad in [
        json!({"type": "hostPath"}),
        json!({"type": "hostPath", "path": " "}),
        json!({"type": "hostPath", "path": "a\u{1}"}),
    ] {
        let e = rejected(with_source("copy", bad));
        assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE_HOST_PATH:a: source.path must be"), "{e}");
    }
}

#[test]
fn http_zip_source() {
    for bad in [
        json!({"type": "httpZip"}),
        json!({"type": "httpZip", "uri": ""}),
        json!({"type": "httpZip", "uri": "/a b.zip"}),
    ] {
        let e = rejected(with_source("downloadExtract", bad));
        assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE_URI:a: source.uri must be"), "{e}");
    }
    let hash = "AB".repeat(32);
    let m = ok(with_source(
        "downloadExtract",
        json!({"type": "httpZip", "uri": "/x.zip", "contentHash": format!("sha256:{hash}")}),
    ));
    assert_eq!(
        m.items[0].source,
        Source::HttpZip { uri: "/x.zip".into(), content_hash: Some("ab".repeat(32)) }
    );
    for bad in [json!("abc"), json!("../../etc/passwd"), json!("g".repeat(64)), json!(12)] {
        let e = rejected(with_source(
            "downloadExtract",
            json!({"type": "httpZip", "uri": "/x.zip", "contentHash": bad}),
        ));
        assert!(
            e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE_CONTENT_HASH:a: source.contentHash must be"),
            "{e}"
        );
    }
}

#[test]
fn inline_text_source() {
    let e = rejected(with_source("writeFile", json!({"type": "inlineText"})));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_SOURCE_TEXT:a: source.text must be a string");
    let e = rejected(with_source("writeFile", json!({"type": "inlineText", "text": 5})));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_SOURCE_TEXT:a: source.text must be a string");
}

#[test]
fn git_source() {
    for bad in [
        json!({"type": "git"}),
        json!({"type": "git", "repo": "--upload-pack=evil"}),
        json!({"type": "git", "repo": "a b"}),
    ] {
        let e = rejected(with_source("checkout", bad));
        assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE_REPO:a: "), "{e}");
    }
    for bad in ["-b", "a..b", "main~1", "HEAD^", "a b", "x.lock", "", "refs//x", "a:b"] {
        let e = rejected(with_source("checkout", json!({"type": "git", "repo": "/r.git", "ref": bad})));
        assert!(e.starts_with("INVALID_AGENT_INPUTS_ITEM_SOURCE_REF:a: "), "{bad:?}: {e}");
    }
    for good in ["main", "release/1.2", "v1.0.0", "0123abcd", "feature_x-y"] {
        ok(with_source("checkout", json!({"type": "git", "repo": "/r.git", "ref": good})));
    }
}

#[test]
fn source_must_suit_apply() {
    let cases = [
        (
            "bindMount",
            json!({"type": "httpZip", "uri": "/x"}),
            "bindMount requires source.type hostPath (got httpZip)",
        ),
        (
            "copy",
            json!({"type": "inlineText", "text": ""}),
            "copy requires source.type hostPath (got inlineText)",
        ),
        (
            "downloadExtract",
            json!({"type": "hostPath", "path": "/x"}),
            "downloadExtract requires source.type httpZip (got hostPath)",
        ),
        (
            "writeFile",
            json!({"type": "git", "repo": "/r"}),
            "writeFile requires source.type inlineText (got git)",
        ),
        (
            "checkout",
            json!({"type": "httpZip", "uri": "/x"}),
            "checkout requires source.type git (got httpZip)",
        ),
    ];
    for (apply, source, want) in cases {
        let e = rejected(with_source(apply, source));
        assert_eq!(e, format!("INVALID_AGENT_INPUTS_ITEM_APPLY_SOURCE:a: {want}"));
    }
}

#[test]
fn first_error_wins_in_item_order() {
    let good = item_with(|_| {})["items"][0].clone();
    let mut bad = good.clone();
    bad["id"] = json!("second");
    bad["target"]["path"] = json!("../x");
    let mut worse = good.clone();
    worse["id"] = json!("third");
    worse["apply"] = json!("nope");
    let e = rejected(json!({"version": 1, "items": [good, bad, worse]}));
    assert_eq!(e, "INVALID_AGENT_INPUTS_ITEM_TARGET:second: target.path must not escape root");
}
