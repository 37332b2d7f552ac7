//! Benchmark of the daemon's agent host (run by scripts/bench acp).
//!
//! This program is the backend: a WebSocket server on loopback that the
//! real daemon (`tuixiu-sandbox proxy`, release build, native provider)
//! connects to. It
//! measures, in order:
//!
//! 1. `acp_open` → `acp_opened`: N fresh runs one after another (each a
//!    new instance, the agent started in its sandbox, `initialize`); each
//!    run is closed and removed before the next;
//! 2. the agent's own start alone, on the host without any sandbox (the
//!    same command answering the same `initialize` on a pipe), so the
//!    daemon's share can be told from Python's;
//! 3. 10 KB `fs/read_text_file` as the agent sees it (its own clock, from
//!    writing the request to reading the response): single reads, and
//!    rounds of 8 sequential against 8 concurrent ones;
//! 4. `session/update` relay: the agent writes N notifications of 200 B as
//!    fast as its pipe takes them; every `acp_update` must arrive, in order,
//!    before the `prompt_result`; the daemon's peak RSS over the relay
//!    (VmHWM reset through `/proc/<pid>/clear_refs` first).
//!
//! The backend runs on its own 2-thread runtime and classifies the flood
//! by a substring search. Neither end is the bottleneck, which is checked:
//! the daemon's CPU time over the relay is reported next to the wall time,
//! and at the end the agent floods a pipe alone and the backend takes a
//! pre-built flood of masked frames over loopback alone.
//!
//! The agent is the tests' fake agent (tests/fake/agent.rs, compiled) or,
//! given a `.py` file, a stdlib-only Python agent speaking the same
//! `reads` and `relay` commands, run as `python3 -S`.
//!
//! Usage: daemon_bench acp <tuixiu-sandbox binary> <scratch dir> <agent> [OPENS] [FLOOD]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

use crate::ProxyToml;
use crate::link::{Ws, send, until};
use crate::procstat::{cpu_ms, status_kib};

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(name: &str, unit: &str, samples: Vec<f64>) -> f64 {
    let s = sorted(samples);
    println!(
        "{name}: median {:.3} {unit}, p10 {:.3}, p90 {:.3}, n {}",
        pct(&s, 0.5),
        pct(&s, 0.1),
        pct(&s, 0.9),
        s.len()
    );
    pct(&s, 0.5)
}

fn open_msg(run: &str) -> Value {
    json!({"type":"acp_open","run_id":run,"cwd":"/workspace","instance_name":format!("tuixiu-run-{run}"),
        "keepalive_ttl_seconds":600,
        "init":{"env":{"TUIXIU_RUN_ID":run},"agentInputs":{"version":1,"items":[]}}})
}

async fn prompt(ws: &mut Ws, run: &str, id: &str, text: &str) {
    send(
        ws,
        json!({"type":"prompt_send","run_id":run,"prompt_id":id,"session_id":null,"cwd":"/workspace",
        "prompt":[{"type":"text","text":text}],"timeout_ms":600000}),
    )
    .await;
}

/// The agent alone on the host: start → `initialize` answered.
fn agent_alone(agent: &Path, rounds: usize) -> Vec<f64> {
    use std::io::{BufRead, Write};
    let mut out = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let mut cmd = if is_python(agent) {
            let mut c = Command::new("/usr/bin/python3");
            c.arg("-S").arg(agent);
            c
        } else {
            Command::new(agent)
        };
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("the agent");
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n",
            )
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        drop(stdin);
        let _ = child.wait();
    }
    out
}

/// The sequence number of a flood text: `"text":"m<seq>:`, searched from
/// the end (the text member comes last; `str::find` built a two-way
/// searcher per message and was a tenth of this backend's time).
fn flood_seq(text: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"text\":\"m";
    let mut end = text.len();
    while let Some(i) = text[..end].iter().rposition(|&b| b == b'm') {
        if i + 1 >= KEY.len() && &text[i + 1 - KEY.len()..=i] == KEY {
            let digits = &text[i + 1..];
            let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
            return std::str::from_utf8(&digits[..n]).ok()?.parse().ok();
        }
        end = i;
    }
    None
}

