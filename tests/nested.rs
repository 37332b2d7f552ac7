//! Nested sandboxes (docs/bwrap.md, "Nested sandboxes"): an agent that runs
//! `bwrap` itself, inside `tuixiu-sandbox run`, as root, as uid 65534 and
//! nested in `unshare -U -r`. The stand-in agent (tests/fixtures/nested/) calls
//! bwrap with codex-acp's exact command lines and Claude Code's sandbox-runtime
//! options.

mod common;
mod nested_support;

use common::{Caller, Fixture, stderr};
use nested_support::{assert_codex_and_sandbox_runtime, assert_nothing_left_running, observations};

/// Runs the stand-in agent in a sandbox; returns what it observed.
fn stand_in(f: &Fixture, extra: &[&str], token: &str) -> std::collections::BTreeMap<String, String> {
    let fixtures = f.dir.join("stand-in");
    nested_support::install(&fixtures);
    nested_support::prepare_workspace(&f.workspace, f.caller.host_uid());
    let bind = fixtures.to_str().unwrap().to_string();
    let mut args = vec!["--ro-bind", bind.as_str(), "/stand-in"];
    args.extend_from_slice(extra);
    let out = f.run(&args, &["sh", "/stand-in/agent.sh", "/workspace", token]);
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    observations(&String::from_utf8(out.stdout).unwrap())
}

for_each_caller!(codex_and_the_sandbox_runtime_run_their_bwrap, |caller: Caller| {
    let f = Fixture::new(caller);
    let token = format!("nested-run-{}-{caller:?}", std::process::id());
    let seen = stand_in(&f, &[], &token);
    assert_codex_and_sandbox_runtime(&seen, &f.workspace, caller.host_uid());
    // No nested sandbox, worker or heartbeat outlives the run.
    assert_nothing_left_running(&token);
    assert_nothing_left_running(f.dir.to_str().unwrap());
});

// The probe is not vacuous: with the outer profile off, the same calls in
// a nested command answer otherwise.
for_each_caller!(nested_commands_run_under_the_outer_seccomp_profile, |caller: Caller| {
    let f = Fixture::new(caller);
    nested_support::install(&f.workspace.join("stand-in"));
    let probe =
        "bwrap --ro-bind / / --unshare-user --unshare-pid -- python3 /workspace/stand-in/probe.py nested";
    for (profile, want_eperm) in [("default", true), ("unconfined", false)] {
        let out = f.run(&["--seccomp", profile], &["sh", "-c", probe]);
        assert!(out.status.success(), "{}", stderr(&out));
        let seen = observations(&String::from_utf8(out.stdout).unwrap());
        for call in ["keyctl", "bpf"] {
            assert_eq!(seen[&format!("nested_{call}")] == "EPERM", want_eperm, "{profile}: {seen:?}");
        }
    }
});

/// What a sandboxing tool's helper does inside a nested sandbox (Claude
/// Code's sandbox runtime's `apply-seccomp`: tests/fixtures/nested/
/// own_namespaces.py), started the way that runtime starts it.
const OWN_NAMESPACES: &str = "bwrap --ro-bind / / --unshare-user --unshare-pid --unshare-net --proc /proc \
     --dev /dev --tmpfs /tmp -- python3 /workspace/stand-in/own_namespaces.py; echo own_status=$?; \
     python3 /workspace/stand-in/probe.py agent";

