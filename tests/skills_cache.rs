//! The result cache and `POST /v1/jobs/cleanup`, against the real
//! `skills serve` with the stub engine in the sandbox: a repeated job is
//! answered with the succeeded run and no engine starts; `no_cache`,
//! other inputs and interactive jobs miss; a run whose artifacts changed
//! is never returned; entries survive a restart; cleanup clears finished
//! runs, requests and every entry, and keeps what is running.

mod common;
mod inputs_support;
mod skills_support;

use common::Caller;
use inputs_support::{ZipEntry, zip};
use serde_json::{Value, json};
use skills_support::{Env, Server, request_with, unzip};

fn files_zip(text: &str) -> Vec<u8> {
    zip(&[ZipEntry::file("input_file", text.as_bytes())])
}

/// Creates a demo job with `body`'s fields over the defaults, uploads
/// `text` as its file; returns the id and the upload's answer.
fn job(server: &Server, extra: Value, text: &str) -> (String, Value) {
    let mut body = json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "cached"},
                          "parameter": {"mode": "ok"}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = server.post_json("/v1/jobs", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["cache_hit"], false);
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    let r = server.upload(&rid, &files_zip(text));
    assert_eq!(r.status, 200, "{}", r.text());
    (rid, r.json())
}

fn runs(env: &Env) -> usize {
    std::fs::read_dir(env.data.join("runs")).unwrap().count()
}

fn wait_entries(env: &Env, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache_entries(env) != n {
        assert!(std::time::Instant::now() < deadline, "{} cache entries, not {n}", cache_entries(env));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn cache_entries(env: &Env) -> usize {
    std::fs::read_dir(env.data.join("jobs/cache")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn repeated_jobs_are_answered_from_the_cache() {
    let env = Env::new(Caller::Root);
    let mut server = env.serve(&[]);
    let (first, up) = job(&server, json!({}), "numbers: 1 2\n");
    assert_eq!(up["cache_hit"], false);
    assert_eq!(server.wait(&first)["status"], "succeeded");
    // The entry is written once the run's record is on disk, just after
    // the success is visible (and answers lookups from then on).
    assert_eq!(runs(&env), 1);
    wait_entries(&env, 1);
    let report = server.get(&format!("/v1/jobs/{first}/artifacts/artifacts/report.json")).json();

    // The same inputs: the first run, no engine.
    let (again, up) = job(&server, json!({"runtime_options": {"debug": true}}), "numbers: 1 2\n");
    assert_eq!(up["cache_hit"], true, "{up}");
    assert_eq!(
        (up["status"].clone(), up["extracted_files"].clone()),
        (json!("succeeded"), json!(["input_file"]))
    );
    let status = server.get(&format!("/v1/jobs/{again}")).json();
    assert_eq!((status["status"].clone(), status["error"].clone()), (json!("succeeded"), Value::Null));
    assert_eq!(runs(&env), 1, "no second run");
    assert_eq!(server.get(&format!("/v1/jobs/{again}/artifacts/artifacts/report.json")).json(), report);
    assert_eq!(
        server.get(&format!("/v1/jobs/{again}/result")).json()["result"],
        server.get(&format!("/v1/jobs/{first}/result")).json()["result"]
    );
    // Its own request's options: the debug bundle of the cached run.
    let r = server.get(&format!("/v1/jobs/{again}/bundle"));
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"run_bundle_debug.zip\""));
    assert!(unzip(&r.body).iter().any(|(n, _)| n == "logs/stdout.txt"));
    // The newer runner's route: the debug bundle whatever the options.
    let r = server.get(&format!("/v1/jobs/{first}/bundle/debug"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"run_bundle_debug.zip\""));
    let names: Vec<String> = unzip(&r.body).into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"input.json".to_string())
            && names.contains(&"bundle/manifest_debug.json".to_string()),
        "{names:?}"
    );

    // Misses: no_cache, another file, another inline input, parameter, model.
    for (extra, text) in [
        (json!({"runtime_options": {"no_cache": true}}), "numbers: 1 2\n"),
        (json!({}), "numbers: 3\n"),
        (json!({"input": {"query": "other"}}), "numbers: 1 2\n"),
        (json!({"model": "stub-model"}), "numbers: 1 2\n"),
    ] {
        let (rid, up) = job(&server, extra.clone(), text);
        assert_eq!(up["cache_hit"], false, "{extra} {text}");
        assert_eq!(server.wait(&rid)["status"], "succeeded");
    }
    assert_eq!(runs(&env), 5);

    // Interactive jobs are never answered from the cache, nor cached.
    wait_entries(&env, 4);
    let entries = cache_entries(&env);
    for _ in 0..2 {
        let rid = server.start_demo("command", "ask", "cached", json!({"execution_mode": "interactive"}));
        server.wait_status(&rid, "waiting_user");
        assert_eq!(server.reply(&rid, json!({"interaction_id": 1, "response": "md"})).status, 200);
        assert_eq!(server.wait(&rid)["status"], "succeeded");
    }
    assert_eq!(cache_entries(&env), entries);

    // Entries survive a restart.
    server.crash();
    let server = env.serve(&[]);
    let (hit, up) = job(&server, json!({}), "numbers: 1 2\n");
    assert_eq!(up["cache_hit"], true);

    // A run whose artifact was removed is never returned: the job runs.
    // (The entry is the latest run of these inputs: `no_cache` skips the
    // lookup, not the recording, as upstream.)
    std::fs::remove_file(env.run_dir(&hit).join("workspace/artifacts/summary.md")).unwrap();
    let (rid, up) = job(&server, json!({}), "numbers: 1 2\n");
    assert_eq!(up["cache_hit"], false);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    let (_, up) = job(&server, json!({}), "numbers: 1 2\n");
    assert_eq!(up["cache_hit"], true, "the new run is cached");
}

