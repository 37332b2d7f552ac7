//! Skill jobs over HTTP against the real `skills serve` process, with the
//! stub engine (tests/fixtures/stub-engine.sh) running in the sandbox and
//! the fixture skill tests/fixtures/skills/tuixiu-demo (one file input, one
//! inline input, one parameter, two required artifacts).

mod common;
mod inputs_support;
mod skills_support;

use std::time::Duration;

use common::Caller;
use inputs_support::{ZipEntry, overlap_bomb, zip};
use serde_json::{Value, json};
use skills_support::{Env, processes_with, unzip};

const INPUT_TEXT: &str = "numbers: 2 3 5 7\n";

fn input_zip() -> Vec<u8> {
    zip(&[ZipEntry::file("input_file", INPUT_TEXT.as_bytes())])
}

/// create → upload → status → result → artifacts → download → bundle →
/// logs, and the sandbox view the engine reported.
fn happy_path(caller: Caller) {
    let env = Env::new(caller);
    let server = env.serve(&[]);

    // Waiting for its upload: no run yet (upstream's 404).
    let rid = server.create_demo("ok", "primes please");
    let r = server.get(&format!("/v1/jobs/{rid}"));
    assert_eq!((r.status, r.detail()), (404, json!("Run not found")));

    let r = server.upload(&rid, &input_zip());
    assert_eq!(r.status, 200, "{}", r.text());
    let up = r.json();
    assert_eq!(up["extracted_files"], json!(["input_file"]));
    assert_eq!(up["cache_hit"], json!(false));

    let status = server.wait(&rid);
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    assert_eq!(status["skill_id"], "tuixiu-demo");
    assert_eq!(status["engine"], "command");
    assert_eq!(status["error"], Value::Null);

    // A second upload to a started job is refused (upstream starts a second run).
    let r = server.upload(&rid, &input_zip());
    assert_eq!((r.status, r.detail()), (409, json!("Run already started")));

    let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
    assert_eq!(result["request_id"], rid.as_str());
    let res = &result["result"];
    assert_eq!(res["status"], "success");
    assert_eq!(res["data"]["summary_path"], "/workspace/artifacts/summary.md");
    assert_eq!(res["artifacts"], json!(["artifacts/report.json", "artifacts/summary.md"]));
    assert_eq!(res["repair_level"], "none");

    let list = server.get(&format!("/v1/jobs/{rid}/artifacts")).json();
    assert_eq!(list["artifacts"], json!(["artifacts/report.json", "artifacts/summary.md"]));

    let r = server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/summary.md"));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/markdown; charset=utf-8"));
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"summary.md\""));
    let summary = r.text();
    assert!(summary.contains("query: primes please") && summary.contains(INPUT_TEXT), "{summary}");

    // What the engine saw: the sandbox, not the host.
    let report = server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/report.json")).json();
    assert_eq!(report["uid"], 1000, "{report}");
    assert_eq!(report["user"], "agent");
    assert_eq!(report["hostname"], "skill-runner");
    assert_eq!(report["pwd"], "/workspace");
    assert_eq!(report["home"], "/home/agent");
    assert_eq!(report["input_file"], "/workspace/uploads/input_file");
    assert!(report["uid_map"].as_str().unwrap().starts_with("1000 "), "user namespace: {report}");
    assert!(report["pid"].as_u64().unwrap() < 10, "pid namespace: {report}");
    assert_eq!(report["skill_mount"], "ro");
    assert_eq!(report["uploads_mount"], "ro");
    assert_eq!(report["skill_writable"], false);
    assert_eq!(report["uploads_writable"], false);
    assert_eq!(report["workspace_writable"], true);
    assert_eq!(report["env_leak"], false, "the server's environment reached the engine");
    let listing = report["root_listing"].as_str().unwrap();
    for absent in ["root", "data", "var", "srv", "mnt"] {
        assert!(!listing.split(' ').any(|n| n == absent), "/{absent} visible in the sandbox: {listing}");
    }
    // The host data directory is not visible at all.
    assert!(!listing.contains(env.data.to_str().unwrap()));

    // Bundle: result, artifacts, manifest with the right hashes.
    let r = server.get(&format!("/v1/jobs/{rid}/bundle"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/zip"));
    let entries = unzip(&r.body);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["result/result.json", "artifacts/report.json", "artifacts/summary.md", "bundle/manifest.json"]
    );
    let manifest: Value = serde_json::from_slice(&entries[3].1).unwrap();
    let files = manifest["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    for (f, (name, data)) in files.iter().zip(&entries) {
        assert_eq!(f["path"], name.as_str());
        assert_eq!(f["size"], data.len());
        assert_eq!(f["sha256"], inputs_support::sha256_hex(data));
    }

    let logs = server.get(&format!("/v1/jobs/{rid}/logs")).json();
    let prompt = logs["prompt"].as_str().unwrap();
    assert!(prompt.contains("input_file=/workspace/uploads/input_file\nquery=primes please\n"), "{prompt}");
    assert!(prompt.contains("- summary (summary.md) -> /workspace/artifacts/summary.md"), "{prompt}");
    assert_eq!(logs["stderr"], "");

    // The engine's home is gone after the run (it may hold credentials).
    let runs: Vec<_> = std::fs::read_dir(env.data.join("runs")).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1);
    assert!(!runs[0].path().join("home").exists());
}

