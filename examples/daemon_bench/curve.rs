//! Scaling curves of the daemon (run by scripts/bench daemon-curve):
//! how its memory, CPU per message and control latency grow with the work.
//!
//! The backend is this program (a WebSocket server on loopback, as in
//! `acp`); the daemon is the real one (release build,
//! native provider). Two phases, each one daemon:
//!
//! * idle: runs opened cumulatively up to 1, 10, 100, 1 000 (run state,
//!   lane, keepalive timer, instance record; no agent); at each step, once
//!   settled, the RSS and 300 sequential `sandbox_control inspect` round
//!   trips (latency p50/p99, the daemon's CPU per inspect);
//! * active: runs with an agent (tests/fake/agent.rs in its
//!   sandbox) up to 1, 10, 50; at each step every run floods at once
//!   (`TOTAL` updates of 200 B shared among them), every update checked in
//!   order per run, while an `inspect` goes out every 5 ms and its round
//!   trip is timed;
//!   the daemon's CPU per relayed update and its peak RSS (VmHWM, reset
//!   before each step).
//!
//! Output: CSV on stdout, one row per step:
//! `phase,runs,rss_kib,cpu_us_per_msg,ctl_p50_ms,ctl_p99_ms,rate_per_s,ahead_p50_kib,ahead_p99_kib`
//! (`ahead`: KiB received between a control and its answer, active phase).
//!
//! Usage: daemon_bench curve <tuixiu-sandbox binary> <scratch dir> <agent binary> [TOTAL [PHASES]]
//! (`PHASES`: `idle`, `active`, or `idle,active`, the default).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::procstat::{cpu_ms, status_kib};

