//! Several daemons under one backend (docs/deploy.md, "Topology", "Adding a
//! host"; docs/protocol.md, "Identity and proxy_id_conflict"): a backend
//! stand-in and three daemons, each on its own "host" — a network namespace
//! with its own address — registering with distinct proxy ids over wss://. Runs
//! dispatched to each id land on that host and complete; killing one daemon
//! fails only its runs while the other two keep streaming; a second daemon with
//! a connected id gets the conflict exit; each host keeps its own state and
//! workspace root.
//!
//! The network is the test's own: a private namespace for the backend and
//! one per host, joined by veth pairs created inside the backend's
//! namespace (10.77.<n>.1 there, 10.77.<n>.2 on host n). Nothing touches
//! the machine's own network. Needs root (CI runs the suite as root).

mod proxy_support;

use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use proxy_support::agent::acp_config;
use proxy_support::net::{NetHolder, backend_ip, host_ip, private_network};
use proxy_support::{Backend, Daemon, Pki, SECS, Scratch};
use serde_json::{Value, json};

const HOSTS: usize = 3;

fn proxy_id(n: usize) -> String {
    format!("host-{n}")
}

fn run_id(n: usize) -> String {
    format!("r{n}")
}

/// Starts a daemon with proxy id `id` inside `host`'s network namespace.
fn start_daemon(host: &NetHolder, s: &Scratch, n: usize, id: &str, pki: &Pki, port: u16) -> Daemon {
    let url = format!("wss://{}:{port}/ws/agent", backend_ip(n));
    let config = acp_config(s, &url, "", "");
    let pid = host.pid().to_string();
    let ca = pki.ca_file.to_str().unwrap();
    Daemon::start_wrapped(
        s,
        "daemon",
        &config,
        &[("ACP_PROXY_AGENT_ID", id), ("ACP_PROXY_TLS_CA_FILE", ca)],
        &["nsenter", "--target", &pid, "--net", "--"],
    )
}

fn open_msg(n: usize) -> Value {
    let run = run_id(n);
    json!({"type": "acp_open", "run_id": run, "cwd": "/workspace",
           "init": {"script": "true", "timeout_seconds": 30, "env": {"USER_HOME": "/home/agent"},
                    "agentInputs": {"version": 1, "items": [
                        {"id": "host", "apply": "writeFile", "source": {"type": "inlineText", "text": proxy_id(n)},
                         "target": {"root": "WORKSPACE", "path": "host.txt"}}]}},
           "instance_name": format!("tuixiu-run-{run}"), "keepalive_ttl_seconds": 600})
}

/// A prompt that reports the host's addresses as the sandbox sees them,
/// then streams `ticks` chunks a quarter of a second apart.
fn streaming_prompt(n: usize, ticks: usize) -> Value {
    let mut script = vec![
        r#"term {"command":"sh","args":["-c","grep -o '10[.]77[.][0-9]*[.][0-9]*' /proc/net/fib_trie | sort -u | tr '\n' ' '"]}"#
            .to_string(),
    ];
    for t in 0..ticks {
        script.push(format!("say tick{t}"));
        script.push("sleep 0.25".into());
    }
    script.push("say done".into());
    json!({"type": "prompt_send", "run_id": run_id(n), "prompt_id": format!("p{n}"), "session_id": null,
           "cwd": "/workspace", "prompt": [{"type": "text", "text": script.join("\n")}], "timeout_ms": 120000})
}

