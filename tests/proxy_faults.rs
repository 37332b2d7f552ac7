//! The daemon under faults (docs/reliability.md, "Fault matrix"): the real
//! daemon binary, the real native sandbox and the fake agent
//! (tests/fake/agent.rs), driven by the fake backend of
//! tests/proxy_support: restarts and kills of the daemon, expiry, full
//! disks, unwritable state, agents that ignore end-of-file.

// The zip server of the manifest tests needs their fixtures, which load
// the test-binary installer that proxy_support loads too.
#![allow(clippy::duplicate_mod)]

mod common;
mod inputs_support;
mod proxy_support;

use std::path::Path;
use std::time::Duration;

use proxy_support::agent::{acp_config, agent_dir, chunks, prompt};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

/// How the fake agent behaves when its stdin ends.
#[derive(Clone, Copy, Debug)]
enum OnEof {
    Exit,
    /// Keeps running (claude-code-acp does), and ignores SIGTERM too.
    Ignore,
}

/// A config running the fake agent with `on_eof`, tagged with a
/// marker unique to this scratch directory (to find its processes).
fn agent_config(s: &Scratch, url: &str, on_eof: OnEof, extra: &str) -> String {
    let dir = agent_dir(s);
    let mut argv = vec!["/agent/fake_agent".to_string(), format!("--marker={}", marker(s))];
    if let OnEof::Ignore = on_eof {
        argv.extend(["--ignore-eof".into(), "--ignore-term".into()]);
    }
    let argv: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    s.config(
        url,
        &format!("agent_command = [{}]\nagent_shutdown_grace_seconds = 1\n{extra}", argv.join(", ")),
        &format!(
            "terminalEnabled = true\n[[sandbox.volumes]]\nhostPath = \"{}\"\nguestPath = \"/agent\"\nreadOnly = true\n",
            dir.display()
        ),
    )
}

fn marker(s: &Scratch) -> String {
    format!("m{}", s.dir.file_name().unwrap().to_string_lossy())
}

/// Host pids of the processes whose command line carries the marker.
fn agent_pids(s: &Scratch) -> Vec<u32> {
    let marker = format!("--marker={}", marker(s));
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
        .filter(|pid| {
            // A zombie has ended.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
        })
        .collect()
}

/// Waits until no process of the agent is left; panics after `timeout`.
async fn agents_gone(s: &Scratch, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = agent_pids(s);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "agent processes still running after {timeout:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn types_of(b: &Backend, conn: usize) -> Vec<String> {
    b.of_conn(conn).iter().map(|m| m["type"].as_str().unwrap_or("?").to_string()).collect()
}

fn init(items: Value) -> Value {
    json!({"script": "", "timeout_seconds": 30,
           "env": {"TUIXIU_RUN_ID": "x", "USER_HOME": "/home/agent"},
           "agentInputs": {"version": 1, "items": items}})
}

/// Sends `acp_open` and waits for its answer (the next `acp_opened` of the run).
async fn open_with(b: &Backend, run: &str, init: Value, ttl: u64) -> Value {
    let opened = |b: &Backend| {
        b.received().into_iter().filter(|r| r.msg["type"] == "acp_opened" && r.msg["run_id"] == run).count()
    };
    let before = opened(b);
    b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init,
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":ttl}));
    b.wait_for(&format!("acp_opened of {run}"), 60 * SECS, |_| opened(b) > before).await;
    let all = b.received();
    all.iter().rev().find(|r| r.msg["type"] == "acp_opened" && r.msg["run_id"] == run).unwrap().msg.clone()
}