// docs/security.md, "Nested sandboxes": a nested command may make its own
// user, mount and pid namespaces and mount in them, as under bubblewrap;
// everything else the profile denies stays denied there, no network
// namespace of its own; the agent itself keeps every restriction; and
// `--nested-userns off` takes it away.
for_each_caller!(nested_commands_make_their_own_user_mount_and_pid_namespaces, |caller: Caller| {
    let f = Fixture::new(caller);
    nested_support::install(&f.workspace.join("stand-in"));
    for extra in [&[][..], &["--landlock", "off"], &["--seccomp", "strict"]] {
        let out = f.run(extra, &["sh", "-c", OWN_NAMESPACES]);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let seen = observations(&String::from_utf8_lossy(&out.stdout));
        let step = |key: &str| seen.get(&format!("own_{key}")).map(String::as_str);
        for key in [
            "unshare_user",
            "setgroups",
            "uid_map",
            "gid_map",
            "unshare_mnt_pid",
            "mount_private",
            "mount_proc",
            "mount_tmpfs",
            "no_new_privs",
            "seccomp",
            "inet_socket",
        ] {
            assert_eq!(step(key), Some("ok"), "{extra:?} {key}: {seen:#?}\n{}", stderr(&out));
        }
        assert_eq!(step("pid"), Some("1"), "{seen:#?}");
        // Its own filter works, and ours is still under it.
        assert_eq!(step("unix_socket"), Some("EPERM"), "{seen:#?}");
        for key in ["keyctl", "bpf", "setns", "chroot", "unshare_net", "unshare_user_net"] {
            assert_eq!(step(key), Some("EPERM"), "{extra:?} {key}: {seen:#?}");
        }
        assert_eq!(step("io_uring_setup"), Some("ENOSYS"), "{seen:#?}");
        assert_eq!(step("status"), Some("0"), "{seen:#?}");
        assert_eq!(seen["agent_unshare"], "EPERM", "{seen:#?}");
        assert_eq!(seen["agent_mount"], "EPERM", "{seen:#?}");
    }
    let out = f.run(&["--nested-userns", "off"], &["sh", "-c", OWN_NAMESPACES]);
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = observations(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(seen.get("own_unshare_user").map(String::as_str), Some("EPERM"), "{seen:#?}");
    assert_eq!(seen["own_status"], "1", "{seen:#?}");
    assert_eq!(seen["agent_unshare"], "EPERM", "{seen:#?}");
});

/// bubblewrap's status descriptors, nested: what bubblewrap's own
/// test-run.sh and test-specifying-{pidns,userns}.sh rely on (the last two
/// wait for the command's pid to appear in `--info-fd`'s file).
const STATUS_FDS: &str = r#"
bwrap --unshare-pid --info-fd 42 --json-status-fd 43 --ro-bind / / -- sh -c 'exit 42' 42>/tmp/info.json 43>/tmp/status.json
echo "rc=$?"
echo "info=$(tr '\n' ' ' </tmp/info.json)"
echo "status=$(tr '\n' ' ' </tmp/status.json)"
bwrap --json-status-fd 43 --ro-bind / / /nonexistent 43>/tmp/failed.json 2>/dev/null
echo "failed_rc=$?"
echo "failed=$(tr '\n' ' ' </tmp/failed.json)"
bwrap --unshare-user --info-fd 5 --userns-block-fd 6 --ro-bind / / -- echo released 5>/tmp/block.json 6< <(sleep 1; echo go)
echo "block_rc=$?"
echo "block_info=$(tr '\n' ' ' </tmp/block.json)"
bwrap --userns 7 --ro-bind / / -- true 7</proc/self/ns/user 2>&1
echo "userns_rc=$?"
bwrap --unshare-all --ro-bind / / --proc /proc --info-fd 42 --json-status-fd 43 -- \
    sh -c 'for n in cgroup ipc mnt net pid uts user; do echo "own_$n=$(stat -L -c %i /proc/self/ns/$n)"; done' \
    42>/tmp/ids-info.json 43>/tmp/ids-status.json
echo "ids_info=$(tr '\n' ' ' </tmp/ids-info.json)"
echo "ids_status=$(head -n 1 /tmp/ids-status.json)"
for n in mnt pid; do echo "outer_$n=$(stat -L -c %i /proc/self/ns/$n)"; done
"#;

/// The `*-namespace` keys of a status line, each with its id.
fn namespace_ids(line: &str) -> std::collections::BTreeMap<String, u64> {
    let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let object = value.as_object().unwrap_or_else(|| panic!("{line}"));
    assert!(object["child-pid"].as_u64().is_some_and(|p| p > 1), "{line}");
    object
        .iter()
        .filter(|(key, _)| key.as_str() != "child-pid")
        .map(|(key, id)| (key.clone(), id.as_u64().unwrap_or_else(|| panic!("{key} in {line}"))))
        .collect()
}

for_each_caller!(status_descriptors_are_served_nested, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.run(&[], &["bash", "-c", STATUS_FDS]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let seen = observations(&text);
    assert_eq!(seen["rc"], "42", "{text}");
    // bubblewrap's formats: pretty-printed on --info-fd, one line each on
    // --json-status-fd, the exit code only once COMMAND has run.
    // With --unshare-pid alone: the new pid namespace and the mount
    // namespace (always), as bubblewrap names them.
    let pid = seen["info"]
        .strip_prefix("{     \"child-pid\": ")
        .and_then(|rest| rest.split_once(",     \"mnt-namespace\": "))
        .map(|(pid, _)| pid)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(pid.parse::<u32>().is_ok_and(|p| p > 1), "{text}");
    let ids = namespace_ids(&seen["info"]);
    assert_eq!(ids.keys().collect::<Vec<_>>(), ["mnt-namespace", "pid-namespace"], "{text}");
    let line = format!(
        "{{ \"child-pid\": {pid}, \"mnt-namespace\": {}, \"pid-namespace\": {} }}",
        ids["mnt-namespace"], ids["pid-namespace"]
    );
    assert_eq!(seen["status"], format!("{line} {{ \"exit-code\": 42 }} "), "{text}");
    assert_eq!(seen["failed_rc"], "1", "{text}");
    assert!(
        seen["failed"].starts_with("{ \"child-pid\": ") && !seen["failed"].contains("exit-code"),
        "{text}"
    );
    // --userns-block-fd: COMMAND waited for the byte, then ran.
    assert_eq!(seen["block_rc"], "0", "{text}");
    assert!(text.contains("released\n"), "{text}");
    assert!(seen["block_info"].contains("\"child-pid\": "), "{text}");
    // Another sandbox's namespaces stay the host's business (docs/bwrap.md).
    assert!(text.contains("--userns is not supported by tuixiu-sandbox's bwrap inside a sandbox"), "{text}");
    assert_eq!(seen["userns_rc"], "1", "{text}");
    // The ids are those of the nested sandbox's own namespaces, as its
    // command sees them (bubblewrap's test-run.sh checks the same), the
    // user namespace never named (bubblewrap makes it after it reports).
    let want: std::collections::BTreeMap<String, u64> = ["cgroup", "ipc", "mnt", "net", "pid", "uts"]
        .iter()
        .map(|ns| {
            let own = seen[&format!("own_{ns}")].parse().unwrap_or_else(|_| panic!("own_{ns}: {text}"));
            (format!("{ns}-namespace"), own)
        })
        .collect();
    assert_eq!(namespace_ids(&seen["ids_info"]), want, "{text}");
    assert_eq!(namespace_ids(&seen["ids_status"]), want, "{text}");
    // Its own, not the outer sandbox's.
    assert_ne!(seen["outer_mnt"], want["mnt-namespace"].to_string(), "{text}");
    assert_ne!(seen["outer_pid"], want["pid-namespace"].to_string(), "{text}");
});

/// Where scripts/ci-setup.d/47-sandbox-runtime.sh installs `srt`.
const SRT_DIR: &str = "/opt/tuixiu-ci/sandbox-runtime-0.0.83";

/// The sandbox runtime's directory, or `None` (with the reason printed)
/// when its setup script found the npm registry unreachable.
fn sandbox_runtime() -> Option<std::path::PathBuf> {
    let dir =
        std::env::var_os("TUIXIU_TEST_SRT_DIR").map_or_else(|| SRT_DIR.into(), std::path::PathBuf::from);
    if dir.join("node_modules/.bin/srt").exists() {
        return Some(dir);
    }
    match std::fs::read_to_string(dir.join("npm-unreachable")) {
        Ok(why) => {
            eprintln!("SKIPPED: @anthropic-ai/sandbox-runtime is not installed: {}", why.trim());
            None
        }
        Err(_) => panic!(
            "no srt in {} (run scripts/ci-setup.d/47-sandbox-runtime.sh, or set TUIXIU_TEST_SRT_DIR)",
            dir.display()
        ),
    }
}

/// Runs `srt -c SCRIPT` (default settings) inside our sandbox. srt waits
/// a fixed few rounds for the socat bridges it starts before the sandbox
/// (outside ours' business); on a loaded machine that can run out, and
/// srt says so: that start alone is tried again.
fn srt(f: &Fixture, srt_dir: &std::path::Path, extra: &[&str], script: &str) -> std::process::Output {
    let bind = srt_dir.to_str().unwrap();
    let mut args = vec!["--ro-bind", bind, "/srt"];
    args.extend_from_slice(extra);
    let mut tries = 0;
    loop {
        let out = f.run(&args, &["/srt/node_modules/.bin/srt", "-c", script]);
        tries += 1;
        if tries == 3 || !stderr(&out).contains("Failed to create bridge sockets") {
            return out;
        }
    }
}

// Claude Code's sandbox runtime in its default settings: its bwrap is
// served nested, and its helper makes its own user, mount and pid
// namespaces in there before it installs the filter that blocks unix
// sockets.
for_each_caller!(the_sandbox_runtime_works_inside_in_its_default_settings, |caller: Caller| {
    let Some(dir) = sandbox_runtime() else { return };
    let f = Fixture::new(caller);
    let out = srt(&f, &dir, &[], "echo srt-ran-$((6 * 7))");
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "srt-ran-42", "{}", stderr(&out));
    // The unix-socket block is srt's own filter at work.
    let socket = "python3 -c 'import socket; socket.socket(socket.AF_UNIX)'";
    let out = srt(&f, &dir, &[], socket);
    assert!(!out.status.success(), "a unix socket was created under srt");
    assert!(stderr(&out).contains("PermissionError: [Errno 1] Operation not permitted"), "{}", stderr(&out));
    // Its filesystem policy: the workspace is not among its writable paths.
    let out = srt(&f, &dir, &[], "echo x > /workspace/written-by-srt");
    assert!(!out.status.success(), "srt let a write through");
    assert!(stderr(&out).contains("Read-only file system"), "{}", stderr(&out));
    assert!(!f.workspace.join("written-by-srt").exists());
    // Not vacuous: without the command's own namespaces, srt's helper
    // fails as it did before they were allowed.
    let out = srt(&f, &dir, &["--nested-userns", "off"], "echo srt-ran");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("apply-seccomp: unshare(CLONE_NEWUSER): Operation not permitted"),
        "{}",
        stderr(&out)
    );
});