for_each_caller!(happy_path_in_the_sandbox, happy_path);

#[test]
fn skills_listing_and_every_runner_json_message() {
    let env = Env::new(Caller::Root);
    let skill_md = |name: &str| format!("---\nname: {name}\n---\n# {name}\n");
    let schema = |extra: Value| {
        let mut s = json!({"type": "object", "properties": {}});
        if let (Some(o), Some(e)) = (s.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        s.to_string()
    };
    let schemas = json!({"input": "assets/input.schema.json", "parameter": "assets/parameter.schema.json", "output": "assets/output.schema.json"});
    let write = |dir: &str, runner: Value, input: Value, parameter: Value, output: Value| {
        env.write_skill(
            dir,
            &[
                ("SKILL.md", skill_md(dir)),
                ("assets/runner.json", runner.to_string()),
                ("assets/input.schema.json", schema(input)),
                ("assets/parameter.schema.json", schema(parameter)),
                ("assets/output.schema.json", schema(output)),
            ],
        );
    };
    let runner = |dir: &str, extra: Value| {
        let mut r = json!({"id": dir, "execution_modes": ["auto"], "schemas": schemas});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                r.as_object_mut().unwrap().remove(k);
            } else {
                r[k] = v.clone();
            }
        }
        r
    };
    let none = || json!({});
    let all = "['codex', 'gemini', 'iflow', 'command', 'sticky']";
    let cases: Vec<(&str, Value, Value, Value, Value, String)> = vec![
        (
            "no-modes",
            json!({"execution_modes": null}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: 'execution_modes' is a required property".into(),
        ),
        (
            "empty-modes",
            json!({"execution_modes": []}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: [] should be non-empty".into(),
        ),
        (
            "batch-mode",
            json!({"execution_modes": ["batch"]}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: 'batch' is not one of ['auto', 'interactive']".into(),
        ),
        (
            "dup-modes",
            json!({"execution_modes": ["auto", "auto"]}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: ['auto', 'auto'] has non-unique elements".into(),
        ),
        (
            "unknown-engine",
            json!({"engines": ["opencode"]}),
            none(),
            none(),
            none(),
            format!("Invalid runner.json manifest: 'opencode' is not one of {all}"),
        ),
        (
            "empty-engines",
            json!({"engines": []}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: [] should be non-empty".into(),
        ),
        (
            "string-engines",
            json!({"engines": "gemini"}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: 'gemini' is not of type 'array'".into(),
        ),
        (
            "overlap",
            json!({"engines": ["gemini"], "unsupported_engines": ["gemini"]}),
            none(),
            none(),
            none(),
            "runner.json engines and unsupported_engines must not overlap: gemini".into(),
        ),
        (
            "all-unsupported",
            json!({"unsupported_engines": ["codex", "gemini", "iflow", "command", "sticky"]}),
            none(),
            none(),
            none(),
            "runner.json effective engines must not be empty".into(),
        ),
        (
            "legacy-field",
            json!({"unsupport_engine": ["iflow"]}),
            none(),
            none(),
            none(),
            "runner.json field 'unsupport_engine' has been renamed to 'unsupported_engines'".into(),
        ),
        (
            "no-output",
            json!({"schemas": {"input": "assets/input.schema.json", "parameter": "assets/parameter.schema.json"}}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: 'output' is a required property".into(),
        ),
        (
            "artifacts-object",
            json!({"artifacts": {}}),
            none(),
            none(),
            none(),
            "Invalid runner.json manifest: {} is not of type 'array'".into(),
        ),
        (
            "bad-version",
            json!({"version": "abc"}),
            none(),
            none(),
            none(),
            "Invalid skill version: abc".into(),
        ),
        (
            "input-url",
            json!({}),
            json!({"properties": {"a": {"x-input-source": "url"}}}),
            none(),
            none(),
            "Invalid input schema: 'url' is not one of ['file', 'inline']".into(),
        ),
        (
            "input-array",
            json!({}),
            json!({"type": "array"}),
            none(),
            none(),
            "Invalid input schema: 'object' was expected".into(),
        ),
        (
            "param-true",
            json!({}),
            none(),
            json!({"properties": {"a": true}}),
            none(),
            "Invalid parameter schema: True is not of type 'object'".into(),
        ),
        (
            "output-binary",
            json!({}),
            none(),
            none(),
            json!({"properties": {"a": {"x-type": "binary"}}}),
            "Invalid output schema: 'binary' is not one of ['artifact', 'file']".into(),
        ),
        (
            "output-role",
            json!({}),
            none(),
            none(),
            json!({"properties": {"a": {"x-type": "file", "x-role": ""}}}),
            "Invalid output schema: '' should be non-empty".into(),
        ),
        (
            "output-escape",
            json!({}),
            none(),
            none(),
            json!({"properties": {"a": {"x-type": "file", "x-filename": "../x"}}}),
            "artifact pattern '../x' must be a relative path inside artifacts/ (no '..', no leading '/')"
                .into(),
        ),
    ];
    for (dir, extra, input, parameter, output, _) in &cases {
        write(dir, runner(dir, extra.clone()), input.clone(), parameter.clone(), output.clone());
    }
    // Package-level failures.
    env.write_skill("no-skill-md", &[("assets/runner.json", runner("no-skill-md", json!({})).to_string())]);
    env.write_skill("bad-json", &[("SKILL.md", skill_md("bad-json")), ("assets/runner.json", "{".into())]);
    env.write_skill(
        "no-schema-file",
        &[
            ("SKILL.md", skill_md("no-schema-file")),
            ("assets/runner.json", runner("no-schema-file", json!({})).to_string()),
            ("assets/input.schema.json", schema(json!({}))),
            ("assets/parameter.schema.json", schema(json!({}))),
        ],
    );
    env.write_skill(
        "schema-not-json",
        &[
            ("SKILL.md", skill_md("schema-not-json")),
            ("assets/runner.json", runner("schema-not-json", json!({})).to_string()),
            ("assets/input.schema.json", "nope".into()),
            ("assets/parameter.schema.json", schema(json!({}))),
            ("assets/output.schema.json", schema(json!({}))),
        ],
    );
    write("no-type", runner("no-type", json!({})), none(), none(), none());
    std::fs::write(env.skills.join("no-type/assets/input.schema.json"), "{\"properties\": {}}").unwrap();
    write("mismatch", runner("other-id", json!({})), none(), none(), none());
    write("no-name", runner("no-name", json!({})), none(), none(), none());
    std::fs::write(env.skills.join("no-name/SKILL.md"), "# no front matter\n").unwrap();
    write(
        "schema-escape",
        runner(
            "schema-escape",
            json!({"schemas": {"input": "../tuixiu-demo/assets/input.schema.json", "parameter": "assets/parameter.schema.json", "output": "assets/output.schema.json"}}),
        ),
        none(),
        none(),
        none(),
    );

    let mut expected: Vec<(String, String)> = cases.iter().map(|c| (c.0.to_string(), c.5.clone())).collect();
    expected.extend([
        ("no-skill-md".into(), "Skill package missing required files: SKILL.md".into()),
        ("bad-json".into(), "Invalid assets/runner.json".into()),
        ("no-schema-file".into(), "Skill package missing required files: assets/output.schema.json".into()),
        ("schema-not-json".into(), "Invalid input schema: not valid JSON".into()),
        ("no-type".into(), "Invalid input schema: 'type' is a required property".into()),
        ("mismatch".into(), "Skill identity mismatch: directory, runner.json id, and SKILL.md name must match".into()),
        ("no-name".into(), "SKILL.md must define frontmatter name".into()),
        (
            "schema-escape".into(),
            "cannot read ../tuixiu-demo/assets/input.schema.json in the skill package: the path leads outside the package".into(),
        ),
    ]);

    let server = env.serve(&[]);
    // Only valid packages are listed, in upstream's manifest shape.
    let list = server.get("/v1/skills").json();
    let ids: Vec<&str> = list.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tuixiu-demo"]);
    let demo = server.get("/v1/skills/tuixiu-demo").json();
    assert_eq!(demo["effective_engines"], json!(["codex", "gemini", "iflow", "command", "sticky"]));
    assert_eq!(demo["execution_modes"], json!(["auto", "interactive"]));
    assert_eq!(
        demo["artifacts"],
        // The output schema's order (summary_path, report_path), as upstream.
        json!([
            {"role": "summary", "pattern": "summary.md", "mime": null, "required": true},
            {"role": "report", "pattern": "report.json", "mime": null, "required": true}
        ])
    );
    assert!(demo.get("path").is_none(), "the server path is not exposed");
    let r = server.get("/v1/skills/nope");
    assert_eq!((r.status, r.detail()), (404, json!("Skill not found")));

    // Invalid packages are reported with their reason, not skipped.
    for (dir, message) in &expected {
        let r = server.get(&format!("/v1/skills/{dir}"));
        assert_eq!(r.status, 422, "{dir}: {}", r.text());
        assert_eq!(r.detail()["message"], format!("Skill '{dir}' is invalid: {message}"), "{dir}");
        let r = server.post_json("/v1/jobs", &json!({"skill_id": dir, "engine": "command"}));
        assert_eq!(r.status, 422, "{dir}: {}", r.text());
    }
    // And on the server's stderr at start, and by `skills check`.
    let log = env.server_log();
    assert!(log.contains("skill package no-modes: Invalid runner.json manifest"), "{log}");
    let out = env
        .fx
        .command(&[
            "skills",
            "check",
            "--skills-dir",
            env.skills.to_str().unwrap(),
            "--engines",
            env.engines.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok tuixiu-demo\n"), "{text}");
    for (dir, message) in &expected {
        assert!(text.contains(&format!("invalid {dir}: {message}\n")), "{dir}: {text}");
    }
}

#[test]
fn create_time_validation_messages() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let create = |body: Value| server.post_json("/v1/jobs", &body);
    let demo = |input: Value| json!({"skill_id": "tuixiu-demo", "engine": "command", "input": input, "parameter": {"mode": "ok"}});

    let r = create(demo(json!({"zzz": 1, "query": "q"})));
    assert_eq!(r.status, 400);
    assert_eq!(r.detail(), "Input validation failed: [\"input validation error: unknown input key 'zzz'\"]");

    let r = create(demo(json!({"input_file": "/etc/passwd", "query": "q"})));
    assert_eq!(
        r.detail(),
        "Input validation failed: [\"input validation error: key 'input_file' is file-sourced; upload file via /upload\"]"
    );

    let r = create(demo(json!({"query": 5})));
    assert_eq!(
        r.detail(),
        "Input validation failed: [\"input validation error: 5 is not of type 'string' (Path: query)\"]"
    );

    let r = create(demo(json!({})));
    assert_eq!(
        r.detail(),
        "Input validation failed: [\"input validation error: 'query' is a required property (Path: )\"]"
    );

    let r = create(json!({"engine": "command"}));
    assert_eq!(r.status, 422);
    assert_eq!(r.detail()[0]["loc"], json!(["body", "skill_id"]));
    assert_eq!(r.detail()[0]["msg"], "Field required");

    let r = server.post_json("/v1/jobs", &json!({"skill_id": "missing"}));
    assert_eq!((r.status, r.detail()), (404, json!("Skill 'missing' not found")));

    let r = create(json!({"skill_id": "tuixiu-demo", "engine": "nope", "input": {"query": "q"}}));
    assert_eq!(r.status, 400);
    assert_eq!(r.detail()["code"], "SKILL_ENGINE_UNSUPPORTED");
    assert_eq!(r.detail()["message"], "Skill 'tuixiu-demo' does not support engine 'nope'");

    let r = create(
        json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"}, "runtime_options": {"foo": 1}}),
    );
    assert_eq!((r.status, r.detail()), (400, json!("Unknown runtime_options: foo")));
    let r = create(
        json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"}, "runtime_options": {"execution_mode": "batch"}}),
    );
    assert_eq!(
        (r.status, r.detail()),
        (400, json!("runtime_options.execution_mode must be one of: auto, interactive"))
    );

    let r = create(json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"},
                          "runtime_options": {"interactive_require_user_reply": 1}}));
    assert_eq!(
        (r.status, r.detail()),
        (400, json!("runtime_options.interactive_require_user_reply must be a boolean"))
    );

    // hard_timeout_seconds must stay below --job-timeout (20 min here).
    for (seconds, accepted) in [(999_999, false), (1200, false), (1199, true)] {
        let r = create(json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"},
                              "runtime_options": {"hard_timeout_seconds": seconds}}));
        if accepted {
            assert_eq!(r.status, 200, "{seconds}: {}", r.text());
        } else {
            assert_eq!(
                (r.status, r.detail()),
                (
                    400,
                    json!(
                        "runtime_options.hard_timeout_seconds must be less than the server's job timeout (1200 seconds)"
                    )
                ),
                "{seconds}"
            );
        }
    }

    // Parameters are checked before the engine starts: the job fails and
    // has no result (upstream's behaviour).
    let r = create(
        json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"}, "parameter": {"mode": "zzz"}}),
    );
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    let status = server.wait(&rid);
    assert_eq!(status["status"], "failed");
    assert_eq!(
        status["error"]["message"],
        "Input validation failed: [\"parameter validation error: 'zzz' is not one of ['ok', 'fenced', 'no-artifact', 'bad-output', 'fail', 'sleep', 'escape', 'clutter', 'ask', 'ask-anonymous', 'sticky-ask', 'sticky-exit', 'flood'] (Path: mode)\"]"
    );
    let r = server.get(&format!("/v1/jobs/{rid}/result"));
    assert_eq!((r.status, r.detail()), (404, json!("Run result not found")));
    let r = server.get("/v1/jobs/00000000-0000-0000-0000-000000000000");
    assert_eq!((r.status, r.detail()), (404, json!("Request not found")));
}

#[test]
fn strict_key_matching() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("extension", zip(&[ZipEntry::file("input_file.txt", b"x")])),
        ("subdir", zip(&[ZipEntry::file("sub/input_file", b"x")])),
        ("directory", zip(&[ZipEntry::dir("input_file/"), ZipEntry::file("input_file/x", b"x")])),
        ("case", zip(&[ZipEntry::file("Input_File", b"x")])),
    ];
    for (what, archive) in cases {
        let rid = server.create_demo("ok", "q");
        let r = server.upload(&rid, &archive);
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        let status = server.wait(&rid);
        assert_eq!(status["status"], "failed", "{what}");
        assert_eq!(
            status["error"]["message"],
            "Input validation failed: ['Missing required input files: input_file', \
             \"input validation error: 'input_file' is a required property (Path: )\"]",
            "{what}"
        );
        // It failed before the engine started.
        let logs = server.get(&format!("/v1/jobs/{rid}/logs")).json();
        assert_eq!(logs["stdout"], Value::Null, "{what}: the engine ran");
    }
}

#[test]
fn engine_outcomes_missing_artifact_bad_output_repair_exit_code() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let run = |mode: &str| {
        let rid = server.create_demo(mode, "q");
        assert_eq!(server.upload(&rid, &input_zip()).status, 200);
        let status = server.wait(&rid);
        let result = server.get(&format!("/v1/jobs/{rid}/result")).json()["result"].clone();
        (status, result)
    };
    let (status, result) = run("no-artifact");
    assert_eq!(status["status"], "failed");
    assert_eq!(status["error"]["message"], "Missing required artifacts: report.json");
    assert_eq!(result["status"], "failed");
    assert_eq!(result["data"], Value::Null);
    assert_eq!(result["artifacts"], json!(["artifacts/summary.md"]));

    let (status, _) = run("bad-output");
    assert_eq!(
        status["error"]["message"],
        "Output validation error: 'summary_path' is a required property (Path: ); \
         Output validation error: 'report_path' is a required property (Path: )"
    );

    let (status, result) = run("fenced");
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["warnings"], json!(["OUTPUT_REPAIRED_GENERIC"]));
    assert_eq!(result["repair_level"], "deterministic_generic");
    assert_eq!(result["validation_warnings"], json!(["OUTPUT_REPAIRED_GENERIC"]));

    let (status, result) = run("fail");
    assert_eq!(status["error"]["message"], "Exit code 3");
    assert!(result["error"]["stderr"].as_str().unwrap().contains("stub: failing on purpose"));
}

