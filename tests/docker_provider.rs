//! The docker provider through its library API, against a real Docker
//! Engine: the instance life cycle, labels, inventory, processes (cwd, env,
//! streaming, kill, exit codes) and where secrets must not appear.

mod docker_support;

use std::time::{Duration, Instant};

use docker_support::{Scratch, docker, image, inspect_format, unique_name};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tuixiu_sandbox::provider::docker::DockerProvider;
use tuixiu_sandbox::provider::{
    InstanceConfig, InstanceStatus, ProcessSpec, Provider, ProviderError, ProviderKind,
};

fn provider(scratch: &Scratch) -> DockerProvider {
    DockerProvider::new("docker", &scratch.state, "tuixiu-run-").unwrap()
}

fn config(scratch: &Scratch, name: &str) -> InstanceConfig {
    let mut c = InstanceConfig::new(name, name.strip_prefix("tuixiu-run-").unwrap(), &scratch.workspace);
    c.image = Some(image());
    c
}

/// Runs a process to its end, returning (exit code, stdout, stderr).
async fn run(p: &DockerProvider, name: &str, spec: ProcessSpec) -> (i32, String, String) {
    let mut proc = p.exec(name, &spec).await.unwrap();
    let mut out = String::new();
    let mut err = String::new();
    let mut stdout = proc.stdout.take().unwrap();
    let mut stderr = proc.stderr.take().unwrap();
    let (a, b) = tokio::join!(stdout.read_to_string(&mut out), stderr.read_to_string(&mut err));
    a.unwrap();
    b.unwrap();
    let status = proc.wait().await.unwrap();
    (status.code_or_signal(), out, err)
}

#[tokio::test]
async fn life_cycle_create_reuse_stop_start_remove() {
    let scratch = Scratch::new("lifecycle");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("life"));
    let cfg = config(&scratch, &name);

    assert_eq!(p.inspect(&name).await.unwrap().status, InstanceStatus::Missing);

    let first = p.ensure(&cfg).await.unwrap();
    assert_eq!(first.status, InstanceStatus::Running);
    assert_eq!(first.provider, "container_oci");
    assert_eq!(first.runtime.as_deref(), Some("docker"));
    let id = first.id.clone().expect("a container id");
    assert!(first.created_at.as_deref().is_some_and(|t| t.starts_with("20")), "{first:?}");

    let inspected = p.inspect(&name).await.unwrap();
    assert_eq!(inspected.status, InstanceStatus::Running);
    assert_eq!(inspected.run_id.as_deref(), cfg.run_id.as_str().into());

    // The labels of the Node proxy, so it and the backend recognise ours.
    let labels = inspect_format(&name, "{{json .Config.Labels}}");
    let labels: serde_json::Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(labels["acp-proxy.managed"], "1");
    assert_eq!(labels["acp-proxy.run_id"], cfg.run_id.as_str());
    assert_eq!(labels["acp-proxy.agent_mode"], "exec");
    assert_eq!(inspect_format(&name, "{{.Config.WorkingDir}}"), "/workspace");
    assert_eq!(inspect_format(&name, "{{.Config.User}}"), "1000:1000");

    let again = p.ensure(&cfg).await.unwrap();
    assert_eq!(again.id.as_deref(), Some(id.as_str()), "a second ensure must reuse the container");

    let stopped = p.stop(&name).await.unwrap();
    assert_eq!(stopped.status, InstanceStatus::Stopped);
    assert_eq!(p.inspect(&name).await.unwrap().status, InstanceStatus::Stopped);
    // Stopping twice is fine.
    assert_eq!(p.stop(&name).await.unwrap().status, InstanceStatus::Stopped);

    let restarted = p.ensure(&cfg).await.unwrap();
    assert_eq!(restarted.status, InstanceStatus::Running);
    assert_eq!(restarted.id.as_deref(), Some(id.as_str()), "ensure starts the same container again");

    let removed = p.remove(&name).await.unwrap();
    assert_eq!(removed.status, InstanceStatus::Missing);
    assert_eq!(p.inspect(&name).await.unwrap().status, InstanceStatus::Missing);
    assert!(!docker(&["inspect", &name]).status.success(), "the container must be gone");
    assert!(!scratch.state.join("docker").join(&name).exists(), "the instance's host files must be gone");
    // Removing a missing instance succeeds.
    assert_eq!(p.remove(&name).await.unwrap().status, InstanceStatus::Missing);
}