/// Receives one prompt's flood: every `acp_update` of `prompt_id` must
/// carry the next sequence number; ends at its `prompt_result`. Returns
/// (count, in order, first update and `prompt_result` arrival after `t`,
/// bytes, result).
async fn receive_flood<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    run_id: &str,
    prompt_id: &str,
    t: Instant,
) -> (usize, bool, Duration, Duration, usize, Value)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let tag = format!("\"prompt_id\":\"{prompt_id}\"");
    // The daemon's own member order: checked with one comparison (other
    // texts take the general test below).
    let prefix = format!("{{\"type\":\"acp_update\",\"run_id\":\"{run_id}\",{tag},");
    let mut first = None;
    let mut next = 0usize;
    let mut bytes = 0usize;
    let mut in_order = true;
    let (last, result) = loop {
        let text = match ws.next().await.expect("the link closed").expect("read") {
            Message::Text(t) => t,
            _ => continue,
        };
        let fast = text.starts_with(prefix.as_str());
        if fast
            || (text.contains("\"acp_update\"")
                && text.contains(tag.as_str())
                && text.contains("agent_message_chunk"))
        {
            if first.is_none() {
                first = Some(t.elapsed());
            }
            bytes += text.len();
            let seq = flood_seq(text.as_bytes());
            if seq != Some(next) {
                in_order = false;
            }
            next += 1;
        } else if text.contains("\"prompt_result\"") && text.contains(tag.as_str()) {
            // The turn ends right after its last update: the clock is read
            // here rather than at each of a million updates.
            break (t.elapsed(), serde_json::from_str::<Value>(&text).unwrap());
        }
    };
    (next, in_order, first.unwrap_or_default(), last, bytes, result)
}