#[test]
fn artifact_paths_are_confined_and_symlinks_never_followed() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let rid = server.create_demo("escape", "q");
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    let base = format!("/v1/jobs/{rid}/artifacts");

    // Symlinks are not listed; regular files in subdirectories are.
    let list = server.get(&base).json();
    assert_eq!(
        list["artifacts"],
        json!(["artifacts/report.json", "artifacts/sub/nested.txt", "artifacts/summary.md"])
    );
    assert_eq!(server.get(&format!("{base}/artifacts/sub/nested.txt")).text(), "nested\n");

    let refused = [
        ("artifacts/..%2Fartifacts2/secret.txt", 400, "Invalid artifact path"),
        ("artifacts/../artifacts2/secret.txt", 400, "Invalid artifact path"),
        ("artifacts/%2e%2e/input.json", 400, "Invalid artifact path"),
        ("artifacts/sub/..%2F..%2Fartifacts2/secret.txt", 400, "Invalid artifact path"),
        ("artifacts//etc/passwd", 400, "Invalid artifact path"),
        ("artifacts/%2Fetc%2Fpasswd", 400, "Invalid artifact path"),
        ("%2Fetc%2Fpasswd", 404, "Artifact not found"),
        ("artifacts/host-link", 400, "Invalid artifact path"),
        ("artifacts/up-link", 400, "Invalid artifact path"),
        ("result/result.json", 404, "Artifact not found"),
        ("artifacts/missing.txt", 404, "Artifact not found"),
        ("artifacts/sub", 404, "Artifact not found"),
    ];
    for (path, status, detail) in refused {
        let r = server.get(&format!("{base}/{path}"));
        assert_eq!((r.status, r.detail()), (status, json!(detail)), "{path}");
    }
    let r = server.get(&format!("{base}/"));
    assert_eq!((r.status, r.detail()), (400, json!("Artifact path is required")));

    // Nothing behind a symlink, nor the sibling directory, is bundled.
    let bundle = unzip(&server.get(&format!("/v1/jobs/{rid}/bundle")).body);
    let names: Vec<&str> = bundle.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "result/result.json",
            "artifacts/report.json",
            "artifacts/sub/nested.txt",
            "artifacts/summary.md",
            "bundle/manifest.json"
        ]
    );
    let host_name = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    for (name, data) in &bundle {
        assert!(host_name.is_empty() || data != host_name.as_bytes(), "{name} holds /etc/hostname");
    }
}