#[tokio::test]
async fn files_persist_in_the_workspace_and_home_between_processes() {
    let scratch = Scratch::new("persist");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("persist"));
    p.ensure(&config(&scratch, &name)).await.unwrap();
    let (code, _, err) =
        run(&p, &name, ProcessSpec::new(["sh", "-c", "echo ws > /workspace/w && echo home > ~/h"])).await;
    assert_eq!(code, 0, "{err}");
    p.stop(&name).await.unwrap();
    p.ensure(&config(&scratch, &name)).await.unwrap();
    let (code, out, err) =
        run(&p, &name, ProcessSpec::new(["sh", "-c", "cat /workspace/w ~/h; id -un; echo $HOME"])).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "ws\nhome\nagent\n/home/agent\n");
    assert_eq!(std::fs::read_to_string(scratch.workspace.join("w")).unwrap(), "ws\n");
}

#[tokio::test]
async fn inventory_lists_only_managed_instances() {
    let scratch = Scratch::new("inventory");
    let p = provider(&scratch);
    let ours = scratch.track(&unique_name("ours"));
    p.ensure(&config(&scratch, &ours)).await.unwrap();
    // Same prefix, no label: not ours.
    let foreign = scratch.track(&unique_name("foreign"));
    let out = docker(&["run", "-d", "--name", &foreign, &image(), "sleep", "60"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Managed but without the prefix: another deployment's.
    let other = scratch.track(&format!("other-{}", unique_name("x")));
    let out =
        docker(&["run", "-d", "--name", &other, "--label", "acp-proxy.managed=1", &image(), "sleep", "60"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let names: Vec<String> = p.list().await.unwrap().into_iter().map(|i| i.name).collect();
    assert!(names.contains(&ours), "{names:?}");
    assert!(!names.contains(&foreign), "{names:?}");
    assert!(!names.contains(&other), "{names:?}");

    // A container without our label is never stopped, removed or reused.
    for result in [p.stop(&foreign).await.err(), p.remove(&foreign).await.err()] {
        assert!(matches!(result, Some(ProviderError::NotManaged(_))), "{result:?}");
    }
    let err = p.ensure(&config(&scratch, &foreign)).await.unwrap_err();
    assert!(matches!(err, ProviderError::NotManaged(_)), "{err}");
    assert_eq!(inspect_format(&foreign, "{{.State.Status}}"), "running");
}

#[tokio::test]
async fn node_proxy_entrypoint_containers_are_recognised_but_not_reused() {
    let scratch = Scratch::new("entrypoint");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("node"));
    let out = docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--label",
        "acp-proxy.managed=1",
        "--label",
        "acp-proxy.agent_mode=entrypoint",
        "--label",
        &format!("acp-proxy.run_id={}", name.strip_prefix("tuixiu-run-").unwrap()),
        &image(),
        "sleep",
        "60",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(p.list().await.unwrap().iter().any(|i| i.name == name));
    assert_eq!(p.inspect(&name).await.unwrap().status, InstanceStatus::Running);
    let err = p.ensure(&config(&scratch, &name)).await.unwrap_err().to_string();
    assert!(err.contains("cannot be reused") && err.contains("tuixiu-sandbox rm"), "{err}");
    assert_eq!(p.remove(&name).await.unwrap().status, InstanceStatus::Missing);
}

#[tokio::test]
async fn reuse_of_another_run_or_workspace_is_refused() {
    let scratch = Scratch::new("conflict");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("conflict"));
    p.ensure(&config(&scratch, &name)).await.unwrap();
    let mut other_run = config(&scratch, &name);
    other_run.run_id = "someone-else".into();
    let err = p.ensure(&other_run).await.unwrap_err().to_string();
    assert!(err.contains("belongs to run"), "{err}");
    let mut other_ws = config(&scratch, &name);
    other_ws.workspace = scratch.home.clone();
    let err = p.ensure(&other_ws).await.unwrap_err().to_string();
    assert!(err.contains("exists with workspace"), "{err}");
}

#[tokio::test]
async fn exec_with_cwd_env_and_exit_codes() {
    let scratch = Scratch::new("exec");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("exec"));
    p.ensure(&config(&scratch, &name)).await.unwrap();
    std::fs::create_dir(scratch.workspace.join("sub")).unwrap();

    let mut spec = ProcessSpec::new(["sh", "-c", "pwd; echo \"$GREETING\"; echo to-stderr >&2; exit 3"]);
    spec.cwd = Some("/workspace/sub".into());
    spec.env = vec![("GREETING".into(), "hello world".into())];
    let (code, out, err) = run(&p, &name, spec).await;
    assert_eq!(code, 3);
    assert_eq!(out, "/workspace/sub\nhello world\n");
    assert_eq!(err, "to-stderr\n");

    assert_eq!(run(&p, &name, ProcessSpec::new(["no-such-command"])).await.0, 127);
    assert_eq!(run(&p, &name, ProcessSpec::new(["/etc/passwd"])).await.0, 126);
    assert_eq!(run(&p, &name, ProcessSpec::new(["sh", "-c", "kill -9 $$"])).await.0, 137);

    // The working directory must stay in the workspace or the home.
    let mut outside = ProcessSpec::new(["true"]);
    outside.cwd = Some("/etc".into());
    let err = p.exec(&name, &outside).await.err().unwrap().to_string();
    assert!(err.contains("must be under /workspace or the home"), "{err}");

    // No process in a stopped instance.
    p.stop(&name).await.unwrap();
    let err = p.exec(&name, &ProcessSpec::new(["true"])).await.err().unwrap();
    assert!(matches!(err, ProviderError::NotRunning { .. }), "{err}");
}

#[tokio::test]
async fn exec_streams_output_and_is_killed_inside_the_container() {
    let scratch = Scratch::new("kill");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("kill"));
    p.ensure(&config(&scratch, &name)).await.unwrap();

    let spec = ProcessSpec::new(["sh", "-c", "echo first; sleep 30 & wait; echo never"]);
    let mut proc = p.exec(&name, &spec).await.unwrap();
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    // The first line arrives while the process still runs: streaming.
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("no output within 10 s");
    assert_eq!(first.unwrap().as_deref(), Some("first"));

    let started = Instant::now();
    proc.killer().kill(libc::SIGTERM).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), proc.wait())
        .await
        .expect("not ended by SIGTERM")
        .unwrap();
    assert_eq!(status.code_or_signal(), 128 + libc::SIGTERM, "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(lines.next_line().await.unwrap(), None, "nothing after the kill");
    // The background `sleep` of that exec was killed too.
    let (_, ps, _) = run(&p, &name, ProcessSpec::new(["ps", "-o", "args"])).await;
    assert!(!ps.contains("sleep 30"), "{ps}");
}