/// The statuses reported for `run`'s instance so far, in order.
fn statuses(b: &Backend, run: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "proxy_update" && r.msg["content"]["type"] == "sandbox_instance_status")
        .filter(|r| r.msg["run_id"] == run)
        .map(|r| r.msg["content"]["status"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Keepalive expiry removes the instance but keeps the run: the backend,
/// which still holds the run open, sends a plain `prompt_send` (no
/// `init`); a new instance is made, the agent started and the session
/// loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_then_a_plain_prompt_resumes_the_run() {
    let backend = Backend::start().await;
    let s = Scratch::new("ttl-resume");
    let cfg = acp_config(&s, &backend.url, "expire_idle_runs = true", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "e1", init(json!([])), 2).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let r = prompt(&backend, "e1", "p1", Value::Null, "say before").await;
    assert_eq!(r["ok"], true, "{r}");
    let session = r["session_id"].as_str().unwrap().to_string();
    backend
        .wait_for("missing after the TTL", 20 * SECS, |_| {
            statuses(&backend, "e1").last().map(String::as_str) == Some("missing")
        })
        .await;
    assert!(!s.state.join("native/tuixiu-run-e1").exists(), "the instance was removed");
    // A restart re-adopts the run; its instance was reported missing once,
    // and is not again.
    assert!(daemon.stop().success());
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(1, 20 * SECS).await;
    let r = backend.control(json!({"action":"report_inventory"})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        statuses(&backend, "e1").iter().filter(|s| *s == "missing").count(),
        1,
        "the removed instance was reported again: {:?}\n{}",
        statuses(&backend, "e1"),
        daemon.stderr()
    );
    // What the real backend sends next: no init.
    backend.send(&json!({"type":"prompt_send","run_id":"e1","prompt_id":"p2","session_id":session,
        "cwd":"/workspace","instance_name":"tuixiu-run-e1","keepalive_ttl_seconds":2,
        "prompt":[{"type":"text","text":"say after"}],"timeout_ms":60000}));
    let r = backend.wait_type("prompt_result", "prompt_id", &json!("p2"), 60 * SECS).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(r["session_id"], session.as_str(), "the session was resumed");
    assert_eq!(chunks(&backend, "p2"), ["after"]);
    assert_eq!(statuses(&backend, "e1").last().map(String::as_str), Some("running"));
    let kept = read_json(&s.state.join("runs/e1.json"));
    assert_eq!(kept["init"]["agentInputs"]["version"], 1, "the run's init is kept: {kept}");
    assert!(daemon.stop().success());
}

/// SIGTERM mid-prompt: the agents are closed while the link is still up,
/// so the interrupted prompt's result and the agent's exit reach the
/// backend before the close; nothing is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_agents_then_flushes_then_closes_the_link() {
    for on_eof in [OnEof::Exit, OnEof::Ignore] {
        let backend = Backend::start().await;
        let s = Scratch::new("sigterm");
        let mut daemon = Daemon::start(&s, "proxy", &agent_config(&s, &backend.url, on_eof, ""));
        backend.registered(0, 20 * SECS).await;
        let opened = open_with(&backend, "t1", init(json!([])), 600).await;
        assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
        backend.send(&json!({"type":"prompt_send","run_id":"t1","prompt_id":"p1","session_id":null,
            "prompt":[{"type":"text","text":"say started\nsleep 60"}],"timeout_ms":120000}));
        backend.wait_for("the prompt is running", 30 * SECS, |_| chunks(&backend, "p1") == ["started"]).await;
        assert!(daemon.stop().success(), "{}", daemon.stderr());
        let t = types_of(&backend, 0);
        let result = backend
            .of_conn(0)
            .into_iter()
            .find(|m| m["type"] == "prompt_result" && m["prompt_id"] == "p1")
            .unwrap_or_else(|| {
                panic!("{on_eof:?}: the interrupted prompt's result was lost: {t:?}\n{}", daemon.stderr())
            });
        assert_eq!(result["ok"], false, "{result}");
        assert!(
            backend.of_conn(0).iter().any(|m| m["content"]["type"] == "transport_disconnected"),
            "{on_eof:?}: the agent's exit was lost: {t:?}"
        );
        let log = daemon.stderr();
        assert!(!log.contains("lost with this shutdown"), "{on_eof:?}: {log}");
        assert!(agent_pids(&s).is_empty(), "{on_eof:?}: the agent outlived the daemon");
    }
}

/// SIGTERM says what it waits for and waits only while something is
/// pending: with the agent's turn over and the outbox empty, the daemon
/// closes the agent, closes the link and exits, although the backend keeps
/// the TCP connection open after answering the close (as a backend behind
/// a proxy may); each step is in the log, the time last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_only_while_something_is_pending() {
    let backend = Backend::start().await;
    backend.linger_after_close(Duration::from_secs(20));
    let s = Scratch::new("shutdown-wait");
    let mut daemon = Daemon::start(&s, "proxy", &agent_config(&s, &backend.url, OnEof::Exit, ""));
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "w1", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let r = prompt(&backend, "w1", "p1", Value::Null, "say done").await;
    assert_eq!(r["ok"], true, "{r}");
    let t0 = std::time::Instant::now();
    assert!(daemon.stop().success(), "{}", daemon.stderr());
    let took = t0.elapsed();
    let log = daemon.stderr();
    for step in ["shutting down: closing 1 agent(s)", "shutting down: closing the link", "shut down in"] {
        assert!(log.contains(step), "{step:?} not logged: {log}");
    }
    assert!(!log.contains("did not answer the close"), "{log}");
    // The close handshake's bound is 3 s; nothing else was pending.
    assert!(took < Duration::from_secs(2), "SIGTERM took {took:?} with nothing pending: {log}");
}

/// Who runs the daemon.
#[derive(Clone, Copy, Debug)]
enum As {
    Root,
    Nobody,
    Nested,
}