/// `d/d/.../d` (`depth` directories), no trailing slash.
fn deep_dir(depth: usize) -> String {
    vec!["d"; depth].join("/")
}

/// Upstream's debug bundle: every file of the run directory with
/// `artifacts/` and `uploads/` at the top (no `workspace/` prefix),
/// `status.json`, and the server's own files where the engine wrote files
/// of the same names.
#[test]
fn debug_bundle_has_upstreams_layout_and_the_servers_files_win() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let r = server.post_json(
        "/v1/jobs",
        &json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"},
                "parameter": {"mode": "clutter"}, "runtime_options": {"debug": true}}),
    );
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    let r = server.get(&format!("/v1/jobs/{rid}/bundle"));
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"run_bundle_debug.zip\""));
    let entries = unzip(&r.body);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let deep = format!("artifacts/{}/deep.txt", deep_dir(200));
    let mut expected = vec![
        "artifacts/report.json",
        "artifacts/summary.md",
        deep.as_str(),
        "input.json",
        "logs/prompt.txt",
        "logs/stderr.txt",
        "logs/stdout.txt",
        "result/result.json",
        "status.json",
        "uploads/input_file",
    ];
    expected.sort();
    expected.push("bundle/manifest_debug.json");
    assert_eq!(names, expected);
    let content = |name: &str| {
        let (_, data) = entries.iter().find(|(n, _)| n == name).unwrap();
        String::from_utf8_lossy(data).into_owned()
    };
    assert_eq!(content("uploads/input_file"), INPUT_TEXT);
    // The server's files, not the engine's of the same name.
    assert!(content("logs/stdout.txt").contains("summary_path"), "{}", content("logs/stdout.txt"));
    assert!(content("input.json").contains(&rid), "{}", content("input.json"));
    let status: Value = serde_json::from_str(&content("status.json")).unwrap();
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["error"], Value::Null);
    // The manifest lists every other file with its hash.
    let manifest: Value = serde_json::from_str(&content("bundle/manifest_debug.json")).unwrap();
    let files = manifest["files"].as_array().unwrap();
    assert_eq!(files.len(), entries.len() - 1);
    for (f, (name, data)) in files.iter().zip(&entries) {
        assert_eq!(f["path"], name.as_str());
        assert_eq!(f["size"], data.len());
        assert_eq!(f["sha256"], inputs_support::sha256_hex(data));
    }
}

