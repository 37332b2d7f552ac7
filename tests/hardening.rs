//! Sandbox hardening, observed from inside real sandboxes started by the
//! real binary, for every kind of caller (root, unprivileged, nested):
//! capabilities, no_new_privs, seccomp (each denied syscall called
//! harmlessly), Landlock, host secrets, the network policy, limits, bad
//! profiles, `--landlock require`, and toolchains under the default profile.
//!
//! Each denial is checked against the same call with the filter (or
//! Landlock) off, so a test cannot pass because the call fails anyway.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Output, Stdio};

use common::{Caller, Fixture, stderr};

/// Calls each syscall with arguments that make an *allowed* call fail
/// harmlessly (bad pointers, fds, pids or flag combinations), and prints
/// `name errno` lines. Run inside the sandbox with python3's ctypes.
const PROBE: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
BAD_FD = 0x7ffffff0
calls = {
    # CLONE_NEWUSER|CLONE_FS is an invalid combination: EINVAL when allowed.
    "clone_newuser": (56, 0x10000000 | 0x200, 0, 0, 0, 0),
    "clone3": (435, 0, 0),
    "unshare": (272, 0x1),
    "setns": (308, BAD_FD, 0),
    "mount": (165, 0, 0, 0, 0, 0),
    "umount2": (166, 0, 0),
    "pivot_root": (155, 0, 0),
    "chroot": (161, 0),
    "fsopen": (430, 0, 0),
    "keyctl": (250, 0x7fff, 0, 0, 0, 0),
    "add_key": (248, 0, 0, 0, 0, 0),
    "bpf": (321, 0x7fff, 0, 0),
    "perf_event_open": (298, 0, 0, 0, BAD_FD, 0),
    "userfaultfd": (323, 0xffff),
    "io_uring_setup": (425, 0, 0),
    "kexec_load": (246, 0, 0, 0, 0),
    "init_module": (175, 0, 0, 0),
    "open_by_handle_at": (304, BAD_FD, 0, 0),
    "ptrace": (101, 2, 0x7ffffff0, 0, 0),
    "process_vm_readv": (310, 0x7ffffff0, 0, 0, 0, 0, 0),
    # TIOCSTI with garbage in the upper 32 bits, on a bad fd: EBADF when allowed.
    "ioctl_tiocsti_high_bits": (16, BAD_FD, 0xdeadbeef00005412, 0),
    "ioctl_tioclinux": (16, BAD_FD, 0x541C, 0),
    "ioctl_other": (16, BAD_FD, 0x5413, 0),
    "socket_vsock": (41, 40, 1, 0),
}
for name, args in calls.items():
    print(name, call(*args))
"#;

/// What the default profile must answer, and whether the unfiltered call
/// is known to answer something else inside the sandbox (so the check is
/// not vacuous).
const EXPECTED: &[(&str, &str)] = &[
    ("clone_newuser", "EPERM"),
    ("clone3", "ENOSYS"),
    ("unshare", "EPERM"),
    ("setns", "EPERM"),
    ("mount", "EPERM"),
    ("umount2", "EPERM"),
    ("pivot_root", "EPERM"),
    ("chroot", "EPERM"),
    ("fsopen", "ENOSYS"),
    ("keyctl", "EPERM"),
    ("add_key", "EPERM"),
    ("bpf", "EPERM"),
    ("perf_event_open", "EPERM"),
    ("userfaultfd", "EPERM"),
    ("io_uring_setup", "ENOSYS"),
    ("kexec_load", "EPERM"),
    ("init_module", "EPERM"),
    ("open_by_handle_at", "EPERM"),
    ("ptrace", "EPERM"),
    ("process_vm_readv", "EPERM"),
    ("ioctl_tiocsti_high_bits", "EPERM"),
    ("ioctl_tioclinux", "EPERM"),
    ("ioctl_other", "EBADF"),
    ("socket_vsock", "EAFNOSUPPORT"),
];

fn probe(f: &Fixture, extra: &[&str]) -> BTreeMap<String, String> {
    std::fs::write(f.workspace.join("probe.py"), PROBE).unwrap();
    let out = f.run(extra, &["python3", "probe.py"]);
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    common::pairs(&out.stdout).into_iter().collect()
}

fn status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

