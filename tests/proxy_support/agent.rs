//! The fake ACP agent (tests/fake/agent.rs, the example `fake_agent`)
//! and helpers to read what it reported, for the agent host's end-to-end
//! tests.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Backend, SECS, Scratch};

/// The built agent: `target/<profile>/examples/fake_agent`, next to this
/// test's own `target/<profile>/deps/`. `cargo test` builds it with the
/// tests (examples are built unless test targets are named alone).
pub fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/TEST");
    let bin = profile.join("examples/fake_agent");
    assert!(bin.is_file(), "{} is missing: build it with `cargo build --example fake_agent`", bin.display());
    bin
}

/// Places the agent where every caller can read and run it; returns its
/// directory (mounted at `/agent` by [`acp_config`]).
pub fn agent_dir(s: &Scratch) -> PathBuf {
    let dir = s.dir.join("agent");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(agent_binary(), dir.join("fake_agent")).unwrap();
    dir
}

/// A config running the fake agent (at `/agent`, read-only) with
/// terminals on; `extra` goes to the top level, `sandbox_extra` to
/// `[sandbox]` (before the volume tables).
pub fn acp_config(s: &Scratch, url: &str, extra: &str, sandbox_extra: &str) -> String {
    let dir = agent_dir(s);
    // The command comes first: `extra` may open tables of its own.
    s.toml(url, &format!("{AGENT_COMMAND}\nagent_shutdown_grace_seconds = 1\n{extra}"))
        .sandbox("terminalEnabled = true")
        .sandbox(sandbox_extra)
        .volume(&dir, "/agent", true)
        .build()
}

/// The fake agent's command line, as [`agent_dir`] places it.
pub const AGENT_COMMAND: &str = r#"agent_command = ["/agent/fake_agent"]"#;

/// Sends a prompt and waits for its result.
pub async fn prompt(b: &Backend, run: &str, id: &str, session: Value, text: &str) -> Value {
    b.send(&json!({"type":"prompt_send","run_id":run,"prompt_id":id,"session_id":session,"cwd":"/workspace",
        "prompt":[{"type":"text","text":text}],"timeout_ms":60000}));
    b.wait_type("prompt_result", "prompt_id", &json!(id), 60 * SECS).await
}

/// The texts of the agent_message_chunk updates of prompt `id`, in order.
pub fn chunks(b: &Backend, id: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "acp_update" && r.msg["prompt_id"] == id)
        .filter(|r| r.msg["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|r| r.msg["update"]["content"]["text"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The reports of `call`/`term` lines of prompt `id`.
pub fn reports(b: &Backend, id: &str) -> Vec<Value> {
    chunks(b, id).iter().filter_map(|t| serde_json::from_str::<Value>(t).ok()).collect()
}

pub fn contents(b: &Backend, kind: &str) -> Vec<Value> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "proxy_update" && r.msg["content"]["type"] == kind)
        .map(|r| r.msg["content"].clone())
        .collect()
}

/// Every file under `dir` (following no links), for "is the secret in
/// there" checks.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_under(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out
}
