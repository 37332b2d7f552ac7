//! `tuixiu-sandbox run`: the native sandbox seen from inside, for every
//! kind of caller (root, unprivileged, nested in `unshare -U -r`).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Caller, Fixture, LEAK_MARKER, stderr};

for_each_caller!(user_view_resolves_name_ids_and_home, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.sh(&[], "id -u; id -g; id -un; id -gn; whoami; echo $HOME $USER $LOGNAME");
    assert_eq!(out, "1000\n1000\nagent\nagent\nagent\n/home/agent agent agent\n");

    let py =
        fx.sh(&[], "python3 -c 'import os, pwd; p = pwd.getpwuid(os.getuid()); print(p.pw_name, p.pw_dir)'");
    assert_eq!(py, "agent /home/agent\n");
    if std::path::Path::new("/usr/bin/node").exists() {
        let node =
            fx.sh(&[], "node -e 'const u = require(\"os\").userInfo(); console.log(u.username, u.homedir)'");
        assert_eq!(node, "agent /home/agent\n");
    }
});

for_each_caller!(custom_user_view, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.sh(
        &["--user", "builder", "--uid", "4242", "--gid", "4343", "--home-path", "/srv/builder"],
        "id -u; id -g; id -un; echo $HOME; pwd -P; cd && pwd",
    );
    assert_eq!(out, "4242\n4343\nbuilder\n/srv/builder\n/workspace\n/srv/builder\n");
});

for_each_caller!(starts_in_workspace_and_writes_reach_the_host_with_the_callers_owner, |caller: Caller| {
    let fx = Fixture::new(caller);
    let home = fx.home.to_str().unwrap().to_string();
    let out = fx.sh(&["--home", &home], "pwd; echo ws > /workspace/from-ws; echo home > $HOME/from-home");
    assert_eq!(out, "/workspace\n");
    for (path, content) in [(fx.workspace.join("from-ws"), "ws\n"), (fx.home.join("from-home"), "home\n")] {
        assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        let owner = std::fs::metadata(&path).unwrap().uid();
        assert_eq!(owner, caller.host_uid(), "{} owned by {owner}", path.display());
    }
});