#[tokio::test]
async fn one_agent_per_instance_with_streaming_stdin() {
    let scratch = Scratch::new("agent");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("agent"));
    p.ensure(&config(&scratch, &name)).await.unwrap();

    let mut agent = p.spawn_agent(&name, &ProcessSpec::new(["cat"])).await.unwrap();
    let err = p.spawn_agent(&name, &ProcessSpec::new(["cat"])).await.err().unwrap();
    assert!(matches!(err, ProviderError::Conflict(_)), "{err}");

    let mut stdin = agent.stdin.take().unwrap();
    let mut lines = BufReader::new(agent.stdout.take().unwrap()).lines();
    stdin.write_all(b"{\"jsonrpc\":\"2.0\"}\n").await.unwrap();
    stdin.flush().await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(echoed.as_deref(), Some("{\"jsonrpc\":\"2.0\"}"));
    drop(stdin);
    assert!(agent.wait().await.unwrap().success());

    // Once it has ended, a new agent may start.
    let mut again = p.spawn_agent(&name, &ProcessSpec::new(["true"])).await.unwrap();
    assert!(again.wait().await.unwrap().success());
}

#[tokio::test]
async fn secrets_stay_off_command_lines_and_logs() {
    let scratch = Scratch::new("secrets");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("secrets"));
    p.ensure(&config(&scratch, &name)).await.unwrap();
    let secret = "sk-test-6b1f0e2a9c4d";

    // The command must not name the secret itself: it echoes it upper-cased.
    let mut spec = ProcessSpec::new(["sh", "-c", "echo \"$OPENAI_API_KEY\" | tr a-z A-Z; sleep 30"]);
    spec.env = vec![("OPENAI_API_KEY".into(), secret.into())];
    let mut proc = p.exec(&name, &spec).await.unwrap();
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    let seen = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(seen, Some(secret.to_uppercase()), "the variable reached the process");

    // Not on the docker CLI's command line (what `ps` shows)...
    let pid = proc.pid().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
    assert!(String::from_utf8_lossy(&cmdline).contains("--env-file=/dev/fd/"));
    // ... nor in the container's recorded command, arguments or logs.
    for format in [
        "{{json .Config.Cmd}}",
        "{{json .Args}}",
        "{{json .Path}}",
        "{{json .Config.Entrypoint}}",
        "{{json .Config.Env}}",
    ] {
        let text = inspect_format(&name, format);
        assert!(!text.contains(secret), "{format}: {text}");
    }
    let logs = docker(&["logs", &name]);
    assert!(!String::from_utf8_lossy(&logs.stdout).contains(secret));
    assert!(!String::from_utf8_lossy(&logs.stderr).contains(secret));
    // Nor in a file of the state directory.
    for entry in walk(&scratch.state) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(secret), "{}", entry.display());
    }

    proc.killer().kill(libc::SIGKILL).await.unwrap();
    proc.wait().await.unwrap();
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() { stack.push(path) } else { out.push(path) }
        }
    }
    out
}

