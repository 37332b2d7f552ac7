//! Run runtimes, keepalive and every `sandbox_control` action, end to end:
//! the real daemon with the real native provider and the real Docker
//! Engine (scripts/ci-setup.d/20-docker.sh), driven by a fake backend.

mod docker_support;
mod proxy_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proxy_support::{Backend, Daemon, SECS, Scratch, persisted, unpersisted};
use serde_json::{Value, json};

const SECRET: &str = "sk-test-secret-value-42";

fn init(extra_env: Value) -> Value {
    let mut env = json!({"OPENAI_API_KEY": SECRET, "TUIXIU_RUN_BRANCH": "run/x", "USER_HOME": "/root"});
    if let Value::Object(extra) = extra_env {
        for (k, v) in extra {
            env[k] = v;
        }
    }
    json!({"script": "true", "timeout_seconds": 30, "env": env,
           "agentInputs": {"version": 1, "items": []}})
}

/// Sends `acp_open` and returns its `acp_opened`.
async fn open(backend: &Backend, run_id: &str, ttl: u64) -> Value {
    backend.send(&json!({"type":"acp_open","run_id":run_id,"cwd":"/workspace","init":init(json!({})),
        "instance_name":format!("tuixiu-run-{run_id}"),"keepalive_ttl_seconds":ttl}));
    backend.wait_type("acp_opened", "run_id", &json!(run_id), 60 * SECS).await
}