for_each_caller!(command_has_no_privileges, |caller: Caller| {
    let f = Fixture::new(caller);
    let status = f.sh(&[], "cat /proc/self/status");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    assert_eq!(status_field(&status, "Seccomp"), "2");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(&status, cap), "0000000000000000", "{cap}");
    }
    // The reaper (PID 1) kept nothing either.
    let init = f.sh(&[], "cat /proc/1/status");
    assert_eq!(status_field(&init, "CapEff"), "0000000000000000");
    assert_eq!(status_field(&init, "CapBnd"), "0000000000000000");
    assert_eq!(status_field(&init, "NoNewPrivs"), "1");
});

for_each_caller!(default_profile_denies_dangerous_syscalls, |caller: Caller| {
    let f = Fixture::new(caller);
    let filtered = probe(&f, &[]);
    let unfiltered = probe(&f, &["--seccomp", "unconfined"]);
    for (name, want) in EXPECTED {
        assert_eq!(filtered.get(*name).map(String::as_str), Some(*want), "{name} under the default profile");
    }
    // Calls that fail differently without the filter prove the filter is
    // what answered (others, e.g. bpf, may be refused by the kernel for an
    // unprivileged caller anyway).
    for name in [
        "clone_newuser",
        "clone3",
        "unshare",
        "setns",
        "mount",
        "fsopen",
        "io_uring_setup",
        "ptrace",
        "ioctl_tiocsti_high_bits",
        "open_by_handle_at",
    ] {
        assert_ne!(filtered[name], unfiltered[name], "{name}: the same answer without the filter");
    }
    // --allow-ptrace lets ptrace through (ESRCH: no such process).
    let allowed = probe(&f, &["--allow-ptrace"]);
    assert_eq!(allowed["ptrace"], "ESRCH");
    assert_eq!(allowed["mount"], "EPERM");
});

for_each_caller!(x32_syscalls_kill_the_process, |caller: Caller| {
    let f = Fixture::new(caller);
    let x32_getpid = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')";
    let out = f.run(&[], &["python3", "-c", x32_getpid]);
    assert_eq!(out.status.code(), Some(128 + libc::SIGSYS), "stderr: {}", stderr(&out));
    assert!(out.stdout.is_empty());
    // Without the filter the kernel just says ENOSYS (or runs it).
    let out = f.run(&["--seccomp", "unconfined"], &["python3", "-c", x32_getpid]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "survived", "{}", stderr(&out));
});

for_each_caller!(landlock_denies_paths_outside_the_view, |caller: Caller| {
    let f = Fixture::new(caller);
    // A host file and directory outside the sandbox's view, readable by the
    // caller, reached through a descriptor the sandbox inherits (stdin) and
    // re-opened by path through /proc/self/fd.
    let secret_dir = f.dir.join("outside");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("secret.txt"), "host-only\n").unwrap();
    let run_with_stdin = |landlock: &str, stdin: &std::path::Path, script: &str| -> Output {
        let ws = f.workspace.to_str().unwrap().to_string();
        let mut cmd =
            f.command(&["run", "--workspace", &ws, "--landlock", landlock, "--", "sh", "-c", script]);
        cmd.stdin(std::fs::File::open(stdin).unwrap());
        cmd.output().unwrap()
    };
    let reopen_file = "cat /proc/self/fd/0";
    let denied = run_with_stdin("best-effort", &secret_dir.join("secret.txt"), reopen_file);
    assert!(
        !denied.status.success(),
        "re-opening a host file worked: {}",
        String::from_utf8_lossy(&denied.stdout)
    );
    assert!(stderr(&denied).contains("Permission denied"), "{}", stderr(&denied));
    let allowed = run_with_stdin("off", &secret_dir.join("secret.txt"), reopen_file);
    assert_eq!(String::from_utf8_lossy(&allowed.stdout), "host-only\n", "{}", stderr(&allowed));

    let through_dir = "cat /proc/self/fd/0/secret.txt";
    let denied = run_with_stdin("best-effort", &secret_dir, through_dir);
    assert!(!denied.status.success(), "a host directory fd leaked its files");
    let allowed = run_with_stdin("off", &secret_dir, through_dir);
    assert_eq!(String::from_utf8_lossy(&allowed.stdout), "host-only\n", "{}", stderr(&allowed));

    // Renames across directories inside the workspace keep working (REFER).
    let out =
        f.sh(&[], "mkdir -p a/deep b && echo x > a/deep/f && mv a/deep/f b/f && mv a/deep b/deep && ls b");
    assert_eq!(out, "deep\nf\n");
    // And writes outside the writable mounts are refused.
    let out = f.run(&[], &["sh", "-c", "echo x > /etc/new-file"]);
    assert!(!out.status.success());
});