/// A file 200 directories deep is listed and served like any other: in
/// the upload's `extracted_files`, the artifact list, the download, the
/// bundle.
#[test]
fn files_200_directories_deep_are_not_lost() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let rid = server.create_demo("clutter", "q");
    let deep_upload = format!("{}/deep-input.txt", deep_dir(200));
    let archive = zip(&[
        ZipEntry::file("input_file", INPUT_TEXT.as_bytes()),
        ZipEntry::file(&deep_upload, b"deep input\n"),
    ]);
    let r = server.upload(&rid, &archive);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["extracted_files"], json!([deep_upload, "input_file"]));
    assert_eq!(server.wait(&rid)["status"], "succeeded");

    let deep = format!("artifacts/{}/deep.txt", deep_dir(200));
    let list = server.get(&format!("/v1/jobs/{rid}/artifacts")).json();
    assert_eq!(list["artifacts"], json!([deep, "artifacts/report.json", "artifacts/summary.md"]));
    let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
    assert_eq!(result["result"]["artifacts"], list["artifacts"]);
    let r = server.get(&format!("/v1/jobs/{rid}/artifacts/{deep}"));
    assert_eq!((r.status, r.text()), (200, "deep\n".to_string()));
    let names: Vec<String> =
        unzip(&server.get(&format!("/v1/jobs/{rid}/bundle")).body).into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&deep), "{names:?}");
}

