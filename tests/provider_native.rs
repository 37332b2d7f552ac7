//! The native provider: instances as records in the state directory, each
//! process a fresh sandbox launched by `tuixiu-sandbox __exec`. Through the
//! library (as the daemon will use it) and through the CLI for every
//! caller.

mod common;

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Caller, Fixture, binary, stderr};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tuixiu_sandbox::provider::native::NativeProvider;
use tuixiu_sandbox::provider::{InstanceConfig, InstanceStatus, Mount, ProcessSpec, Provider, ProviderError};

fn provider(fixture: &Fixture) -> NativeProvider {
    NativeProvider::new(&fixture.dir.join("state"), binary(), "tuixiu-run-").unwrap()
}

fn config(fixture: &Fixture, name: &str) -> InstanceConfig {
    InstanceConfig::new(name, "r1", &fixture.workspace)
}

async fn output(p: &NativeProvider, name: &str, spec: ProcessSpec) -> (i32, String, String) {
    let mut proc = p.exec(name, &spec).await.unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let mut stdout = proc.stdout.take().unwrap();
    let mut stderr = proc.stderr.take().unwrap();
    let (a, b) = tokio::join!(stdout.read_to_string(&mut out), stderr.read_to_string(&mut err));
    a.unwrap();
    b.unwrap();
    (proc.wait().await.unwrap().code_or_signal(), out, err)
}

#[tokio::test]
async fn life_cycle_and_persistence() {
    let fixture = Fixture::new(Caller::Root);
    let p = provider(&fixture);
    let name = "tuixiu-run-life";
    assert_eq!(p.inspect(name).await.unwrap().status, InstanceStatus::Missing);

    let created = p.ensure(&config(&fixture, name)).await.unwrap();
    assert_eq!(created.status, InstanceStatus::Running);
    assert_eq!(created.provider, "bwrap");
    assert_eq!(created.run_id.as_deref(), Some("r1"));
    let again = p.ensure(&config(&fixture, name)).await.unwrap();
    assert_eq!(again.created_at, created.created_at, "reused, not recreated");

    // The home persists between processes; the workspace is the host's.
    let (code, _, err) =
        output(&p, name, ProcessSpec::new(["sh", "-c", "echo h > ~/h && echo w > /workspace/w"])).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) =
        output(&p, name, ProcessSpec::new(["sh", "-c", "cat ~/h /workspace/w; id -un"])).await;
    assert_eq!((code, out.as_str()), (0, "h\nw\nagent\n"), "{err}");
    assert_eq!(std::fs::read_to_string(fixture.workspace.join("w")).unwrap(), "w\n");

    let names: Vec<String> = p.list().await.unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, [name]);

    assert_eq!(p.stop(name).await.unwrap().status, InstanceStatus::Stopped);
    let err = p.exec(name, &ProcessSpec::new(["true"])).await.err().unwrap();
    assert!(matches!(err, ProviderError::NotRunning { .. }), "{err}");
    assert_eq!(p.ensure(&config(&fixture, name)).await.unwrap().status, InstanceStatus::Running);
    let (_, out, _) = output(&p, name, ProcessSpec::new(["cat", "/home/agent/h"])).await;
    assert_eq!(out, "h\n", "the home survives stop and start");

    let home = fixture.dir.join("state/native").join(name).join("home");
    assert!(home.is_dir());
    assert_eq!(p.remove(name).await.unwrap().status, InstanceStatus::Missing);
    assert!(!home.exists(), "the instance's own home goes with it");
    assert!(fixture.workspace.join("w").exists(), "the workspace is never removed");
    assert_eq!(p.remove(name).await.unwrap().status, InstanceStatus::Missing);
}

#[tokio::test]
async fn exec_cwd_env_streaming_kill_and_exit_codes() {
    let fixture = Fixture::new(Caller::Root);
    let p = provider(&fixture);
    let name = "tuixiu-run-exec";
    p.ensure(&config(&fixture, name)).await.unwrap();
    std::fs::create_dir(fixture.workspace.join("sub")).unwrap();

    let mut spec = ProcessSpec::new(["sh", "-c", "pwd; echo \"$GREETING\"; echo e >&2; exit 5"]);
    spec.cwd = Some("/workspace/sub".into());
    spec.env = vec![("GREETING".into(), "hi there".into())];
    let (code, out, err) = output(&p, name, spec).await;
    assert_eq!((code, out.as_str(), err.as_str()), (5, "/workspace/sub\nhi there\n", "e\n"));

    let (code, _, err) = output(&p, name, ProcessSpec::new(["no-such-command"])).await;
    assert_eq!(code, 127, "{err}");
    let (code, _, _) = output(&p, name, ProcessSpec::new(["/etc/passwd"])).await;
    assert_eq!(code, 126);

    let mut proc =
        p.exec(name, &ProcessSpec::new(["sh", "-c", "echo first; sleep 30; echo never"])).await.unwrap();
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(first.as_deref(), Some("first"));
    let started = Instant::now();
    proc.killer().kill(libc::SIGTERM).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), proc.wait()).await.unwrap().unwrap();
    assert_eq!(status.code_or_signal(), 128 + libc::SIGTERM);
    assert!(started.elapsed() < Duration::from_secs(5));
    // Killing an ended process is fine.
    proc.killer().kill(libc::SIGKILL).await.unwrap();
}