for_each_caller!(root_and_system_dirs_are_read_only, |caller: Caller| {
    let fx = Fixture::new(caller);
    let script = "for p in /newfile /usr/newfile /etc/newfile /bin/newfile /dev/newfile /proc/sys/kernel/hostname; do \
                    if (echo x > $p) 2>/dev/null; then echo writable:$p; fi; done; \
                  echo done";
    assert_eq!(fx.sh(&[], script), "done\n");
    // A system file the user would otherwise own through the mapping.
    let out = fx.run(&[], &["sh", "-c", "echo x >> /etc/passwd"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Read-only file system"), "{}", stderr(&out));
});

for_each_caller!(tmp_is_private_and_empty, |caller: Caller| {
    let fx = Fixture::new(caller);
    let name = format!("tuixiu-private-{}-{caller:?}", std::process::id());
    let host_marker = std::env::temp_dir().join(format!("{name}-host"));
    std::fs::write(&host_marker, "host").unwrap();
    let out = fx.sh(&[], &format!("ls -A /tmp; echo x > /tmp/{name}; ls -A /tmp"));
    assert_eq!(out, format!("{name}\n"));
    assert!(!std::env::temp_dir().join(&name).exists(), "a write to /tmp reached the host");
    std::fs::remove_file(host_marker).unwrap();
});

for_each_caller!(only_sandbox_processes_are_visible, |caller: Caller| {
    let fx = Fixture::new(caller);
    // PID 1 is the reaper, PID 2 the shell; `ls` is a child of the shell.
    let out = fx.sh(&[], "for d in /proc/[0-9]*; do echo ${d#/proc/}; done; echo self=$$");
    let mut lines: Vec<&str> = out.lines().collect();
    let self_line = lines.pop().unwrap();
    assert_eq!(self_line, "self=2");
    let pids: Vec<u32> = lines.iter().map(|l| l.parse().unwrap()).collect();
    assert!(pids.contains(&1) && pids.contains(&2), "{pids:?}");
    assert!(pids.len() <= 3 && pids.iter().all(|&p| p < 10), "host processes visible: {pids:?}");
});

for_each_caller!(environment_is_built_not_inherited, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.sh(&["--env", "FOO=bar", "--env-allow", "FOO", "--pass-env", "PATH"], "env | sort");
    assert!(!out.contains(LEAK_MARKER.0), "caller environment leaked: {out}");
    for expected in ["FOO=bar", "HOME=/home/agent", "USER=agent", "LOGNAME=agent"] {
        assert!(out.lines().any(|l| l == expected), "{expected} missing from {out}");
    }
    // --pass-env PATH copies the caller's PATH verbatim, after the
    // nested-sandbox portal's directory (our `bwrap` comes first).
    let path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    assert!(out.lines().any(|l| l == format!("PATH=/run/tuixiu/bin:{path}")), "{out}");
    let out = fx.sh(&["--pass-env", "PATH", "--nested", "off"], "echo \"$PATH\"");
    assert_eq!(out.trim_end(), path);

    // --env-file is init.env: a key the allowlist does not name is dropped,
    // and named (never its value) on stderr. (A key typed with --env is the
    // caller's explicit choice and passes: typed_env_reaches_the_command.)
    let env_file = fx.home.join("secret.env");
    std::fs::write(&env_file, "SECRET_TOKEN=s3cr3t-value\n").unwrap();
    let dropped =
        fx.run(&["--env-file", env_file.to_str().unwrap()], &["sh", "-c", "echo ${SECRET_TOKEN:-unset}"]);
    assert_eq!(String::from_utf8_lossy(&dropped.stdout), "unset\n");
    let err = stderr(&dropped);
    assert!(err.contains("SECRET_TOKEN") && !err.contains("s3cr3t-value"), "{err}");
});

for_each_caller!(exit_codes_follow_docker_conventions, |caller: Caller| {
    let fx = Fixture::new(caller);
    let code = |cmd: &[&str]| fx.run(&[], cmd).status.code().unwrap();
    assert_eq!(code(&["true"]), 0);
    assert_eq!(code(&["sh", "-c", "exit 42"]), 42);
    assert_eq!(code(&["sh", "-c", "kill -9 $$"]), 128 + 9);
    let missing = fx.run(&[], &["no-such-command-xyz"]);
    assert_eq!(missing.status.code(), Some(127));
    assert_eq!(stderr(&missing).lines().count(), 1, "{}", stderr(&missing));
    assert!(stderr(&missing).contains("command not found"), "{}", stderr(&missing));

    std::fs::write(fx.workspace.join("not-executable"), "#!/bin/sh\n").unwrap();
    let denied = fx.run(&[], &["/workspace/not-executable"]);
    assert_eq!(denied.status.code(), Some(126));
    assert!(stderr(&denied).contains("EACCES"), "{}", stderr(&denied));
});

for_each_caller!(stdout_carries_only_the_commands_output, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.run(&[], &["printf", "{\"jsonrpc\":\"2.0\"}\n"]);
    assert!(out.status.success());
    assert_eq!(out.stdout, b"{\"jsonrpc\":\"2.0\"}\n");
    assert!(out.stderr.is_empty(), "unexpected stderr: {}", stderr(&out));
});

