//! Temporary skill runs (`/v1/temp-skill-runs`, `skills serve
//! --temp-skills`): the client uploads the skill package with the run. The
//! package gets the checks of an installed one and the upload zip's
//! safety; the run is sandboxed like any other. Against the real server
//! with the stub engine, as root, as uid 65534 and nested.

mod common;
mod inputs_support;
mod skills_support;

use std::time::Duration;

use common::Caller;
use inputs_support::{ZipEntry, zip};
use serde_json::{Value, json};
use skills_support::{Env, unzip};

const INPUT_TEXT: &str = "numbers: 2 3 5 7\n";

/// The files of a package `temp-demo` (the fixture skill under another
/// id), as (path inside the package, content).
fn package_files(id: &str, runner_extra: Value) -> Vec<(String, Vec<u8>)> {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/skills/tuixiu-demo");
    let read = |rel: &str| std::fs::read(fixture.join(rel)).unwrap();
    let mut runner: Value = serde_json::from_slice(&read("assets/runner.json")).unwrap();
    runner["id"] = json!(id);
    for (k, v) in runner_extra.as_object().unwrap() {
        if v.is_null() {
            runner.as_object_mut().unwrap().remove(k);
        } else {
            runner[k] = v.clone();
        }
    }
    let mut files = vec![
        ("SKILL.md".to_string(), format!("---\nname: {id}\n---\n# {id}\n").into_bytes()),
        ("assets/runner.json".to_string(), runner.to_string().into_bytes()),
    ];
    for schema in ["input", "parameter", "output"] {
        let rel = format!("assets/{schema}.schema.json");
        files.push((rel.clone(), read(&rel)));
    }
    files
}

/// A package zip: `files` under the top-level directory `top`.
fn package_zip(top: &str, files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let entries: Vec<ZipEntry> =
        files.iter().map(|(rel, data)| ZipEntry::file(&format!("{top}/{rel}"), data)).collect();
    zip(&entries)
}

fn good_package() -> Vec<u8> {
    package_zip("temp-demo", &package_files("temp-demo", json!({})))
}

fn input_zip() -> Vec<u8> {
    zip(&[ZipEntry::file("input_file", INPUT_TEXT.as_bytes())])
}