/// Starts nested sandboxes and, meanwhile, opens the `environ`, `maps` and
/// `mem` of every process that appears next to them and reads them for the
/// caller's secret (whose two halves are its first arguments, so that its
/// own command line, in every copy of the launcher, does not hold it).
const STEAL: &str = r#"
import os, subprocess, sys
secret = (sys.argv[1] + sys.argv[2]).encode()
opened, found = 0, set()
def scan(env, maps, mem):
    hits = set()
    if secret in os.read(env, 1 << 20):
        hits.add("environ")
    text = b""
    while chunk := os.read(maps, 65536):
        text += chunk
    for line in text.decode().splitlines():
        (lo, hi), perms = line.split()[0].split("-"), line.split()[1]
        lo, hi = int(lo, 16), int(hi, 16)
        if "r" in perms and hi - lo <= 64 << 20:
            try:
                os.lseek(mem, lo, 0)
                if secret in os.read(mem, hi - lo):
                    hits.add("mem")
            except OSError:
                pass
    return hits
for _ in range(int(sys.argv[3])):
    p = subprocess.Popen(["bwrap", "--ro-bind", "/", "/", "--unshare-user", "--", "/bin/true"])
    while p.poll() is None:
        for pid in range(p.pid + 1, p.pid + 6):
            try:
                fds = [os.open(f"/proc/{pid}/{n}", os.O_RDONLY) for n in ("environ", "maps", "mem")]
            except OSError:
                continue
            opened += 1
            try:
                found |= scan(*fds)
            except OSError:
                pass
            for fd in fds:
                os.close(fd)
    p.wait()