for_each_caller!(stdin_is_passed_through, |caller: Caller| {
    let fx = Fixture::new(caller);
    let ws = fx.workspace.to_str().unwrap().to_string();
    let mut child = fx
        .command(&["run", "--workspace", &ws, "--", "sh", "-c", "read line; echo got:$line"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.stdout, b"got:hello\n");
});

for_each_caller!(signals_are_forwarded_to_the_command, |caller: Caller| {
    let fx = Fixture::new(caller);
    let ws = fx.workspace.to_str().unwrap().to_string();
    for (sig, name) in
        [(libc::SIGTERM, "TERM"), (libc::SIGINT, "INT"), (libc::SIGHUP, "HUP"), (libc::SIGUSR1, "USR1")]
    {
        let script =
            format!("trap 'echo got-{name}; exit 3' {name}; echo ready; while :; do sleep 0.05; done");
        let mut child = fx
            .command(&["run", "--workspace", &ws, "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, sig) };
        assert_eq!(lines.next().unwrap().unwrap(), format!("got-{name}"));
        assert_eq!(child.wait().unwrap().code(), Some(3), "signal {name}");
    }
});

for_each_caller!(killing_the_launcher_kills_the_whole_sandbox, |caller: Caller| {
    let fx = Fixture::new(caller);
    let ws = fx.workspace.to_str().unwrap().to_string();
    // Unique per test run and caller: the three variants run in parallel.
    let marker = format!("{}{}", 900_000 + std::process::id() % 90_000, caller as u8);
    // A background grandchild too: the pid namespace must take it down.
    let script = format!("sleep {marker} & echo ready; sleep {marker}");
    let mut child = KillOnDrop(
        fx.command(&["run", "--workspace", &ws, "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes_with_arg(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the two sleeps never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The sandbox's pid namespace: its PID 1 (`tuixiu-sandbox-init`, no
    // marker in its command line) must go as well.
    let ns = pid_ns(processes_with_arg(&marker)[0]).expect("the sleep's pid namespace");
    assert!(processes_in_pid_ns(&ns).len() >= 3, "PID 1 and the two sleeps: {:?}", processes_in_pid_ns(&ns));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with_arg(&marker).is_empty() || !processes_in_pid_ns(&ns).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox processes survived: {:?}, in its pid namespace {ns}: {:?}",
            processes_with_arg(&marker),
            processes_in_pid_ns(&ns)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
});

for_each_caller!(nothing_of_the_sandbox_runs_once_run_has_returned, |caller: Caller| {
    let fx = Fixture::new(caller);
    let ws = fx.workspace.to_str().unwrap().to_string();
    let marker = format!("{}{}", 800_000 + std::process::id() % 90_000, caller as u8);
    // The command exits at once and leaves a background process behind,
    // one that ignores SIGTERM and SIGHUP. `run` returns before the kernel
    // has torn down the sandbox's namespaces, but only after that process
    // is gone: checked at once, without waiting.
    let script =
        format!("readlink /proc/self/ns/pid; trap '' TERM HUP; (sleep {marker}) & sleep 0.2; exit 7");
    let out = fx.command(&["run", "--workspace", &ws, "--", "sh", "-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(processes_with_arg(&marker), Vec::<u32>::new());
    // PID 1 included: nothing is left in the sandbox's pid namespace.
    let ns = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(ns.starts_with("pid:["), "{ns}");
    // `run` returns without waiting for PID 1's own exit (the kernel's
    // teardown of the namespaces, `return_before_teardown`): PID 1 may
    // still be there, exiting, but no other process, and nothing that
    // still runs code of its own.
    let left: Vec<String> = processes_in_pid_ns(&ns)
        .into_iter()
        .filter(|&pid| !is_exiting_pid1(pid))
        .map(|pid| {
            format!("{pid}: {}", std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
        })
        .collect();
    assert!(left.is_empty(), "left in the sandbox's pid namespace: {left:#?}");
});

/// Kills the launcher if an assertion fails first, so no sandbox outlives the test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid namespace of `pid` as `pid:[inode]`.
fn pid_ns(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok().map(|l| l.to_string_lossy().into_owned())
}

/// Pids of live processes (zombies aside) in pid namespace `ns`
/// (`pid:[inode]`), whatever their command line.
fn processes_in_pid_ns(ns: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid_ns(pid).as_deref() != Some(ns) {
            continue;
        }
        let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if !state.contains(") Z ") {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `pid` is its pid namespace's PID 1 (the last `NSpid` is 1) and
/// is in its exit (`PF_EXITING` among the flags of `/proc/PID/stat`).
fn is_exiting_pid1(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let pid1 =
        status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|ids| ids.split_whitespace().last())
            == Some("1");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name: state, ppid, pgrp, session, tty_nr,
    // tpgid, flags.
    let flags = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(6)?.parse::<u64>().ok());
    pid1 && flags.is_some_and(|f| f & PF_EXITING != 0)
}

/// Pids of live processes with `arg` among their arguments.
fn processes_with_arg(arg: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // Zombies awaiting their parent are not running processes.
            if !state.contains(") Z ") {
                pids.push(pid);
            }
        }
    }
    pids
}

for_each_caller!(network_off_has_only_loopback_and_it_is_up, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.sh(
        &["--network", "off"],
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; \
         python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); \
         c = socket.create_connection(s.getsockname()); print(\"loopback-ok\", c.getpeername()[0])'",
    );
    assert_eq!(out, "lo\nloopback-ok 127.0.0.1\n");
    if std::path::Path::new("/usr/sbin/ip").exists() || std::path::Path::new("/sbin/ip").exists() {
        let addr = fx.sh(&["--network", "off"], "ip -o -4 addr show dev lo");
        assert!(addr.contains("inet 127.0.0.1/8"), "{addr}");
    }
});

for_each_caller!(network_on_shares_the_hosts_interfaces, |caller: Caller| {
    let fx = Fixture::new(caller);
    let host = std::fs::read_to_string("/proc/net/dev").unwrap().lines().count();
    let inside = fx.sh(&[], "wc -l < /proc/net/dev");
    assert_eq!(inside.trim().parse::<usize>().unwrap(), host);
});

for_each_caller!(bad_input_is_one_clear_line_and_exit_125, |caller: Caller| {
    let fx = Fixture::new(caller);
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--workspace", "/no/such/dir", "--", "true"], "--workspace /no/such/dir: ENOENT"),
        (
            &["run", "--home-path", "relative/home", "--", "true"],
            "--home-path \"relative/home\": must be an absolute path",
        ),
        (&["run", "--home-path", "/workspace/h", "--", "true"], "must not be /workspace or inside it"),
        (
            &["run", "--chdir", "/etc", "--", "true"],
            "working directory \"/etc\" must be under /workspace or the home",
        ),
        (&["run", "--bind", "/no/such/src", "/x", "--", "true"], "bind source /no/such/src: ENOENT"),
        (&["run", "--env", "NOEQUALS", "--", "true"], "--env: expected KEY=VALUE"),
        (&["run", "--user", "Bad:Name", "--", "true"], "user name \"Bad:Name\""),
    ];
    for (args, expected) in cases {
        // The workspace defaults to the current directory, the fixture dir.
        let mut with_ws: Vec<&str> = args.to_vec();
        if !args.contains(&"--workspace") {
            with_ws.splice(1..1, ["--workspace", fx.workspace.to_str().unwrap()]);
        }
        let out = fx.command(&with_ws).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.starts_with("tuixiu-sandbox: ") && err.contains(expected), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
});

for_each_caller!(in_sandbox_setup_failure_names_step_syscall_and_errno, |caller: Caller| {
    let fx = Fixture::new(caller);
    let src = fx.workspace.to_str().unwrap().to_string();
    // A directory onto the generated /etc/passwd (a file): refused inside
    // the sandbox before any mount, as bubblewrap's `ensure_dir` refuses it.
    let out = fx.run(&["--ro-bind", &src, "/etc/passwd"], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("-> /etc/passwd (ro)") && err.contains("mkdirat(\"/etc/passwd\") => ENOTDIR"),
        "{err}"
    );
});

for_each_caller!(missing_targets_in_the_read_only_system_view_are_spliced, |caller: Caller| {
    // The target does not exist in the host's /usr, which the sandbox shows
    // read-only: /usr becomes a tmpfs with the host's entries bound back in.
    let fx = Fixture::new(caller);
    std::fs::write(fx.workspace.join("marker"), "bound").unwrap();
    let src = fx.workspace.to_str().unwrap().to_string();
    let host_entries = std::fs::read_dir("/usr").unwrap().count();
    let out = fx.sh(
        &["--ro-bind", &src, "/usr/new-mountpoint"],
        "cat /usr/new-mountpoint/marker; echo; ls -A /usr | wc -l; test -x /usr/bin/env && echo env-ok; \
         (touch /usr/x) 2>/dev/null && echo usr-writable || echo usr-ro; \
         (touch /usr/bin/x) 2>/dev/null && echo bin-writable || echo bin-ro",
    );
    assert_eq!(out, format!("bound\n{}\nenv-ok\nusr-ro\nbin-ro\n", host_entries + 1));
    assert!(!Path::new("/usr/new-mountpoint").exists(), "nothing is created on the host");
});

for_each_caller!(extra_mounts_apply_in_command_line_order, |caller: Caller| {
    let fx = Fixture::new(caller);
    let a = fx.dir.join("a");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("who"), "a\n").unwrap();
    let a = a.to_str().unwrap().to_string();
    // ro-bind, then a tmpfs covering it, then a bind into the tmpfs.
    let out = fx.sh(
        &["--ro-bind", &a, "/data/x", "--tmpfs", "/data/x", "--bind", &a, "/data/x/inner"],
        "ls -A /data/x; cat /data/x/inner/who; echo t > /data/x/file && echo tmpfs-writable",
    );
    assert_eq!(out, "inner\na\ntmpfs-writable\n");
    let ro = fx.run(&["--ro-bind", &a, "/data/x"], &["sh", "-c", "cat /data/x/who; echo y > /data/x/who"]);
    assert_eq!(String::from_utf8_lossy(&ro.stdout), "a\n");
    assert!(stderr(&ro).contains("Read-only file system"), "{}", stderr(&ro));
});

for_each_caller!(json_status_fd_reports_start_and_exit, |caller: Caller| {
    let fx = Fixture::new(caller);
    let status = fx.dir.join("status.json");
    let ws = fx.workspace.to_str().unwrap();
    let script = format!(
        "exec 3>{} && exec {} run --workspace {ws} --json-status-fd 3 -- sh -c 'exit 7'",
        status.display(),
        common::binary().display()
    );
    std::fs::File::create(&status).unwrap();
    std::os::unix::fs::chown(&status, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
    let out = caller.command(std::path::Path::new("/bin/sh"), &["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let text = std::fs::read_to_string(&status).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0]["child-pid"].as_u64().unwrap() > 1);
    assert_eq!(lines[1]["exit-code"], 7);
});

for_each_caller!(home_is_a_private_tmpfs_by_default, |caller: Caller| {
    let fx = Fixture::new(caller);
    let out = fx.sh(&[], "ls -A $HOME; touch $HOME/x && stat -c '%u %a' $HOME; grep \" $HOME \" /proc/self/mounts | cut -d' ' -f3");
    assert_eq!(out, "1000 755\ntmpfs\n");
    assert_eq!(std::fs::read_dir(&fx.home).unwrap().count(), 0);
});

/// Read-only must hold on submounts of a bind, not just its top mount.
#[test]
fn read_only_bind_covers_submounts() {
    common::require_root();
    for caller in [Caller::Root, Caller::Unprivileged, Caller::Nested] {
        let fx = Fixture::new(caller);
        let tree = fx.dir.join("tree");
        let sub = tree.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0777", "tuixiu-test-submount"])
            .arg(&sub)
            .status()
            .unwrap();
        assert!(status.success());
        let tree_s = tree.to_str().unwrap().to_string();
        let out = fx.run(
            &["--ro-bind", &tree_s, "/data/tree"],
            &["sh", "-c", "grep ' /data/tree/sub ' /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1; echo x > /data/tree/sub/f"],
        );
        let umount = std::process::Command::new("umount").arg(&sub).status().unwrap();
        assert!(umount.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ro\n", "{caller:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("Read-only file system"), "{caller:?}: {}", stderr(&out));
    }
}

#[test]
fn help_documents_the_options() {
    let out = std::process::Command::new(common::binary()).args(["run", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--workspace",
        "--home",
        "--user",
        "--uid",
        "--gid",
        "--home-path",
        "--chdir",
        "--ro-bind",
        "--bind",
        "--tmpfs",
        "--env",
        "--pass-env",
        "--network",
        "--json-status-fd",
        "--map-uid",
        "--map-gid",
    ] {
        assert!(help.contains(flag), "{flag} missing from run --help");
    }
}

/// A root caller can map the sandbox user onto another host user.
#[test]
fn root_can_map_onto_other_host_ids() {
    let fx = Fixture::new(Caller::Root);
    std::os::unix::fs::chown(&fx.workspace, Some(4000), Some(4001)).unwrap();
    let out = fx.sh(&["--map-uid", "4000", "--map-gid", "4001"], "id -u; touch /workspace/mapped");
    assert_eq!(out, "1000\n");
    let meta = std::fs::metadata(fx.workspace.join("mapped")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4000, 4001));
}

#[test]
fn unprivileged_callers_cannot_map_onto_other_ids() {
    let fx = Fixture::new(Caller::Unprivileged);
    let out = fx.run(&["--map-uid", "0"], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("only a root caller"), "{}", stderr(&out));
}

/// PID 1 of the sandbox keeps none of the launcher's descriptors (only its
/// own pipes): anything it held would be one /proc/1/fd away from the
/// command once PID 1 has no privileges left.
#[test]
fn sandbox_init_holds_no_inherited_descriptors() {
    let fx = Fixture::new(Caller::Root);
    let status = fx.dir.join("status.json");
    let script = format!(
        "exec 5</etc/hostname 3>{} && exec {} run --workspace {} --json-status-fd 3 -- sleep 5",
        status.display(),
        common::binary().display(),
        fx.workspace.display()
    );
    let mut child =
        KillOnDrop(Caller::Root.command(std::path::Path::new("/bin/sh"), &["-c", &script]).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    let pid = loop {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            break v["child-pid"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "the sandbox never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    let targets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().unwrap() > 2)
        .map(|e| std::fs::read_link(e.path()).unwrap().display().to_string())
        .collect();
    assert!(targets.iter().all(|t| t.starts_with("pipe:")), "PID 1 holds {targets:?}");
    child.0.kill().unwrap();
}

// While the command runs, the launcher's only child is the sandbox's PID 1:
// no helper it started during setup (the idmap helper of a root caller)
// lingers as a zombie until the sandbox ends.
for_each_caller!(launcher_leaves_no_zombie_child, |caller: Caller| {
    let fx = Fixture::new(caller);
    let started = fx.start(&[], &["sleep", "30"], &[]);
    // The helper is killed during setup; give a zombie time to show.
    std::thread::sleep(Duration::from_millis(200));
    let children = common::children(started.launcher);
    assert_eq!(children, [(started.pid1, 'S')], "children of the launcher (pid, state)");
});

// A variable typed on the command line with --env reaches the command,
// whatever the allowlist says (README's `--env RUST_LOG=info`); the
// allowlist still filters --env-file, and nothing else of the caller's
// environment is inherited.
for_each_caller!(typed_env_reaches_the_command, |caller: Caller| {
    let fx = Fixture::new(caller);
    let env_file = fx.home.join("vars.env");
    std::fs::write(&env_file, "RUST_LOG=debug\nFROM_FILE=file-value\n").unwrap();
    let ef = env_file.to_str().unwrap();
    let script = "env | grep -E '^(RUST_LOG|MY_SETTING|FROM_FILE|TUIXIU_TEST_LEAK_MARKER)=' | sort";
    let out = fx.run(
        &["--env-file", ef, "--env", "RUST_LOG=info", "--env", "MY_SETTING=a=b c", "--no-default-env-allow"],
        &["sh", "-c", script],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "MY_SETTING=a=b c\nRUST_LOG=info\n");
    assert!(
        err.contains("env: not in the allowlist, dropped: FROM_FILE (allow with --env-allow KEY)"),
        "{err}"
    );
    assert!(!err.contains("RUST_LOG"), "{err}");
});
