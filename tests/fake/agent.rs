//! The fake ACP agent of every daemon test and benchmark (built as the
//! example `fake_agent`; docs/testing.md, "Fakes"). It speaks NDJSON
//! JSON-RPC on stdin/stdout; a prompt's text is a script, one command per
//! line:
//!
//!   say TEXT                 agent_message_chunk TEXT
//!   updates N                N agent_message_chunk updates "u0".."u<N-1>"
//!   call METHOD JSON         request METHOD (sessionId added) and report
//!                            {"call": METHOD, "result"|"error": ...} as a chunk
//!   calls N METHOD JSON      N such requests at once, answers reported in order
//!   term JSON                terminal/create JSON, wait_for_exit, output,
//!                            release; reports {"exit", "len", "truncated", "tail", ...}
//!   termkill JSON            terminal/create, kill, wait_for_exit, output, release
//!   terms N LIMIT BYTES      N terminals at once, each printing BYTES bytes with
//!                            outputByteLimit LIMIT; reports {"terms", "lens"}
//!   flood SECONDS K METHOD JSON
//!                            keep K requests METHOD JSON in flight for SECONDS;
//!                            reports {"flood", "n", "codes": {code: count},
//!                            "message": the first error's message}
//!   cwdrace N K JSON         N terminals (K at a time) created with JSON (its cwd
//!                            is /workspace/d) while a thread swaps the directory
//!                            /workspace/d and a symlink /workspace/l -> /etc
//!                            (renameat2 RENAME_EXCHANGE) without pause; reports
//!                            {"cwdrace", "outputs": {text: count}, "codes": {...}}
//!   relay N                  N agent_message_chunk updates of exactly 200 bytes
//!                            ("m<seq>:" then padding), written in 256 KiB writes
//!                            as fast as the pipe takes them
//!   reads N PATH             N sequential fs/read_text_file of PATH, then 50
//!                            rounds of 8 sequential and 8 concurrent ones, each
//!                            timed here; reports {"size", "single_ns",
//!                            "seq8_ns", "conc8_ns"}
//!   wait_cancel              block until session/cancel, then stop "cancelled"
//!   sleep SECONDS            sleep
//!   stderr TEXT              a line on stderr
//!   stderrfile PATH          PATH's content as a line on stderr
//!   file PATH TEXT           write TEXT to PATH from the agent process itself
//!   run ARGS...              run ARGS (split on spaces) as the agent's own child;
//!                            reports {"run", "code", "stdout", "stderr"}
//!   exit CODE                exit at once (a crash)
//!   stop REASON              end the turn with this stopReason
//!
//! Sessions are kept in `$HOME/.scripted-agent/sessions.json`, so a new
//! process can `session/load` them (history replayed as
//! user_message_chunk). Options: `--ignore-eof` keeps the process alive
//! after stdin ends (as claude-code-acp does), `--ignore-term` ignores
//! SIGTERM too, `--marker=TEXT` is ignored (tests find the process by it);
//! `SCRIPTED_AGENT_STDERR_ON_START` is written to stderr at start.
//! `fake_agent --flood-only N` writes the relay to stdout without any
//! protocol (the benchmark measures the agent alone against a pipe).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// The relay's notification `n`, exactly 200 bytes with its newline.
fn flood_line(sid: &str, n: usize, out: &mut Vec<u8>) {
    let head = format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{sid}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":""#
    );
    let tail = "\"}}}}\n";
    let seq = format!("m{n}:");
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(seq.as_bytes());
    let pad = 200 - head.len() - tail.len() - seq.len();
    out.resize(out.len() + pad, b'x');
    out.extend_from_slice(tail.as_bytes());
}

/// Writes `n` relay lines; the head is formatted once and the sequence
/// number patched in, so the agent spends tens of nanoseconds per line.
fn flood(out: &mut impl Write, sid: &str, n: usize) {
    let mut template = Vec::new();
    flood_line(sid, 0, &mut template);
    // The sequence number goes right after the last `"text":"`.
    let t = b"\"text\":\"";
    let head_len = template.windows(t.len()).rposition(|w| w == t).expect("text member") + t.len();
    let mut buf = Vec::with_capacity(256 * 1024 + 200);
    for i in 0..n {
        let line_start = buf.len();
        buf.extend_from_slice(&template);
        let digits = i.to_string();
        let dst = &mut buf[line_start + head_len..];
        dst[0] = b'm';
        dst[1..1 + digits.len()].copy_from_slice(digits.as_bytes());
        dst[1 + digits.len()] = b':';
        if buf.len() >= 256 * 1024 {
            out.write_all(&buf).expect("stdout");
            buf.clear();
        }
    }
    out.write_all(&buf).expect("stdout");
    out.flush().expect("stdout");
}