print("found=" + ",".join(sorted(found)))
"#;

// Without Landlock nothing but dumpability keeps the outer command out of
// the portal's processes, each a copy of the launcher's memory with the
// caller's environment: a nested sandbox's PID 1 that was dumpable while it
// wrote its id maps showed it (`environ`) to a command racing it.
for_each_caller!(nested_sandboxes_show_the_command_nothing_of_the_callers_environment, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.workspace.join("steal.py"), STEAL).unwrap();
    let (head, tail) = common::LEAK_MARKER.1.split_at(6);
    let out = f.run(&["--landlock", "off"], &["python3", "/workspace/steal.py", head, tail, "100"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "found=\n", "{}", stderr(&out));
});

// A nested sandbox's tmpfs, and its root, which stays writable, are memory
// like the sandbox's own: no larger than `--tmpfs-size`, whatever `--size`
// asks for (a smaller one is kept).
#[test]
fn nested_tmpfs_are_no_larger_than_the_sandboxs() {
    let f = Fixture::new(Caller::Unprivileged);
    let fill = |path: &str| format!("head -c 20000000 /dev/zero > {path} 2>/dev/null; stat -c %s {path}");
    let root = "--ro-bind /usr /usr --dev /dev --symlink usr/bin /bin --symlink usr/lib /lib \
                --symlink usr/lib64 /lib64";
    let script = [
        format!("bwrap --ro-bind / / --dev /dev --size 67108864 --tmpfs /tmp -- sh -c '{}'", fill("/tmp/f")),
        format!("bwrap --ro-bind / / --dev /dev --size 1000000 --tmpfs /tmp -- sh -c '{}'", fill("/tmp/f")),
        format!("bwrap --ro-bind / / --dev /dev --tmpfs /tmp -- sh -c '{}'", fill("/tmp/f")),
        format!("bwrap {root} -- sh -c '{}'", fill("/big")),
    ]
    .join("; ");
    // Landlock would keep the nested command from writing to its root.
    let out = f.run(&["--tmpfs-size", "8M", "--landlock", "off"], &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pages = |n: u64| n.div_ceil(4096) * 4096;
    let want = [8 << 20, pages(1_000_000), 8 << 20, 8 << 20].map(|n: u64| n.to_string()).join("\n") + "\n";
    assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{}", stderr(&out));
}

#[test]
fn nested_off_leaves_bwrap_out() {
    let f = Fixture::new(Caller::Root);
    let script = "echo \"$PATH\"; ls -A /run/tuixiu 2>&1; true";
    let out = f.run(&["--nested", "off"], &["sh", "-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("/run/tuixiu/bin"), "{text}");
    assert!(text.contains("No such file or directory"), "{text}");
    // On, the front end is first on PATH.
    let out = f.run(
        &[],
        &["sh", "-c", "command -v bwrap; bwrap --version; bwrap --help | grep -c -- --tx-landlock"],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, "/run/tuixiu/bin/bwrap\nbubblewrap 0.11.1\n1\n");
}

#[test]
fn the_hosts_own_bwrap_is_covered_by_the_front_end() {
    // scripts/ci-setup.d/40-bubblewrap.sh installs bubblewrap: agents that
    // call /usr/bin/bwrap by path get ours too.
    assert!(std::path::Path::new("/usr/bin/bwrap").exists(), "install bubblewrap (scripts/ci-setup.d)");
    let f = Fixture::new(Caller::Unprivileged);
    // Ours lists its own options after bubblewrap's.
    let out = f.run(&[], &["/usr/bin/bwrap", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--tx-landlock"));
    let out = f.run(&["--nested", "off"], &["/usr/bin/bwrap", "--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: /usr/bin/bwrap"), "the host's own");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("--tx-landlock"));
}

#[test]
fn at_most_sixteen_nested_sandboxes_at_once() {
    let f = Fixture::new(Caller::Root);
    // Sixteen nested sandboxes that wait for a file, then a seventeenth.
    let script = "for i in $(seq 16); do bwrap --ro-bind / / --bind /workspace /workspace -- sh -c \
                  \"touch /workspace/up-$i; while [ ! -e /workspace/go ]; do sleep 0.05; done\" & done; \
                  while [ $(ls /workspace | grep -c up-) -lt 16 ]; do sleep 0.05; done; \
                  bwrap --ro-bind / / -- true; echo \"rc=$?\"; touch /workspace/go; wait";
    let out = f.run(&[], &["sh", "-c", script]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rc=1"), "{text}");
    assert!(
        stderr(&out).contains("bwrap: too many nested sandboxes at once (at most 16 per sandbox)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_front_end_outside_a_sandbox_runs_it_on_the_host() {
    // No portal: the launcher runs the request itself (tests/bwrap_host.rs).
    let f = Fixture::new(Caller::Root);
    let out = f.command(&["bwrap", "--ro-bind", "/", "/", "--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // --help works anywhere, bubblewrap's then ours.
    let out = f.command(&["bwrap", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.starts_with("usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]"), "{help}");
    assert!(help.contains("\n    --tx-seccomp PROFILE "), "{help}");
}

/// `pid` and every process below it, by parent pid.
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        let children: Vec<u32> =
            all.iter().copied().filter(|&c| parent_of(c) == Some(p) && !found.contains(&c)).collect();
        found.extend(children);
        i += 1;
    }
    found
}

/// Whether `pid` has ended (gone, or a zombie waiting for its reaper).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

// The caller's lifeline (`__exec --lifeline-fd`, how the daemon's sandboxes
// die with it) ends the nested sandboxes too: its hang-up kills PID 1, the
// sandbox's pid namespace (the portal's acceptor and workers, the nested
// sandboxes) goes with it, and the launcher ends the portal's server.
for_each_caller!(the_lifeline_ends_nested_sandboxes_too, |caller: Caller| {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let f = Fixture::new(caller);
    let token = format!("lifeline-nested-{}-{caller:?}", std::process::id());
    let script = format!("bwrap --ro-bind / / -- sh -c 'sleep 300; :' {token}; echo not-killed");
    let spec = sandbox::SandboxBuilder::new("sh").args(["-c", &script]).build().unwrap();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let ((spec_r, spec_w), (life_r, life_w)) = (pipe(), pipe());
    let mut cmd = f.command(&["__exec", "--spec-fd", "3", "--lifeline-fd", "4"]);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let (spec_raw, life_raw) = (spec_r.as_raw_fd(), life_r.as_raw_fd());
    let onto_3_and_4 = move || {
        // Out of the way first (close-on-exec copies), then onto 3 and 4.
        // SAFETY: fcntl and dup2 on descriptor numbers; no memory is touched.
        let spec = unsafe { libc::fcntl(spec_raw, libc::F_DUPFD_CLOEXEC, 10) };
        // SAFETY: as above.
        let life = unsafe { libc::fcntl(life_raw, libc::F_DUPFD_CLOEXEC, 10) };
        // SAFETY: as above.
        if spec < 0 || life < 0 || unsafe { libc::dup2(spec, 3) } < 0 || unsafe { libc::dup2(life, 4) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: only fcntl/dup2 (async-signal-safe) run between fork and exec.
    unsafe { cmd.pre_exec(onto_3_and_4) };
    let child = cmd.spawn().unwrap();
    drop((spec_r, life_r));
    std::fs::File::from(spec_w).write_all(&spec.to_json()).unwrap();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while nested_support::processes_with(&token).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the nested sandbox did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The launcher, PID 1, the command, the portal's server, acceptor and
    // worker, the nested PID 1 and its command. (The token shows in the
    // front end's arguments before the worker has forked: wait for them.)
    let mut tree = descendants(child.id());
    while tree.len() < 7 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        tree = descendants(child.id());
    }
    assert!(tree.len() >= 7, "{tree:?}");

    drop(life_w);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("not-killed"));
    nested_support::assert_nothing_left_running(&token);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !tree.iter().all(|&p| ended(p)) {
        let left: Vec<u32> = tree.iter().copied().filter(|&p| !ended(p)).collect();
        assert!(std::time::Instant::now() < deadline, "still running: {left:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
});

// The options of `bwrap` on the host (docs/bwrap.md, "Options") are served
// nested too, through the portal.
for_each_caller!(data_overlay_seccomp_and_pid_1_options_nested, |caller: Caller| {
    let f = Fixture::new(caller);
    let bpf = "import errno, seccomp\n\
               f = seccomp.SyscallFilter(seccomp.ALLOW)\n\
               f.add_rule(seccomp.ERRNO(errno.EACCES), 'mkdir')\n\
               f.add_rule(seccomp.ERRNO(errno.EACCES), 'mkdirat')\n\
               f.export_bpf(open('deny-mkdir.bpf', 'wb'))\n";
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", bpf])
        .current_dir(&f.workspace)
        .output()
        .unwrap();
    assert!(out.status.success(), "python3-seccomp: {}", stderr(&out));
    std::fs::create_dir_all(f.workspace.join("lower")).unwrap();
    std::fs::write(f.workspace.join("lower/a"), "lower\n").unwrap();
    std::fs::write(f.workspace.join("data"), "payload\n").unwrap();
    // The caller's, as its own files would be (overlayfs copies a file up
    // with its owner, which must be mapped in the sandbox).
    for path in ["lower", "lower/a", "data", "deny-mkdir.bpf"] {
        let uid = Some(caller.host_uid());
        std::os::unix::fs::chown(f.workspace.join(path), uid, uid).unwrap();
    }
    let script = "cd /workspace; \
        bwrap --ro-bind / / --tmpfs /tmp --file 3 /tmp/f --perms 0640 --ro-bind-data 4 /tmp/r --dir /tmp/d \
          --chmod 0700 /tmp/d --overlay-src /workspace/lower --tmp-overlay /tmp/o --unshare-ipc --mqueue /tmp/mq \
          --lock-file /tmp/f -- sh -c 'stat -c \"%n %a\" /tmp/f /tmp/r /tmp/d; cat /tmp/f /tmp/o/a; \
          echo up > /tmp/o/a; cat /tmp/o/a; grep -c \" /tmp/mq \" /proc/self/mountinfo' 3<data 4<data; \
        cat lower/a; \
        bwrap --ro-bind / / --tmpfs /tmp --seccomp 3 -- mkdir /tmp/x 3<deny-mkdir.bpf 2>&1; echo rc=$?; \
        bwrap --ro-bind / / --unshare-pid --as-pid-1 -- sh -c 'echo pid=$$'; \
        { sleep 0.3; echo go; } | bwrap --ro-bind / / --block-fd 0 -- echo unblocked";
    let text = f.sh(&[], script);
    assert_eq!(
        text,
        "/tmp/f 666\n/tmp/r 640\n/tmp/d 700\npayload\nlower\nup\n1\nlower\n\
         mkdir: cannot create directory '/tmp/x': Permission denied\nrc=1\npid=1\nunblocked\n"
    );
});

// The helper that makes a nested user namespace (docs/security.md, "The
// sandbox's PID 1") is let go without PID 1 waiting for it; with
// `--as-pid-1` nothing reaps it after the `execve`, so PID 1 reaps it
// first: the command, PID 1 of its pid namespace, sees no other process
// (a shell's glob, no fork of its own), zombie or not.
for_each_caller!(a_pid_1_command_inherits_no_user_namespace_helper, |caller: Caller| {
    let f = Fixture::new(caller);
    let script = "for i in 1 2 3; do \
          bwrap --ro-bind / / --unshare-user --unshare-pid --proc /proc --as-pid-1 -- \
            sh -c 'set -- /proc/[0-9]*; echo \"$*\"'; \
        done";
    let text = f.sh(&[], script);
    assert_eq!(text, "/proc/1\n/proc/1\n/proc/1\n");
});

// Inside a nested sandbox there is no portal: the front end (bound over
// the host's /usr/bin/bwrap) tries to build the sandbox itself, as on the
// host, and says why the sandbox's seccomp profile refuses it.
#[test]
fn a_bwrap_without_portal_says_a_seccomp_filter_refused() {
    assert!(std::path::Path::new("/usr/bin/bwrap").exists(), "install bubblewrap (scripts/ci-setup.d)");
    let f = Fixture::new(Caller::Unprivileged);
    // (With the nested command's own namespaces allowed, the default, that
    // bwrap gets further: docs/bwrap.md, "Differences from bubblewrap
    // (nested)".)
    let script = "bwrap --ro-bind / / -- /usr/bin/bwrap --ro-bind / / true 2>&1; echo rc=$?";
    let text = f.sh(&["--nested-userns", "off"], script);
    assert!(text.starts_with("bwrap: No permissions to create a new namespace"), "{text}");
    assert!(text.contains("this process runs under a seccomp filter"), "{text}");
    assert!(text.ends_with("rc=1\n"), "{text}");
}