use crate::ProxyToml;
use crate::link::{Ws, recv_text, send, until};

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Starts the daemon on `scratch` and accepts its link.
async fn daemon(bin: &Path, scratch: &Path, agent: Option<&Path>) -> (Child, u32, Ws) {
    let _ = std::fs::remove_dir_all(scratch);
    let root = scratch.join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let (listener, url) = crate::link::listen().await;
    let mut config = ProxyToml::new(&url, &scratch.join("state"), "curve", &root);
    if let Some(agent) = agent {
        let dir = scratch.join("agent");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(agent, dir.join("agent")).unwrap();
        config = config
            .agent_command(r#"["/bench/agent"]"#)
            .agent("max_concurrent = 100")
            .volume(&dir, "/bench", true);
    }
    config.write(&scratch.join("proxy.toml"));
    crate::link::start_daemon(bin, &scratch.join("proxy.toml"), &[], &listener, true).await
}

fn open_msg(run: &str) -> Value {
    let init = json!({"env":{"TUIXIU_RUN_ID":run},"agentInputs":{"version":1,"items":[]}});
    json!({"type":"acp_open","run_id":run,"cwd":"/workspace","instance_name":format!("tuixiu-run-{run}"),
        "keepalive_ttl_seconds":3600,"init":init})
}

/// Opens runs `from..to` (names `{prefix}{i}`), all sent at once.
async fn open_runs(ws: &mut Ws, prefix: &str, from: usize, to: usize, agent: bool) {
    for i in from..to {
        send(ws, open_msg(&format!("{prefix}{i}"))).await;
    }
    let mut opened = 0;
    while opened < to - from {
        let m: Value = serde_json::from_str(&recv_text(ws).await).unwrap();
        if m["type"] == "acp_opened" {
            // Idle runs have no agent to start: their open ends there, as
            // in `proxy`, with the run kept.
            let no_agent = m["error"].as_str().is_some_and(|e| e.contains("agent_command is not configured"));
            assert!(m["ok"] == true || (!agent && no_agent), "{m}");
            opened += 1;
        }
    }
}

/// `n` sequential inspect round trips: latencies (ms) and daemon CPU (µs) each.
async fn sequential_inspects(ws: &mut Ws, pid: u32, instance: &str, n: usize) -> (Vec<f64>, f64) {
    let cpu = cpu_ms(pid);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("q{i}");
        let t = Instant::now();
        send(
            ws,
            json!({"type":"sandbox_control","action":"inspect","instance_name":instance,"request_id":id}),
        )
        .await;
        until(ws, |m| m["type"] == "sandbox_control_result" && m["request_id"] == id.as_str()).await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (lat, (cpu_ms(pid) - cpu) * 1000.0 / n as f64)
}

async fn idle_phase(bin: &Path, scratch: &Path) {
    let (mut child, pid, mut ws) = daemon(bin, scratch, None).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut lat, cpu) = sequential_inspects(&mut ws, pid, "none", 300).await;
    println!(
        "no-runs,0,{},{cpu:.1},{:.3},{:.3},",
        status_kib(pid, "VmRSS:"),
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99)
    );
    let mut have = 0;
    for n in [1, 10, 100, 1000] {
        open_runs(&mut ws, "i", have, n, false).await;
        have = n;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss = status_kib(pid, "VmRSS:");
        let (mut lat, cpu) = sequential_inspects(&mut ws, pid, "tuixiu-run-i0", 300).await;
        println!("idle,{n},{rss},{cpu:.1},{:.3},{:.3},,,", pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
}

/// One flood step: every run floods `per_run` updates at once.
async fn flood_step(ws: Ws, pid: u32, runs: usize, per_run: usize, step: usize) -> (Ws, String) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let cpu = cpu_ms(pid);
    let (mut tx, mut rx) = ws.split();
    for r in 0..runs {
        let msg = json!({"type":"prompt_send","run_id":format!("a{r}"),"prompt_id":format!("f{step}-{r}"),
            "session_id":null,"cwd":"/workspace","prompt":[{"type":"text","text":format!("relay {per_run}")}],
            "timeout_ms":600000});
        tx.send(Message::text(msg.to_string())).await.unwrap();
    }
    let t = Instant::now();
    // Controls every 5 ms while the flood lasts.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Bytes received so far: what arrived between a control and its answer
    // is what the answer waited behind on the way (in the daemon's last
    // batch, the sockets' buffers and this reader).
    let rx_bytes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rx_at_send = rx_bytes.clone();
    let ctl = tokio::spawn(async move {
        let mut sent = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let id = format!("c{step}-{}", sent.len());
                    sent.push((Instant::now(), rx_at_send.load(std::sync::atomic::Ordering::Relaxed)));
                    tx.send(Message::text(json!({"type":"sandbox_control","action":"inspect",
                        "instance_name":"tuixiu-run-a0","request_id":id}).to_string())).await.unwrap();
                }
                _ = &mut stop_rx => return (tx, sent),
            }
        }
    });
    let mut next = vec![0usize; runs];
    let mut done = 0;
    let mut in_order = true;
    let mut ctl_at: HashMap<usize, (Instant, usize)> = HashMap::new();
    let ctl_prefix = format!("\"request_id\":\"c{step}-");
    while done < runs {
        let text = match rx.next().await.expect("link").expect("read") {
            Message::Text(t) => t,
            _ => continue,
        };
        let received = rx_bytes.fetch_add(text.len(), std::sync::atomic::Ordering::Relaxed) + text.len();
        if let Some(rest) = text.strip_prefix("{\"type\":\"acp_update\",\"run_id\":\"a") {
            let r: usize = rest.split('"').next().unwrap().parse().unwrap();
            let seq = text
                .rfind("\"text\":\"m")
                .and_then(|i| text[i + 9..].split(':').next().and_then(|n| n.parse::<usize>().ok()));
            in_order &= seq == Some(next[r]);
            next[r] += 1;
        } else if text.contains("\"prompt_result\"") {
            let m: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(m["ok"], true, "{m}");
            done += 1;
        } else if let Some(i) = text.find(ctl_prefix.as_str()) {
            let n: usize = text[i + ctl_prefix.len()..].split('"').next().unwrap().parse().unwrap();
            ctl_at.insert(n, (Instant::now(), received));
        }
    }
    let wall = t.elapsed();
    let cpu = cpu_ms(pid) - cpu;
    let _ = stop_tx.send(());
    let (tx, sent) = ctl.await.unwrap();
    // Controls still in flight are not counted (they were answered after
    // the flood's end).
    let mut lat: Vec<f64> = ctl_at
        .iter()
        .filter_map(|(n, (at, _))| sent.get(*n).map(|(s, _)| (*at - *s).as_secs_f64() * 1000.0))
        .collect();
    let mut ahead: Vec<f64> = ctl_at
        .iter()
        .filter_map(|(n, (_, rx))| sent.get(*n).map(|(_, s)| rx.saturating_sub(*s) as f64 / 1024.0))
        .collect();
    let total = runs * per_run;
    assert!(in_order && next.iter().all(|&n| n == per_run), "updates lost or out of order: {next:?}");
    let row = format!(
        "active,{runs},{},{:.3},{:.3},{:.3},{:.0},{:.0},{:.0}",
        status_kib(pid, "VmHWM:"),
        cpu * 1000.0 / total as f64,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        total as f64 / wall.as_secs_f64(),
        pct(&mut ahead, 0.5),
        pct(&mut ahead, 0.99)
    );
    (rx.reunite(tx).unwrap(), row)
}

async fn active_phase(bin: &Path, scratch: &Path, agent: &Path, total: usize) {
    let (mut child, pid, mut ws) = daemon(bin, scratch, Some(agent)).await;
    let mut have = 0;
    for (step, n) in [1, 10, 50].into_iter().enumerate() {
        open_runs(&mut ws, "a", have, n, true).await;
        have = n;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (back, row) = flood_step(ws, pid, n, total / n, step).await;
        ws = back;
        println!("{row}");
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
}

/// `args[0]` is the program, then this benchmark's arguments.
pub async fn main(args: Vec<String>) {
    let usage = "usage: daemon_bench curve BINARY SCRATCH AGENT [TOTAL [PHASES]]";
    let bin = PathBuf::from(args.get(1).expect(usage));
    let scratch = PathBuf::from(args.get(2).expect(usage));
    let agent = PathBuf::from(args.get(3).expect(usage));
    let total: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(500_000);
    // `idle`, `active` or both (the default): an A/B of the relay needs
    // only the active phase.
    let phases = args.get(5).map(String::as_str).unwrap_or("idle,active");
    println!(
        "phase,runs,rss_kib,cpu_us_per_msg,ctl_p50_ms,ctl_p99_ms,rate_per_s,ahead_p50_kib,ahead_p99_kib"
    );
    if phases.split(',').any(|p| p == "idle") {
        idle_phase(&bin, &scratch.join("idle")).await;
    }
    if phases.split(',').any(|p| p == "active") {
        active_phase(&bin, &scratch.join("active"), &agent, total).await;
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