fn temp_run_lifecycle(caller: Caller) {
    let env = Env::new(caller);
    let server = env.serve(&["--temp-skills"]);
    let r = server.post_json(
        "/v1/temp-skill-runs",
        &json!({"engine": "command", "input": {"query": "from a temp run"}, "parameter": {"mode": "ok"},
                "model": "stub-model", "runtime_options": {"no_cache": true, "verbose": 1, "debug": false}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "queued");
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    let base = format!("/v1/temp-skill-runs/{rid}");
    let upload = |fields: &[(&str, &[u8])]| server.post_files(&format!("{base}/upload"), fields);

    // Waiting for its package: queued, skill unknown (upstream). The two
    // families do not see each other's requests.
    let status = server.get(&base).json();
    assert_eq!((status["status"].clone(), status["skill_id"].clone()), (json!("queued"), json!("unknown")));
    let r = server.get(&format!("/v1/jobs/{rid}"));
    assert_eq!((r.status, r.detail()), (404, json!("Request not found")));

    // Packages that are refused, whole; the request keeps waiting.
    let files = package_files("temp-demo", json!({}));
    let mut two_tops =
        files.iter().map(|(r, d)| ZipEntry::file(&format!("temp-demo/{r}"), d)).collect::<Vec<_>>();
    two_tops.push(ZipEntry::file("other/x", b"x"));
    let mut top_file =
        files.iter().map(|(r, d)| ZipEntry::file(&format!("temp-demo/{r}"), d)).collect::<Vec<_>>();
    top_file.push(ZipEntry::file("README", b"x"));
    let mut with_link =
        files.iter().map(|(r, d)| ZipEntry::file(&format!("temp-demo/{r}"), d)).collect::<Vec<_>>();
    with_link.push(ZipEntry::symlink("temp-demo/scripts/passwd", "/etc/passwd"));
    let refused: Vec<(&str, Vec<u8>, String)> = vec![
        ("not a zip", b"not a zip".to_vec(), "Invalid zip package: not a valid zip archive".into()),
        (
            "dot-dot",
            zip(&[ZipEntry::file("../temp-demo/SKILL.md", b"x")]),
            "Invalid zip package: zip entry path is not allowed: ../temp-demo/SKILL.md".into(),
        ),
        ("symlink", zip(&with_link), "Invalid zip package: zip entry symlink is not allowed".into()),
        ("two tops", zip(&two_tops), "Skill package must contain exactly one top-level directory".into()),
        ("top file", zip(&top_file), "Skill package must contain exactly one top-level directory".into()),
        ("empty", zip(&[]), "Skill package must contain exactly one top-level directory".into()),
        (
            "identity",
            package_zip("renamed", &files),
            "Skill identity mismatch: directory, runner.json id, and SKILL.md name must match".into(),
        ),
        (
            "no modes",
            package_zip("temp-demo", &package_files("temp-demo", json!({"execution_modes": null}))),
            "Invalid runner.json manifest: 'execution_modes' is a required property".into(),
        ),
    ];
    // Each refusal marks the request failed with its reason (upstream);
    // a later upload may still start it.
    for (what, package, message) in refused {
        let r = upload(&[("skill_package", &package), ("file", &input_zip())]);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let detail = r.detail();
        assert!(detail.as_str().unwrap().starts_with(&message), "{what}: {detail}");
        let status = server.get(&base).json();
        assert_eq!(status["status"], "failed", "{what}");
        assert_eq!(status["error"], json!({"message": detail}), "{what}");
    }
    let r = upload(&[(
        "skill_package",
        &package_zip("temp-demo", &package_files("temp-demo", json!({"engines": ["codex"]}))),
    )]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.detail()["code"], "SKILL_ENGINE_UNSUPPORTED");
    assert_eq!(r.detail()["message"], "Skill 'temp-demo' does not support engine 'command'");
    let status = server.get(&base).json();
    assert_eq!(status["error"]["message"], "Skill 'temp-demo' does not support engine 'command'");
    let r = upload(&[("file", &input_zip())]);
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.detail()[0]["loc"], json!(["body", "skill_package"]));
    assert!(!std::path::Path::new("/tmp/passwd").exists());

    // The good package runs in the sandbox like an installed skill.
    let r = upload(&[("skill_package", &good_package()), ("file", &input_zip())]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["extracted_files"], json!(["input_file"]));
    assert_eq!(server.get(&base).json()["error"], Value::Null, "a good upload clears the refusal");
    let r = upload(&[("skill_package", &good_package()), ("file", &input_zip())]);
    assert_eq!((r.status, r.detail()), (409, json!("Run already started")));

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let s = server.get(&base).json();
        if matches!(s["status"].as_str(), Some("succeeded" | "failed" | "canceled")) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "{s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    assert_eq!(status["skill_id"], "temp-demo");
    let result = server.get(&format!("{base}/result")).json();
    assert_eq!(result["result"]["artifacts"], json!(["artifacts/report.json", "artifacts/summary.md"]));
    let list = server.get(&format!("{base}/artifacts")).json();
    assert_eq!(list["artifacts"], json!(["artifacts/report.json", "artifacts/summary.md"]));
    let summary = server.get(&format!("{base}/artifacts/artifacts/summary.md")).text();
    assert!(summary.contains("query: from a temp run") && summary.contains(INPUT_TEXT), "{summary}");
    let report = server.get(&format!("{base}/artifacts/artifacts/report.json")).json();
    assert_eq!(
        (report["skill_mount"].clone(), report["skill_writable"].clone()),
        (json!("ro"), json!(false))
    );
    assert_eq!(report["env_leak"], false);
    let names: Vec<String> =
        unzip(&server.get(&format!("{base}/bundle")).body).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["result/result.json", "artifacts/report.json", "artifacts/summary.md", "bundle/manifest.json"]
    );
    assert!(
        server.get(&format!("{base}/logs")).json()["prompt"]
            .as_str()
            .unwrap()
            .contains("query=from a temp run")
    );
    let c = server.post(&format!("{base}/cancel")).json();
    assert_eq!(c["message"], "Run already in terminal state");

    // The staged package is the one uploaded, untouched by the run.
    let staged = env.data.join(format!("requests/{rid}/skill/temp-demo"));
    for (rel, data) in package_files("temp-demo", json!({})) {
        assert_eq!(std::fs::read(staged.join(&rel)).unwrap(), data, "{rel}");
    }
}

for_each_caller!(temp_skill_runs, temp_run_lifecycle);

/// Off unless asked for; a queued temporary run survives a restart (its
/// package is loaded again from the request directory).
#[test]
fn temp_runs_are_opt_in_and_survive_a_restart() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let refusal = json!("Temporary skill runs are not enabled on this server (skills serve --temp-skills)");
    let r = server.post_json("/v1/temp-skill-runs", &json!({"engine": "command"}));
    assert_eq!((r.status, r.detail()), (403, refusal.clone()));
    let r = server.get("/v1/temp-skill-runs/00000000-0000-0000-0000-000000000000");
    assert_eq!((r.status, r.detail()), (403, refusal));
    drop(server);

    let mut server = env.serve(&["--temp-skills", "--max-concurrent", "1"]);
    let marker = format!("temp-restart-marker-{}", std::process::id());
    let busy = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&busy, &input_zip()).status, 200);
    server.wait_artifact(&busy, "artifacts/started");
    let r = server.post_json(
        "/v1/temp-skill-runs",
        &json!({"engine": "command", "input": {"query": "after a restart"}, "parameter": {"mode": "ok"}}),
    );
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    let r = server.post_files(
        &format!("/v1/temp-skill-runs/{rid}/upload"),
        &[("skill_package", &good_package()), ("file", &input_zip())],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.get(&format!("/v1/temp-skill-runs/{rid}")).json()["status"], "queued");
    server.crash();

    let server = env.serve(&["--temp-skills"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let s = server.get(&format!("/v1/temp-skill-runs/{rid}")).json();
        if matches!(s["status"].as_str(), Some("succeeded" | "failed" | "canceled")) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "{s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    let summary = server.get(&format!("/v1/temp-skill-runs/{rid}/artifacts/artifacts/summary.md")).text();
    assert!(summary.contains("query: after a restart"), "{summary}");
    assert_eq!(server.get(&format!("/v1/jobs/{busy}")).json()["status"], "failed");
}