for_each_caller!(host_secrets_stay_unreadable, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.run(&[], &["cat", "/etc/shadow"]);
    assert!(!out.status.success(), "/etc/shadow was readable: {}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr(&out).contains("Permission denied"), "{}", stderr(&out));
    if std::path::Path::new("/etc/ssl/private").exists() {
        let out = f.run(&[], &["ls", "/etc/ssl/private"]);
        assert!(!out.status.success(), "listing /etc/ssl/private worked");
    }
    // World-readable system files still are.
    assert!(f.sh(&[], "cat /etc/hostname").len() > 1);
    assert!(f.sh(&[], "ls /usr/bin").contains("sh\n"));
});

/// Where idmapped mounts are impossible, a root caller's view masks what a
/// scan of /etc finds instead (forced here with the test-only knob).
#[test]
fn host_secrets_masked_without_idmapped_mounts() {
    let f = Fixture::new(Caller::Root);
    let ws = f.workspace.to_str().unwrap().to_string();
    let out = f
        .command(&[
            "-v",
            "run",
            "--workspace",
            &ws,
            "--",
            "sh",
            "-c",
            "cat /etc/shadow; ls /etc/ssl/private; cat /etc/hostname",
        ])
        .env(sandbox::idmap::TEST_NO_IDMAP_ENV, "1")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(err.contains("masking"), "{err}");
    assert!(err.contains("/etc/shadow: Permission denied"), "{err}");
    if std::path::Path::new("/etc/ssl/private").exists() {
        assert!(err.contains("/etc/ssl/private': Permission denied"), "{err}");
    }
    assert!(!String::from_utf8_lossy(&out.stdout).contains("root:"), "shadow leaked");
    assert!(!out.stdout.is_empty(), "world-readable /etc/hostname should be readable");
}

for_each_caller!(pids_limit_is_enforced_or_reported, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.run(
        &["--pids", "5"],
        &["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 1 & done; wait; echo all-started"],
    );
    let err = stderr(&out);
    if caller == Caller::Root {
        // Host root is exempt from RLIMIT_NPROC and no cgroup is writable
        // here (unless one is): never claimed, said on stderr.
        assert!(err.contains("--pids 5: NOT applied") || err.contains("pids.max=5"), "{err}");
    } else {
        assert!(err.contains("RLIMIT_NPROC=5") || err.contains("pids.max=5"), "{err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("all-started"),
            "8 processes started under --pids 5"
        );
    }
});