#[test]
fn malicious_upload_zips_are_refused_and_lose_nothing() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--zip-max-total", "1M", "--zip-max-entries", "50"]);
    let rid = server.create_demo("ok", "q");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dot-dot",
            zip(&[ZipEntry::file("../evil.txt", b"x")]),
            "zip entry path is not allowed: ../evil.txt",
        ),
        (
            "absolute",
            zip(&[ZipEntry::file("/tmp/evil.txt", b"x")]),
            "zip entry path is not allowed: /tmp/evil.txt",
        ),
        (
            "symlink",
            zip(&[ZipEntry::symlink("input_file", "/etc/passwd")]),
            "zip entry symlink is not allowed: input_file",
        ),
        ("bomb", overlap_bomb(1 << 20, 40), "zip too large"),
        (
            "entries",
            zip(&(0..60).map(|i| ZipEntry::file(&format!("f{i}"), b"x")).collect::<Vec<_>>()),
            "zip too many entries",
        ),
        (
            "duplicate",
            zip(&[ZipEntry::file("input_file", b"a"), ZipEntry::file("input_file", b"b")]),
            "duplicate",
        ),
        ("not-a-zip", b"this is not a zip".to_vec(), "not a valid zip archive"),
    ];
    for (what, archive, reason) in cases {
        let r = server.upload(&rid, &archive);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let detail = r.detail();
        let detail = detail.as_str().unwrap();
        assert!(detail.starts_with("Invalid zip file: ") && detail.contains(reason), "{what}: {detail}");
        // Nothing started, nothing landed outside.
        let r = server.get(&format!("/v1/jobs/{rid}"));
        assert_eq!((r.status, r.detail()), (404, json!("Run not found")), "{what}");
    }
    assert!(!env.data.join("requests/evil.txt").exists() && !env.data.join("evil.txt").exists());
    assert!(!std::path::Path::new("/tmp/evil.txt").exists());
    let r = server.upload_as(&rid, "other", &input_zip());
    assert_eq!(r.status, 422);
    assert_eq!(r.detail()[0]["loc"], json!(["body", "file"]));
    // The request is intact: a good upload still runs it.
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
}

#[test]
fn cancel_kills_the_sandbox() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--kill-grace", "1s"]);
    let marker = format!("cancel-marker-{}", std::process::id());
    let rid = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    server.wait_artifact(&rid, "artifacts/started");
    assert!(!processes_with(&marker).is_empty(), "the stub should be running");

    let r = server.post(&format!("/v1/jobs/{rid}/cancel"));
    assert_eq!(r.status, 200);
    let c = r.json();
    assert_eq!((c["accepted"].clone(), c["status"].clone()), (json!(true), json!("canceled")));
    assert_eq!(c["message"], "Cancel request accepted");

    let status = server.wait(&rid);
    assert_eq!(status["status"], "canceled");
    assert_eq!(status["error"]["code"], "CANCELED_BY_USER");
    let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
    assert_eq!(result["result"]["status"], "canceled");
    assert_eq!(result["result"]["error"]["code"], "CANCELED_BY_USER");
    assert!(processes_with(&marker).is_empty(), "sandbox processes left: {:?}", processes_with(&marker));

    let again = server.post(&format!("/v1/jobs/{rid}/cancel")).json();
    assert_eq!(again["accepted"], false);
    assert_eq!(again["message"], "Run already in terminal state");
    let r = server.post("/v1/jobs/nope/cancel");
    assert_eq!((r.status, r.detail()), (404, json!("Request not found")));
}

#[test]
fn timeout_fails_the_job() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--job-timeout", "1s", "--kill-grace", "1s"]);
    let marker = format!("timeout-marker-{}", std::process::id());
    let rid = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    let status = server.wait(&rid);
    assert_eq!(status["status"], "failed");
    assert_eq!(status["error"]["code"], "TIMEOUT");
    assert_eq!(status["error"]["message"], "TIMEOUT: engine execution exceeded hard timeout (1s)");
    assert!(processes_with(&marker).is_empty());
}