/// A skill with no file input is looked up at create.
#[test]
fn jobs_without_uploads_hit_at_create() {
    let env = Env::new(Caller::Root);
    let object = |props: Value| json!({"type": "object", "properties": props}).to_string();
    env.write_skill(
        "inline-only",
        &[
            ("SKILL.md", "---\nname: inline-only\n---\n".to_string()),
            (
                "assets/runner.json",
                json!({"id": "inline-only", "execution_modes": ["auto"],
                       "entrypoint": {"prompts": {"command": "mode=no-artifact\nquery={{ input.query }}\n"}},
                       "schemas": {"input": "assets/in.json", "parameter": "assets/p.json", "output": "assets/p.json"}})
                .to_string(),
            ),
            ("assets/in.json", object(json!({"query": {"type": "string", "x-input-source": "inline"}}))),
            ("assets/p.json", object(json!({}))),
        ],
    );
    let server = env.serve(&[]);
    let create = || {
        let r = server.post_json(
            "/v1/jobs",
            &json!({"skill_id": "inline-only", "engine": "command", "input": {"query": "q"}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let first = create();
    assert_eq!((first["cache_hit"].clone(), first["status"].clone()), (json!(false), json!("queued")));
    let rid = first["request_id"].as_str().unwrap();
    assert_eq!(server.wait(rid)["status"], "succeeded", "{}", env.server_log());
    let second = create();
    assert_eq!((second["cache_hit"].clone(), second["status"].clone()), (json!(true), json!("succeeded")));
    let status = server.get(&format!("/v1/jobs/{}", second["request_id"].as_str().unwrap())).json();
    assert_eq!(status["status"], "succeeded");
    assert_eq!(runs(&env), 1);
}

#[test]
fn cleanup_clears_finished_runs_requests_and_cache_entries() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--kill-grace", "1s"]);
    let (done, _) = job(&server, json!({}), "numbers: 5\n");
    assert_eq!(server.wait(&done)["status"], "succeeded");
    let (hit, up) = job(&server, json!({}), "numbers: 5\n");
    assert_eq!(up["cache_hit"], true);
    let (failed, _) = job(&server, json!({"parameter": {"mode": "fail"}}), "x");
    assert_eq!(server.wait(&failed)["status"], "failed");
    let waiting_upload = server.create_demo("ok", "never uploaded");
    let marker = format!("cleanup-marker-{}", std::process::id());
    let running = server.create_demo("sleep", &marker);
    assert_eq!(server.upload(&running, &files_zip("x")).status, 200);
    server.wait_artifact(&running, "artifacts/started");

    // Not from a web page.
    let r =
        request_with(&server.addr, "POST", "/v1/jobs/cleanup", None, &["Origin: http://evil.example"], b"");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(server.get(&format!("/v1/jobs/{done}")).status, 200);

    let r = server.post("/v1/jobs/cleanup");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"runs_deleted": 2, "requests_deleted": 4, "cache_entries_deleted": 1}));
    for rid in [&done, &hit, &failed, &waiting_upload] {
        let r = server.get(&format!("/v1/jobs/{rid}"));
        assert_eq!((r.status, r.detail()), (404, json!("Request not found")), "{rid}");
        assert!(!env.data.join(format!("jobs/{rid}.json")).exists());
        assert!(!env.data.join(format!("requests/{rid}")).exists());
    }
    assert_eq!(cache_entries(&env), 0);
    // What was running is untouched and still ends as it should.
    assert_eq!(runs(&env), 1);
    assert_eq!(server.get(&format!("/v1/jobs/{running}")).json()["status"], "running");
    assert_eq!(server.post(&format!("/v1/jobs/{running}/cancel")).json()["accepted"], true);
    assert_eq!(server.wait(&running)["status"], "canceled");
    // The same inputs now run again.
    let (_, up) = job(&server, json!({}), "numbers: 5\n");
    assert_eq!(up["cache_hit"], false);
}