for_each_caller!(network_off_keeps_loopback_and_none_has_no_ip, |caller: Caller| {
    let f = Fixture::new(caller);
    let script = r#"
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
c = socket.create_connection(s.getsockname(), timeout=2); a, _ = s.accept(); c.sendall(b"hi"); print("loopback", a.recv(2).decode())
try:
    socket.create_connection(("192.0.2.1", 9), timeout=2); print("outside connected")
except OSError as e:
    print("outside", e.errno)
"#;
    std::fs::write(f.workspace.join("net.py"), script).unwrap();
    let out = f.sh(&["--network", "off"], "python3 net.py");
    assert!(out.contains("loopback hi\n"), "{out}");
    assert!(out.contains(&format!("outside {}\n", libc::ENETUNREACH)), "{out}");
    // `none`: not even an IP socket can be made.
    let out = f.run(&["--network", "none"], &["python3", "-c", "import socket; socket.socket()"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Address family not supported"), "{}", stderr(&out));
    let out = f.sh(
        &["--network", "none"],
        "python3 -c 'import socket; a, b = socket.socketpair(); a.send(b\"u\"); print(b.recv(1))'",
    );
    assert_eq!(out, "b'u'\n");
});

for_each_caller!(memory_and_timeout_limits, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.run(
        &["--memory", "64M"],
        &["python3", "-c", "b = bytearray(256 * 1024 * 1024); print('allocated')"],
    );
    assert!(!out.status.success(), "a 256 MiB allocation succeeded under --memory 64M");
    assert!(out.stdout.is_empty());
    // Small allocations still work.
    f.sh(&["--memory", "64M"], "python3 -c 'b = bytearray(8 * 1024 * 1024)'");

    let start = std::time::Instant::now();
    let out = f.run(&["--timeout", "300ms", "--kill-after", "1s"], &["sleep", "30"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    assert!(stderr(&out).contains("--timeout"), "{}", stderr(&out));
    // A command that ignores SIGTERM is killed after the grace period.
    let out =
        f.run(&["--timeout", "200ms", "--kill-after", "300ms"], &["sh", "-c", "trap '' TERM; sleep 30"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(start.elapsed() < std::time::Duration::from_secs(20));

    let out = f.run(&["--nofile", "64"], &["sh", "-c", "ulimit -n"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "64", "{}", stderr(&out));
});

for_each_caller!(toolchains_work_under_the_default_profile, |caller: Caller| {
    let f = Fixture::new(caller);
    f.sh(
        &[],
        "git init -q repo && cd repo && echo hi > f && git add f && \
         git -c user.email=agent@sandbox -c user.name=agent commit -q -m first && git log --oneline | grep -q first",
    );
    f.sh(&[], "python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c 'import sys; assert sys.prefix == \"/tmp/venv\"'");
    if caller == Caller::Root {
        // With pip (ensurepip), which is slower: once.
        f.sh(&[], "python3 -m venv /tmp/venv2 && /tmp/venv2/bin/python -m pip --version");
    }
    match std::process::Command::new("npm").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let v = f.sh(&[], "npm --version");
            assert_eq!(v, String::from_utf8_lossy(&o.stdout));
        }
        _ => eprintln!("skipping npm: not installed on this host"),
    }
});

/// cargo is installed per user (rustup under /root here): bind the root
/// caller's toolchain in read-only and build a fresh crate.
#[test]
fn cargo_new_and_build_under_the_default_profile() {
    let (cargo_bin, rustup) =
        (std::path::Path::new("/root/.cargo/bin"), std::path::Path::new("/root/.rustup"));
    if !cargo_bin.join("cargo").exists() || !rustup.is_dir() {
        eprintln!("skipping cargo: no rustup toolchain under /root on this host");
        return;
    }
    let f = Fixture::new(Caller::Root);
    let out = f.sh(
        &[
            "--ro-bind",
            "/root/.cargo/bin",
            "/rust/cargo-bin",
            "--ro-bind",
            "/root/.rustup",
            "/rust/rustup",
            "--env",
            "RUSTUP_HOME=/rust/rustup",
            "--env",
            "CARGO_HOME=/home/agent/.cargo",
            "--env",
            "PATH=/rust/cargo-bin:/usr/local/bin:/usr/bin:/bin",
            "--env-allow",
            "RUSTUP_HOME",
            "--env-allow",
            "CARGO_HOME",
            "--env-allow",
            "PATH",
        ],
        "cargo new -q hello && cd hello && cargo build -q --offline && ./target/debug/hello",
    );
    assert_eq!(out, "Hello, world!\n");
}

for_each_caller!(bad_profiles_and_landlock_require_exit_125, |caller: Caller| {
    let f = Fixture::new(caller);
    let cases: &[(&str, &str, &str)] = &[
        ("broken.json", "{\"defaultAction\": ", "invalid JSON"),
        (
            "unknown-syscall.json",
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["getpid"],"action":"SCMP_ACT_ERRNO"},{"names":["frobnicate"],"action":"SCMP_ACT_ERRNO"}]}"#,
            "syscalls[1] (\"frobnicate\"): unknown syscall \"frobnicate\"",
        ),
        (
            "unknown-action.json",
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["getpid"],"action":"SCMP_ACT_MAYBE"}]}"#,
            "syscalls[0] (\"getpid\"): unknown action \"SCMP_ACT_MAYBE\"",
        ),
    ];
    for (name, json, want) in cases {
        let path = f.dir.join(name);
        std::fs::write(&path, json).unwrap();
        let out = f.run(&["--seccomp", path.to_str().unwrap()], &["touch", "/workspace/started"]);
        assert_eq!(out.status.code(), Some(125), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&format!("seccomp profile {}", path.display())), "{err}");
        assert!(err.contains(want), "{err:?} lacks {want:?}");
        assert!(!f.workspace.join("started").exists(), "the command ran with a broken profile");
    }
    let out = f.run(&["--seccomp", "nonesuch"], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("no such built-in profile"), "{}", stderr(&out));

    // A kernel without Landlock, simulated (test-only knob, see landlock.rs).
    let ws = f.workspace.to_str().unwrap().to_string();
    let no_landlock = |mode: &str| {
        f.command(&["run", "--workspace", &ws, "--landlock", mode, "--", "true"])
            .env(sandbox::landlock::TEST_ABI_ENV, "0")
            .output()
            .unwrap()
    };
    let out = no_landlock("require");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("--landlock require"), "{}", stderr(&out));
    let out = no_landlock("best-effort");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("landlock: not enforced"), "{}", stderr(&out));
    // ABI 3 (no scoping, no device ioctls): partial, so `require` refuses too.
    let out = f
        .command(&["run", "--workspace", &ws, "--landlock", "require", "--", "true"])
        .env(sandbox::landlock::TEST_ABI_ENV, "3")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("partially enforced"), "{}", stderr(&out));
});