/// A masked client text frame, as the daemon's WebSocket client writes it.
fn client_frame(payload: &[u8], mask: [u8; 4], out: &mut Vec<u8>) {
    out.push(0x81);
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// The backend alone: the same receiving code fed over loopback by a plain
/// thread that writes pre-built masked frames of the flood (the daemon's
/// `acp_update` texts, sequence numbers in order) in 256 KiB writes. Its
/// rate is the most this backend can take, whoever sends.
async fn backend_alone(n: usize) -> f64 {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let writer = std::thread::spawn(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_nodelay(true).unwrap();
        write!(
            tcp,
            "GET /ws/agent HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            tcp.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        // One masked frame as a template; each frame patches its sequence
        // number in (masked), so the writer costs next to nothing.
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        // As long as the daemon's (201 bytes for a 200-byte notification).
        let frame_text = |pad: usize| {
            format!(
                r#"{{"type":"acp_update","run_id":"reads","prompt_id":"solo","session_id":"s1","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"m0:{}"}}}}}}"#,
                "x".repeat(pad)
            )
        };
        let text = frame_text(201 - frame_text(0).len());
        let mut template = Vec::new();
        client_frame(text.as_bytes(), mask, &mut template);
        let at = template.len() - text.len() + text.find("\"text\":\"m").unwrap() + 9;
        let mask_at = template.len() - text.len();
        let mut buf = Vec::with_capacity(300 * 1024);
        for i in 0..n {
            let start = buf.len();
            buf.extend_from_slice(&template);
            let digits = format!("{i}:");
            for (k, b) in digits.bytes().enumerate() {
                let pos = at + k;
                buf[start + pos] = b ^ mask[(pos - mask_at) % 4];
            }
            if buf.len() >= 256 * 1024 {
                tcp.write_all(&buf).unwrap();
                buf.clear();
            }
        }
        client_frame(
            br#"{"type":"prompt_result","run_id":"reads","prompt_id":"solo","ok":true}"#,
            mask,
            &mut buf,
        );
        tcp.write_all(&buf).unwrap();
        // Held open until the receiver is done.
        let _ = tcp.read(&mut byte);
    });
    let (tcp, _) = listener.accept().await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let t = Instant::now();
    let (got, in_order, _, last, _, _) = receive_flood(&mut ws, "reads", "solo", t).await;
    assert!(got == n && in_order, "backend alone: {got} of {n}, in order {in_order}");
    drop(ws);
    writer.join().unwrap();
    n as f64 / last.as_secs_f64()
}

/// The agent alone: its flood written into a pipe that this process reads
/// (256 KiB reads, lines counted); `None` for the Python agent.
fn agent_alone_flood(agent: &Path, n: usize) -> Option<f64> {
    use std::io::Read;
    if is_python(agent) {
        return None;
    }
    let t = Instant::now();
    let mut child =
        Command::new(agent).args(["--flood-only", &n.to_string()]).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut lines = 0;
    loop {
        let k = out.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        lines += buf[..k].iter().filter(|&&b| b == b'\n').count();
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let _ = child.wait();
    assert_eq!(lines, n);
    Some(rate)
}

fn is_python(agent: &Path) -> bool {
    agent.extension().is_some_and(|e| e == "py")
}

/// The agent's command line inside the sandbox (it is bound at /bench).
fn agent_argv(agent: &Path) -> (&'static str, &'static str) {
    if is_python(agent) {
        ("agent.py", r#"["/usr/bin/python3", "-S", "/bench/agent.py"]"#)
    } else {
        ("agent", r#"["/bench/agent"]"#)
    }
}

/// `args[0]` is the program, then this benchmark's arguments.
pub async fn main(args: Vec<String>) {
    if args.get(1).map(String::as_str) == Some("--backend-alone") {
        let n = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        println!("backend alone: {:.0} notifications/s over loopback", backend_alone(n).await);
        return;
    }
    let usage = "usage: daemon_bench acp BINARY SCRATCH AGENT [OPENS] [FLOOD]";
    let bin = PathBuf::from(args.get(1).expect(usage));
    let scratch = PathBuf::from(args.get(2).expect(usage));
    let agent = PathBuf::from(args.get(3).expect(usage));
    let opens: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(30);
    let flood: usize = args.get(5).and_then(|v| v.parse().ok()).unwrap_or(300_000);
    let _ = std::fs::remove_dir_all(&scratch);
    let root = scratch.join("ws");
    let agent_dir = scratch.join("agent");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&agent_dir).unwrap();
    let (agent_file, agent_command) = agent_argv(&agent);
    std::fs::copy(&agent, agent_dir.join(agent_file)).unwrap();

    let (listener, url) = crate::link::listen().await;
    let config = scratch.join("proxy.toml");
    ProxyToml::new(&url, &scratch.join("state"), "bench", &root)
        .agent_command(agent_command)
        .volume(&agent_dir, "/bench", true)
        .write(&config);
    let (mut child, pid, mut ws) = crate::link::start_daemon(&bin, &config, &[], &listener, true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The anonymous part is what the daemon allocates; the file-backed
    // part follows how the page cache holds its binary (docs/benchmarks.md).
    println!(
        "daemon idle RSS: {} KiB (anonymous {} KiB, file-backed {} KiB)",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "RssAnon:"),
        status_kib(pid, "RssFile:")
    );

    // 1. acp_open → acp_opened, fresh runs.
    let mut open_ms = Vec::new();
    for i in 0..opens + 2 {
        let run = format!("o{i}");
        let t = Instant::now();
        send(&mut ws, open_msg(&run)).await;
        let r = until(&mut ws, |m| m["type"] == "acp_opened" && m["run_id"] == run.as_str()).await;
        let dt = t.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(r["ok"], true, "{r}");
        if i >= 2 {
            open_ms.push(dt); // the first two warm the page cache
        }
        send(
            &mut ws,
            json!({"type":"sandbox_control","action":"remove","run_id":run,
            "instance_name":format!("tuixiu-run-{run}"),"request_id":format!("rm-{run}")}),
        )
        .await;
        until(&mut ws, |m| m["type"] == "sandbox_control_result" && m["request_id"] == format!("rm-{run}"))
            .await;
    }
    let open_med = summary("acp_open -> acp_opened (ms)", "ms", open_ms);
    let alone_med =
        summary("agent alone on the host: start -> initialize answered (ms)", "ms", agent_alone(&agent, 20));
    println!("daemon's share (difference of medians): {:.1} ms", open_med - alone_med);

    // 2. 10 KB reads as the agent sees them.
    let run = "reads";
    let ws_dir = root.join(format!("run-{run}"));
    std::fs::create_dir_all(&ws_dir).unwrap();
    let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?-_=+()[]{}<>@#$%^&*~\n";
    let text: String = line.repeat(10 * 1024 / line.len() + 1)[..10 * 1024].to_string();
    std::fs::write(ws_dir.join("ten-kb.txt"), &text).unwrap();
    send(&mut ws, open_msg(run)).await;
    let r = until(&mut ws, |m| m["type"] == "acp_opened" && m["run_id"] == run).await;
    assert_eq!(r["ok"], true, "{r}");
    prompt(&mut ws, run, "r1", "reads 500 /workspace/ten-kb.txt").await;
    let report = until(&mut ws, |m| {
        m["type"] == "acp_update"
            && m["prompt_id"] == "r1"
            && m["update"]["sessionUpdate"] == "agent_message_chunk"
    })
    .await;
    until(&mut ws, |m| m["type"] == "prompt_result" && m["prompt_id"] == "r1").await;
    let rep: Value = serde_json::from_str(report["update"]["content"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(rep["size"], 10 * 1024);
    let ms = |k: &str| -> Vec<f64> {
        rep[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() / 1e6).collect()
    };
    summary("10 KB fs/read_text_file, as the agent sees it (ms)", "ms", ms("single_ns"));
    let seq = summary("8 sequential reads (ms per batch)", "ms", ms("seq8_ns"));
    let conc = summary("8 concurrent reads (ms per batch)", "ms", ms("conc8_ns"));
    println!("concurrent / sequential: {:.2}", conc / seq);

    // 3. The relay.
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let rss_before = status_kib(pid, "VmRSS:");
    let cpu_before = cpu_ms(pid);
    prompt(&mut ws, run, "f1", &format!("relay {flood}")).await;
    let t = Instant::now();
    let (next, in_order, first, last, bytes, result) = receive_flood(&mut ws, run, "f1", t).await;
    let cpu = cpu_ms(pid) - cpu_before;
    assert_eq!(result["ok"], true, "{result}");
    println!(
        "relay: {next} of {flood} acp_update received, in order: {}, none lost: {}",
        in_order && next == flood,
        next == flood
    );
    println!(
        "relay rate: {:.0} notifications/s (prompt_send -> prompt_result {:.1} ms; first update -> prompt_result {:.1} ms; {:.1} MB to the backend)",
        flood as f64 / last.as_secs_f64(),
        last.as_secs_f64() * 1000.0,
        (last - first).as_secs_f64() * 1000.0,
        bytes as f64 / 1e6
    );
    println!(
        "daemon CPU over the relay: {cpu:.0} ms ({:.2} us per notification)",
        cpu * 1000.0 / flood as f64
    );
    println!(
        "daemon RSS: {} KiB before the relay, peak {} KiB during it (VmHWM)",
        rss_before,
        status_kib(pid, "VmHWM:")
    );

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&scratch);

    // 4. The two ends alone: neither may be what limits the relay.
    if let Some(rate) = agent_alone_flood(&agent, flood) {
        println!("agent alone: {rate:.0} notifications/s into a pipe");
    }
    println!("backend alone: {:.0} notifications/s over loopback", backend_alone(flood).await);
}