#[tokio::test]
async fn one_agent_and_stop_ends_every_process() {
    let fixture = Fixture::new(Caller::Root);
    let p = provider(&fixture);
    let name = "tuixiu-run-agent";
    p.ensure(&config(&fixture, name)).await.unwrap();
    let mut agent = p.spawn_agent(name, &ProcessSpec::new(["sleep", "60"])).await.unwrap();
    let err = p.spawn_agent(name, &ProcessSpec::new(["true"])).await.err().unwrap();
    assert!(matches!(err, ProviderError::Conflict(_)), "{err}");
    let mut terminal = p.exec(name, &ProcessSpec::new(["sleep", "60"])).await.unwrap();

    let started = Instant::now();
    assert_eq!(p.stop(name).await.unwrap().status, InstanceStatus::Stopped);
    let a = tokio::time::timeout(Duration::from_secs(10), agent.wait()).await.unwrap().unwrap();
    let t = tokio::time::timeout(Duration::from_secs(10), terminal.wait()).await.unwrap().unwrap();
    assert_eq!(a.code_or_signal(), 128 + libc::SIGTERM);
    assert_eq!(t.code_or_signal(), 128 + libc::SIGTERM);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_read_only_workspace() {
    let fixture = Fixture::new(Caller::Root);
    let p = provider(&fixture);
    let mut cfg = config(&fixture, "tuixiu-run-ro");
    cfg.workspace_read_only = true;
    p.ensure(&cfg).await.unwrap();
    let (code, out, err) = output(&p, "tuixiu-run-ro", ProcessSpec::new(["sh", "-c", "pwd; touch x"])).await;
    assert_ne!(code, 0);
    assert_eq!(out, "/workspace\n");
    assert!(err.contains("Read-only file system"), "{err}");
}

#[tokio::test]
async fn invalid_configs_leave_nothing_behind() {
    let fixture = Fixture::new(Caller::Root);
    let p = provider(&fixture);
    let mut bad = config(&fixture, "tuixiu-run-bad");
    bad.mounts.push(Mount::Bind {
        src: "/nonexistent/source".into(),
        dst: "/data".into(),
        access: sandbox::Access::Ro,
    });
    assert!(p.ensure(&bad).await.is_err());
    assert!(!fixture.dir.join("state/native/tuixiu-run-bad").exists());
    for name in ["--x", "other", "tuixiu-run-a/b"] {
        assert!(
            matches!(p.ensure(&config(&fixture, name)).await, Err(ProviderError::InvalidName(_))),
            "{name}"
        );
    }
    let mut image = config(&fixture, "tuixiu-run-img");
    image.image = Some("busybox".into());
    assert!(p.ensure(&image).await.unwrap_err().to_string().contains("--image is for --provider docker"));
    let mut other_ws = config(&fixture, "tuixiu-run-ws");
    p.ensure(&other_ws).await.unwrap();
    other_ws.workspace = fixture.home.clone();
    assert!(p.ensure(&other_ws).await.unwrap_err().to_string().contains("exists with workspace"));
}

/// The state directory of a CLI test, owned by the caller.
fn state_dir(fixture: &Fixture) -> String {
    let state = fixture.dir.join("state");
    std::fs::create_dir(&state).unwrap();
    chown(&state, Some(fixture.caller.host_uid()), Some(fixture.caller.host_uid())).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    state.display().to_string()
}

fn named_instance_through_the_cli(caller: Caller) {
    let fixture = Fixture::new(caller);
    let state = state_dir(&fixture);
    let extra = ["--state-dir", state.as_str(), "--instance-name", "tuixiu-run-cli"];
    assert_eq!(fixture.sh(&extra, "echo kept > ~/note; id -un"), "agent\n");
    assert_eq!(fixture.sh(&extra, "cat ~/note"), "kept\n");
    let out = fixture.run(&extra, &["sh", "-c", "exit 6"]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));

    let out = fixture
        .command(&["instances", "--provider", "native", "--state-dir", &state, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["name"], "tuixiu-run-cli");
    assert_eq!(list[0]["status"], "running");
    assert_eq!(list[0]["run_id"], "cli");

    let out = fixture.command(&["rm", "--state-dir", &state, "tuixiu-run-cli"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!Path::new(&state).join("native/tuixiu-run-cli").exists());
    // A new instance of that name starts with an empty home.
    assert_eq!(fixture.sh(&extra, "ls -A ~ | wc -l"), "0\n");
}

for_each_caller!(named_instance, named_instance_through_the_cli);