/// The chunk texts run `n`'s prompt streamed, with when they arrived.
fn chunks(b: &Backend, n: usize) -> Vec<(String, Instant)> {
    b.received_from(&proxy_id(n))
        .into_iter()
        .filter(|r| r.msg["type"] == "acp_update" && r.msg["prompt_id"] == format!("p{n}").as_str())
        .filter(|r| r.msg["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|r| (r.msg["update"]["content"]["text"].as_str().unwrap_or("").to_string(), r.at))
        .collect()
}

fn ticks(b: &Backend, n: usize) -> Vec<(String, Instant)> {
    chunks(b, n).into_iter().filter(|(t, _)| t.starts_with("tick")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_three_hosts_under_one_backend() {
    assert_eq!(
        nix::unistd::geteuid().as_raw(),
        0,
        "the network namespaces need root (CI runs the suite as root)"
    );
    let hosts: Vec<NetHolder> = (0..HOSTS).map(|_| NetHolder::start()).collect();
    let listener = private_network(&hosts.iter().map(NetHolder::pid).collect::<Vec<_>>(), 0);
    let port = listener.local_addr().unwrap().port();
    let pki_dir = Scratch::new("hosts-pki");
    let names: Vec<String> = (1..=HOSTS).map(backend_ip).collect();
    let pki = Pki::generate_for(&pki_dir.dir, &names.iter().map(String::as_str).collect::<Vec<_>>());
    let backend = Backend::start_on(listener, Some(&pki), format!("wss://10.77.n.1:{port}/ws/agent"));
    backend.refuse_duplicate_ids(true);

    // One daemon per host, each with its own state and workspace root.
    let scratches: Vec<Scratch> = (1..=HOSTS).map(|n| Scratch::new(&format!("host{n}"))).collect();
    let mut daemons: Vec<Daemon> = (1..=HOSTS)
        .map(|n| start_daemon(&hosts[n - 1], &scratches[n - 1], n, &proxy_id(n), &pki, port))
        .collect();
    for n in 1..=HOSTS {
        let id = proxy_id(n);
        let deadline = Instant::now() + 30 * SECS;
        while !backend.is_connected(&id) {
            assert!(Instant::now() < deadline, "{id} did not register:\n{}", daemons[n - 1].stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Each registered from its own host's address.
        assert_eq!(backend.peer_of(&id).unwrap().ip(), host_ip(n).parse::<IpAddr>().unwrap());
    }

    // A run per host, dispatched by proxy id.
    for n in 1..=HOSTS {
        backend.send_to(&proxy_id(n), &open_msg(n));
    }
    for n in 1..=HOSTS {
        let opened = backend.wait_type("acp_opened", "run_id", &json!(run_id(n)), 60 * SECS).await;
        assert_eq!(opened["ok"], true, "{opened}\n{}", daemons[n - 1].stderr());
        backend.send_to(&proxy_id(n), &streaming_prompt(n, 40));
    }
    // Every host streams; then host 2 dies mid-stream.
    let deadline = Instant::now() + 60 * SECS;
    while (1..=HOSTS).any(|n| ticks(&backend, n).len() < 3) {
        assert!(
            Instant::now() < deadline,
            "not every host streams: {:?}",
            (1..=HOSTS).map(|n| ticks(&backend, n).len()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: signalling the daemon process this test started.
    unsafe { libc::kill(daemons[1].pid() as i32, libc::SIGKILL) };
    let killed_at = Instant::now();
    assert_eq!(daemons[1].wait_exit(10 * SECS).signal(), Some(libc::SIGKILL));

    // Only host 2's run fails (its prompt was pending when its socket went).
    let deadline = Instant::now() + 20 * SECS;
    while backend.failed_runs().is_empty() {
        assert!(Instant::now() < deadline, "the backend never saw host-2 go");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(backend.failed_runs(), [(run_id(2), "proxy host-2 disconnected".to_string())]);

    // Hosts 1 and 3 keep streaming after the kill and complete, in order.
    for n in [1, 3] {
        let result =
            backend.wait_type("prompt_result", "prompt_id", &json!(format!("p{n}")), 60 * SECS).await;
        assert_eq!(result["ok"], true, "{result}\n{}", daemons[n - 1].stderr());
        let texts: Vec<String> = chunks(&backend, n).into_iter().map(|(t, _)| t).collect();
        let mut want: Vec<String> = (0..40).map(|t| format!("tick{t}")).collect();
        want.push("done".into());
        assert_eq!(texts[1..], want[..], "host-{n}'s chunks");
        assert!(
            ticks(&backend, n).iter().filter(|(_, at)| *at > killed_at).count() >= 3,
            "host-{n} stopped streaming when host-2 died"
        );
        // The run ran on its own host: the sandbox saw that host's address only.
        let report: Value = serde_json::from_str(&texts[0]).unwrap();
        assert_eq!(report["exit"]["exitCode"], 0, "{report}");
        let seen: Vec<&str> = report["tail"].as_str().unwrap().split_whitespace().collect();
        assert!(seen.contains(&host_ip(n).as_str()), "host-{n}'s sandbox saw {seen:?}");
        assert!(
            seen.iter().all(|ip| ip.starts_with(&format!("10.77.{n}."))),
            "host-{n}'s sandbox saw {seen:?}"
        );
    }
    assert!(
        backend.received_from(&proxy_id(2)).iter().all(|r| r.msg["type"] != "prompt_result"),
        "host-2 cannot have answered after it died"
    );

    // A second daemon claiming host-1's id while host-1 is connected: the
    // backend refuses it and the daemon exits with the conflict status.
    let intruder_scratch = Scratch::new("host1-again");
    let mut intruder = start_daemon(&hosts[0], &intruder_scratch, 1, &proxy_id(1), &pki, port);
    let status = intruder.wait_exit(30 * SECS);
    assert_eq!(status.code(), Some(3), "{}", intruder.stderr());
    assert!(intruder.stderr().contains("proxy_id_conflict"), "{}", intruder.stderr());
    assert!(backend.is_connected(&proxy_id(1)), "the first host-1 keeps its connection");

    // Each host's state and workspace root hold its own run only.
    for n in 1..=HOSTS {
        let s = &scratches[n - 1];
        for m in 1..=HOSTS {
            let state = s.state.join("runs").join(format!("{}.json", run_id(m)));
            let ws = s.root.join(format!("run-{}", run_id(m)));
            assert_eq!(state.exists(), n == m, "{}", state.display());
            assert_eq!(ws.exists(), n == m, "{}", ws.display());
        }
        let host_file = s.root.join(format!("run-{}", run_id(n))).join("host.txt");
        assert_eq!(std::fs::read_to_string(&host_file).unwrap(), proxy_id(n));
    }
    for d in daemons.iter_mut() {
        if d.running() {
            d.stop();
        }
    }
}