#[test]
fn restart_keeps_finished_jobs_and_fails_the_running_one() {
    let env = Env::new(Caller::Root);
    let mut server = env.serve(&[]);
    let done = server.create_demo("ok", "finished job");
    assert_eq!(server.upload(&done, &input_zip()).status, 200);
    assert_eq!(server.wait(&done)["status"], "succeeded");
    let pending = server.create_demo("ok", "pending job");

    let marker = format!("restart-marker-{}", std::process::id());
    let running = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&running, &input_zip()).status, 200);
    server.wait_artifact(&running, "artifacts/started");

    server.crash();
    // The sandbox dies with the server (death signal on the launcher, then
    // the sandbox's PID 1).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "left running: {:?}", processes_with(&marker));
        std::thread::sleep(Duration::from_millis(20));
    }

    let server = env.serve(&[]);
    let status = server.get(&format!("/v1/jobs/{done}")).json();
    assert_eq!(status["status"], "succeeded");
    let result = server.get(&format!("/v1/jobs/{done}/result")).json();
    assert_eq!(result["result"]["status"], "success");
    let r = server.get(&format!("/v1/jobs/{done}/artifacts/artifacts/summary.md"));
    assert!(r.text().contains("query: finished job"));

    let status = server.get(&format!("/v1/jobs/{running}")).json();
    assert_eq!(status["status"], "failed");
    assert_eq!(status["error"]["code"], "ORCHESTRATOR_RESTART_INTERRUPTED");
    assert_eq!(status["recovery_state"], "failed_reconciled");
    assert!(!env.data.join("runs").read_dir().unwrap().flatten().any(|r| r.path().join("home").exists()));

    // A request that was waiting for its upload still takes it.
    assert_eq!(server.upload(&pending, &input_zip()).status, 200);
    assert_eq!(server.wait(&pending)["status"], "succeeded");
}

#[test]
fn skills_run_cli_twin() {
    let env = Env::new(Caller::Root);
    let input = env.fx.dir.join("in.txt");
    std::fs::write(&input, INPUT_TEXT).unwrap();
    let skill = env.skills.join("tuixiu-demo");
    let data = env.fx.dir.join("cli-data");
    let skills_run = |extra: &[&str]| {
        let mut args = vec!["skills", "run", "--skill", skill.to_str().unwrap(), "--parameter", "mode=ok"];
        args.extend_from_slice(&["--engine", "command", "--engines", env.engines.to_str().unwrap()]);
        args.extend_from_slice(&["--data-dir", data.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = env.fx.command(&args).output().unwrap();
        let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, result)
    };
    let file_arg = format!("input_file={}", input.display());
    let (out, result) = skills_run(&["--file", &file_arg, "--input", "query=from the cli"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    assert_eq!(result["status"], "success");
    assert_eq!(result["artifacts"], json!(["artifacts/report.json", "artifacts/summary.md"]));

    let (out, result) = skills_run(&["--input", "query=no file"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        result["error"]["message"].as_str().unwrap().contains("Missing required input files: input_file")
    );
}

#[test]
fn queue_limits_and_cancel_while_queued() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--max-concurrent", "1", "--max-queue", "1", "--kill-grace", "1s"]);
    let marker = format!("queue-marker-{}", std::process::id());
    // The upload is answered once the job's record is on disk: with a free
    // slot it is `running` there (never recorded as queued), without one
    // `queued` (a restart queues it again).
    let on_disk = |id: &str| -> Value {
        let bytes = std::fs::read(env.data.join("jobs").join(format!("{id}.json"))).unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()["status"].clone()
    };
    let running = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&running, &input_zip()).status, 200);
    assert_eq!(on_disk(&running), "running");
    server.wait_artifact(&running, "artifacts/started");

    // One slot busy, one place in the queue.
    let queued = server.create_demo("ok", "queued");
    let r = server.upload(&queued, &input_zip());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(on_disk(&queued), "queued");
    assert_eq!(server.get(&format!("/v1/jobs/{queued}")).json()["status"], "queued");

    let refused = server.create_demo("ok", "refused");
    let r = server.upload(&refused, &input_zip());
    assert_eq!((r.status, r.detail()), (429, json!("Job queue is full")));

    // A queued job is canceled without its engine ever starting.
    let c = server.post(&format!("/v1/jobs/{queued}/cancel")).json();
    assert_eq!(c["accepted"], true);
    assert_eq!(server.wait(&queued)["status"], "canceled");
    let logs = server.get(&format!("/v1/jobs/{queued}/logs")).json();
    assert_eq!(logs["stdout"], Value::Null, "the engine ran");

    // Once the slot is free, the refused request can still upload.
    server.post(&format!("/v1/jobs/{running}/cancel"));
    assert_eq!(server.wait(&running)["status"], "canceled");
    assert_eq!(server.upload(&refused, &input_zip()).status, 200);
    assert_eq!(server.wait(&refused)["status"], "succeeded");
    assert!(processes_with(&marker).is_empty());
}

/// The execution mode must be one the skill declares: upstream's
/// `SKILL_EXECUTION_MODE_UNSUPPORTED` otherwise.
#[test]
fn execution_modes_the_skill_does_not_declare_are_refused() {
    let env = Env::new(Caller::Root);
    let empty = json!({"type": "object", "properties": {}}).to_string();
    for (id, modes) in [("auto-only", json!(["auto"])), ("interactive-only", json!(["interactive"]))] {
        env.write_skill(
            id,
            &[
                ("SKILL.md", format!("---\nname: {id}\n---\n")),
                (
                    "assets/runner.json",
                    json!({"id": id, "execution_modes": modes, "schemas": {
                        "input": "assets/s.json", "parameter": "assets/s.json", "output": "assets/s.json"}})
                    .to_string(),
                ),
                ("assets/s.json", empty.clone()),
            ],
        );
    }
    let server = env.serve(&[]);
    let create = |id: &str, mode: &str| {
        server.post_json(
            "/v1/jobs",
            &json!({"skill_id": id, "engine": "command", "runtime_options": {"execution_mode": mode}}),
        )
    };
    let r = create("auto-only", "interactive");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.detail(),
        json!({
            "code": "SKILL_EXECUTION_MODE_UNSUPPORTED",
            "message": "Skill 'auto-only' does not support execution_mode 'interactive'",
            "declared_execution_modes": ["auto"],
            "requested_execution_mode": "interactive",
        })
    );
    // No mode is `auto`.
    let r = server.post_json("/v1/jobs", &json!({"skill_id": "interactive-only", "engine": "command"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.detail()["requested_execution_mode"], "auto");
}

/// Artifacts inferred from the output schema come in the schema's
/// property order, not sorted (upstream's clients compare the lists).
#[test]
fn inferred_artifacts_keep_the_schema_order() {
    let env = Env::new(Caller::Root);
    let empty = json!({"type": "object", "properties": {}}).to_string();
    // Written as text: the property order is the file's.
    let output = r#"{"type": "object", "properties": {
        "zeta": {"type": "string", "x-type": "artifact", "x-filename": "z.md", "x-role": "last"},
        "alpha": {"type": "string", "x-type": "file", "x-filename": "a.md"},
        "plain": {"type": "string"},
        "mid": {"type": "string", "x-type": "artifact"},
        "zeta": {"type": "string", "x-type": "artifact", "x-filename": "z2.md", "x-role": "again"}
    }, "required": ["mid", "zeta"]}"#;
    env.write_skill(
        "ordered",
        &[
            ("SKILL.md", "---\nname: ordered\n---\n".to_string()),
            (
                "assets/runner.json",
                json!({"id": "ordered", "execution_modes": ["auto"], "schemas": {
                    "input": "assets/e.json", "parameter": "assets/e.json", "output": "assets/output.json"}})
                .to_string(),
            ),
            ("assets/e.json", empty),
            ("assets/output.json", output.to_string()),
        ],
    );
    let server = env.serve(&[]);
    let r = server.get("/v1/skills/ordered");
    assert_eq!(r.status, 200, "{}", r.text());
    // A repeated key keeps its first place and its last value (Python's
    // json.loads, serde_json).
    assert_eq!(
        r.json()["artifacts"],
        json!([
            {"role": "again", "pattern": "z2.md", "mime": null, "required": true},
            {"role": "output", "pattern": "a.md", "mime": null, "required": false},
            {"role": "output", "pattern": "mid", "mime": null, "required": true}
        ])
    );
}

