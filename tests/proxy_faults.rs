//! The daemon under faults (docs/reliability.md, "Fault matrix"): the real
//! daemon binary, the real native sandbox and the scripted agent
//! (tests/fixtures/scripted_agent.py), driven by the fake backend of
//! tests/proxy_support: restarts and kills of the daemon, expiry, full
//! disks, unwritable state, agents that ignore end-of-file.

mod proxy_support;

use std::path::Path;
use std::time::Duration;

use proxy_support::agent::{acp_config, agent_dir, chunks, prompt};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

/// How the scripted agent behaves when its stdin ends.
#[derive(Clone, Copy, Debug)]
enum OnEof {
    Exit,
    /// Keeps running (claude-code-acp does), and ignores SIGTERM too.
    Ignore,
}

/// A config running the scripted agent with `on_eof`, tagged with a
/// marker unique to this scratch directory (to find its processes).
fn agent_config(s: &Scratch, url: &str, on_eof: OnEof, extra: &str) -> String {
    let dir = agent_dir(s);
    let mut argv =
        vec!["python3".to_string(), "/agent/scripted_agent.py".into(), format!("--marker={}", marker(s))];
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

async fn open_with(b: &Backend, run: &str, init: Value, ttl: u64) -> Value {
    b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init,
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":ttl}));
    b.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await
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

/// Daemon SIGKILL with an idle agent that ignores end-of-file and SIGTERM
/// (as claude-code-acp does): the agent's sandbox dies with the daemon
/// (the launcher's lifeline, whichever daemon thread started it), and the
/// restarted daemon's first prompt works. With `stop_launcher`, the old
/// launcher is frozen first, so the agent survives the daemon: the restart
/// must end it and wait until it has really exited before the new agent
/// starts (before, the first prompt failed with "already has a running agent").
async fn sigkill_with_an_agent_that_ignores_eof(who: As, stop_launcher: bool) {
    let backend = Backend::start().await;
    let s = Scratch::new("sigkill-eof");
    let cfg = agent_config(&s, &backend.url, OnEof::Ignore, "");
    let mut daemon = start_as(who, &s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "k1", init(json!([])), 600).await;
    assert_eq!(opened["ok"], true, "{who:?}: {opened}\n{}", daemon.stderr());
    let r = prompt(&backend, "k1", "p1", Value::Null, "say one").await;
    assert_eq!(r["ok"], true, "{who:?}: {r}");
    let session = r["session_id"].as_str().unwrap().to_string();
    let old_agent = agent_pids(&s);
    assert!(!old_agent.is_empty(), "{who:?}: the agent is not running");
    let _frozen = stop_launcher.then(|| {
        let launcher = agent_launcher(&s, "k1");
        // SAFETY: plain kill(2) on the launcher this test's daemon started.
        unsafe { libc::kill(launcher, libc::SIGSTOP) };
        KillOnDrop(launcher)
    });
    sigkill(&mut daemon);
    if stop_launcher {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!agent_pids(&s).is_empty(), "{who:?}: the frozen launcher's agent should have survived");
    } else {
        agents_gone(&s, 10 * SECS).await;
    }
    let mut daemon = start_as(who, &s, "second", &cfg);
    backend.registered(1, 20 * SECS).await;
    let r = prompt(&backend, "k1", "p2", json!(session), "say two").await;
    assert_eq!(r["ok"], true, "{who:?} (stop_launcher {stop_launcher}): {r}\n{}", daemon.stderr());
    assert_eq!(r["session_id"], session.as_str());
    assert_eq!(chunks(&backend, "p2"), ["two"]);
    let now: Vec<u32> = agent_pids(&s);
    assert!(
        old_agent.iter().all(|p| !now.contains(p)),
        "{who:?}: the old agent still runs: {old_agent:?} {now:?}"
    );
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_agents_die_with_the_daemon() {
    for who in [As::Root, As::Nobody, As::Nested] {
        sigkill_with_an_agent_that_ignores_eof(who, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_waits_for_a_leftover_agent() {
    for who in [As::Root, As::Nobody] {
        sigkill_with_an_agent_that_ignores_eof(who, true).await;
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

/// After a daemon restart (and after an agent crash), the persisted `init`
/// is used again to start the agent: an input the agent changed since it
/// landed is left as it is and reported, never overwritten; untouched
/// inputs stay as they are. When the backend sends `init` again, it asked
/// for the inputs: they land again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_never_overwrites_the_agents_work() {
    let backend = Backend::start().await;
    let s = Scratch::new("reland");
    let cfg = agent_config(&s, &backend.url, OnEof::Exit, "");
    let mut daemon = Daemon::start(&s, "first", &cfg);
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
    let r = prompt(
        &backend,
        "l1",
        "p1",
        Value::Null,
        "file /workspace/notes/readme.txt the agent's edit\nfile /home/agent/.config/rc agent rc",
    )
    .await;
    assert_eq!(r["ok"], true, "{r}");
    let session = r["session_id"].as_str().unwrap().to_string();
    assert_eq!(std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(), "the agent's edit");

    // A daemon restart: the next prompt starts the agent with the persisted init.
    assert!(daemon.stop().success());
    let kept_mtime = std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap();
    let mut daemon = Daemon::start(&s, "second", &cfg);
    backend.registered(1, 20 * SECS).await;
    let r = prompt(&backend, "l1", "p2", json!(session), "say back").await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(),
        "the agent's edit",
        "the persisted init overwrote the agent's work"
    );
    assert_eq!(std::fs::read_to_string(home.join(".config/rc")).unwrap(), "agent rc");
    assert_eq!(std::fs::read_to_string(ws.join("kept.txt")).unwrap(), "untouched");
    assert_eq!(std::fs::metadata(ws.join("kept.txt")).unwrap().modified().unwrap(), kept_mtime, "rewritten");
    let reported: Vec<String> = proxy_support::agent::contents(&backend, "text")
        .iter()
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .filter(|t| t.contains("changed since it was applied"))
        .collect();
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(
        reported[0].contains("item notes") && reported[0].contains("/workspace/notes/readme.txt"),
        "{reported:?}"
    );
    assert!(reported[1].contains("item rc"), "{reported:?}");

    // The backend sends init again (the agent runs: nothing happens yet);
    // the agent crashes; the next start lands what the backend asked for.
    let opened = open_with(&backend, "l1", init(items), 600).await;
    assert_eq!(opened["ok"], true, "{opened}");
    let r = prompt(&backend, "l1", "p3", json!(session), "exit 3").await;
    assert_eq!(r["ok"], false);
    backend.wait_type("acp_exit", "run_id", &json!("l1"), 20 * SECS).await;
    let r = prompt(&backend, "l1", "p4", json!(session), "say again").await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(), "from the manifest");
    assert!(daemon.stop().success());
}
