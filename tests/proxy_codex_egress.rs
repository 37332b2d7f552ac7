//! codex-acp (npm `@zed-industries/codex-acp`, the real agent) through the
//! daemon with `sandbox.network = "allow"`: its model, a loopback stand-in
//! of the OpenAI Responses API, is reachable only by name through the
//! egress proxy; a turn completes. scripts/ci-setup.d/45-egress.sh
//! installs the pinned codex-acp.

mod egress_support;
mod proxy_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use egress_support::{HOSTS_ENV, hosts_file};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

const ANSWER: &str = "all done through the egress proxy";

/// The directory holding the `codex-acp` binary.
fn codex_dir() -> std::path::PathBuf {
    let dir = std::env::var("TUIXIU_TEST_CODEX_ACP_DIR").unwrap_or_else(|_| {
        "/opt/tuixiu-ci/codex-acp-0.16.0/node_modules/@zed-industries/codex-acp-linux-x64/bin".into()
    });
    let dir = std::path::PathBuf::from(dir);
    assert!(
        dir.join("codex-acp").exists(),
        "codex-acp is missing in {}: run scripts/ci-setup.d/45-egress.sh",
        dir.display()
    );
    dir
}

/// A Responses API stand-in on 127.0.0.2: every `POST …/responses` gets
/// one assistant message as server-sent events. Keeps each request's
/// method, path and `Host`.
fn model_stand_in() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap_or(0);
                let mut host = String::new();
                let mut length = 0usize;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("host:") {
                        host = v.trim().to_string();
                    }
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let request = line.split(' ').take(2).collect::<Vec<_>>().join(" ");
                log.lock().unwrap().push(format!("{request} host={host}"));
                let mut stream = stream;
                if !request.starts_with("POST") || !request.contains("/responses") {
                    let _ = stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                }
                let item = json!({"type": "message", "role": "assistant", "id": "msg_1",
                    "content": [{"type": "output_text", "text": ANSWER}]});
                let usage = json!({"input_tokens": 10, "input_tokens_details": null, "output_tokens": 5,
                    "output_tokens_details": null, "total_tokens": 15});
                let events = [
                    ("response.created", json!({"type": "response.created", "response": {"id": "resp_1"}})),
                    (
                        "response.output_item.done",
                        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
                    ),
                    (
                        "response.completed",
                        json!({"type": "response.completed", "response": {"id": "resp_1", "usage": usage}}),
                    ),
                ];
                let mut sse = String::new();
                for (name, data) in events {
                    sse.push_str(&format!("event: {name}\ndata: {data}\n\n"));
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    sse.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(sse.as_bytes());
            });
        }
    });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_completes_a_turn_through_the_proxy() {
    let codex = codex_dir();
    let backend = Backend::start().await;
    let s = Scratch::new("egress-codex");
    let (port, seen) = model_stand_in();
    let mapping = hosts_file(&s.dir, &[("127.0.0.2", "api.model.test")]);
    let sandbox = format!(
        "network = \"allow\"\nallowHosts = [\"api.model.test:{port}\"]\nallowRanges = [\"127.0.0.2\"]\n\
         [[sandbox.volumes]]\nhostPath = \"{}\"\nguestPath = \"/codex\"\nreadOnly = true\n",
        codex.display()
    );
    let top = "agent_command = [\"/codex/codex-acp\"]\nagent_shutdown_grace_seconds = 1\n\
               agent_env_allowlist = [\"HOME\", \"USER_HOME\", \"CODEX_HOME\", \"OPENAI_API_KEY\", \"CODEX_API_KEY\", \"STANDIN_API_KEY\", \"RUST_LOG\"]";
    let cfg = s.config(&backend.url, top, &sandbox);
    let mut daemon = Daemon::start_env(&s, "proxy", &cfg, &[(HOSTS_ENV, mapping.to_str().unwrap())]);
    backend.registered(0, 20 * SECS).await;

    let config_toml = format!(
        "model = \"gpt-5.3-codex\"\nmodel_provider = \"standin\"\napproval_policy = \"never\"\nsandbox_mode = \"read-only\"\n\
         [model_providers.standin]\nname = \"stand-in\"\nbase_url = \"http://api.model.test:{port}/v1\"\n\
         env_key = \"STANDIN_API_KEY\"\nwire_api = \"responses\"\nsupports_websockets = false\n"
    );
    let init = json!({"script": "", "timeout_seconds": 30,
        "env": {"USER_HOME": "/home/agent", "CODEX_HOME": "/home/agent/.codex", "STANDIN_API_KEY": "stand-in",
                "OPENAI_API_KEY": "stand-in", "CODEX_API_KEY": "stand-in", "RUST_LOG": "warn"},
        "agentInputs": {"version": 1, "items": [
            {"id": "codex-config", "apply": "writeFile", "source": {"type": "inlineText", "text": config_toml},
             "target": {"root": "USER_HOME", "path": ".codex/config.toml"}}]}});
    backend.send(&json!({"type":"acp_open","run_id":"cx","cwd":"/workspace","init":init,
        "instance_name":"tuixiu-run-cx","keepalive_ttl_seconds":600}));
    let opened = backend.wait_type("acp_opened", "run_id", &json!("cx"), 120 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());

    backend.send(&json!({"type":"prompt_send","run_id":"cx","prompt_id":"p1","session_id":Value::Null,
        "cwd":"/workspace","prompt":[{"type":"text","text":"Say that you are done."}],"timeout_ms":120000}));
    let result = backend.wait_type("prompt_result", "prompt_id", &json!("p1"), 180 * SECS).await;
    assert_eq!(result["ok"], true, "{result}\n{}", daemon.stderr());
    let said: String = backend
        .received()
        .iter()
        .filter(|r| {
            r.msg["type"] == "acp_update" && r.msg["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .filter_map(|r| r.msg["update"]["content"]["text"].as_str().map(str::to_string))
        .collect();
    assert!(said.contains(ANSWER), "the agent said {said:?}\n{}", daemon.stderr());
    let requests = seen.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("POST /v1/responses")
                && r.ends_with(&format!("host=api.model.test:{port}"))),
        "{requests:?}"
    );
    // Whatever else codex tried to reach was refused, and said so.
    for r in backend.received().iter().filter(|r| r.msg["content"]["type"] == "text") {
        let text = r.msg["content"]["text"].as_str().unwrap_or("");
        if text.starts_with("[proxy:network]") {
            assert!(!text.contains("api.model.test"), "{text}");
        }
    }
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}