/// `GET /v1/engines` and `GET /v1/engines/{engine}/models`, from the
/// engines configuration, in upstream's shapes.
#[test]
fn engines_and_their_models() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let r = server.get("/v1/engines");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"engines": [
            {"engine": "codex", "cli_version_detected": null},
            {"engine": "gemini", "cli_version_detected": null},
            {"engine": "iflow", "cli_version_detected": null},
            {"engine": "command", "cli_version_detected": null},
            {"engine": "sticky", "cli_version_detected": null}
        ]})
    );
    let model = |id: &str| json!({"id": id, "display_name": null, "deprecated": false, "notes": null, "supported_effort": null});
    let r = server.get("/v1/engines/command/models");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"engine": "command", "cli_version_detected": null, "snapshot_version_used": "engines_config",
               "source": "engines_config", "fallback_reason": null,
               "models": [model("stub-model"), model("stub-model-large")]})
    );
    // A built-in engine that declares no models: any model, none listed.
    assert_eq!(server.get("/v1/engines/codex/models").json()["models"], json!([]));
    let r = server.get("/v1/engines/nope/models");
    assert_eq!((r.status, r.detail()), (404, json!("Unknown engine: nope")));

    // The list is what a create is checked against. The runtime options
    // are what upstream's e2e runner sends (`verbose` is its -v count);
    // upstream checks neither their type, and takes `debug` as truthy.
    let create = |model: &str| {
        server.post_json(
            "/v1/jobs",
            &json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"},
                    "parameter": {"mode": "ok"}, "model": model,
                    "runtime_options": {"no_cache": false, "verbose": 2, "debug": 1}}),
        )
    };
    let r = create("stub-model-large");
    assert_eq!(r.status, 200, "{}", r.text());
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(server.upload(&rid, &input_zip()).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    let r = server.get(&format!("/v1/jobs/{rid}/bundle"));
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"run_bundle_debug.zip\""));
    let r = create("gpt-5");
    assert_eq!((r.status, r.detail()), (400, json!("Model 'gpt-5' not allowed for engine 'command'")));
}
