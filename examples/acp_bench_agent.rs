//! The minimal ACP agent of the daemon benchmark (examples/daemon_bench/):
//! the benchmarks' commands of the tests' scripted agent
//! (tests/fixtures/scripted_agent.py, which speaks `reads` and `relay` too),
//! compiled, so that neither its start nor its writing rate is what the
//! benchmark measures (in Python the start alone is 7-9 ms and the relay
//! tops out near the target rate). One thread, blocking stdio. A prompt's
//! text is one command:
//!
//!   reads N PATH   N sequential fs/read_text_file of PATH, then 50 rounds of
//!                  8 sequential and 8 concurrent reads, each timed here
//!                  (from writing the request to reading its response);
//!                  reported as one agent_message_chunk (JSON)
//!   relay N        N session/update notifications of exactly 200 bytes
//!                  (sequence numbers in order), written in 256 KiB writes
//!                  as fast as the pipe takes them, then the end of the turn
//!   terms N LIMIT BYTES
//!                  N terminals at once, each printing BYTES bytes with
//!                  outputByteLimit LIMIT; once all have exited, their output
//!                  read one after another, then all released; reported as
//!                  one agent_message_chunk {"terms", "lens"}
//!
//! `acp_bench_agent --flood-only N` writes the flood to stdout without any
//! protocol (the benchmark measures the agent alone against a pipe).

use std::io::{BufRead, BufReader, Write};
use std::time::Instant;

use serde_json::{Value, json};

/// The flood's notification `n`, exactly 200 bytes with its newline.
fn flood_line(sid: &str, n: usize, out: &mut Vec<u8>) {
    let head = format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{sid}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":""#
    );
    let tail = "\"}}}}\n";
    let seq = format!("m{n}:");
    let start = out.len();
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(seq.as_bytes());
    let pad = 200 - head.len() - tail.len() - seq.len();
    out.resize(out.len() + pad, b'x');
    out.extend_from_slice(tail.as_bytes());
    debug_assert_eq!(out.len() - start, 200);
}

/// Writes `n` flood lines; the head is formatted once and the sequence
/// number patched in, so the agent spends tens of nanoseconds per line.
fn flood(out: &mut impl Write, sid: &str, n: usize) {
    let mut template = Vec::new();
    flood_line(sid, 0, &mut template);
    // The sequence number goes right after the last `"text":"`.
    let t = b"\"text\":\"";
    let head_len = template.windows(t.len()).rposition(|w| w == t).expect("text member") + t.len();
    let mut buf = Vec::with_capacity(256 * 1024 + 200);
    let mut num = [0u8; 20];
    for i in 0..n {
        let line_start = buf.len();
        buf.extend_from_slice(&template);
        let digits = fmt_usize(i, &mut num);
        let dst = &mut buf[line_start + head_len..];
        dst[0] = b'm';
        dst[1..1 + digits.len()].copy_from_slice(digits);
        dst[1 + digits.len()] = b':';
        if buf.len() >= 256 * 1024 {
            out.write_all(&buf).expect("stdout");
            buf.clear();
        }
    }
    out.write_all(&buf).expect("stdout");
    out.flush().expect("stdout");
}