for_each_caller!(strict_profile_runs_a_shell_and_python, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.sh(
        &["--seccomp", "strict"],
        "echo hi > x && cat x && python3 -c 'print(1 + 1)' && ls / > /dev/null",
    );
    assert_eq!(out, "hi\n2\n");
    // No ptrace under strict, and the switch still lifts it.
    std::fs::write(f.workspace.join("probe.py"), PROBE).unwrap();
    let out = f.sh(&["--seccomp", "strict"], "python3 probe.py");
    assert!(out.contains("ptrace EPERM\n"), "{out}");
    assert!(out.contains("clone3 ENOSYS\n"), "{out}");
});

for_each_caller!(check_says_run_works, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = f.command(&["check", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runWorks"], true);
    let checks = v["checks"].as_array().unwrap();
    for name in [
        "user namespaces",
        "Landlock",
        "seccomp",
        "mount /proc",
        "sandbox",
        "cgroup v2 delegation",
        "docker daemon",
    ] {
        assert!(checks.iter().any(|c| c["check"] == name), "no {name} row");
    }
    let table = f.command(&["check"]).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("tuixiu-sandbox run works on this host."));
});

#[test]
fn stdout_carries_only_the_command_output() {
    // Diagnostics (the limit and Landlock lines) go to stderr.
    let f = Fixture::new(Caller::Root);
    let mut cmd = f.command(&[
        "-v",
        "run",
        "--workspace",
        f.workspace.to_str().unwrap(),
        "--memory",
        "512M",
        "--cpus",
        "1",
        "--",
        "sh",
        "-c",
        "read x; echo got $x",
    ]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"line\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got line\n");
    let err = stderr(&out);
    assert!(err.contains("landlock: fully enforced") || err.contains("landlock:"), "{err}");
    // Whatever was not applied is said in one line, never claimed.
    assert!(err.contains("--cpus 1: NOT applied") || err.contains("cpu.max="), "{err}");
}

/// Hardening options that only the plain native sandbox honours are refused
/// elsewhere rather than silently ignored.
#[test]
fn hardening_flags_are_refused_where_they_would_be_ignored() {
    let f = Fixture::new(Caller::Root);
    for extra in [
        &["--provider", "docker", "--seccomp", "strict"][..],
        &["--provider", "docker", "--landlock", "require"],
        &["--instance-name", "tuixiu-hardening-test", "--timeout", "5s"],
    ] {
        let out = f.run(extra, &["true"]);
        assert_eq!(out.status.code(), Some(125), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("applies to the plain native sandbox only"), "{}", stderr(&out));
    }
}