#[tokio::test]
async fn limits_network_off_and_a_read_only_workspace_are_applied() {
    let scratch = Scratch::new("limits");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("limits"));
    let mut cfg = config(&scratch, &name);
    cfg.network = sandbox::Network::Off;
    cfg.limits.memory = Some(64 << 20);
    cfg.limits.pids = Some(64);
    cfg.limits.cpus = Some(0.5);
    cfg.workspace_read_only = true;
    p.ensure(&cfg).await.unwrap();
    assert_eq!(inspect_format(&name, "{{.HostConfig.Memory}}"), (64u64 << 20).to_string());
    assert_eq!(inspect_format(&name, "{{.HostConfig.PidsLimit}}"), "64");
    assert_eq!(inspect_format(&name, "{{.HostConfig.NanoCpus}}"), "500000000");
    assert_eq!(inspect_format(&name, "{{.HostConfig.NetworkMode}}"), "none");
    let (_, out, _) =
        run(&p, &name, ProcessSpec::new(["sh", "-c", "ls /sys/class/net; grep CapEff /proc/self/status"]))
            .await;
    assert_eq!(out, "lo\nCapEff:\t0000000000000000\n");
    let (code, _, err) = run(&p, &name, ProcessSpec::new(["touch", "/workspace/x"])).await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");
}