/// The statuses reported for `instance` so far, in order.
fn statuses(backend: &Backend, instance: &str) -> Vec<String> {
    backend
        .received()
        .iter()
        .filter(|r| r.msg["type"] == "proxy_update" && r.msg["content"]["type"] == "sandbox_instance_status")
        .filter(|r| r.msg["content"]["instance_name"] == instance)
        .map(|r| r.msg["content"]["status"].as_str().unwrap().to_string())
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn hmac_sign(secret: &str, msg: &mut Value) {
    msg["signed_at"] =
        json!(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    let canon = tuixiu_sandbox::proxy::control::canonical_json(msg);
    msg["signature"] = json!(tuixiu_sandbox::proxy::control::hmac_hex(secret, canon.as_bytes()));
}

/// A daemon killed right after it answered `acp_open` keeps the run: its
/// record is on disk before the answer goes out, even when the disk is
/// slow (here: every state write held back 400 ms, a debug-build hook).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_opened_goes_out_after_the_run_record_is_on_disk() {
    let backend = Backend::start().await;
    let s = Scratch::new("durable-open");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start_env(&s, "proxy", &cfg, &[("TUIXIU_PERSIST_DELAY_MS", "400")]);
    backend.registered(0, 20 * SECS).await;
    for run in ["d1", "d2"] {
        open(&backend, run, 600).await;
        let record = s.state.join(format!("runs/{run}.json"));
        assert!(record.is_file(), "{run}: acp_opened arrived before {} was written", record.display());
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    daemon.wait_exit(10 * SECS);
    for run in ["d1", "d2"] {
        let record: Value =
            serde_json::from_slice(&std::fs::read(s.state.join(format!("runs/{run}.json"))).unwrap())
                .unwrap();
        assert_eq!(record["instance_name"], format!("tuixiu-run-{run}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_run_lifecycle_and_controls() {
    let backend = Backend::start().await;
    let s = Scratch::new("native");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;

    // acp_open: the instance is ensured and reported, the run persisted;
    // no agent_command is configured here, so the open fails at that step
    // (tests/proxy_acp.rs runs agents).
    let opened = open(&backend, "r1", 600).await;
    assert!(s.state.join("runs/r1.json").is_file(), "acp_opened arrived before the run's record was on disk");
    assert_eq!(opened["ok"], false);
    assert!(opened["error"].as_str().unwrap().contains("agent_command is not configured"), "{opened}");
    assert_eq!(statuses(&backend, "tuixiu-run-r1"), ["running"]);
    let status =
        backend.wait_for("status", SECS, |r| r.msg["content"]["type"] == "sandbox_instance_status").await.msg;
    assert_eq!(status["run_id"], "r1");
    assert_eq!(status["content"]["provider"], "bwrap");
    assert_eq!(status["content"]["runtime"], Value::Null);
    assert!(status["content"]["last_seen_at"].as_str().unwrap().ends_with('Z'));
    let state_file = s.state.join("runs/r1.json");
    let record = persisted(&state_file, "r1 opened", |_| true).await;
    assert_eq!(mode(&s.state.join("runs")), 0o700);
    assert_eq!(mode(&state_file), 0o600);
    assert_eq!(record["instance_name"], "tuixiu-run-r1");
    assert_eq!(record["keepalive_ttl_seconds"], 600);
    assert_eq!(record["init"]["env"]["OPENAI_API_KEY"], SECRET);
    assert!(s.root.join("run-r1").is_dir() && s.root.join("home-r1").is_dir());

    // A different instance name for an existing run is an error.
    backend.send(&json!({"type":"acp_open","run_id":"r1","instance_name":"tuixiu-run-other"}));
    let bad = backend
        .wait_for("second acp_opened", 20 * SECS, |r| {
            r.msg["type"] == "acp_opened" && r.msg["error"].as_str().is_some_and(|e| e.contains("differs"))
        })
        .await;
    assert_eq!(bad.msg["ok"], false);

    // inspect / ensure_running / stop.
    let r = backend.control(json!({"action":"inspect","run_id":"r1","instance_name":"tuixiu-run-r1"})).await;
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(true), json!("running")));
    assert_eq!(r["action"], "inspect");
    assert_eq!(r["run_id"], "r1");
    assert_eq!(r["instance_name"], "tuixiu-run-r1");
    assert!(r["details"]["created_at"].as_str().unwrap().ends_with('Z'));
    let r = backend.control(json!({"action":"ensure_running","run_id":"r2"})).await;
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(true), json!("running")), "{r}");
    assert_eq!(r["instance_name"], Value::Null, "echoed as sent");
    let r = backend.control(json!({"action":"stop","run_id":"r1","instance_name":"tuixiu-run-r1"})).await;
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(true), json!("stopped")), "{r}");
    assert_eq!(statuses(&backend, "tuixiu-run-r1").last().unwrap(), "stopped");
    // ensure_running starts it again.
    let r = backend.control(json!({"action":"ensure_running","run_id":"r1"})).await;
    assert_eq!(r["status"], "running", "{r}");

    // Refusals.
    let r = backend.control(json!({"action":"stop","instance_name":"foreign-container"})).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("prefix"), "{r}");
    let r = backend.control(json!({"action":"inspect","run_id":"../x"})).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("run id \"../x\""), "{r}");
    assert_eq!(r["run_id"], "../x");
    let r = backend.control(json!({"action":"remove_workspace","run_id":"../x"})).await;
    assert_eq!(r["ok"], false);
    let r = backend.control(json!({"action":"remove_image","image":"busybox"})).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("no images"), "{r}");
    let r = backend.control(json!({"action":"remove_image"})).await;
    assert_eq!(r["error"], "image 为空");

    // report_inventory with expected instances.
    let r = backend
        .control(json!({"action":"report_inventory","expected_instances":[
            {"instance_name":"tuixiu-run-r1","run_id":"r1"},{"instance_name":"tuixiu-run-gone","run_id":null}]}))
        .await;
    assert_eq!(r["ok"], true);
    let inv = backend
        .wait_for("inventory with missing_instances", 10 * SECS, |r| r.msg["missing_instances"].is_array())
        .await
        .msg;
    assert_eq!(inv["missing_instances"], json!([{"instance_name":"tuixiu-run-gone","run_id":"gone"}]));
    let names: Vec<&str> =
        inv["instances"].as_array().unwrap().iter().map(|i| i["instance_name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tuixiu-run-r1", "tuixiu-run-r2"]);
    assert_eq!(inv["instances"][0]["run_id"], "r1");

    // gc is a dry run by default: a plan, nothing deleted.
    let expected = json!([{"instance_name":"tuixiu-run-r1","run_id":"r1"}]);
    let r = backend.control(json!({"action":"gc","expected_instances":expected})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        r["planned"]["deletes"],
        json!([{"kind":"instance","instance_name":"tuixiu-run-r2","run_id":"r2"},
               {"kind":"workspace","workspace_provider":"host","instance_name":"tuixiu-run-r2","run_id":"r2"}])
    );
    assert!(r.get("deleted").is_none());
    assert!(s.root.join("run-r2").is_dir());
    // max_delete_count cuts the plan.
    let r = backend
        .control(json!({"action":"gc","expected_instances":expected,"gc":{"max_delete_count":1}}))
        .await;
    assert_eq!(r["planned"]["deletes"].as_array().unwrap().len(), 1);

    // prune_orphans removes what the backend does not expect.
    let r = backend.control(json!({"action":"prune_orphans","expected_instances":expected})).await;
    assert_eq!((r["ok"].clone(), r["deleted_count"].clone()), (json!(true), json!(1)), "{r}");
    let del =
        backend.wait_for("deleted_instances", 10 * SECS, |r| r.msg["deleted_instances"].is_array()).await.msg;
    assert_eq!(
        del["deleted_instances"],
        json!([{"instance_name":"tuixiu-run-r2","run_id":"r2","reason":"prune_orphans"}])
    );
    assert_eq!(statuses(&backend, "tuixiu-run-r2").last().unwrap(), "missing");
    unpersisted(&s.state.join("runs/r2.json"), "the run was forgotten").await;
    let r = backend.control(json!({"action":"inspect","instance_name":"tuixiu-run-r2"})).await;
    assert_eq!(r["status"], "missing");

    // remove_workspace: refuses a symlink out of the root, deletes the run's dirs.
    let outside = s.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "x").unwrap();
    std::os::unix::fs::symlink(&outside, s.root.join("run-evil")).unwrap();
    let r = backend.control(json!({"action":"remove_workspace","run_id":"evil"})).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("outside the workspace root"), "{r}");
    assert!(outside.join("keep").exists());
    let r = backend.control(json!({"action":"remove_workspace","run_id":"r2"})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(!s.root.join("run-r2").exists() && !s.root.join("home-r2").exists());
    let dw = backend
        .wait_for("deleted_workspaces", 10 * SECS, |r| r.msg["deleted_workspaces"].is_array())
        .await
        .msg;
    assert_eq!(dw["deleted_workspaces"][0]["run_id"], "r2");
    assert_eq!(dw["deleted_workspaces"][0]["reason"], "remove_workspace");

    // remove: the instance goes, the run is forgotten, inventories follow.
    let r = backend.control(json!({"action":"remove","run_id":"r1","instance_name":"tuixiu-run-r1"})).await;
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(true), json!("missing")), "{r}");
    let del = backend
        .wait_for("remove inventory", 10 * SECS, |r| {
            r.msg["deleted_instances"][0]["reason"] == "sandbox_control_remove"
        })
        .await
        .msg;
    assert_eq!(del["deleted_instances"][0]["instance_name"], "tuixiu-run-r1");
    assert!(!state_file.exists());
    assert!(s.root.join("run-r1").is_dir(), "remove keeps the workspace");

    // keepalive_ttl_seconds: clamped to [keepalive_min_seconds, 86400], default 1800.
    for (run, ttl, want) in
        [("t1", json!(999_999), 86_400), ("t2", Value::Null, 1800), ("t3", json!("120"), 120)]
    {
        backend.send(&json!({"type":"acp_open","run_id":run,"keepalive_ttl_seconds":ttl}));
        backend.wait_type("acp_opened", "run_id", &json!(run), 30 * SECS).await;
        // Read at once, not waited for: the record is on disk before the
        // answer goes out (src/proxy/persist.rs, "Durable before the reply").
        let record = std::fs::read(s.state.join(format!("runs/{run}.json")));
        let st: Value = serde_json::from_slice(&record.unwrap_or_else(|e| {
            panic!("{run}: acp_opened arrived before the run's record was on disk: {e}")
        }))
        .unwrap();
        assert_eq!(st["keepalive_ttl_seconds"], want, "{run}");
        assert_eq!(st["instance_name"], format!("tuixiu-run-{run}"), "default instance name");
    }

    // No secret reached the backend's events or the log.
    for r in backend.received() {
        assert!(!r.msg.to_string().contains(SECRET), "secret in {}", r.msg);
    }
    assert!(!daemon.stderr().contains(SECRET));
    assert!(daemon.stop().success());
}