// Every private tmpfs is sized: 1 GiB by default, `--tmpfs-size` to choose;
// writing past it fails with ENOSPC instead of taking the host's memory.
for_each_caller!(private_tmpfs_mounts_are_sized, |caller: Caller| {
    let f = Fixture::new(caller);
    let sizes =
        f.sh(&["--tmpfs", "/extra"], "for d in /tmp /dev/shm $HOME /extra; do stat -f -c '%b %S' $d; done");
    for line in sizes.lines() {
        let (blocks, block_size) = line.split_once(' ').unwrap();
        let bytes: u64 = blocks.parse::<u64>().unwrap() * block_size.parse::<u64>().unwrap();
        assert_eq!(bytes, 1 << 30, "{sizes}");
    }
    let script = "for d in /tmp /dev/shm $HOME /extra; do \
                  head -c 5000000 /dev/zero > $d/fill 2>/dev/null; echo $d $?; rm -f $d/fill; done; \
                  head -c 3000000 /dev/zero > /tmp/fits && echo fits";
    let out = f.sh(&["--tmpfs", "/extra", "--tmpfs-size", "4M"], script);
    let home = "/home/agent";
    assert_eq!(out, format!("/tmp 1\n/dev/shm 1\n{home} 1\n/extra 1\nfits\n"));
    // The error the writer sees is ENOSPC.
    let err = f.run(&["--tmpfs-size", "1M"], &["sh", "-c", "head -c 2000000 /dev/zero > /tmp/big"]);
    assert!(stderr(&err).contains("No space left on device"), "{}", stderr(&err));
});

/// `check --json` as `caller`, with `env` and an optional wrapper between
/// the user switch and the binary (e.g. `prlimit`).
fn check_json(caller: Caller, env: &[(&str, &str)], wrapper: &[&str]) -> (Option<i32>, serde_json::Value) {
    let bin = common::binary().to_str().unwrap().to_string();
    let mut args: Vec<&str> = wrapper.to_vec();
    args.extend([bin.as_str(), "check", "--json"]);
    let mut cmd = if wrapper.is_empty() {
        caller.command(common::binary(), &["check", "--json"])
    } else {
        caller.command(std::path::Path::new(args[0]), &args[1..])
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    (out.status.code(), v)
}

fn check_row<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} row"))
}

// When `check` cannot even fork its probe, the user namespace row must not
// say ok. (RLIMIT_NPROC does not bind root, so root is not tried.)
#[test]
fn check_reports_a_probe_it_could_not_run() {
    for caller in [Caller::Unprivileged, Caller::Nested] {
        let (code, v) = check_json(caller, &[], &["prlimit", "--nproc=1:1", "--"]);
        let row = check_row(&v, "user namespaces");
        assert_eq!(row["status"], "fail", "{caller:?}: {row}");
        assert!(row["detail"].as_str().unwrap().contains("fork() => EAGAIN"), "{caller:?}: {row}");
        assert_eq!(code, Some(1), "{caller:?}: {v}");
    }
}

// The sandbox row says what the throwaway sandbox really had: no Landlock
// when the kernel has none.
for_each_caller!(check_sandbox_row_claims_only_the_landlock_it_had, |caller: Caller| {
    let (_, v) = check_json(caller, &[(sandbox::landlock::TEST_ABI_ENV, "0")], &[]);
    let detail = check_row(&v, "sandbox")["detail"].as_str().unwrap().to_string();
    assert!(detail.ends_with("without Landlock (unavailable)"), "{detail}");
    let (_, v) = check_json(caller, &[], &[]);
    let detail = check_row(&v, "sandbox")["detail"].as_str().unwrap().to_string();
    let abi = sandbox::landlock::probe_abi().unwrap();
    assert!(detail.ends_with(&format!("Landlock (ABI {abi})")), "{detail}");
});

// Without a pids controller, `--pids` falls back to RLIMIT_NPROC, except
// for a sandbox user that maps onto host root (a root caller's default),
// whom the kernel exempts: check must say so rather than claim the fallback.
for_each_caller!(check_tells_the_pids_fallback_truthfully, |caller: Caller| {
    let (_, v) = check_json(caller, &[], &[]);
    let row = check_row(&v, "cgroup v2 delegation");
    if row["status"] == "ok" {
        return; // every controller is delegated here: no fallback to describe
    }
    let hint = row["hint"].as_str().unwrap();
    // "DIR: only memory, cpu" lists what is usable; other details say why
    // none is.
    let detail = row["detail"].as_str().unwrap();
    let pids_missing = !detail.split_once(": only ").is_some_and(|(_, usable)| usable.contains("pids"));
    if caller == Caller::Root && pids_missing {
        assert!(hint.contains("--pids is not applied"), "{hint}");
        assert!(!hint.contains("--pids falls back"), "{hint}");
    } else if pids_missing {
        assert!(hint.contains("--pids falls back to RLIMIT_NPROC"), "{hint}");
    }
});