#[tokio::test]
async fn invalid_names_and_images_are_refused() {
    let scratch = Scratch::new("names");
    let p = provider(&scratch);
    for name in ["--privileged", "tuixiu-run-a b", "other-name", ""] {
        assert!(matches!(p.inspect(name).await, Err(ProviderError::InvalidName(_))), "{name:?}");
        assert!(matches!(p.remove(name).await, Err(ProviderError::InvalidName(_))), "{name:?}");
    }
    let mut cfg = config(&scratch, &unique_name("img"));
    cfg.image = Some("--privileged".into());
    assert!(matches!(p.ensure(&cfg).await, Err(ProviderError::InvalidName(_))));
    assert_eq!(p.kind(), ProviderKind::Docker);
}

#[tokio::test]
async fn a_stopped_instance_starts_after_its_host_files_were_wiped() {
    let scratch = Scratch::new("wiped");
    let p = provider(&scratch);
    let name = scratch.track(&unique_name("wiped"));
    let id = p.ensure(&config(&scratch, &name)).await.unwrap().id;
    p.stop(&name).await.unwrap();
    std::fs::remove_dir_all(scratch.state.join("docker").join(&name)).unwrap();
    let info = p.ensure(&config(&scratch, &name)).await.unwrap();
    assert_eq!((info.status, info.id), (InstanceStatus::Running, id));
    let (code, out, err) = run(&p, &name, ProcessSpec::new(["sh", "-c", "id -un; touch ~/x"])).await;
    assert_eq!((code, out.as_str()), (0, "agent\n"), "{err}");
}

#[tokio::test]
async fn inputs_written_into_the_volumes_before_start_are_the_users() {
    use std::os::unix::fs::MetadataExt;
    use tuixiu_sandbox::provider::docker::as_container_user;

    let scratch = Scratch::new("volumes");
    let p = provider(&scratch);

    // A one-off container: home and scratch are host directories that go
    // away with it.
    let mut cfg = config(&scratch, &unique_name("vol"));
    let volumes = p.prepare_volumes(&mut cfg, true).unwrap();
    // The user cannot search the (root-private) state directory: the
    // writer goes through the handles.
    let (workspace, home, scratch_dir) = volumes.writable();
    as_container_user(&cfg, || {
        assert!(std::fs::metadata(volumes.home.join(".")).is_err(), "the state directory is private");
        std::fs::create_dir_all(home.join(".codex")).unwrap();
        std::fs::write(home.join(".codex/AGENTS.md"), "# hi\n").unwrap();
        std::fs::write(scratch_dir.unwrap().join("x"), "scratch\n").unwrap();
        std::fs::write(workspace.join("in.txt"), "input\n").unwrap();
    });
    assert_eq!(std::fs::metadata(volumes.home.join(".codex/AGENTS.md")).unwrap().uid(), 1000);
    let script = "cat ~/.codex/AGENTS.md /scratch/x /workspace/in.txt && echo more >> ~/.codex/AGENTS.md && echo appended";
    let (mut cmd, _env_fd, files) =
        p.run_once_command(&cfg, &ProcessSpec::new(["sh", "-c", script])).unwrap();
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "# hi\nscratch\ninput\nappended\n");
    let dir = files.dir.clone();
    files.remove();
    assert!(!dir.exists());

    // A named instance keeps them.
    let name = scratch.track(&unique_name("volnamed"));
    let mut cfg = config(&scratch, &name);
    let volumes = p.prepare_volumes(&mut cfg, true).unwrap();
    let (_, _, scratch_dir) = volumes.writable();
    as_container_user(&cfg, || std::fs::write(scratch_dir.unwrap().join("y"), "kept\n").unwrap());
    p.ensure(&cfg).await.unwrap();
    let (code, out, err) = run(&p, &name, ProcessSpec::new(["cat", "/scratch/y"])).await;
    assert_eq!((code, out.as_str()), (0, "kept\n"), "{err}");
}
