//! What scripts and packagers read: the `--json` outputs against their
//! schemas in docs/schema/ (validated with the `jsonschema` crate), the man
//! pages (`__man`, each rendered by `man -l`), and the shell completions
//! (`completions SHELL`, loaded and exercised in bash; zsh and fish
//! checked by their shells where installed), and `proxy --help`'s list
//! of config keys.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Caller, Fixture};
use serde_json::{Value, json};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn schema(name: &str) -> Value {
    let path = repo().join("docs/schema").join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts `value` is valid against docs/schema/NAME.json (instance.json
/// registered for the references to it).
fn assert_valid(name: &str, value: &Value) {
    let instance = schema("instance");
    let id = instance["$id"].as_str().unwrap().to_string();
    let registry = jsonschema::Registry::new()
        .add(id, jsonschema::Resource::from_contents(instance))
        .unwrap()
        .prepare()
        .unwrap();
    let validator = jsonschema::options().with_registry(&registry).build(&schema(name)).unwrap();
    let errors: Vec<String> =
        validator.iter_errors(value).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{name}: {errors:?}\n{value:#}");
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn check_json_follows_its_schema() {
    let fx = Fixture::new(Caller::Root);
    let out = fx.command(&["check", "--json"]).output().unwrap();
    let v = stdout_json(&out);
    assert_valid("check", &v);
    assert_eq!(out.status.success(), v["runWorks"] == true);
    assert_eq!(v["daemonAlive"], Value::Null);
    // With --daemon, for a directory without a daemon: false, exit 1.
    let out = fx.command(&["check", "--json", "--daemon", fx.dir.to_str().unwrap()]).output().unwrap();
    let v = stdout_json(&out);
    assert_valid("check", &v);
    assert_eq!(v["daemonAlive"], false);
    assert_eq!(out.status.code(), Some(1));
    assert!(v["checks"].as_array().unwrap().iter().any(|c| c["check"] == "daemon" && c["status"] == "fail"));
}

#[test]
fn instance_commands_json_follow_their_schemas() {
    let fx = Fixture::new(Caller::Root);
    let state = fx.dir.join("state");
    let state = state.to_str().unwrap();
    let ws = fx.workspace.to_str().unwrap();
    let name = format!("tuixiu-run-json{}", std::process::id());
    let out = fx
        .command(&["run", "--instance-name", &name, "--state-dir", state, "--workspace", ws, "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out =
        fx.command(&["instances", "--provider", "native", "--state-dir", state, "--json"]).output().unwrap();
    let list = stdout_json(&out);
    assert_valid("instances", &list);
    assert!(list.as_array().unwrap().iter().any(|i| i["name"] == name.as_str()), "{list}");

    let out = fx.command(&["inspect", "--state-dir", state, "--json", &name]).output().unwrap();
    let one = stdout_json(&out);
    assert_valid("instance", &one);
    assert_eq!(one["provider"], "bwrap");
    let out = fx.command(&["rm", "--state-dir", state, "--json", &name]).output().unwrap();
    assert_valid("instance", &stdout_json(&out));
    let out = fx.command(&["inspect", "--state-dir", state, "--json", &name]).output().unwrap();
    let gone = stdout_json(&out);
    assert_valid("instance", &gone);
    assert_eq!(gone["status"], "missing");
    // What the schemas refuse, they refuse (the validator is not vacuous).
    let mut broken = one.clone();
    broken["status"] = json!("sleeping");
    assert!(!jsonschema::is_valid(&schema("instance"), &broken));
}

#[test]
fn manifest_check_json_follows_its_schema() {
    let fx = Fixture::new(Caller::Root);
    let ws = fx.workspace.to_str().unwrap();
    let good = fx.dir.join("good.json");
    std::fs::write(
        &good,
        json!({"version": 1, "envPatch": {"HOME": "/home/dev", "USER": "dev"}, "items": [
            {"id": "ws", "apply": "bindMount", "access": "rw", "source": {"type": "hostPath", "path": ws},
             "target": {"root": "WORKSPACE", "path": "."}},
            {"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": "hello"},
             "target": {"root": "USER_HOME", "path": "notes.txt"}},
            {"id": "zip", "apply": "downloadExtract",
             "source": {"type": "httpZip", "uri": "https://example.com/a.zip?token=t#part"},
             "target": {"root": "WORKSPACE", "path": "vendor"}}]})
        .to_string(),
    )
    .unwrap();
    let out = fx
        .command(&["manifest", "check", "--json", "--workspace", ws, good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let v = stdout_json(&out);
    assert_valid("manifest-check", &v);
    assert_eq!(v["valid"], true);
    assert_eq!(v["items"], 3);
    assert_eq!(v["envPatch"], json!({"HOME": "/home/dev", "USER": "dev"}));
    assert_eq!(v["workspace"]["access"], "rw");
    let plan = v["plan"].as_array().unwrap();
    assert_eq!(plan[0]["workspace"], true);
    assert_eq!(plan[1]["target"], "/home/dev/notes.txt");
    assert_eq!(plan[1]["targetSpec"], "USER_HOME/notes.txt");
    assert_eq!(plan[1]["access"], Value::Null);
    // No query string, no fragment.
    assert_eq!(plan[2]["source"], "https://example.com/a.zip");
    // The same plan as the lines without --json.
    let lines =
        fx.command(&["manifest", "check", "--workspace", ws, good.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8(lines.stdout).unwrap();
    assert!(
        text.contains("notes: writeFile inline text (5 bytes) -> /home/dev/notes.txt (USER_HOME/notes.txt)"),
        "{text}"
    );

    let bad = fx.dir.join("bad.json");
    std::fs::write(
        &bad,
        json!({"version": 1, "items": [{"id": "evil", "apply": "writeFile",
            "source": {"type": "inlineText", "text": "x"}, "target": {"root": "WORKSPACE", "path": "../x"}}]})
        .to_string(),
    )
    .unwrap();
    let out = fx.command(&["manifest", "check", "--json", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = stdout_json(&out);
    assert_valid("manifest-check", &v);
    assert_eq!(v["error"]["code"], "INVALID_AGENT_INPUTS_ITEM_TARGET");
    assert_eq!(v["error"]["item"], "evil");

    let out = fx.command(&["manifest", "check", "--json", "/nonexistent/m.json"]).output().unwrap();
    let v = stdout_json(&out);
    assert_valid("manifest-check", &v);
    assert_eq!(v["error"]["code"], Value::Null);
    assert!(v["error"]["message"].as_str().unwrap().contains("/nonexistent/m.json"), "{v}");
}

/// `__man DIR` writes a page per command (and bwrap's), and `man -l`
/// renders each without a warning.
#[test]
fn man_pages_render() {
    let fx = Fixture::new(Caller::Root);
    let dir = fx.dir.join("man");
    std::fs::create_dir(&dir).unwrap();
    let out = fx.command(&["__man", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut pages: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    pages.sort();
    for want in [
        "tuixiu-sandbox.1",
        "tuixiu-sandbox-full.1",
        "tuixiu-sandbox-run.1",
        "tuixiu-sandbox-proxy.1",
        "tuixiu-sandbox-check.1",
        "tuixiu-sandbox-instances.1",
        "tuixiu-sandbox-inspect.1",
        "tuixiu-sandbox-stop.1",
        "tuixiu-sandbox-rm.1",
        "tuixiu-sandbox-manifest.1",
        "tuixiu-sandbox-manifest-check.1",
        "tuixiu-sandbox-skills.1",
        "tuixiu-sandbox-skills-serve.1",
        "tuixiu-sandbox-skills-run.1",
        "tuixiu-sandbox-skills-check.1",
        "tuixiu-sandbox-bwrap.1",
        "tuixiu-sandbox-completions.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "{want} missing from {pages:?}");
    }
    assert!(!pages.iter().any(|p| p.contains("__")), "hidden commands have no page: {pages:?}");
    for page in &pages {
        let out = Command::new("man")
            .arg("-l")
            .arg(dir.join(page))
            .env("MANWIDTH", "80")
            .env("PAGER", "cat")
            .output()
            .expect("man (man-db) is installed: scripts/ci-setup.d/50-package.sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{page}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{page}:\n{text}");
    }
    let render = |page: &str| {
        let out = Command::new("man").arg("-l").arg(dir.join(page)).env("MANWIDTH", "200").output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(render("tuixiu-sandbox-proxy.1").contains("--metrics-listen"));
    let bwrap = render("tuixiu-sandbox-bwrap.1");
    for o in ["--ro-bind <SRC> <DEST>", "--unshare-all", "--tx-landlock", "nested: refused"] {
        // man(1) renders the option names with Unicode hyphens in some locales.
        assert!(bwrap.replace('\u{2010}', "-").contains(o), "{o} missing:\n{bwrap}");
    }
}

/// The completions a package installs, and `completions SHELL` prints.
#[test]
fn completions_load_and_complete_in_bash() {
    let fx = Fixture::new(Caller::Root);
    let out = fx.command(&["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = fx.dir.join("tuixiu-sandbox.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // Loaded in a fresh non-interactive bash, then asked as readline would
    // ask: the words so far and the index of the one being completed.
    let complete = |words: &str| {
        let probe = format!(
            "source '{}' && complete -p tuixiu-sandbox >/dev/null && \
             COMP_WORDS=({words}) && COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && \
             COMP_LINE=\"${{COMP_WORDS[*]}}\" && COMP_POINT=${{#COMP_LINE}} && \
             _tuixiu_sandbox tuixiu-sandbox \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\" && \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash").args(["--norc", "--noprofile", "-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{words}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let subcommands = complete("tuixiu-sandbox ''");
    for sub in ["run", "proxy", "check", "manifest", "skills", "completions", "bwrap"] {
        assert!(subcommands.lines().any(|l| l == sub), "{sub} not offered: {subcommands}");
    }
    assert!(!subcommands.contains("__exec"), "hidden commands are not offered: {subcommands}");
    assert_eq!(complete("tuixiu-sandbox proxy --metrics-l").trim(), "--metrics-listen");
    assert!(complete("tuixiu-sandbox run --net").contains("--network"));
    assert_eq!(complete("tuixiu-sandbox completions z").trim(), "zsh");

    // zsh and fish: the scripts parse in their shells, where installed.
    for (shell, check) in [("zsh", vec!["-n"]), ("fish", vec!["--no-execute"])] {
        let out = fx.command(&["completions", shell]).output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
        let file = fx.dir.join(format!("completion.{shell}"));
        std::fs::write(&file, &out.stdout).unwrap();
        if let Ok(run) = Command::new(shell).args(&check).arg(&file).output() {
            assert!(run.status.success(), "{shell}: {}", String::from_utf8_lossy(&run.stderr));
        }
    }
}

/// `proxy --help` lists every config key from its declaration (the list
/// itself is checked against the keys by the unit tests of
/// `proxy::config::keys`).
#[test]
fn proxy_help_lists_the_config_keys() {
    let fx = Fixture::new(Caller::Root);
    let out = fx.command(&["proxy", "--help"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains(&tuixiu_sandbox::proxy::config::help_text()), "{help}");
    for key in tuixiu_sandbox::proxy::config::SCHEMA {
        assert!(help.contains(&key.dotted()), "{} missing from:\n{help}", key.dotted());
    }
}
