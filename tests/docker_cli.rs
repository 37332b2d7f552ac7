//! `tuixiu-sandbox run --provider docker` and the instance commands, run as
//! the real binary against a real Docker Engine.

mod common;
mod docker_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use docker_support::{Scratch, docker, image, inspect_format, unique_name};

/// `tuixiu-sandbox ARGS` with a clean environment and the scratch state dir.
fn cli(scratch: &Scratch, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::binary());
    cmd.args(args);
    cmd.env_clear();
    cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    cmd.env("TUIXIU_STATE_DIR", &scratch.state);
    cmd.env(common::LEAK_MARKER.0, common::LEAK_MARKER.1);
    cmd.stdin(Stdio::null());
    cmd
}

/// `run --provider docker --image IMG --workspace WS EXTRA... -- COMMAND...`
fn run_args(scratch: &Scratch, extra: &[&str], command: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--provider", "docker", "--image", &image(), "--workspace"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(scratch.workspace.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(command.iter().map(|s| s.to_string()));
    args
}

fn run(scratch: &Scratch, extra: &[&str], command: &[&str]) -> Output {
    let args = run_args(scratch, extra, command);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cli(scratch, &args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn one_off_passes_stdio_and_exit_codes_through() {
    let scratch = Scratch::new("cli-oneoff");
    let out = run(&scratch, &[], &["sh", "-c", "id -un; pwd; echo to-stderr >&2; env | sort; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("agent\n/workspace\n"), "{stdout}");
    assert!(!stdout.contains(common::LEAK_MARKER.1), "the caller's environment leaked: {stdout}");
    assert!(stdout.contains("HOME=/home/agent\n") && stdout.contains("USER=agent\n"), "{stdout}");
    assert_eq!(text(&out.stderr), "to-stderr\n");

    assert_eq!(run(&scratch, &[], &["no-such-command"]).status.code(), Some(127));
    assert_eq!(run(&scratch, &[], &["/etc/passwd"]).status.code(), Some(126));
    assert_eq!(run(&scratch, &[], &["sh", "-c", "kill -9 $$"]).status.code(), Some(137));

    // Docker's own failure (an image that is not there; no registry) is 125.
    let args = ["run", "--provider", "docker", "--image", "tuixiu-test/absent:latest", "--", "true"];
    let out = cli(&scratch, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));

    // No host files are left behind (the container itself: see
    // one_off_container_is_removed_and_labelled).
    let docker_state = scratch.state.join("docker");
    let left: Vec<_> =
        std::fs::read_dir(&docker_state).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "one-off host files left behind: {left:?}");
}

// Inside the container a set-uid file is powerless (no-new-privileges),
// but the workspace is a host directory, where it would not be: the
// runtime's profile keeps the bits off (busybox's chmod and mkdir make the
// calls), and a named instance gets the same profile.
#[test]
fn set_id_bits_stay_off_the_host_workspace() {
    let scratch = Scratch::new("cli-setid");
    let script = "cd /workspace; touch f; chmod 4755 f; echo chmod=$?; chmod g+s f; echo sgid=$?; \
                  mkdir -m 2775 d; echo mkdir=$?; chmod 755 f; echo plain=$?";
    let out = run(&scratch, &[], &["sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "chmod=1\nsgid=1\nmkdir=1\nplain=0\n", "{}", text(&out.stderr));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(scratch.workspace.join("f")).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755);
    // busybox's mkdir makes the directory, then fails to chmod it.
    let mode = std::fs::metadata(scratch.workspace.join("d")).map(|m| m.permissions().mode()).unwrap_or(0);
    assert_eq!(mode & 0o6000, 0);
}

#[test]
fn one_off_container_is_removed_and_labelled() {
    let scratch = Scratch::new("cli-label");
    let run_id = format!("oneoff-{}", std::process::id());
    let mut child = cli(
        &scratch,
        &run_args(&scratch, &["--run-id", &run_id], &["sleep", "30"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .spawn()
    .unwrap();
    let filter = format!("label=acp-proxy.run_id={run_id}");
    let name = wait_for(|| {
        let out = docker(&["ps", "--filter", &filter, "--format", "{{.Names}}"]);
        Some(text(&out.stdout).trim().to_string()).filter(|n| !n.is_empty())
    });
    assert!(name.starts_with("tuixiu-run-"), "{name}");
    assert_eq!(inspect_format(&name, "{{index .Config.Labels \"acp-proxy.managed\"}}"), "1");
    assert_eq!(inspect_format(&name, "{{index .Config.Labels \"acp-proxy.agent_mode\"}}"), "exec");
    signal(&child, libc::SIGTERM);
    let status = wait_timeout(&mut child, Duration::from_secs(15));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "sleep killed by the relayed SIGTERM");
    wait_for(|| (!docker(&["inspect", &name]).status.success()).then_some(()));
}

#[test]
fn one_off_relays_signals_and_stdin() {
    let scratch = Scratch::new("cli-signal");
    let script = "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 1; done";
    let args = run_args(&scratch, &[], &["sh", "-c", script]);
    let mut child = cli(&scratch, &args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    signal(&child, libc::SIGTERM);
    assert_eq!(lines.next().unwrap().unwrap(), "got-term");
    assert_eq!(wait_timeout(&mut child, Duration::from_secs(15)).code(), Some(9));

    let args = run_args(&scratch, &[], &["sh", "-c", "cat; echo done"]);
    let mut child = cli(&scratch, &args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"line one\nline two\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "line one\nline two\ndone\n");
}

#[test]
fn secrets_are_not_on_any_command_line() {
    let scratch = Scratch::new("cli-secret");
    let secret = "ghp_cli0secret0value0123";
    let run_id = format!("secret-{}", std::process::id());
    let args = run_args(
        &scratch,
        &["--pass-env", "GH_TOKEN", "--run-id", &run_id],
        &["sh", "-c", "echo ready; sleep 30"],
    );
    let mut child = cli(&scratch, &args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("GH_TOKEN", secret)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // The docker CLI we started: its command line names only /dev/fd/N.
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap();
    let docker_pid = children.split_whitespace().next().expect("the docker CLI runs as our child");
    let cmdline = text(&std::fs::read(format!("/proc/{docker_pid}/cmdline")).unwrap());
    assert!(cmdline.contains("--env-file=/dev/fd/"), "{cmdline}");
    assert!(!cmdline.contains(secret), "{cmdline}");
    let filter = format!("label=acp-proxy.run_id={run_id}");
    let name = wait_for(|| {
        let out = docker(&["ps", "--filter", &filter, "--format", "{{.Names}}"]);
        Some(text(&out.stdout).trim().to_string()).filter(|n| !n.is_empty())
    });
    for format in ["{{json .Config.Cmd}}", "{{json .Args}}", "{{json .Path}}", "{{json .Config.Entrypoint}}"]
    {
        assert!(!inspect_format(&name, format).contains(secret), "{format}");
    }
    let logs = docker(&["logs", &name]);
    assert!(!text(&logs.stdout).contains(secret) && !text(&logs.stderr).contains(secret));
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let _ = docker(&["rm", "-f", &name]);
}

#[test]
fn named_instance_through_the_cli() {
    let scratch = Scratch::new("cli-named");
    let name = scratch.track(&unique_name("cli"));
    let named = ["--instance-name", name.as_str()];
    let out = run(&scratch, &named, &["sh", "-c", "echo kept > ~/note; hostname"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "sandbox\n");
    let id = inspect_format(&name, "{{.Id}}");

    let out = run(
        &scratch,
        &[&named[..], &["--chdir", "/home/agent"]].concat(),
        &["sh", "-c", "pwd; cat note; exit 4"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "/home/agent\nkept\n");
    assert_eq!(inspect_format(&name, "{{.Id}}"), id, "the instance is reused");
    assert_eq!(run(&scratch, &named, &["no-such-command"]).status.code(), Some(127));

    let out = cli(&scratch, &["instances", "--provider", "docker", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine = list.as_array().unwrap().iter().find(|i| i["name"] == name.as_str()).expect("listed");
    assert_eq!(mine["status"], "running");
    assert_eq!(mine["provider"], "container_oci");

    let out = cli(&scratch, &["stop", &name]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("status:     stopped"), "{}", text(&out.stdout));
    let out = cli(&scratch, &["inspect", "--json", &name]).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["status"], "stopped");

    // `run` starts a stopped instance again.
    let out = run(&scratch, &named, &["cat", "/home/agent/note"]);
    assert_eq!(text(&out.stdout), "kept\n", "{}", text(&out.stderr));
    assert_eq!(inspect_format(&name, "{{.Id}}"), id);

    let out = cli(&scratch, &["rm", &name]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = cli(&scratch, &["inspect", "--provider", "docker", "--json", &name]).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["status"], "missing");
}

#[test]
fn named_instance_relays_signals_inside_the_container() {
    let scratch = Scratch::new("cli-named-signal");
    let name = scratch.track(&unique_name("sig"));
    let script = "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 1; done";
    let args = run_args(&scratch, &["--instance-name", &name], &["sh", "-c", script]);
    let mut child = cli(&scratch, &args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    signal(&child, libc::SIGTERM);
    assert_eq!(lines.next().unwrap().unwrap(), "got-term");
    assert_eq!(wait_timeout(&mut child, Duration::from_secs(15)).code(), Some(9));
    // The instance itself keeps running.
    assert_eq!(inspect_format(&name, "{{.State.Status}}"), "running");
}

#[test]
fn native_only_options_are_refused() {
    let scratch = Scratch::new("cli-refuse");
    for flag in [&["--keep-session"][..], &["--map-uid", "0"], &["--json-status-fd", "2"]] {
        let out = run(&scratch, flag, &["true"]);
        assert_eq!(out.status.code(), Some(125), "{flag:?}");
        assert!(text(&out.stderr).contains("not supported by the docker provider"), "{}", text(&out.stderr));
    }
    let out = run(&scratch, &["--network", "off"], &["ls", "/sys/class/net"]);
    assert_eq!(text(&out.stdout), "lo\n", "{}", text(&out.stderr));
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn wait_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the CLI did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for<T>(mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting");
        std::thread::sleep(Duration::from_millis(50));
    }
}