/// What every thread of the agent shares.
struct Agent {
    out: Mutex<std::io::Stdout>,
    pending: Mutex<HashMap<u64, mpsc::Sender<Value>>>,
    next_id: AtomicU64,
    cancelled: Mutex<HashSet<String>>,
    sessions: Mutex<PathBuf>,
}

impl Agent {
    fn send(&self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).expect("json");
        line.push(b'\n');
        let mut out = self.out.lock().unwrap();
        out.write_all(&line).expect("stdout");
        out.flush().expect("stdout");
    }

    fn reply(&self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn update(&self, sid: &str, text: &str, kind: &str) {
        self.send(&json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
            "update": {"sessionUpdate": kind, "content": {"type": "text", "text": text}}}}));
    }

    fn chunk(&self, sid: &str, report: &Value) {
        self.update(sid, &report.to_string(), "agent_message_chunk");
    }

    /// Sends a request; its whole answer (`result` or `error`) comes on
    /// the receiver (an error when stdin closed first).
    fn ask(&self, method: &str, params: &Value) -> mpsc::Receiver<Value> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx
    }

    fn answer(rx: mpsc::Receiver<Value>) -> Value {
        rx.recv().unwrap_or_else(|_| json!({"error": {"code": 0, "message": "stdin closed"}}))
    }

    /// Sends a request and waits for its whole answer.
    fn request(&self, method: &str, params: &Value) -> Value {
        Self::answer(self.ask(method, params))
    }

    /// Sends `n` requests at once (no thread each: the timing is the
    /// daemon's, not the agent's), then waits for every answer, in order.
    fn requests(&self, method: &str, params: &Value, n: usize) -> Vec<Value> {
        let waits: Vec<_> = (0..n).map(|_| self.ask(method, params)).collect();
        waits.into_iter().map(Self::answer).collect()
    }

    fn result(&self, method: &str, params: &Value) -> Value {
        self.request(method, params).get("result").cloned().unwrap_or(Value::Null)
    }

    fn load_sessions(&self, file: &PathBuf) -> Map<String, Value> {
        std::fs::read(file).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn save_sessions(&self, file: &PathBuf, sessions: &Map<String, Value>) {
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(file, serde_json::to_vec(sessions).expect("json"));
    }

    fn handle(self: &Arc<Self>, msg: Value) {
        let id = msg.get("id").cloned();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            if let Some(tx) =
                id.and_then(|i| i.as_u64()).and_then(|i| self.pending.lock().unwrap().remove(&i))
            {
                let _ = tx.send(msg);
            }
            return;
        };
        let id = id.unwrap_or(Value::Null);
        match method {
            "initialize" => self.reply(&id, json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "promptCapabilities": {"embeddedContext": true}},
                "authMethods": [], "clientCapabilitiesSeen": params.get("clientCapabilities")})),
            "session/new" => {
                let file = self.sessions.lock().unwrap();
                let mut sessions = self.load_sessions(&file);
                let sid = format!("s-{}-{}", std::process::id(), sessions.len() + 1);
                sessions.insert(sid.clone(), json!([]));
                self.save_sessions(&file, &sessions);
                self.reply(&id, json!({"sessionId": sid, "configOptions": [{"id": "mode", "currentValue": "default"}]}));
            }
            "session/load" => {
                let sid = params["sessionId"].as_str().unwrap_or_default().to_string();
                let sessions = { self.load_sessions(&self.sessions.lock().unwrap()) };
                let Some(history) = sessions.get(&sid) else {
                    return self.not_found(&id, &sid);
                };
                for text in history.as_array().into_iter().flatten() {
                    self.update(&sid, text.as_str().unwrap_or_default(), "user_message_chunk");
                }
                self.reply(&id, Value::Null);
            }
            "session/prompt" => {
                let me = Arc::clone(self);
                std::thread::spawn(move || me.prompt(&id, &params));
            }
            "session/cancel" => {
                let sid = params["sessionId"].as_str().unwrap_or_default().to_string();
                self.cancelled.lock().unwrap().insert(sid);
            }
            "session/set_mode" | "session/set_model" => self.reply(&id, json!({})),
            "session/set_config_option" => self.reply(
                &id,
                json!({"configOptions": [{"id": params.get("configId"), "currentValue": params.get("value")}]}),
            ),
            _ if !id.is_null() => self.send(&json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": format!("method not found: {method}")}})),
            _ => {}
        }
    }

    fn not_found(&self, id: &Value, sid: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32002, "message": format!("session {sid} not found")}}));
    }

    /// One prompt turn: the script's lines in order, then its stopReason.
    fn prompt(self: &Arc<Self>, id: &Value, params: &Value) {
        let sid = params["sessionId"].as_str().unwrap_or_default().to_string();
        let text: String = params["prompt"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect();
        {
            let file = self.sessions.lock().unwrap();
            let mut sessions = self.load_sessions(&file);
            let Some(Value::Array(history)) = sessions.get_mut(&sid) else {
                drop(file);
                return self.not_found(id, &sid);
            };
            history.push(json!(text));
            self.save_sessions(&file, &sessions);
        }
        let mut stop = "end_turn".to_string();
        for line in text.lines() {
            let line = line.trim();
            let (cmd, arg) = line.split_once(' ').unwrap_or((line, ""));
            match self.command(&sid, cmd, arg) {
                Some(reason) if reason == "cancelled" => {
                    stop = reason;
                    break;
                }
                Some(reason) => stop = reason,
                None => {}
            }
        }
        self.cancelled.lock().unwrap().remove(&sid);
        self.reply(id, json!({"stopReason": stop}));
    }

    /// Runs one line of a script; `Some(reason)` changes the stopReason.
    fn command(self: &Arc<Self>, sid: &str, cmd: &str, arg: &str) -> Option<String> {
        match cmd {
            "say" => self.update(sid, arg, "agent_message_chunk"),
            "updates" => {
                for i in 0..arg.parse().unwrap_or(0) {
                    self.update(sid, &format!("u{i}"), "agent_message_chunk");
                }
            }
            "call" => self.calls(sid, 1, arg),
            "calls" => {
                let (n, rest) = arg.split_once(' ').unwrap_or((arg, ""));
                self.calls(sid, n.parse().unwrap_or(1), rest);
            }
            "term" | "termkill" => self.term(sid, cmd, arg),
            "terms" => {
                let n: Vec<u64> = arg.split(' ').map(|v| v.parse().unwrap_or(0)).collect();
                let report = self.terms(
                    sid,
                    n[0] as usize,
                    n.get(1).copied().unwrap_or(0),
                    n.get(2).copied().unwrap_or(0),
                );
                self.chunk(sid, &report);
            }
            "flood" => self.flood_requests(sid, arg),
            "cwdrace" => self.cwdrace(sid, arg),
            "relay" => flood(&mut *self.out.lock().unwrap(), sid, arg.parse().unwrap_or(0)),
            "reads" => {
                let (n, path) = arg.split_once(' ').unwrap_or((arg, ""));
                let report = self.reads(sid, n.parse().unwrap_or(1), path);
                self.chunk(sid, &report);
            }
            "wait_cancel" => {
                while !self.cancelled.lock().unwrap().contains(sid) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Some("cancelled".into());
            }
            "sleep" => std::thread::sleep(Duration::from_secs_f64(arg.parse().unwrap_or(0.0))),
            "file" => {
                let (path, body) = arg.split_once(' ').unwrap_or((arg, ""));
                std::fs::write(path, body).expect("file");
            }
            "run" => self.run(sid, arg),
            "stderr" => eprintln!("{arg}"),
            "stderrfile" => eprintln!("{}", std::fs::read_to_string(arg).expect("stderrfile").trim()),
            "exit" => std::process::exit(arg.parse().unwrap_or(1)),
            "stop" => return Some(arg.to_string()),
            _ => {}
        }
        None
    }

    /// `METHOD JSON` with the session added.
    fn method_params(sid: &str, arg: &str) -> (String, Value) {
        let (method, raw) = arg.split_once(' ').unwrap_or((arg, ""));
        let mut params: Value =
            if raw.trim().is_empty() { json!({}) } else { serde_json::from_str(raw).expect("JSON") };
        if let Some(obj) = params.as_object_mut() {
            obj.entry("sessionId").or_insert(json!(sid));
        }
        (method.to_string(), params)
    }

    fn calls(self: &Arc<Self>, sid: &str, n: usize, arg: &str) {
        let (method, params) = Self::method_params(sid, arg);
        let answers: Vec<Value> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n).map(|_| s.spawn(|| self.request(&method, &params))).collect();
            handles.into_iter().map(|h| h.join().expect("call")).collect()
        });
        for r in answers {
            let report = match r.get("error") {
                Some(e) => json!({"call": method, "error": e}),
                None => json!({"call": method, "result": r.get("result")}),
            };
            self.chunk(sid, &report);
        }
    }

    fn term(self: &Arc<Self>, sid: &str, cmd: &str, arg: &str) {
        let mut params: Value = serde_json::from_str(arg).expect("JSON");
        params["sessionId"] = json!(sid);
        let created = self.request("terminal/create", &params);
        if let Some(e) = created.get("error") {
            return self.chunk(sid, &json!({"call": "terminal/create", "error": e}));
        }
        let r = json!({"sessionId": sid, "terminalId": created["result"]["terminalId"]});
        if cmd == "termkill" {
            std::thread::sleep(Duration::from_millis(200));
            self.request("terminal/kill", &r);
        }
        let exit = self.result("terminal/wait_for_exit", &r);
        let o = self.result("terminal/output", &r);
        let released = self.request("terminal/release", &r).get("result").is_some();
        let after = self.request("terminal/output", &r);
        let output = o["output"].as_str().unwrap_or_default();
        let chars: Vec<char> = output.chars().collect();
        let tail: String = chars[chars.len().saturating_sub(200)..].iter().collect();
        self.chunk(
            sid,
            &json!({"call": cmd, "exit": exit, "len": output.len(), "truncated": o["truncated"], "tail": tail,
                "exitStatus": o.get("exitStatus"), "released": released, "after_release": after["error"]["code"]}),
        );
    }

    fn terms(&self, sid: &str, n: usize, limit: u64, bytes: u64) -> Value {
        let command = format!("head -c {bytes} /dev/zero | tr '\\000' x");
        let create = json!({"sessionId": sid, "command": command, "outputByteLimit": limit});
        let all = |method: &str, params: Vec<Value>| -> Vec<Value> {
            std::thread::scope(|s| {
                let handles: Vec<_> = params.iter().map(|p| s.spawn(|| self.result(method, p))).collect();
                handles.into_iter().map(|h| h.join().expect("request")).collect()
            })
        };
        let created = all("terminal/create", vec![create; n]);
        let refs: Vec<Value> =
            created.iter().map(|c| json!({"sessionId": sid, "terminalId": c["terminalId"]})).collect();
        all("terminal/wait_for_exit", refs.clone());
        let lens: Vec<usize> = refs
            .iter()
            .map(|r| self.result("terminal/output", r)["output"].as_str().map_or(0, str::len))
            .collect();
        all("terminal/release", refs);
        json!({"terms": n, "lens": lens})
    }

    fn flood_requests(self: &Arc<Self>, sid: &str, arg: &str) {
        let mut parts = arg.splitn(3, ' ');
        let secs: f64 = parts.next().unwrap_or("0").parse().unwrap_or(0.0);
        let k: usize = parts.next().unwrap_or("1").parse().unwrap_or(1);
        let (method, params) = Self::method_params(sid, parts.next().unwrap_or(""));
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let stats = Mutex::new((0u64, BTreeMap::<String, u64>::new(), Value::Null));
        std::thread::scope(|s| {
            for _ in 0..k {
                s.spawn(|| {
                    while Instant::now() < end {
                        let r = self.request(&method, &params);
                        let mut st = stats.lock().unwrap();
                        st.0 += 1;
                        let code = r.get("error").map_or("ok".to_string(), |e| e["code"].to_string());
                        *st.1.entry(code).or_default() += 1;
                        if let Some(e) = r.get("error")
                            && st.2.is_null()
                        {
                            st.2 = e["message"].clone();
                        }
                    }
                });
            }
        });
        let (n, codes, message) = stats.into_inner().unwrap();
        self.chunk(sid, &json!({"flood": method, "n": n, "codes": codes, "message": message}));
    }

    fn cwdrace(self: &Arc<Self>, sid: &str, arg: &str) {
        let mut parts = arg.splitn(3, ' ');
        let n: usize = parts.next().unwrap_or("0").parse().unwrap_or(0);
        let k: usize = parts.next().unwrap_or("1").parse().unwrap_or(1);
        let mut params: Value = serde_json::from_str(parts.next().unwrap_or("{}")).expect("JSON");
        params["sessionId"] = json!(sid);
        std::fs::create_dir_all("/workspace/d").expect("/workspace/d");
        if std::fs::symlink_metadata("/workspace/l").is_err() {
            std::os::unix::fs::symlink("/etc", "/workspace/l").expect("/workspace/l");
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let todo = Mutex::new(n);
        let found = Mutex::new((BTreeMap::<String, u64>::new(), BTreeMap::<String, u64>::new()));
        std::thread::scope(|s| {
            s.spawn(|| {
                let (d, l) = (c"/workspace/d", c"/workspace/l");
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: two NUL-terminated paths; the call only renames.
                    unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            d.as_ptr(),
                            libc::AT_FDCWD,
                            l.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                }
            });
            let racers: Vec<_> = (0..k)
                .map(|_| {
                    s.spawn(|| {
                        loop {
                            {
                                let mut left = todo.lock().unwrap();
                                if *left == 0 {
                                    return;
                                }
                                *left -= 1;
                            }
                            let created = self.request("terminal/create", &params);
                            if let Some(e) = created.get("error") {
                                *found.lock().unwrap().1.entry(e["code"].to_string()).or_default() += 1;
                                continue;
                            }
                            let r = json!({"sessionId": params["sessionId"], "terminalId": created["result"]["terminalId"]});
                            self.request("terminal/wait_for_exit", &r);
                            let o = self.result("terminal/output", &r);
                            let text = o["output"].as_str().unwrap_or_default().trim().to_string();
                            self.request("terminal/release", &r);
                            *found.lock().unwrap().0.entry(text).or_default() += 1;
                        }
                    })
                })
                .collect();
            for r in racers {
                r.join().expect("racer");
            }
            stop.store(true, Ordering::Relaxed);
        });
        let (outputs, codes) = found.into_inner().unwrap();
        self.chunk(sid, &json!({"cwdrace": n, "outputs": outputs, "codes": codes}));
    }

    fn reads(&self, sid: &str, n: usize, path: &str) -> Value {
        let params = json!({"sessionId": sid, "path": path});
        let size = Mutex::new(0usize);
        let timed = || {
            let t = Instant::now();
            let r = read_ok(self.request("fs/read_text_file", &params));
            *size.lock().unwrap() = r["result"]["content"].as_str().map_or(0, |c| c.chars().count());
            t.elapsed().as_nanos() as u64
        };
        let single: Vec<u64> = (0..n).map(|_| timed()).collect();
        let (mut seq8, mut conc8) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            let t = Instant::now();
            for _ in 0..8 {
                timed();
            }
            seq8.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            for r in self.requests("fs/read_text_file", &params, 8) {
                read_ok(r);
            }
            conc8.push(t.elapsed().as_nanos() as u64);
        }
        json!({"size": *size.lock().unwrap(), "single_ns": single, "seq8_ns": seq8, "conc8_ns": conc8})
    }

    fn run(&self, sid: &str, arg: &str) {
        let argv: Vec<&str> = arg.split(' ').filter(|a| !a.is_empty()).collect();
        let out =
            std::process::Command::new(argv[0]).args(&argv[1..]).stdin(std::process::Stdio::null()).output();
        let report = match out {
            Ok(o) => {
                use std::os::unix::process::ExitStatusExt;
                let code = o.status.code().unwrap_or_else(|| -o.status.signal().unwrap_or(0));
                json!({"run": arg, "code": code, "stdout": String::from_utf8_lossy(&o.stdout),
                    "stderr": String::from_utf8_lossy(&o.stderr)})
            }
            Err(e) => json!({"run": arg, "code": 127, "stdout": "", "stderr": e.to_string()}),
        };
        self.chunk(sid, &report);
    }
}

/// A read's answer; a failed read ends the benchmark (its figures would lie).
fn read_ok(r: Value) -> Value {
    if let Some(e) = r.get("error") {
        eprintln!("read failed: {e}");
        std::process::exit(1);
    }
    r
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--flood-only") {
        let n = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        flood(&mut std::io::stdout().lock(), "s1", n);
        return;
    }
    if args.iter().any(|a| a == "--ignore-term") {
        // SAFETY: SIG_IGN for SIGTERM, before any thread exists.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    if let Ok(text) = std::env::var("SCRIPTED_AGENT_STDERR_ON_START") {
        eprintln!("{text}");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let agent = Arc::new(Agent {
        out: Mutex::new(std::io::stdout()),
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        cancelled: Mutex::new(HashSet::new()),
        sessions: Mutex::new(home.join(".scripted-agent/sessions.json")),
    });
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if let Ok(msg) = serde_json::from_str::<Value>(line.trim())
            && !line.trim().is_empty()
        {
            agent.handle(msg);
        }
    }
    agent.pending.lock().unwrap().clear();
    if args.iter().any(|a| a == "--ignore-eof") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
