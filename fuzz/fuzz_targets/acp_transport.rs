//! The agent's side of ACP: NDJSON lines read by `acp::transport` and the
//! requests served by `acp::client::Client` (fs reads and writes through
//! `GuestFs` on a host tree, terminal requests up to the process start,
//! which fails, and permissions by a policy the first byte picks).
//!
//! Checked: no panic; every request of the agent (a line with a method and
//! a non-null id) gets exactly one response, within 20 s; every message
//! the daemon queues for the backend is a JSON object with a `type` (the
//! update relay splices the agent's JSON text into it); no answer or
//! message contains the secret that lies outside the workspace and home;
//! nothing outside them changes.
#![no_main]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tuixiu_sandbox::acp::client::{Client, Spawner};
use tuixiu_sandbox::acp::fs::GuestFs;
use tuixiu_sandbox::acp::transport::Transport;
use tuixiu_sandbox_fuzz::{ALLOWED, guest_tree, outside_allowed};

fuzz_target!(|data: &[u8]| {
    let Some((&policy, input)) = data.split_first() else { return };
    let policy = ["allow_once", "deny", "ask"][usize::from(policy % 3)];

    let dir = tuixiu_sandbox_fuzz::scratch();
    let tree = dir.path().join("tree");
    let secret = tuixiu_sandbox_fuzz::marker();
    guest_tree(&tree, &secret);
    let before = outside_allowed(&tree);
    let expected = requests(input);

    let cfg = tuixiu_sandbox_fuzz::proxy_config(
        dir.path(),
        &format!("permission_policy = \"{policy}\"\npermission_timeout_seconds = 5"),
    );
    let rt = tuixiu_sandbox_fuzz::runtime();
    let (answers, sent) = rt.block_on(async {
        let d = Arc::new(tuixiu_sandbox_fuzz::daemon(cfg));
        let fs = GuestFs::tree_root(&tree, ALLOWED);
        let spawner: Spawner = Arc::new(|_spec| {
            Box::pin(async { Err(tuixiu_sandbox::provider::InvalidError::EmptyCommand.into()) })
        });
        let client = Arc::new(Client::new(
            d.acp_context(),
            "run-fuzz".into(),
            "tuixiu-run-run-fuzz".into(),
            fs,
            spawner,
            vec![("PATH".into(), "/usr/bin:/bin".into())],
            "/home/agent".into(),
        ));
        let (mut agent_out, ours_in) = tokio::io::duplex(1 << 16);
        let (ours_out, agent_in) = tokio::io::duplex(1 << 16);
        let _transport = Transport::start(ours_in, ours_out, client);
        let answers = Arc::new(Mutex::new(Vec::<String>::new()));
        let collected = answers.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(agent_in).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                collected.lock().unwrap().push(line);
            }
        });
        let _ = agent_out.write_all(input).await;
        let _ = agent_out.write_all(b"\n").await;
        // Every answer must come before end-of-file (which cancels what is
        // still being served).
        let wanted: usize = expected.values().sum();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut sent = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::thread::sleep(Duration::from_micros(50));
            let n = d.outbox().len();
            if n > 0 {
                let batch = d.outbox().peek_batch(n, usize::MAX, Some(usize::MAX)).await;
                sent.extend(batch.texts().iter().map(|t| t.as_str().to_string()));
                d.outbox().pop_sent(&batch);
            }
            let have = answers
                .lock()
                .unwrap()
                .iter()
                .filter(|l| response_id(l).is_some_and(|id| id != "null"))
                .count();
            if have >= wanted || Instant::now() > deadline {
                break;
            }
        }
        drop(agent_out);
        let answers = answers.lock().unwrap().clone();
        (answers, sent)
    });
    drop(rt);

    let mut got: HashMap<String, usize> = HashMap::new();
    // Triage: TUIXIU_FUZZ_DEBUG=1 <binary> <input> shows what was exchanged.
    if std::env::var_os("TUIXIU_FUZZ_DEBUG").is_some() {
        eprintln!("DEBUG expected {expected:?}\nanswers {answers:#?}\nsent {sent:#?}");
    }
    for line in &answers {
        assert!(!line.contains(&secret), "an answer holds the secret: {line}");
        let id = response_id(line).unwrap_or_else(|| panic!("not a response: {line}"));
        if id != "null" {
            *got.entry(id).or_default() += 1;
        }
    }
    for (id, n) in &expected {
        assert_eq!(got.get(id), Some(n), "request id {id}: {n} request(s), answers: {answers:#?}");
    }
    for id in got.keys() {
        assert!(expected.contains_key(id), "an answer to {id}, which the agent never asked: {answers:#?}");
    }
    for text in &sent {
        assert!(!text.contains(&secret), "a message to the backend holds the secret: {text}");
        // Read as the backend would; numbers out of f64's range are valid
        // JSON (the agent's text is relayed as written), so no tree.
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(rename = "type")]
            _kind: String,
        }
        serde_json::from_str::<Head>(text).unwrap_or_else(|e| panic!("not JSON with a type ({e}): {text}"));
    }
    assert_eq!(outside_allowed(&tree), before, "something outside the workspace and home changed");
});

/// The id (as JSON text) of a JSON-RPC response line.
fn response_id(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    let obj = v.as_object()?;
    if obj.contains_key("method") || !(obj.contains_key("result") || obj.contains_key("error")) {
        return None;
    }
    obj.get("id").map(Value::to_string)
}

/// The agent's requests in `input`, by id (as JSON text), read as the
/// transport reads lines: as an envelope of raw members first (which, like
/// the transport's, skips unknown members without checking their text),
/// else as a JSON value.
fn requests(input: &[u8]) -> HashMap<String, usize> {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Envelope<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        #[serde(borrow)]
        error: Option<&'a RawValue>,
    }
    let mut out = HashMap::new();
    for line in input.split(|&b| b == b'\n') {
        let line = trim(line);
        let id = match serde_json::from_slice::<Envelope<'_>>(line) {
            Ok(Envelope { method: Some(_), id: Some(id), .. }) => {
                Some(serde_json::from_str::<Value>(id.get()).unwrap_or(Value::Null))
            }
            Ok(_) => None,
            Err(_) => match serde_json::from_slice::<Value>(line) {
                Ok(Value::Object(obj)) => match (obj.get("method"), obj.get("id")) {
                    (Some(Value::String(_)), Some(id)) if !id.is_null() => Some(id.clone()),
                    _ => None,
                },
                _ => None,
            },
        };
        // An id that reads as null is answered with a null id, like a
        // batch: such answers are not counted.
        if let Some(id) = id.filter(|id| !id.is_null()) {
            *out.entry(id.to_string()).or_default() += 1;
        }
    }
    out
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., b'\r' | b' ' | b'\t'] = s {
        s = rest;
    }
    s
}
