//! The daemon's memory for terminal output (run by
//! scripts/bench terminal-rss): RUNS runs at once, each with 32
//! terminals at the 64 MiB `outputByteLimit`, each printing more than that;
//! once all have exited their output is read one terminal after another.
//! The daemon is the real one (release build, native provider), the agent
//! tests/fake/agent.rs (`terms`).
//!
//! Output, one line per measurement: the daemon's peak RSS (VmHWM, reset
//! after the runs were opened) over the whole step, its RSS at the end,
//! and the time the step took.
//!
//! Usage: daemon_bench terminal-rss <tuixiu-sandbox binary> <scratch dir> <agent binary> RUNS [BYTES]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::procstat::status_kib;

use crate::link::{recv_json, send, until};

const TERMINALS: usize = 32;
const LIMIT: u64 = 64 * 1024 * 1024;

/// `args[0]` is the program, then this benchmark's arguments.
pub async fn main(args: Vec<String>) {
    let usage = "usage: daemon_bench terminal-rss BINARY SCRATCH AGENT RUNS [BYTES]";
    let bin = PathBuf::from(args.get(1).expect(usage));
    let scratch = PathBuf::from(args.get(2).expect(usage));
    let agent = PathBuf::from(args.get(3).expect(usage));
    let runs: usize = args.get(4).and_then(|v| v.parse().ok()).expect(usage);
    let bytes: u64 = args.get(5).and_then(|v| v.parse().ok()).unwrap_or(LIMIT + LIMIT / 4);

    let _ = std::fs::remove_dir_all(&scratch);
    let root = scratch.join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let dir = scratch.join("agent");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&agent, dir.join("agent")).unwrap();
    let (listener, url) = crate::link::listen().await;
    crate::ProxyToml::new(&url, &scratch.join("state"), "terminal-rss", &root)
        .agent_command(r#"["/bench/agent"]"#)
        .agent("max_concurrent = 100")
        .sandbox("terminalEnabled = true")
        .volume(&dir, "/bench", true)
        .write(&scratch.join("proxy.toml"));
    let (mut child, pid, mut ws) =
        crate::link::start_daemon(&bin, &scratch.join("proxy.toml"), &[], &listener, true).await;

    for r in 0..runs {
        let run = format!("t{r}");
        let init = json!({"env":{},"agentInputs":{"version":1,"items":[]}});
        send(
            &mut ws,
            json!({"type":"acp_open","run_id":run,"cwd":"/workspace",
            "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":3600,"init":init}),
        )
        .await;
        let m = until(&mut ws, |m| m["type"] == "acp_opened" && m["run_id"] == run.as_str()).await;
        assert_eq!(m["ok"], true, "{m}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = status_kib(pid, "VmRSS:");
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let t = Instant::now();
    for r in 0..runs {
        send(
            &mut ws,
            json!({"type":"prompt_send","run_id":format!("t{r}"),"prompt_id":format!("p{r}"),
            "session_id":null,"cwd":"/workspace","timeout_ms":3_600_000,
            "prompt":[{"type":"text","text":format!("terms {TERMINALS} {LIMIT} {bytes}")}]}),
        )
        .await;
    }
    let mut done = 0;
    while done < runs {
        let m: Value = recv_json(&mut ws).await;
        if m["type"] == "acp_update" && m["update"]["sessionUpdate"] == "agent_message_chunk" {
            let report: Value =
                serde_json::from_str(m["update"]["content"]["text"].as_str().unwrap()).unwrap();
            let lens = report["lens"].as_array().unwrap();
            assert_eq!(lens.len(), TERMINALS, "{report}");
            assert!(lens.iter().all(|l| l.as_u64() == Some(LIMIT.min(bytes))), "{report}");
        }
        if m["type"] == "prompt_result" {
            assert_eq!(m["ok"], true, "{m}");
            done += 1;
        }
    }
    println!(
        "runs {runs}: {TERMINALS} terminals each at {} MiB, {} MiB printed each: idle {} KiB, peak RSS (VmHWM) {} KiB, \
         end {} KiB, {:.1} s",
        LIMIT >> 20,
        bytes >> 20,
        idle,
        status_kib(pid, "VmHWM:"),
        status_kib(pid, "VmRSS:"),
        t.elapsed().as_secs_f64()
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&scratch);
}