fn fmt_usize(mut v: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

struct Agent {
    inp: BufReader<std::io::Stdin>,
    out: std::io::Stdout,
    next_id: u64,
}

impl Agent {
    fn send(&mut self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).expect("json");
        line.push(b'\n');
        let mut out = self.out.lock();
        out.write_all(&line).expect("stdout");
        out.flush().expect("stdout");
    }

    fn read_msg(&mut self) -> Option<Value> {
        loop {
            let mut line = String::new();
            if self.inp.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if !line.trim().is_empty() {
                return serde_json::from_str(&line).ok();
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        id
    }

    /// Reads until every id in `ids` was answered; fails on an error.
    fn await_ids(&mut self, ids: &[u64]) {
        let mut want: Vec<u64> = ids.to_vec();
        while !want.is_empty() {
            let msg = self.read_msg().expect("the daemon closed stdin");
            if msg.get("method").is_none()
                && let Some(id) = msg.get("id").and_then(Value::as_u64)
                && let Some(i) = want.iter().position(|w| *w == id)
            {
                if msg.get("error").is_some() {
                    eprintln!("read failed: {msg}");
                    std::process::exit(1);
                }
                want.swap_remove(i);
            }
        }
    }

    fn reads(&mut self, sid: &str, n: usize, path: &str) -> Value {
        let params = json!({"sessionId": sid, "path": path});
        let timed = |me: &mut Agent| {
            let t = Instant::now();
            let id = me.request("fs/read_text_file", params.clone());
            me.await_ids(&[id]);
            t.elapsed().as_nanos() as u64
        };
        let single: Vec<u64> = (0..n).map(|_| timed(self)).collect();
        let (mut seq8, mut conc8) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            let t = Instant::now();
            for _ in 0..8 {
                timed(self);
            }
            seq8.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            let ids: Vec<u64> = (0..8).map(|_| self.request("fs/read_text_file", params.clone())).collect();
            self.await_ids(&ids);
            conc8.push(t.elapsed().as_nanos() as u64);
        }
        // The size is checked by the backend against the file it wrote.
        json!({"size": 10 * 1024, "single_ns": single, "seq8_ns": seq8, "conc8_ns": conc8})
    }

    /// Sends every request and returns the results, in order.
    fn all(&mut self, calls: Vec<(&str, Value)>) -> Vec<Value> {
        let ids: Vec<u64> = calls.into_iter().map(|(m, p)| self.request(m, p)).collect();
        let mut results = vec![Value::Null; ids.len()];
        let mut left = ids.len();
        while left > 0 {
            let msg = self.read_msg().expect("the daemon closed stdin");
            if msg.get("method").is_none()
                && let Some(id) = msg.get("id").and_then(Value::as_u64)
                && let Some(i) = ids.iter().position(|w| *w == id)
            {
                if let Some(e) = msg.get("error") {
                    eprintln!("request {id} failed: {e}");
                    std::process::exit(1);
                }
                results[i] = msg["result"].clone();
                left -= 1;
            }
        }
        results
    }

    fn terms(&mut self, sid: &str, n: usize, limit: u64, bytes: u64) -> Value {
        let command = format!("head -c {bytes} /dev/zero | tr '\\000' x");
        let create = json!({"sessionId": sid, "command": command, "outputByteLimit": limit});
        let created = self.all((0..n).map(|_| ("terminal/create", create.clone())).collect());
        let refs: Vec<Value> =
            created.iter().map(|c| json!({"sessionId": sid, "terminalId": c["terminalId"]})).collect();
        self.all(refs.iter().map(|r| ("terminal/wait_for_exit", r.clone())).collect());
        let lens: Vec<usize> = refs
            .iter()
            .map(|r| self.all(vec![("terminal/output", r.clone())])[0]["output"].as_str().map_or(0, str::len))
            .collect();
        self.all(refs.iter().map(|r| ("terminal/release", r.clone())).collect());
        json!({"terms": n, "lens": lens})
    }

    fn handle(&mut self, msg: Value) {
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let id = msg.get("id").cloned();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match (method, id) {
            ("initialize", Some(id)) => self.send(&json!({"jsonrpc":"2.0","id":id,"result":{
                "protocolVersion":1,"agentCapabilities":{"loadSession":false,"promptCapabilities":{}},"authMethods":[]}})),
            ("session/new", Some(id)) => self.send(&json!({"jsonrpc":"2.0","id":id,"result":{"sessionId":"s1"}})),
            ("session/prompt", Some(id)) => {
                let sid = params["sessionId"].as_str().unwrap_or("s1").to_string();
                let text: String = params["prompt"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b["type"] == "text")
                    .filter_map(|b| b["text"].as_str())
                    .collect();
                let mut words = text.trim().splitn(3, ' ');
                let chunk = |me: &mut Agent, report: Value| {
                    me.send(&json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,
                        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":report.to_string()}}}}));
                };
                match (words.next(), words.next(), words.next()) {
                    (Some("terms"), Some(n), Some(rest)) => {
                        let mut r = rest.split(' ').map(|v| v.parse().unwrap_or(0));
                        let (limit, bytes) = (r.next().unwrap_or(0), r.next().unwrap_or(0));
                        let report = self.terms(&sid, n.parse().unwrap_or(1), limit, bytes);
                        chunk(self, report);
                    }
                    (Some("reads"), Some(n), Some(path)) => {
                        let report = self.reads(&sid, n.parse().unwrap_or(1), path);
                        self.send(&json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,
                            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":report.to_string()}}}}));
                    }
                    (Some("relay"), Some(n), _) => {
                        let mut out = self.out.lock();
                        flood(&mut out, &sid, n.parse().unwrap_or(0));
                    }
                    _ => {}
                }
                self.send(&json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
            }
            (m, Some(id)) if !m.is_empty() => self.send(
                &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":"method not found"}}),
            ),
            _ => {}
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--flood-only") {
        let n = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        flood(&mut std::io::stdout().lock(), "s1", n);
        return;
    }
    let mut agent = Agent { inp: BufReader::new(std::io::stdin()), out: std::io::stdout(), next_id: 1000 };
    while let Some(msg) = agent.read_msg() {
        agent.handle(msg);
    }
}
