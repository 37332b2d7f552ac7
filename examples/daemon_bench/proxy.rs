//! Benchmark of `tuixiu-sandbox proxy` (run by scripts/bench proxy).
//!
//! This program is the backend: a WebSocket server on loopback that the
//! real daemon (release build, native provider) connects to. It measures
//! 1. the daemon's idle RSS once registered;
//! 2. the RSS added by 100 idle runs (each opened with `acp_open`: run
//!    state, lane task, keepalive timer, instance record; no agents);
//! 3. bursts of 1 000 `sandbox_control inspect` sent back to back (10 by
//!    default, `BURSTS=N`): all answered, in order, with per-message
//!    latency (send → result); the median over bursts is reported;
//! 4. 1 000 sequential `inspect` round trips.
//!
//! Usage: daemon_bench proxy <tuixiu-sandbox binary> <scratch dir>
//! (`PROXY_ARGS="--log-format json -v"`: more options for the daemon)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::procstat::{cpu_ms, status_kib};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

use crate::link::recv_json;

/// `args[0]` is the program, then this benchmark's arguments.
pub async fn main(args: Vec<String>) {
    let bin = PathBuf::from(args.get(1).expect("usage: daemon_bench proxy BINARY SCRATCH"));
    let scratch = PathBuf::from(args.get(2).expect("usage: daemon_bench proxy BINARY SCRATCH"));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("ws")).unwrap();

    let (listener, url) = crate::link::listen().await;
    let config = scratch.join("proxy.toml");
    crate::ProxyToml::new(&url, &scratch.join("state"), "bench", &scratch.join("ws")).write(&config);
    // Options for the daemon beyond the config, e.g. `--log-format json -v`.
    let extra = std::env::var("PROXY_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let (mut child, pid, mut ws) = crate::link::start_daemon(&bin, &config, &extra, &listener, false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = status_kib(pid, "VmRSS:");
    let (idle_anon, idle_file) = (status_kib(pid, "RssAnon:"), status_kib(pid, "RssFile:"));
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);

    // 100 idle runs.
    let runs = 100;
    for i in 0..runs {
        let msg = json!({"type":"acp_open","run_id":format!("r{i}"),"cwd":"/workspace",
            "instance_name":format!("tuixiu-run-r{i}"),"keepalive_ttl_seconds":1800,
            "init":{"script":"true","timeout_seconds":30,"env":{"TUIXIU_RUN_ID":format!("r{i}"),"OPENAI_API_KEY":"sk-bench-123456"},
                    "agentInputs":{"version":1,"items":[]}}});
        ws.send(Message::text(msg.to_string())).await.unwrap();
    }
    let mut opened = 0;
    while opened < runs {
        let m = recv_json(&mut ws).await;
        if m["type"] == "acp_opened" {
            opened += 1;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let with_runs = status_kib(pid, "VmRSS:");
    let per_run = (with_runs.saturating_sub(idle)) as f64 / runs as f64;

    // Bursts of 1 000 inspects, BURSTS of them (default 10) one after the
    // other: a single burst's median swings with scheduling on a small
    // machine, so the median over bursts is what is reported, with the
    // best and worst burst beside it.
    let n = 1000;
    let bursts: usize = std::env::var("BURSTS").ok().and_then(|v| v.parse().ok()).unwrap_or(10).max(1);
    let (mut tx, mut rx) = ws.split();
    let mut medians = Vec::with_capacity(bursts);
    let mut all: Vec<f64> = Vec::with_capacity(bursts * n);
    let mut in_order = true;
    let mut totals = Vec::with_capacity(bursts);
    let cpu_before = cpu_ms(pid);
    for b in 0..bursts {
        let start = Instant::now();
        let writer = tokio::spawn(async move {
            let mut sent = Vec::with_capacity(n);
            for i in 0..n {
                let msg = json!({"type":"sandbox_control","action":"inspect","instance_name":"tuixiu-run-r0","request_id":format!("b{b}-{i}")});
                sent.push(start.elapsed());
                tx.send(Message::text(msg.to_string())).await.unwrap();
            }
            (tx, sent)
        });
        let prefix = format!("b{b}-");
        let mut got: Vec<(usize, Duration)> = Vec::with_capacity(n);
        while got.len() < n {
            let Some(Ok(Message::Text(t))) = rx.next().await else { continue };
            let m: Value = serde_json::from_str(&t).unwrap();
            if m["type"] == "sandbox_control_result" {
                assert_eq!(m["ok"], true, "{m}");
                let id: usize =
                    m["request_id"].as_str().unwrap().strip_prefix(&prefix).unwrap().parse().unwrap();
                got.push((id, start.elapsed()));
            }
        }
        totals.push(start.elapsed().as_secs_f64() * 1000.0);
        let (back, sent) = writer.await.unwrap();
        tx = back;
        in_order &= got.iter().enumerate().all(|(i, (id, _))| *id == i);
        let mut burst: Vec<f64> =
            got.iter().map(|(id, at)| (*at - sent[*id]).as_secs_f64() * 1000.0).collect();
        burst.sort_by(|a, b| a.partial_cmp(b).unwrap());
        medians.push(percentile(&burst, 0.5));
        all.extend(burst);
    }
    let cpu_burst = cpu_ms(pid) - cpu_before;
    medians.sort_by(|a, b| a.partial_cmp(b).unwrap());
    totals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());

    // Sequential round trips.
    let mut seq = Vec::with_capacity(n);
    for i in 0..n {
        let msg = json!({"type":"sandbox_control","action":"inspect","instance_name":"tuixiu-run-r0","request_id":format!("s{i}")});
        let t0 = Instant::now();
        tx.send(Message::text(msg.to_string())).await.unwrap();
        loop {
            let Some(Ok(Message::Text(t))) = rx.next().await else { continue };
            let m: Value = serde_json::from_str(&t).unwrap();
            if m["type"] == "sandbox_control_result" && m["request_id"] == format!("s{i}") {
                break;
            }
        }
        seq.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    seq.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let peak = status_kib(pid, "VmHWM:");

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(Path::new(&scratch));

    println!("idle_rss_kib {idle}");
    // What the daemon allocates, against what it maps of its files (which
    // follows the page cache: docs/benchmarks.md).
    println!("idle_rss_anon_kib {idle_anon}");
    println!("idle_rss_file_kib {idle_file}");
    println!("threads {threads}");
    println!("rss_with_{runs}_runs_kib {with_runs}");
    println!("per_run_kib {per_run:.1}");
    println!("bursts {bursts} x {n}, all_in_order {in_order}");
    println!("burst_total_ms_median {:.1}", percentile(&totals, 0.5));
    println!("daemon_cpu_us_per_inspect {:.1}", cpu_burst * 1000.0 / (bursts * n) as f64);
    println!(
        "burst_latency_ms_median {:.2} (per-burst medians: best {:.2}, worst {:.2})",
        percentile(&medians, 0.5),
        medians[0],
        medians[medians.len() - 1]
    );
    println!("burst_latency_ms_p99 {:.2}", percentile(&all, 0.99));
    println!("sequential_rtt_ms_median {:.3}", percentile(&seq, 0.5));
    println!("sequential_rtt_ms_p99 {:.3}", percentile(&seq, 0.99));
    println!("peak_rss_kib {peak}");
}
