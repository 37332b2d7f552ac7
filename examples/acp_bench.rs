//! Benchmark of the daemon's agent host (run by scripts/bench-acp.sh).
//!
//! This program is the backend: a WebSocket server on loopback that the
//! real daemon (`tuixiu-sandbox proxy`, release build, native provider)
//! connects to; the agent is examples/acp_bench_agent.py (stdlib only). It
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
//! by a substring search, so it is not the bottleneck (it is checked: the
//! daemon's CPU time over the relay is reported next to the wall time).
//!
//! Usage: acp_bench <tuixiu-sandbox binary> <scratch dir> <agent.py> [OPENS] [FLOOD]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field).map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

/// utime + stime of `pid`, in milliseconds.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1000.0 / hz
}

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

async fn recv_text(ws: &mut Ws) -> String {
    loop {
        match ws.next().await.expect("daemon closed the link").expect("read") {
            Message::Text(t) => return t.to_string(),
            _ => continue,
        }
    }
}

/// Reads until a message satisfies `pred` (acking register_agent on the way).
async fn until(ws: &mut Ws, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let m: Value = serde_json::from_str(&recv_text(ws).await).unwrap();
        if m["type"] == "register_agent" {
            ws.send(Message::text(json!({"type":"register_ack","success":true}).to_string())).await.unwrap();
        }
        if m["type"] == "proxy_update" && m["content"]["type"] == "text" {
            let t = m["content"]["text"].as_str().unwrap_or("");
            if t.contains("error") || t.contains("stderr") {
                eprintln!("daemon says: {t}");
            }
        }
        if pred(&m) {
            return m;
        }
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
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
        let mut child = Command::new("/usr/bin/python3")
            .arg("-S")
            .arg(agent)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: acp_bench BINARY SCRATCH AGENT.py [OPENS] [FLOOD]";
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
    std::fs::copy(&agent, agent_dir.join("agent.py")).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = scratch.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "orchestrator_url = \"ws://127.0.0.1:{port}/ws/agent\"\nstate_dir = \"{}\"\n\
             agent_command = [\"/usr/bin/python3\", \"-S\", \"/bench/agent.py\"]\nagent_shutdown_grace_seconds = 1\n\
             [agent]\nid = \"bench\"\n[sandbox]\nworkspaceHostRoot = \"{}\"\n\
             [[sandbox.volumes]]\nhostPath = \"{}\"\nguestPath = \"/bench\"\nreadOnly = true\n",
            scratch.join("state").display(),
            root.display(),
            agent_dir.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(&bin);
    cmd.args(["proxy", "--config"]).arg(&config).env_clear().env("PATH", "/usr/bin:/bin");
    if let Some(filter) = std::env::var_os("TUIXIU_LOG") {
        cmd.env("TUIXIU_LOG", filter);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the daemon");
    let pid = child.id();
    let (tcp, _) = listener.accept().await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    until(&mut ws, |m| m["type"] == "workspace_inventory").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("daemon idle RSS: {} KiB", status_kib(pid, "VmRSS:"));

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
    prompt(&mut ws, run, "f1", &format!("flood {flood}")).await;
    let t = Instant::now();
    let (mut first, mut last) = (None, None);
    let mut next = 0usize;
    let mut bytes = 0usize;
    let mut in_order = true;
    let result = loop {
        let text = recv_text(&mut ws).await;
        if text.contains("\"acp_update\"")
            && text.contains("\"prompt_id\":\"f1\"")
            && text.contains("agent_message_chunk")
        {
            let at = t.elapsed();
            first.get_or_insert(at);
            last = Some(at);
            bytes += text.len();
            // "text":"m<seq>:xxx
            let seq = text
                .find("\"text\":\"m")
                .and_then(|i| text[i + 9..].split(':').next().and_then(|n| n.parse::<usize>().ok()));
            if seq != Some(next) {
                in_order = false;
            }
            next += 1;
        } else if text.contains("\"prompt_result\"") && text.contains("\"f1\"") {
            break serde_json::from_str::<Value>(&text).unwrap();
        }
    };
    let cpu = cpu_ms(pid) - cpu_before;
    let (first, last) = (first.unwrap_or_default(), last.unwrap_or_default());
    assert_eq!(result["ok"], true, "{result}");
    println!(
        "relay: {next} of {flood} acp_update received, in order: {}, none lost: {}",
        in_order && next == flood,
        next == flood
    );
    println!(
        "relay rate: {:.0} notifications/s (prompt_send -> last update {:.1} ms; first -> last {:.1} ms; {:.1} MB to the backend)",
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
}