fn start_as(who: As, s: &Scratch, name: &str, cfg: &str) -> Daemon {
    match who {
        As::Root => Daemon::start(s, name, cfg),
        As::Nobody => Daemon::start_unprivileged(s, name, cfg, false),
        As::Nested => Daemon::start_unprivileged(s, name, cfg, true),
    }
}

fn sigkill(daemon: &mut Daemon) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    daemon.wait_exit(10 * SECS);
}

/// The launcher pid of the run's agent, from the native provider's records.
fn agent_launcher(s: &Scratch, run: &str) -> i32 {
    let dir = s.state.join(format!("native/tuixiu-run-{run}/procs"));
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("agent")))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no agent recorded in {}", dir.display()))
}

/// SIGKILLs a process when dropped (a stopped launcher must not outlive a failed test).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: plain kill(2); the pid was recorded by this test's daemon.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// Daemon SIGKILL, idle or in the middle of a prompt, with an agent that
/// exits at end-of-file or one that ignores it and SIGTERM (as
/// claude-code-acp does): the agent's sandbox dies with the daemon (the
/// launcher's lifeline, whichever daemon thread started it), and the
/// restarted daemon's first prompt works and resumes the session. (The
/// interrupted prompt's result dies with the daemon: the backend fails it
/// itself when the proxy disconnects.) With `stop_launcher`, the old
/// launcher is frozen first, so the agent survives the daemon: the restart
/// must end it and wait until it has really exited before the new agent
/// starts (before, the first prompt failed with "already has a running
/// agent").
async fn sigkill_daemon(who: As, on_eof: OnEof, mid_prompt: bool, stop_launcher: bool) {
    let what = format!("{who:?}, agent {on_eof:?}, mid-prompt {mid_prompt}, frozen launcher {stop_launcher}");
    let backend = Backend::start().await;
    let s = Scratch::new("sigkill");
    let cfg = agent_config(&s, &backend.url, on_eof, "");
    let mut daemon = start_as(who, &s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "k1", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{what}: {opened}\n{}", daemon.stderr());
    let session = if mid_prompt {
        backend.send(&json!({"type":"prompt_send","run_id":"k1","prompt_id":"p1","session_id":null,
            "prompt":[{"type":"text","text":"say started\nsleep 60"}],"timeout_ms":120000}));
        backend.wait_for("the prompt runs", 30 * SECS, |_| chunks(&backend, "p1") == ["started"]).await;
        let created = backend
            .wait_for("session_created", SECS, |m| m.msg["update"]["sessionUpdate"] == "session_created")
            .await;
        created.msg["session_id"].as_str().unwrap().to_string()
    } else {
        let r = prompt(&backend, "k1", "p1", Value::Null, "say one").await;
        assert_eq!(r["ok"], true, "{what}: {r}");
        r["session_id"].as_str().unwrap().to_string()
    };
    let old_agent = agent_pids(&s);
    assert!(!old_agent.is_empty(), "{what}: the agent is not running");
    let _frozen = stop_launcher.then(|| {
        let launcher = agent_launcher(&s, "k1");
        // SAFETY: plain kill(2) on the launcher this test's daemon started.
        unsafe { libc::kill(launcher, libc::SIGSTOP) };
        KillOnDrop(launcher)
    });
    sigkill(&mut daemon);
    if stop_launcher {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!agent_pids(&s).is_empty(), "{what}: the frozen launcher's agent should have survived");
    } else {
        agents_gone(&s, 10 * SECS).await;
    }
    let mut daemon = start_as(who, &s, "second", &cfg);
    backend.registered(1, 20 * SECS).await;
    let r = prompt(&backend, "k1", "p2", json!(session), "say two").await;
    assert_eq!(r["ok"], true, "{what}: {r}\n{}", daemon.stderr());
    assert_eq!(r["session_id"], session.as_str());
    assert_eq!(chunks(&backend, "p2"), ["two"]);
    let now: Vec<u32> = agent_pids(&s);
    assert!(
        old_agent.iter().all(|p| !now.contains(p)),
        "{what}: the old agent still runs: {old_agent:?} {now:?}"
    );
    assert!(
        backend
            .received()
            .iter()
            .all(|m| !(m.msg["type"] == "prompt_result" && m.msg["prompt_id"] == "p1" && m.conn == 1)),
        "{what}: the new daemon answered a prompt it never had"
    );
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_agents_die_with_the_daemon() {
    for on_eof in [OnEof::Exit, OnEof::Ignore] {
        for mid_prompt in [false, true] {
            sigkill_daemon(As::Root, on_eof, mid_prompt, false).await;
        }
    }
    for who in [As::Nobody, As::Nested] {
        sigkill_daemon(who, OnEof::Ignore, true, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_waits_for_a_leftover_agent() {
    for who in [As::Root, As::Nobody] {
        sigkill_daemon(who, OnEof::Ignore, false, true).await;
    }
}

/// The daemon's peak resident set (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A workspace owned by the daemon's user, with a sparse file whose first
/// line is `first_line` bytes long (no disk used).
fn workspace_with_sparse_file(s: &Scratch, run: &str, who: As, first_line: u64) {
    let ws = s.root.join(format!("run-{run}"));
    std::fs::create_dir_all(&ws).unwrap();
    let f = std::fs::File::create(ws.join("big.txt")).unwrap();
    f.set_len(first_line).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\ntail\n", first_line).unwrap();
    std::fs::write(ws.join("small.txt"), "a\nb\nc\n").unwrap();
    if !matches!(who, As::Root) {
        for p in [ws.clone(), ws.join("big.txt"), ws.join("small.txt")] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
    }
}

/// `fs/read_text_file` by lines reads and keeps at most `fs_read_max_bytes`
/// of the file (a 128 MiB line once took the daemon's memory with it), and
/// one run's agent cannot hold more than `run_max_terminals` terminals or
/// start one when its sandbox runs `run_max_processes` processes (as root
/// no kernel limit applies to the sandbox: the daemon counts).
async fn agent_bounds(who: As) {
    let backend = Backend::start().await;
    let s = Scratch::new("bounds");
    let extra = "fs_read_max_bytes = 1048576\nrun_max_terminals = 4\nrun_max_processes = 8";
    workspace_with_sparse_file(&s, "b1", who, 128 << 20);
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, extra);
    let mut daemon = start_as(who, &s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "b1", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    let before = peak_rss_kib(daemon.pid());
    let script = [
        r#"call fs/read_text_file {"path":"/workspace/big.txt","line":2,"limit":1}"#,
        r#"call fs/read_text_file {"path":"/workspace/small.txt","line":2,"limit":1}"#,
        r#"calls 6 terminal/create {"command":"sleep","args":["30"]}"#,
    ]
    .join("\n");
    let r = prompt(&backend, "b1", "p1", Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{who:?}: {r}");
    let rep = proxy_support::agent::reports(&backend, "p1");
    assert_eq!(rep[0]["error"]["code"], -32603, "{who:?}: a 128 MiB line was read: {}", rep[0]);
    assert!(rep[0]["error"]["message"].as_str().unwrap().contains("fs_read_max_bytes"), "{}", rep[0]);
    assert_eq!(rep[1]["result"]["content"], "b\n");
    let grown = peak_rss_kib(daemon.pid()).saturating_sub(before);
    assert!(grown < 32 * 1024, "{who:?}: the daemon's peak memory grew by {grown} KiB");
    let created = rep[2..8].iter().filter(|r| r["result"]["terminalId"].is_string()).count();
    let refused: Vec<&Value> = rep[2..8].iter().filter(|r| r.get("error").is_some()).collect();
    assert_eq!((created, refused.len()), (4, 2), "{who:?}: {:?}", &rep[2..8]);
    assert!(refused.iter().all(|r| r["error"]["message"].as_str().unwrap().contains("run_max_terminals")));

    // Processes: a terminal that starts five more fills the sandbox
    // (PID 1, the agent, sh and five sleeps); the next one is refused.
    let opened = open_with(&backend, "b2", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{opened}");
    let script = [
        r#"call terminal/create {"command":"sh","args":["-c","for i in 1 2 3 4 5; do sleep 30 & done; wait"]}"#,
        "sleep 1",
        r#"call terminal/create {"command":"true"}"#,
    ]
    .join("\n");
    let r = prompt(&backend, "b2", "p2", Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{who:?}: {r}");
    let rep = proxy_support::agent::reports(&backend, "p2");
    assert!(rep[0]["result"]["terminalId"].is_string(), "{who:?}: {}", rep[0]);
    assert_eq!(rep[1]["error"]["code"], -32603, "{who:?}: a 9th process was started: {}", rep[1]);
    assert!(rep[1]["error"]["message"].as_str().unwrap().contains("run_max_processes"), "{}", rep[1]);
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_reads_terminals_and_processes_are_bounded() {
    for who in [As::Root, As::Nobody, As::Nested] {
        agent_bounds(who).await;
    }
}

/// The agent edits two inputs it was given, `notes/readme.txt` in the
/// workspace and `.config/rc` in its home; returns the prompt's result.
async fn agent_edits(b: &Backend, run: &str) -> Value {
    let edits = "file /workspace/notes/readme.txt the agent's edit\nfile /home/agent/.config/rc agent rc";
    let r = prompt(b, run, "p1", Value::Null, edits).await;
    assert_eq!(r["ok"], true, "{r}");
    r
}

/// After a daemon restart (and after an agent crash), the persisted `init`
/// is used again to start the agent: an input the agent changed since it
/// landed is left as it is and reported, never overwritten; untouched
/// inputs stay as they are. The same when the backend sends `init` again,
/// with `acp_open` or with the `prompt_send` that starts the next agent.
async fn reopening(who: As) {
    let backend = Backend::start().await;
    let s = Scratch::new("reland");
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, "");
    let mut daemon = start_as(who, &s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    let items = json!([
        {"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": "from the manifest"},
         "target": {"root": "WORKSPACE", "path": "notes/readme.txt"}},
        {"id": "kept", "apply": "writeFile", "source": {"type": "inlineText", "text": "untouched"},
         "target": {"root": "WORKSPACE", "path": "kept.txt"}},
        {"id": "rc", "apply": "writeFile", "source": {"type": "inlineText", "text": "home input"},
         "target": {"root": "USER_HOME", "path": ".config/rc"}}]);
    let opened = open_with(&backend, "l1", init(items.clone()), 600).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let ws = s.root.join("run-l1");
    let home = s.root.join("home-l1");
    let r = agent_edits(&backend, "l1").await;
    let session = r["session_id"].as_str().unwrap().to_string();
    assert_eq!(std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(), "the agent's edit");

    // A daemon restart: the next prompt starts the agent with the persisted init.
    assert!(daemon.stop().success());
    let kept_mtime = std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap();
    let mut daemon = start_as(who, &s, "second", &cfg);
    backend.registered(1, 20 * SECS).await;
    let r = prompt(&backend, "l1", "p2", json!(session), "say back").await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(),
        "the agent's edit",
        "{who:?}: the persisted init overwrote the agent's work"
    );
    assert_eq!(std::fs::read_to_string(home.join(".config/rc")).unwrap(), "agent rc");
    assert_eq!(std::fs::read_to_string(ws.join("kept.txt")).unwrap(), "untouched");
    assert_eq!(std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap(), kept_mtime, "rewritten");
    let reported = left_alone_reports(&backend, "l1");
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(
        reported[0].contains("item notes")
            && reported[0].contains("/workspace/notes/readme.txt")
            && reported[0].contains("changed since it was applied"),
        "{reported:?}"
    );
    assert!(reported[1].contains("item rc"), "{reported:?}");

    // The backend sends init again (the agent runs: nothing happens yet);
    // the agent crashes; the next start, by a `prompt_send` carrying init
    // too, lands nothing over the agent's work either: init or not, the
    // rule is the same.
    let opened = open_with(&backend, "l1", init(items.clone()), 600).await;
    assert_eq!(opened["ok"], true, "{opened}");
    let r = prompt(&backend, "l1", "p3", json!(session), "exit 3").await;
    assert_eq!(r["ok"], false);
    backend.wait_type("acp_exit", "run_id", &json!("l1"), 20 * SECS).await;
    backend.send(&json!({"type":"prompt_send","run_id":"l1","prompt_id":"p4","session_id":session,
        "cwd":"/workspace","init":init(items),"prompt":[{"type":"text","text":"say again"}],"timeout_ms":60000}));
    let r = backend.wait_type("prompt_result", "prompt_id", &json!("p4"), 60 * SECS).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(), "the agent's edit", "{who:?}");
    assert_eq!(std::fs::read_to_string(home.join(".config/rc")).unwrap(), "agent rc", "{who:?}");
    assert_eq!(std::fs::read_to_string(ws.join("kept.txt")).unwrap(), "untouched");
    let reported = left_alone_reports(&backend, "l1");
    assert_eq!(reported.len(), 4, "{who:?}: reported at each start: {reported:?}");
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_never_overwrites_the_agents_work() {
    for who in [As::Root, As::Nobody, As::Nested] {
        reopening(who).await;
    }
}

/// Texts the daemon sent for `run` that report an input left alone.
fn left_alone_reports(b: &Backend, run: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "proxy_update" && r.msg["run_id"] == run)
        .filter_map(|r| r.msg["content"]["text"].as_str().map(str::to_string))
        .filter(|t| t.contains("left as it is"))
        .collect()
}

/// The backend's recovery: a run whose keepalive expired (its instance
/// removed, `missing` reported), then a link reset (here: the connection
/// dropped, and a daemon restart); the backend sees `sandboxStatus =
/// missing` and sends `acp_open` **with** its recovery `init`. The
/// agent's edits survive, are reported, and untouched inputs stay as
/// they are; when the role's content changed since, an untouched input
/// gets the new content and an edited one keeps the agent's, with the
/// backend's new content kept aside in the state directory.
async fn recovery(who: As) {
    let backend = Backend::start().await;
    let s = Scratch::new("recovery");
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, "expire_idle_runs = true");
    let mut daemon = start_as(who, &s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    let items = |notes: &str, kept: &str| {
        json!([
            {"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": notes},
             "target": {"root": "WORKSPACE", "path": "notes/readme.txt"}},
            {"id": "kept", "apply": "writeFile", "source": {"type": "inlineText", "text": kept},
             "target": {"root": "WORKSPACE", "path": "kept.txt"}},
            {"id": "rc", "apply": "writeFile", "source": {"type": "inlineText", "text": "home input"},
             "target": {"root": "USER_HOME", "path": ".config/rc"}}])
    };
    let opened = open_with(&backend, "r1", init(items("from the manifest", "untouched")), 2).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    let (ws, home) = (s.root.join("run-r1"), s.root.join("home-r1"));
    agent_edits(&backend, "r1").await;
    backend
        .wait_for("missing after the keepalive", 30 * SECS, |_| {
            statuses(&backend, "r1").last().map(String::as_str) == Some("missing")
        })
        .await;
    let kept_mtime = std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap();

    // A link reset, then the backend's recovery open, with init.
    backend.drop_conn();
    backend.registered(1, 20 * SECS).await;
    let opened = open_with(&backend, "r1", init(items("from the manifest", "untouched")), 600).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    let edited = |what: &str| {
        assert_eq!(
            std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(),
            "the agent's edit",
            "{who:?}: the recovery init overwrote the agent's work ({what})"
        );
        assert_eq!(std::fs::read_to_string(home.join(".config/rc")).unwrap(), "agent rc", "{who:?}: {what}");
    };
    edited("after a link reset");
    assert_eq!(std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap(), kept_mtime, "rewritten");
    let reported = left_alone_reports(&backend, "r1");
    assert_eq!(reported.len(), 2, "{who:?}: {reported:?}\n{}", daemon.stderr());
    assert!(
        reported.iter().any(|t| t.contains("item notes")
            && t.contains("/workspace/notes/readme.txt")
            && t.contains("changed since it was applied")),
        "{reported:?}"
    );
    assert!(reported.iter().any(|t| t.contains("item rc")), "{reported:?}");

    // The same after a daemon restart, with the role's content changed.
    assert!(daemon.stop().success());
    let mut daemon = start_as(who, &s, "second", &cfg);
    backend.registered(2, 20 * SECS).await;
    let opened = open_with(&backend, "r1", init(items("version 2", "kept v2")), 600).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    edited("after a restart, with new content");
    assert_eq!(
        std::fs::read_to_string(ws.join("kept.txt")).unwrap(),
        "kept v2",
        "{who:?}: untouched, so updated"
    );
    let aside = s.state.join("incoming/r1/workspace/notes/readme.txt");
    assert_eq!(
        std::fs::read_to_string(&aside).unwrap(),
        "version 2",
        "{who:?}: the new content is not kept aside"
    );
    let reported = left_alone_reports(&backend, "r1");
    let last = reported.iter().rev().find(|t| t.contains("item notes")).unwrap();
    assert!(last.contains(&aside.display().to_string()), "{who:?}: {last}");
    // Forgetting the run removes what was kept aside.
    let removed =
        backend.control(json!({"action":"remove","run_id":"r1","instance_name":"tuixiu-run-r1"})).await;
    assert_eq!(removed["ok"], true, "{removed}");
    backend.wait_for("incoming removed", 10 * SECS, |_| !aside.exists()).await;
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backends_recovery_init_never_overwrites_the_agents_work() {
    for who in [As::Root, As::Nobody] {
        recovery(who).await;
    }
}

/// The backend goes away in the middle of a prompt (its connection drops
/// and it refuses new ones, as a restarting backend does) while the agent
/// keeps producing updates: after the daemon registers again, everything
/// arrives, once, in order, the prompt's result last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_restart_mid_prompt_loses_nothing() {
    let backend = Backend::start().await;
    let s = Scratch::new("backend-restart");
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "b1", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{opened}");
    backend.send(&json!({"type":"prompt_send","run_id":"b1","prompt_id":"p1","session_id":null,
        "prompt":[{"type":"text","text":"say before\nsleep 1\nupdates 300\nsleep 1\nsay after"}],"timeout_ms":60000}));
    backend.wait_for("the prompt runs", 30 * SECS, |_| chunks(&backend, "p1") == ["before"]).await;
    backend.refuse(true);
    backend.drop_conn();
    // Down for longer than the rest of the turn: the result is produced
    // while the backend is away.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(backend.connections(), 1, "connected while refusing");
    backend.refuse(false);
    let r = backend.wait_type("prompt_result", "prompt_id", &json!("p1"), 30 * SECS).await;
    assert_eq!(r["ok"], true, "{r}");
    let mut want = vec!["before".to_string()];
    want.extend((0..300).map(|i| format!("u{i}")));
    want.push("after".into());
    assert_eq!(chunks(&backend, "p1"), want, "lost, repeated or reordered updates");
    // The result comes after the last update, on the new connection.
    let msgs = backend.received();
    let last_update =
        msgs.iter().rposition(|m| m.msg["type"] == "acp_update" && m.msg["prompt_id"] == "p1").unwrap();
    let result =
        msgs.iter().position(|m| m.msg["type"] == "prompt_result" && m.msg["prompt_id"] == "p1").unwrap();
    assert!(result > last_update && msgs[result].conn == 1, "the result overtook updates or came early");
    assert!(daemon.stop().success());
}

/// A small tmpfs mounted at `dir` for one test (unmounted when dropped).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str, owner: u32, read_only: bool) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let mut opts = format!("size={size},mode=0755,uid={owner},gid={owner}");
        if read_only {
            opts.push_str(",ro");
        }
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount a tmpfs at {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    fn free_bytes(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.0).unwrap();
        st.blocks_available() * st.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every path under `dir` whose name starts with `prefix` or ends with `suffix`.
fn litter(dir: &Path, prefix: &str, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) || name.ends_with(suffix) {
            out.push(e.path());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(litter(&e.path(), prefix, suffix));
        }
    }
    out
}

fn owner_of(who: As) -> u32 {
    if matches!(who, As::Root) { 0 } else { 65534 }
}

/// The workspace root is full while an archive is extracted: the open
/// fails naming the item and the error, nothing is left half-written (no
/// target, no staging directory, the space given back), and once there is
/// room again the daemon lands inputs as before.
async fn disk_full_while_extracting(who: As) {
    let backend = Backend::start().await;
    let s = Scratch::new("full-extract");
    let disk = Tmpfs::mount(&s.root, "4m", owner_of(who), false);
    let http = inputs_support::HttpServer::start();
    let big = vec![b'x'; 8 << 20];
    http.route(
        "/big.zip",
        inputs_support::Reply::Body(inputs_support::zip(&[
            inputs_support::ZipEntry::file("README.md", b"readme"),
            inputs_support::ZipEntry::file("data/big.bin", &big),
        ])),
    );
    http.route(
        "/small.zip",
        inputs_support::Reply::Body(inputs_support::zip(&[inputs_support::ZipEntry::file("ok.txt", b"ok")])),
    );
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, "");
    let mut daemon = start_as(who, &s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let free_before = disk.free_bytes();
    let item = |uri: String| {
        json!([{"id": "skill:big", "apply": "downloadExtract",
        "source": {"type": "httpZip", "uri": uri}, "target": {"root": "WORKSPACE", "path": "skills/big"}}])
    };
    let opened = open_with(&backend, "x1", init(item(http.url("/big.zip"))), 600).await;
    assert_eq!(opened["ok"], false, "{who:?}: {opened}");
    let err = opened["error"].as_str().unwrap();
    assert!(
        err.contains("skill:big") && err.contains("No space left on device"),
        "{who:?}: unclear error: {err}"
    );
    assert!(!s.root.join("run-x1/skills/big").exists(), "{who:?}: a half-extracted target");
    let left = litter(&s.root, ".tuixiu", ".tmp");
    assert!(left.is_empty(), "{who:?}: staging litter: {left:?}");
    assert!(disk.free_bytes() + (256 << 10) >= free_before, "{who:?}: the partial files still take space");
    // Room again: the same daemon lands inputs.
    let opened = open_with(&backend, "x2", init(item(http.url("/small.zip"))), 600).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    assert_eq!(std::fs::read_to_string(s.root.join("run-x2/skills/big/ok.txt")).unwrap(), "ok");
    assert!(daemon.stop().success());
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_while_extracting_fails_cleanly() {
    for who in [As::Root, As::Nobody] {
        disk_full_while_extracting(who).await;
    }
}

/// Runs whose state cannot be written (`damage` makes the state directory
/// full, read-only or unwritable, `repair` undoes it): the controls that
/// would write fail naming the file and the error, a run-state write that
/// fails is reported to the backend, the files already there stay whole
/// and parseable with no temporary file left beside them, and the daemon
/// serves on; once repaired, it works as before.
async fn state_write_fails(who: As, label: &str, damage: &dyn Fn(&Path), repair: &dyn Fn(&Path), why: &str) {
    let backend = Backend::start().await;
    let s = Scratch::new(label);
    std::fs::create_dir_all(&s.state).unwrap();
    std::os::unix::fs::chown(&s.state, Some(owner_of(who)), Some(owner_of(who))).unwrap();
    let disk = Tmpfs::mount(&s.state, "2m", owner_of(who), false);
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = start_as(who, &s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let r = backend.control(json!({"action":"ensure_running","run_id":"f1"})).await;
    assert_eq!(r["ok"], true, "{label}: {r}");
    let state_file = s.state.join("runs/f1.json");
    let deadline = std::time::Instant::now() + 10 * SECS;
    while !state_file.exists() {
        assert!(std::time::Instant::now() < deadline, "{label}: the run state was not written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = std::fs::read(&state_file).unwrap();
    damage(&s.state);
    // A new run: its instance record cannot be written.
    let r = backend.control(json!({"action":"ensure_running","run_id":"f2"})).await;
    assert_eq!(r["ok"], false, "{label}: {r}");
    let err = r["error"].as_str().unwrap();
    assert!(
        err.contains(why) && err.contains(&s.state.display().to_string()),
        "{label}: unclear error: {err}"
    );
    // A run-state write (acp_close starts the keepalive clock): reported.
    backend.send(&json!({"type":"acp_close","run_id":"f1"}));
    let closed = backend.wait_type("acp_closed", "run_id", &json!("f1"), 10 * SECS).await;
    assert_eq!(closed["ok"], true);
    let reported = backend
        .wait_for("the failed run-state write", 10 * SECS, |m| {
            m.msg["type"] == "proxy_update"
                && m.msg["content"]["text"].as_str().is_some_and(|t| t.contains("persisting run state"))
        })
        .await;
    let text = reported.msg["content"]["text"].as_str().unwrap();
    assert!(text.contains(why) && text.contains("runs/f1.json"), "{label}: {text}");
    assert_eq!(std::fs::read(&state_file).unwrap(), before, "{label}: the run state changed");
    serde_json::from_slice::<Value>(&before).unwrap();
    let left = litter(&s.state, "\u{0}", ".tmp");
    assert!(left.is_empty(), "{label}: half-written files left: {left:?}");
    assert!(daemon.running(), "{label}: the daemon died");
    repair(&s.state);
    let r = backend.control(json!({"action":"ensure_running","run_id":"f2"})).await;
    assert_eq!(r["ok"], true, "{label}: after the repair: {r}");
    assert!(daemon.stop().success());
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_while_writing_state() {
    let fill = |state: &Path| {
        use std::io::Write;
        let mut f = std::fs::File::create(state.join("filler")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
    };
    let unfill = |state: &Path| std::fs::remove_file(state.join("filler")).unwrap();
    for who in [As::Root, As::Nobody] {
        state_write_fails(who, "full-state", &fill, &unfill, "No space left on device").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_directory_unwritable() {
    // Root: the state's directories turn read-only (read-only binds over
    // them; the filesystem itself cannot be remounted while the daemon
    // holds its lock file open for writing).
    let ro = |state: &Path| {
        for d in ["runs", "native"] {
            let dir = state.join(d);
            let bind =
                std::process::Command::new("mount").arg("--bind").arg(&dir).arg(&dir).status().unwrap();
            let ro = std::process::Command::new("mount")
                .args(["-o", "remount,bind,ro"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(bind.success() && ro.success(), "read-only bind over {}", dir.display());
        }
    };
    let rw = |state: &Path| {
        for d in ["runs", "native"] {
            let st = std::process::Command::new("umount").arg(state.join(d)).status().unwrap();
            assert!(st.success());
        }
    };
    state_write_fails(As::Root, "ro-state", &ro, &rw, "Read-only file system").await;
    // An unprivileged daemon: its directories lose their write permission.
    let lock = |state: &Path| {
        for d in ["runs", "native"] {
            std::fs::set_permissions(state.join(d), std::os::unix::fs::PermissionsExt::from_mode(0o500))
                .unwrap();
        }
    };
    let unlock = |state: &Path| {
        for d in ["runs", "native"] {
            std::fs::set_permissions(state.join(d), std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .unwrap();
        }
    };
    state_write_fails(As::Nobody, "locked-state", &lock, &unlock, "Permission denied").await;

    // At startup: a state directory that cannot be written is a clear error.
    for who in [As::Root, As::Nobody] {
        let backend = Backend::start().await;
        let s = Scratch::new("unwritable-start");
        let _ro = match who {
            As::Root => Some(Tmpfs::mount(&s.state, "1m", 0, true)),
            _ => {
                // Owned by root, 0755: not the daemon's.
                std::fs::create_dir_all(&s.state).unwrap();
                None
            }
        };
        let mut daemon = start_as(who, &s, "proxy", &s.config(&backend.url, "", ""));
        let status = daemon.wait_exit(20 * SECS);
        assert_eq!(status.code(), Some(125), "{who:?}: {}", daemon.stderr());
        let log = daemon.stderr();
        assert!(
            log.contains(&s.state.display().to_string())
                && ["Read-only file system", "Permission denied", "Operation not permitted"]
                    .iter()
                    .any(|e| log.contains(e)),
            "{who:?}: unclear startup error:\n{log}"
        );
        assert_eq!(backend.connections(), 0);
    }
}