/// The daemon as an unprivileged user and nested in a user namespace: the
/// state directory, lock, run state and native instances work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprivileged_and_nested_daemons_run_native_instances() {
    for nested in [false, true] {
        let backend = Backend::start().await;
        let s = Scratch::new(if nested { "nested" } else { "nobody" });
        let cfg = s.config(&backend.url, "", "");
        let mut daemon = Daemon::start_unprivileged(&s, "proxy", &cfg, nested);
        backend.registered(0, 20 * SECS).await;
        let opened = open(&backend, "u1", 600).await;
        assert!(
            opened["error"].as_str().unwrap().contains("agent_command is not configured"),
            "{opened}\n{}",
            daemon.stderr()
        );
        assert_eq!(statuses(&backend, "tuixiu-run-u1"), ["running"]);
        let state_file = s.state.join("runs/u1.json");
        persisted(&state_file, "u1 opened", |_| true).await;
        let meta = std::fs::metadata(&state_file).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534);
        assert_eq!(mode(&state_file), 0o600);
        assert_eq!(mode(&s.state), 0o700);
        let r = backend.control(json!({"action":"remove","run_id":"u1"})).await;
        assert_eq!(r["status"], "missing", "{r}");
        assert!(daemon.stop().success(), "{}", daemon.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_expiry_removes_the_native_instance() {
    let backend = Backend::start().await;
    let s = Scratch::new("keepalive");
    // Node behaviour: only acp_close starts the clock.
    let cfg = s.config(&backend.url, "expire_idle_runs = false", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    open(&backend, "k1", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(statuses(&backend, "tuixiu-run-k1"), ["running"], "expired without acp_close");
    backend.send(&json!({"type":"acp_close","run_id":"k1"}));
    let closed = backend.wait_type("acp_closed", "run_id", &json!("k1"), 10 * SECS).await;
    assert_eq!(closed["ok"], true);
    backend
        .wait_for("missing after expiry", 10 * SECS, |_| {
            statuses(&backend, "tuixiu-run-k1").last().map(String::as_str) == Some("missing")
        })
        .await;
    assert!(!s.state.join("native/tuixiu-run-k1").exists(), "instance record removed");
    // The run is kept (tests/proxy_acp.rs resumes one after expiry).
    let kept =
        persisted(&s.state.join("runs/k1.json"), "k1 after expiry", |v| v["expires_at_ms"].is_null()).await;
    assert_eq!(kept["init"]["env"]["OPENAI_API_KEY"], SECRET, "the run's init is kept");
    let r = backend.control(json!({"action":"inspect","run_id":"k1"})).await;
    assert_eq!(r["status"], "missing");
    // `remove` forgets it.
    let r = backend.control(json!({"action":"remove","run_id":"k1"})).await;
    assert_eq!(r["ok"], true, "{r}");
    unpersisted(&s.state.join("runs/k1.json"), "k1 removed").await;
    assert!(daemon.stop().success());
}

/// By default (as the Node proxy) an idle run never expires; with
/// `expire_idle_runs = true` its instance goes after the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_runs_expire_only_when_configured() {
    let backend = Backend::start().await;
    let s = Scratch::new("idle");
    let default = Daemon::start(&s, "default", &s.config(&backend.url, "", ""));
    backend.registered(0, 20 * SECS).await;
    open(&backend, "i0", 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(statuses(&backend, "tuixiu-run-i0"), ["running"], "an idle run expired by default");
    drop(default);
    let _daemon = Daemon::start(&s, "expiring", &s.config(&backend.url, "expire_idle_runs = true", ""));
    backend.registered(1, 20 * SECS).await;
    open(&backend, "i1", 2).await;
    backend
        .wait_for("missing after the idle TTL", 15 * SECS, |_| {
            statuses(&backend, "tuixiu-run-i1").last().map(String::as_str) == Some("missing")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_controls_need_a_valid_signature() {
    let backend = Backend::start().await;
    let s = Scratch::new("signed");
    let key = "control-signing-key-1";
    let cfg = s.config(&backend.url, &format!("control_signing_secret = \"{key}\""), "");
    let _daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let r = backend.control(json!({"action":"ensure_running","run_id":"s1"})).await;
    assert_eq!(r["ok"], true, "non-destructive actions need no signature: {r}");
    let r = backend.control(json!({"action":"stop","run_id":"s1"})).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().starts_with("signature_required"), "{r}");
    let mut msg = json!({"type":"sandbox_control","action":"stop","run_id":"s1","request_id":"sig-bad"});
    hmac_sign("wrong-key", &mut msg);
    backend.send(&msg);
    let r = backend.result("sig-bad").await;
    assert!(r["error"].as_str().unwrap().starts_with("signature_invalid"), "{r}");
    // A signature over other content (tampered run id) fails too.
    let mut msg = json!({"type":"sandbox_control","action":"stop","run_id":"s1","request_id":"sig-tamper"});
    hmac_sign(key, &mut msg);
    msg["instance_name"] = json!("tuixiu-run-s1");
    backend.send(&msg);
    assert_eq!(backend.result("sig-tamper").await["ok"], false);
    let mut msg = json!({"type":"sandbox_control","action":"stop","run_id":"s1","request_id":"sig-old"});
    msg["signed_at"] = json!(1_000_000);
    let canon = tuixiu_sandbox::proxy::control::canonical_json(&msg);
    msg["signature"] = json!(tuixiu_sandbox::proxy::control::hmac_hex(key, canon.as_bytes()));
    backend.send(&msg);
    assert!(backend.result("sig-old").await["error"].as_str().unwrap().starts_with("signature_expired"));
    let mut msg = json!({"type":"sandbox_control","action":"stop","run_id":"s1","request_id":"sig-ok"});
    hmac_sign(key, &mut msg);
    backend.send(&msg);
    let r = backend.result("sig-ok").await;
    assert_eq!((r["ok"].clone(), r["status"].clone()), (json!(true), json!("stopped")), "{r}");
    // gc: the dry run needs none, the real one does.
    let r = backend.control(json!({"action":"gc","expected_instances":[]})).await;
    assert_eq!(r["ok"], true);
    let r = backend.control(json!({"action":"gc","dry_run":false,"expected_instances":[]})).await;
    assert!(r["error"].as_str().unwrap().starts_with("signature_required"), "{r}");
    let mut msg = json!({"type":"sandbox_control","action":"gc","dry_run":false,"expected_instances":[],"request_id":"gc-ok"});
    hmac_sign(key, &mut msg);
    backend.send(&msg);
    let r = backend.result("gc-ok").await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["deleted"], json!({"instances":1,"workspaces":1}));
    assert!(!s.root.join("run-s1").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_push_pushes_without_hooks_and_never_leaks_the_password() {
    let backend = Backend::start().await;
    let s = Scratch::new("gitpush");
    let bare = s.dir.join("remote.git");
    let ws = s.root.join("run-g1");
    std::fs::create_dir_all(&ws).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(&s.dir, &["init", "-q", "--bare", bare.to_str().unwrap()]);
    git(&ws, &["init", "-q", "-b", "run/x"]);
    git(&ws, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "work"]);
    git(&ws, &["remote", "add", "origin", bare.to_str().unwrap()]);
    // A hook planted by the agent must not run on the host.
    let hook = ws.join(".git/hooks/pre-push");
    std::fs::write(&hook, format!("#!/bin/sh\ntouch {}/hook-ran\n", s.dir.display())).unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let password = "ghp_supersecretpassword123";
    let env = json!({"TUIXIU_REPO_URL": bare.to_str().unwrap(), "TUIXIU_GIT_AUTH_MODE":"https_pat",
        "TUIXIU_GIT_HTTP_USERNAME":"x-access-token","TUIXIU_GIT_HTTP_PASSWORD":password,"GH_TOKEN":password});
    let r = backend
        .control(json!({"action":"git_push","run_id":"g1","instance_name":"tuixiu-run-g1","branch":"run/x",
            "cwd":"/workspace","env":env,"timeout_seconds":60}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["code"], 0);
    assert!(r["stderr"].is_string() && r["stdout"].is_string());
    let out = Command::new("git")
        .arg("-C")
        .arg(&bare)
        .args(["rev-parse", "--verify", "refs/heads/run/x"])
        .output()
        .unwrap();
    assert!(out.status.success(), "the branch was not pushed");
    assert!(!s.dir.join("hook-ran").exists(), "the workspace's pre-push hook ran on the host");
    // A remote that is not TUIXIU_REPO_URL does not get the credentials.
    let r = backend
        .control(json!({"action":"git_push","run_id":"g1","branch":"run/x",
            "env":{"TUIXIU_REPO_URL":"https://example.invalid/other.git","TUIXIU_GIT_HTTP_PASSWORD":password}}))
        .await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("refusing to send credentials"), "{r}");
    // A credential helper planted for the remote's URL would run on the
    // host with the password: refused before git pushes.
    git(
        &ws,
        &["config", "--local", "credential.https://example.com.helper", "!touch /tmp/tuixiu-helper-ran"],
    );
    let r = backend
        .control(json!({"action":"git_push","run_id":"g1","branch":"run/x","env":{"TUIXIU_GIT_HTTP_PASSWORD":password}}))
        .await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("credential.https://example.com.helper"), "{r}");
    // Bad branch names never reach git.
    let r = backend.control(json!({"action":"git_push","run_id":"g1","branch":"--force"})).await;
    assert!(r["error"].as_str().unwrap().contains("not a valid branch"), "{r}");
    for m in backend.received() {
        assert!(!m.msg.to_string().contains(password), "password in {}", m.msg);
    }
    assert!(!daemon.stderr().contains(password));
    assert!(daemon.stop().success());
}

// ------------------------------------------------------------------ docker

fn docker_cfg(s: &Scratch, url: &str, extra: &str) -> String {
    s.config(url, extra, &format!("provider = \"container_oci\"\nimage = \"{}\"\n", docker_support::image()))
}

fn container_state(name: &str) -> Option<String> {
    let out = docker_support::docker(&["inspect", "--format", "{{.State.Status}}", name]);
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Removes the test's containers even when an assertion failed.
struct Containers(Vec<String>);
impl Drop for Containers {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = docker_support::docker(&["rm", "-f", c]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_restart_readopts_instance_and_persisted_run() {
    docker_support::require_engine();
    let run = format!("d{}", std::process::id());
    let name = format!("tuixiu-run-{run}");
    let _cleanup = Containers(vec![name.clone()]);
    let backend = Backend::start().await;
    let s = Scratch::new("docker-restart");
    let cfg = docker_cfg(&s, &backend.url, "expire_idle_runs = false");
    let mut first = Daemon::start(&s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    assert_eq!(backend.of_conn(0)[0]["agent"]["capabilities"]["sandbox"]["provider"], "container_oci");
    assert_eq!(backend.of_conn(0)[0]["agent"]["capabilities"]["sandbox"]["runtime"], "docker");
    let opened = open(&backend, &run, 600).await;
    // The busybox image has no bash: the open stops at the init script.
    assert!(opened["error"].as_str().unwrap().contains("init.script exited with exitCode=127"), "{opened}");
    assert_eq!(container_state(&name).as_deref(), Some("running"));
    let st = backend
        .wait_for("docker status", 10 * SECS, |r| r.msg["content"]["instance_name"] == name.as_str())
        .await
        .msg;
    assert_eq!(st["content"]["provider"], "container_oci");
    assert_eq!(st["content"]["runtime"], "docker");
    assert!(first.stop().success());
    assert_eq!(container_state(&name).as_deref(), Some("running"), "the instance outlives the daemon");

    let mut second = Daemon::start(&s, "second", &cfg);
    backend.registered(1, 20 * SECS).await;
    // The connect inventory lists the container with its run id.
    let inv = backend
        .wait_for("inventory", 10 * SECS, |r| r.conn == 1 && r.msg["type"] == "sandbox_inventory")
        .await
        .msg;
    let entry = inv["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_name"] == name.as_str())
        .unwrap()
        .clone();
    assert_eq!(entry["run_id"], run.as_str());
    assert_eq!(entry["status"], "running");
    // The run is known again: prompt_send without init reaches it (the
    // persisted init is used: the open gets as far as starting the agent,
    // which this config has none of) and acp_close works.
    backend.send(&json!({"type":"prompt_send","run_id":run,"prompt_id":"p1","session_id":null,
        "instance_name":name,"prompt":[{"type":"text","text":"continue"}]}));
    let pr = backend.wait_type("prompt_result", "prompt_id", &json!("p1"), 30 * SECS).await;
    assert!(pr["error"].as_str().unwrap().contains("init.script exited with exitCode=127"), "{pr}");
    let persisted: Value =
        serde_json::from_slice(&std::fs::read(s.state.join(format!("runs/{run}.json"))).unwrap()).unwrap();
    assert_eq!(persisted["init"]["env"]["OPENAI_API_KEY"], SECRET);
    let r = backend.control(json!({"action":"inspect","run_id":run})).await;
    assert_eq!(r["status"], "running");
    assert_eq!(r["instance_name"], Value::Null);
    // Keepalive after close: the container is removed.
    backend.send(&json!({"type":"acp_close","run_id":run}));
    assert_eq!(backend.wait_type("acp_closed", "run_id", &json!(run), 10 * SECS).await["ok"], true);
    // TTL 600 from the open: shorten it with a new open? No: the clock
    // uses the run's TTL; re-open with TTL 1 and close again.
    backend.send(&json!({"type":"acp_open","run_id":run,"keepalive_ttl_seconds":1}));
    backend.wait_for("second acp_opened", 30 * SECS, |r| r.conn == 1 && r.msg["type"] == "acp_opened").await;
    backend.send(&json!({"type":"acp_close","run_id":run}));
    backend
        .wait_for("missing", 20 * SECS, |_| {
            statuses(&backend, &name).last().map(String::as_str) == Some("missing")
        })
        .await;
    assert_eq!(container_state(&name), None, "the container was not removed at expiry");
    assert!(second.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_controls_refuse_foreign_containers_and_remove_images() {
    docker_support::require_engine();
    // A prefix of its own: prune_orphans with no expected instances must
    // not reach containers of other tests running at the same time.
    let prefix = format!("tuixiu-t{}c-", std::process::id());
    let foreign = format!("{prefix}foreign");
    let managed_run = "m1".to_string();
    let managed = format!("{prefix}{managed_run}");
    let tag = format!("tuixiu-test/rmme:{}", std::process::id());
    let _cleanup = Containers(vec![foreign.clone(), managed.clone()]);
    // A container with the right prefix but not created by us (no label).
    let out =
        docker_support::docker(&["run", "-d", "--name", &foreign, &docker_support::image(), "sleep", "600"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(docker_support::docker(&["tag", &docker_support::image(), &tag]).status.success());
    let backend = Backend::start().await;
    let s = Scratch::new("docker-controls");
    let cfg = s.config(
        &backend.url,
        "",
        &format!(
            "provider = \"container_oci\"\nimage = \"{}\"\ninstancePrefix = \"{prefix}\"\n",
            docker_support::image()
        ),
    );
    let _daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    for action in ["stop", "remove"] {
        let r = backend.control(json!({"action":action,"instance_name":foreign})).await;
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["error"].as_str().unwrap().contains("not managed"), "{r}");
    }
    assert_eq!(container_state(&foreign).as_deref(), Some("running"));
    // Foreign containers are not in the inventory and not pruned.
    let r = backend.control(json!({"action":"ensure_running","run_id":managed_run})).await;
    assert_eq!(r["status"], "running", "{r}");
    let r = backend.control(json!({"action":"prune_orphans","expected_instances":[]})).await;
    assert_eq!(r["deleted_count"], 1, "{r}");
    assert_eq!(container_state(&managed), None);
    assert_eq!(container_state(&foreign).as_deref(), Some("running"));
    // remove_image.
    let r = backend.control(json!({"action":"remove_image","image":tag})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(!docker_support::docker(&["image", "inspect", &tag]).status.success());
    let r = backend.control(json!({"action":"remove_image","image":"--all"})).await;
    assert_eq!(r["ok"], false);
}

/// `sandbox.pathMapping = windows_to_wsl`: a backend on Windows sends
/// `D:\repo\x`; the daemon uses `<mountRoot>/d/repo/x` for the workspace,
/// and the allowlist check under workspaceHostRoot sees the mapped path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_host_paths_are_mapped_before_any_check() {
    let backend = Backend::start().await;
    let s = Scratch::new("pathmap");
    let mount_root = s.root.join("mnt");
    let mapped = mount_root.join("d/repo/x");
    std::fs::create_dir_all(&mapped).unwrap();
    let cfg = s.config(
        &backend.url,
        "",
        &format!("pathMapping = {{ type = \"windows_to_wsl\", mountRoot = \"{}\" }}", mount_root.display()),
    );
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;

    let mut init = init(json!({}));
    init["agentInputs"]["items"] = json!([{
        "id": "ws", "apply": "bindMount", "access": "rw",
        "source": {"type": "hostPath", "path": "D:\\repo\\x"},
        "target": {"root": "WORKSPACE", "path": "."}
    }]);
    backend.send(&json!({"type":"acp_open","run_id":"w1","cwd":"/workspace","init":init,
        "instance_name":"tuixiu-run-w1"}));
    let opened = backend.wait_type("acp_opened", "run_id", &json!("w1"), 60 * SECS).await;
    // No agent_command here: the open gets as far as the agent step.
    assert!(opened["error"].as_str().unwrap().contains("agent_command is not configured"), "{opened}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(s.state.join("native/tuixiu-run-w1/instance.json")).unwrap())
            .unwrap();
    assert_eq!(
        record["workspace"].as_str().map(Path::new),
        Some(mapped.canonicalize().unwrap().as_path()),
        "{record}"
    );
    assert!(!s.root.join("run-w1").exists(), "the default workspace was used instead");

    // A UNC path cannot be mapped: one clear line naming the item.
    let mut unc = init.clone();
    unc["agentInputs"]["items"][0]["source"]["path"] = json!("\\\\server\\share");
    backend.send(&json!({"type":"acp_open","run_id":"w2","init":unc,"instance_name":"tuixiu-run-w2"}));
    let bad = backend.wait_type("acp_opened", "run_id", &json!("w2"), 60 * SECS).await;
    assert_eq!(bad["ok"], false);
    assert!(bad["error"].as_str().unwrap().contains("agentInputs item ws: source.path"), "{bad}");
    assert!(daemon.stop().success());
}

/// A control whose required fields are missing or malformed is refused,
/// naming the field, and touches nothing: every action, and the shapes of
/// `expected_instances` that once read as "none expected" and removed
/// every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_controls_are_refused_and_touch_nothing() {
    let backend = Backend::start().await;
    let s = Scratch::new("malformed-controls");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    for run in ["m1", "m2"] {
        open(&backend, run, 600).await;
    }
    let intact = |what: &str| {
        for run in ["m1", "m2"] {
            assert!(s.state.join(format!("native/tuixiu-run-{run}")).is_dir(), "{what}: instance {run} gone");
            assert!(s.state.join(format!("runs/{run}.json")).is_file(), "{what}: run {run} forgotten");
            assert!(s.root.join(format!("run-{run}")).is_dir(), "{what}: workspace {run} gone");
            let rec: Value = serde_json::from_slice(
                &std::fs::read(s.state.join(format!("native/tuixiu-run-{run}/instance.json"))).unwrap(),
            )
            .unwrap();
            assert_eq!(rec["stopped"], false, "{what}: instance {run} stopped");
        }
    };
    let cases: Vec<(Value, &str)> = vec![
        (json!({"action":"prune_orphans"}), "expected_instances is missing"),
        (json!({"action":"prune_orphans","expected_instances":null}), "expected_instances is missing"),
        (
            json!({"action":"prune_orphans","expected_instances":"notalist"}),
            "expected_instances must be a list",
        ),
        (
            json!({"action":"prune_orphans","expected_instances":{"instance_name":"tuixiu-run-m1"}}),
            "expected_instances must be a list",
        ),
        (
            json!({"action":"prune_orphans","expected_instances":[{"bogus":1}]}),
            "expected_instances[0].instance_name is missing",
        ),
        (
            json!({"action":"prune_orphans","expected_instances":[{"instance_name":"tuixiu-run-m1"},7]}),
            "expected_instances[1] must be an object",
        ),
        (
            json!({"action":"prune_orphans","expected_instances":[{"instance_name":5}]}),
            "expected_instances[0].instance_name must be a name",
        ),
        (
            json!({"action":"prune_orphans","expected_instances":[{"instance_name":"tuixiu-run-m1","run_id":3}]}),
            "expected_instances[0].run_id",
        ),
        (json!({"action":"gc","dry_run":false}), "expected_instances is missing"),
        (
            json!({"action":"gc","dry_run":false,"expected_instances":[{"bogus":1}]}),
            "expected_instances[0].instance_name is missing",
        ),
        (json!({"action":"gc","dry_run":"false","expected_instances":[]}), "dry_run must be true or false"),
        (
            json!({"action":"gc","gc":{"dry_run":0},"expected_instances":[]}),
            "gc.dry_run must be true or false",
        ),
        (json!({"action":"gc","gc":"all","expected_instances":[]}), "gc must be an object"),
        (
            json!({"action":"gc","dry_run":false,"gc":{"max_delete_count":"9"},"expected_instances":[]}),
            "gc.max_delete_count",
        ),
        (
            json!({"action":"gc","dry_run":false,"gc":{"remove_workspaces":"yes"},"expected_instances":[]}),
            "gc.remove_workspaces",
        ),
        (
            json!({"action":"report_inventory","expected_instances":"notalist"}),
            "expected_instances must be a list",
        ),
        (json!({"action":"inspect"}), "instance_name"),
        (json!({"action":"inspect","instance_name":5}), "instance_name must be a string"),
        (json!({"action":"ensure_running","instance_name":"tuixiu-run-m1"}), "run_id is missing"),
        (json!({"action":"ensure_running","run_id":["m1"]}), "run_id must be a string"),
        (json!({"action":"stop"}), "instance_name"),
        (json!({"action":"stop","instance_name":["tuixiu-run-m1"]}), "instance_name must be a string"),
        (json!({"action":"stop","run_id":7}), "run_id must be a string"),
        (json!({"action":"remove"}), "instance_name"),
        (
            json!({"action":"remove","instance_name":{"name":"tuixiu-run-m2"}}),
            "instance_name must be a string",
        ),
        (json!({"action":"remove","run_id":"../m1"}), "run id"),
        (json!({"action":"remove_workspace"}), "run_id"),
        (json!({"action":"remove_workspace","run_id":true}), "run_id must be a string"),
        (json!({"action":"remove_image"}), "image"),
        (json!({"action":"remove_image","image":5}), "image must be a string"),
        (json!({"action":"git_push","run_id":"m1"}), "branch"),
        (json!({"action":"git_push","run_id":"m1","branch":"main","remote":5}), "remote must be a string"),
        (
            json!({"action":"git_push","run_id":"m1","branch":"main","timeout_seconds":"5"}),
            "timeout_seconds must be",
        ),
        (json!({"action":"git_push","run_id":"m1","branch":"main","env":"A=b"}), "env must be an object"),
    ];
    for (msg, field) in cases {
        let r = backend.control(msg.clone()).await;
        assert_eq!(r["ok"], false, "{msg} was accepted: {r}");
        let err = r["error"].as_str().unwrap_or_default();
        assert!(err.contains(field), "{msg}: the error does not name {field:?}: {err}");
        intact(&msg.to_string());
    }
    for action in [Value::Null, json!(5), json!("PRUNE_ORPHANS")] {
        let r = backend.control(json!({"action":action})).await;
        assert_eq!(r["error"], "unsupported_action", "{r}");
    }
    intact("unsupported actions");
    assert!(
        backend
            .received()
            .iter()
            .all(|r| r.msg.get("deleted_instances").is_none() && r.msg.get("deleted_workspaces").is_none()),
        "something was reported deleted"
    );
    // Well-formed, the same controls work (an empty list means none expected).
    let r = backend
        .control(json!({"action":"prune_orphans","expected_instances":[
        {"instance_name":"tuixiu-run-m1","run_id":"m1"},{"instance_name":"tuixiu-run-m2","run_id":null}]}))
        .await;
    assert_eq!((r["ok"].clone(), r["deleted_count"].clone()), (json!(true), json!(0)), "{r}");
    intact("a well-formed prune_orphans");
    let r = backend
        .control(json!({"action":"prune_orphans","expected_instances":[
        {"instance_name":"tuixiu-run-m1","run_id":"m1"}]}))
        .await;
    assert_eq!(r["deleted_count"], 1, "{r}");
    assert!(!s.state.join("native/tuixiu-run-m2").exists());
    assert!(daemon.stop().success());
}

/// A directory under /opt, which every native sandbox's system view
/// shows read-only; removed when dropped.
struct OptDir(std::path::PathBuf);

impl OptDir {
    fn new(label: &str) -> OptDir {
        let dir = Path::new("/opt").join(format!("tuixiu-test-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        OptDir(dir)
    }
}

impl Drop for OptDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two runs on one daemon whose workspace root and state directory lie in
/// the sandboxes' system view (under /opt): the daemon warns at startup
/// and in `check --daemon`, and neither run's agent can list or read the
/// other's workspace or home, nor the state, by any path.
async fn two_runs(who: &str) {
    let backend = Backend::start().await;
    let opt = OptDir::new(who);
    let mut s = Scratch::new("two-runs");
    s.root = opt.0.join("workspaces");
    s.state = opt.0.join("state");
    std::fs::create_dir_all(&s.root).unwrap();
    let cfg = proxy_support::agent::acp_config(&s, &backend.url, "", "");
    let mut daemon = if who == "root" {
        Daemon::start(&s, "proxy", &cfg)
    } else {
        std::os::unix::fs::chown(&opt.0, Some(65534), Some(65534)).unwrap();
        Daemon::start_unprivileged(&s, "proxy", &cfg, who == "nested")
    };
    backend.registered(0, 20 * SECS).await;
    let items = |run: &str| {
        json!({"version": 1, "items": [
            {"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": format!("notes of {run}")},
             "target": {"root": "USER_HOME", "path": "notes.txt"}}]})
    };
    for run in ["a", "b"] {
        backend.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","keepalive_ttl_seconds":600,
            "init":{"env":{"USER_HOME":"/home/agent"},"agentInputs":items(run)}}));
        let opened = backend.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await;
        assert_eq!(opened["ok"], true, "{who}: {opened}\n{}", daemon.stderr());
        let r = proxy_support::agent::prompt(
            &backend,
            run,
            &format!("w{run}"),
            Value::Null,
            &format!(
                "file /workspace/code.txt code of {run}\nrun mkdir /home/agent/.claude\n\
                 file /home/agent/.claude/key secret of {run}"
            ),
        )
        .await;
        assert_eq!(r["ok"], true, "{who}: {r}");
        for dir in [format!("run-{run}"), format!("home-{run}")] {
            assert_eq!(mode(&s.root.join(&dir)), 0o700, "{who}: {dir}");
        }
    }
    // Run b looks for run a by every path it has: the root, a's
    // directories in it, the state directory.
    let (root, state) = (s.root.display().to_string(), s.state.display().to_string());
    let tries = [
        format!("ls -a {root}"),
        format!("ls -a {}", opt.0.display()),
        format!("cat {root}/run-a/code.txt"),
        format!("cat {root}/home-a/notes.txt"),
        format!("cat {root}/home-a/.claude/key"),
        format!("ls -a {state}"),
        format!("cat {state}/runs/a.json"),
    ];
    let script: Vec<String> = tries.iter().map(|t| format!("run {t}")).collect();
    let r = proxy_support::agent::prompt(&backend, "b", "look", Value::Null, &script.join("\n")).await;
    assert_eq!(r["ok"], true, "{who}: {r}");
    let reports = proxy_support::agent::reports(&backend, "look");
    assert_eq!(reports.len(), tries.len(), "{who}: {reports:?}");
    for (t, rep) in tries.iter().zip(&reports) {
        let out = rep["stdout"].as_str().unwrap_or_default();
        for leaked in ["run-a", "home-a", "code of a", "notes of a", "secret of a", "runs", "agentInputs"] {
            assert!(!out.contains(leaked), "{who}: run b saw {leaked:?} with `{t}`: {rep}");
        }
    }
    // Its own are where they should be.
    let r = proxy_support::agent::prompt(
        &backend,
        "b",
        "own",
        Value::Null,
        "run cat /workspace/code.txt /home/agent/notes.txt",
    )
    .await;
    assert_eq!(r["ok"], true, "{who}: {r}");
    let own = proxy_support::agent::reports(&backend, "own");
    assert_eq!(own[0]["stdout"], "code of bnotes of b", "{who}: {own:?}");
    let log = daemon.stderr();
    for key in ["sandbox.workspaceHostRoot", "state_dir"] {
        assert!(
            log.lines().any(|l| l.contains("WARN") && l.contains(key) && l.contains("lies inside /opt")),
            "{who}: no startup warning for {key}: {log}"
        );
    }
    // check --daemon says what the log said.
    let out = Command::new(proxy_support::binary()).args(["check", "--daemon", &state]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("daemon paths") && l.contains("sandbox.workspaceHostRoot")),
        "{who}: {text}"
    );
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_cannot_see_each_others_workspace_or_home() {
    // The daemon as root, as uid 65534, and as 65534 inside `unshare -U -r`.
    for who in ["root", "nobody", "nested"] {
        two_runs(who).await;
    }
}
