//! The backend's WebSocket messages: `protocol::Incoming::decode`, then
//! `Daemon::dispatch` into a daemon whose provider is the real native one
//! with a launcher that does not exist (instances are made and recorded;
//! no process starts, nothing reaches the network).
//!
//! The input is up to 32 text frames, one per line. `@ROOT@` and `@OUT@`
//! in a frame become the workspace root and a directory next to it, so
//! paths can aim at both. Before dispatch, what would reach the network is
//! taken out of `init` (`TUIXIU_REPO_URL` after its own check, manifest
//! items that download or check out); `git_push` is off in the config.
//!
//! Checked: no panic; every message that expects an answer gets exactly
//! one (`acp_opened`, `prompt_result`, `acp_closed`,
//! `session_control_result`, `sandbox_control_result`) within 20 s; every
//! outgoing message is a JSON object with a `type`; nothing outside the
//! daemon's state directory and workspace root changes (a sibling holds
//! files, and the root holds symlinks that lead to it).
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tuixiu_sandbox::proxy::protocol::Incoming;
use tuixiu_sandbox_fuzz::Snapshot;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let frames: Vec<&str> = text.split('\n').take(32).collect();

    let dir = tuixiu_sandbox_fuzz::scratch();
    let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(outside.join("keep"), "keep").unwrap();
    std::fs::create_dir_all(&root).unwrap();
    for (name, target) in [("run-out", "../outside"), ("home-out", "../outside/sub")] {
        std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    }
    let before = Snapshot::take(dir.path(), &["root", "state"]);
    let root_links = Snapshot::take(&root, &[]);

    let cfg = tuixiu_sandbox_fuzz::proxy_config(dir.path(), "");
    let root = cfg.sandbox.workspace_host_root.clone();
    let rt = tuixiu_sandbox_fuzz::runtime();
    rt.block_on(async {
        let d = Arc::new(tuixiu_sandbox_fuzz::daemon(cfg));
        let mut expected: HashMap<&'static str, usize> = HashMap::new();
        for frame in frames {
            let frame = frame
                .replace("@ROOT@", &root.display().to_string())
                .replace("@OUT@", &std::fs::canonicalize(&outside).unwrap().display().to_string());
            let Ok(mut msg) = Incoming::decode(&frame) else { continue };
            let answer = match &mut msg {
                Incoming::AcpOpen(m) => {
                    offline(&mut m.init, &root);
                    Some("acp_opened")
                }
                Incoming::PromptSend(m) => {
                    offline(&mut m.init, &root);
                    Some("prompt_result")
                }
                Incoming::AcpClose(_) => Some("acp_closed"),
                Incoming::SessionControl { .. } => Some("session_control_result"),
                Incoming::SandboxControl(_) => Some("sandbox_control_result"),
                Incoming::SessionPermission(_)
                | Incoming::AcpMessage(_)
                | Incoming::RegisterAck(_)
                | Incoming::IdConflict { .. } => None,
            };
            if let Some(kind) = answer {
                *expected.entry(kind).or_default() += 1;
            }
            d.dispatch(msg);
        }

        let mut got: HashMap<String, usize> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            std::thread::sleep(Duration::from_micros(100));
            let n = d.outbox().len();
            if n > 0 {
                let batch = d.outbox().peek_batch(n, usize::MAX, Some(usize::MAX)).await;
                for text in batch.texts() {
                    let v: Value = serde_json::from_str(text.as_str()).unwrap_or_else(|e| {
                        panic!("an outgoing message is not JSON ({e}): {}", text.as_str())
                    });
                    let kind =
                        v.get("type").and_then(Value::as_str).unwrap_or_else(|| panic!("no type: {v}"));
                    *got.entry(kind.to_string()).or_default() += 1;
                }
                d.outbox().pop_sent(&batch);
            }
            let done = expected.iter().all(|(k, n)| got.get(*k).copied().unwrap_or(0) >= *n);
            if done || Instant::now() > deadline {
                break;
            }
        }
        // Triage: TUIXIU_FUZZ_DEBUG=1 <binary> <input> shows the counts.
        if std::env::var_os("TUIXIU_FUZZ_DEBUG").is_some() {
            eprintln!("DEBUG expected {expected:?} got {got:?}");
        }
        for kind in
            ["acp_opened", "prompt_result", "acp_closed", "session_control_result", "sandbox_control_result"]
        {
            let (want, have) =
                (expected.get(kind).copied().unwrap_or(0), got.get(kind).copied().unwrap_or(0));
            assert_eq!(have, want, "{kind}: {want} expected, {have} sent (all sent: {got:?})");
        }
    });
    drop(rt);
    assert_eq!(
        Snapshot::take(dir.path(), &["root", "state"]),
        before,
        "something outside the daemon's directories changed"
    );
    let links_now = Snapshot::take(&root, &[]);
    for (path, node) in &root_links.0 {
        if !path.as_os_str().is_empty() {
            assert_eq!(links_now.0.get(path), Some(node), "{} changed", path.display());
        }
    }
});

/// Takes out of `init` what would reach the network: `TUIXIU_REPO_URL`
/// (checked first, as the daemon checks it) and manifest items whose JSON
/// mentions a download or a checkout.
fn offline(init: &mut Value, root: &std::path::Path) {
    if let Some(env) = init.get_mut("env").and_then(Value::as_object_mut) {
        let vars: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string)))
            .collect();
        if let Err(e) = tuixiu_sandbox::proxy::repo::Request::from_env(&vars, root) {
            tuixiu_sandbox_fuzz::assert_one_line("TUIXIU_REPO_URL error", &e.to_string());
        }
        env.remove("TUIXIU_REPO_URL");
    }
    if let Some(items) = init.pointer_mut("/agentInputs/items").and_then(Value::as_array_mut) {
        items.retain(|item| {
            let text = item.to_string();
            !["git", "http", "Zip", "zip", "xtract", "heckout", "ownload"].iter().any(|w| text.contains(w))
        });
    }
}
