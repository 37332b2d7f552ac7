//! `bwrap` on the host (docs/bwrap.md, "How it runs on the host"): the launcher
//! answering bubblewrap 0.11's command line outside any sandbox of ours,
//! through the runtime, as root, as uid 65534 and nested in `unshare -U -r`.
//! Expectations come from bwrap(1) and from what bubblewrap itself does on this
//! machine (the side-by-side test runs the host's bubblewrap on the same
//! lines).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Output, Stdio};

use common::{Caller, Fixture, binary, stderr};

/// Runs `sh -c SCRIPT` as the fixture's caller in its directory, with
/// `$BWRAP` naming our launcher called as `bwrap`.
fn sh(f: &Fixture, script: &str) -> Output {
    let link = f.dir.join("bin/bwrap");
    if !link.exists() {
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(binary(), &link).unwrap();
    }
    let mut cmd = f.caller.command(Path::new("/bin/sh"), &["-c", script]);
    cmd.current_dir(&f.workspace).stdin(Stdio::null()).env("BWRAP", &link);
    cmd.output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts success and returns stdout.
fn ok(f: &Fixture, script: &str) -> String {
    let out = sh(f, script);
    assert!(out.status.success(), "{script}: {:?}\n{}{}", out.status, stdout(&out), stderr(&out));
    stdout(&out)
}

/// The caller's mounts, to check that a failed run left nothing behind.
fn mounts(f: &Fixture) -> String {
    ok(f, "cat /proc/self/mountinfo | cut -d' ' -f5 | sort")
}

const ROOT_VIEW: &str = "--ro-bind / / --proc /proc --dev /dev";

for_each_caller!(runs_commands_in_bubblewraps_namespaces, |caller: Caller| {
    let f = Fixture::new(caller);
    // The user (bubblewrap maps the caller's uid onto itself), the pid
    // namespace with a reaper as PID 1, a private network with lo only.
    let text = ok(
        &f,
        &format!(
            "$BWRAP {ROOT_VIEW} --unshare-all -- sh -c 'id -u; echo $$; tail -n +3 /proc/net/dev | cut -d: -f1; \
             readlink /proc/self/ns/net' ; readlink /proc/self/ns/net"
        ),
    );
    let lines: Vec<&str> = text.lines().collect();
    let uid = if caller == Caller::Nested { 0 } else { caller.host_uid() };
    assert_eq!(lines[0], uid.to_string(), "{text}");
    assert_eq!(lines[1], "2", "{text}");
    assert_eq!(lines[2].trim(), "lo", "{text}");
    assert_ne!(lines[3], lines[4], "a new network namespace: {text}");
    // --uid/--gid inside a new user namespace, --hostname in a new uts.
    let text = ok(
        &f,
        &format!(
            "$BWRAP {ROOT_VIEW} --unshare-user --uid 4242 --gid 4343 --unshare-uts --hostname sandboxed \
             -- sh -c 'id -u; id -g; hostname; cat /proc/self/uid_map'"
        ),
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(&lines[..3], ["4242", "4343", "sandboxed"], "{text}");
    assert_eq!(lines[3].split_whitespace().collect::<Vec<_>>(), ["4242", &uid.to_string(), "1"], "{text}");
    // The environment options apply in order; --chdir; --argv0.
    let text = ok(
        &f,
        "A=1 B=2 $BWRAP --ro-bind / / --setenv C 3 --unsetenv A --chdir /usr --argv0 renamed \
         -- sh -c 'echo \"$0 ${A:-unset} $B $C $PWD\"; pwd'",
    );
    assert_eq!(text, "renamed unset 2 3 /usr\n/usr\n");
    let text = ok(&f, "A=1 $BWRAP --ro-bind / / --clearenv -- /usr/bin/env");
    assert_eq!(text, format!("PWD={}\n", f.workspace.display()));
});

for_each_caller!(info_and_json_status_fds_say_what_bubblewrap_says, |caller: Caller| {
    let f = Fixture::new(caller);
    let out = sh(
        &f,
        &format!(
            "$BWRAP {ROOT_VIEW} --unshare-all --info-fd 3 --json-status-fd 4 \
             -- sh -c 'stat -L -c \"%n %i\" /proc/self/ns/*; exit 42' 3>info.json 4>status.json"
        ),
    );
    assert_eq!(out.status.code(), Some(42), "{}", stderr(&out));
    // The ids COMMAND sees in /proc/self/ns.
    let ns: BTreeMap<String, u64> = stdout(&out)
        .lines()
        .filter_map(|l| {
            let (path, ino) = l.split_once(' ')?;
            Some((path.strip_prefix("/proc/self/ns/")?.to_string(), ino.parse().ok()?))
        })
        .collect();
    let info = std::fs::read_to_string(f.workspace.join("info.json")).unwrap();
    assert!(info.starts_with("{\n    \"child-pid\": "), "{info}");
    assert!(info.ends_with("\n}\n"), "{info}");
    let info: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&info).unwrap();
    let keys: Vec<&str> = info.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "cgroup-namespace",
            "child-pid",
            "ipc-namespace",
            "mnt-namespace",
            "net-namespace",
            "pid-namespace",
            "uts-namespace"
        ]
    );
    for name in ["cgroup", "ipc", "mnt", "net", "pid", "uts"] {
        assert_eq!(info[&format!("{name}-namespace")], ns[name], "{name}: {info:?} {ns:?}");
    }
    assert!(info["child-pid"].as_u64().unwrap() > 1);
    let status = std::fs::read_to_string(f.workspace.join("status.json")).unwrap();
    let lines: Vec<&str> = status.lines().collect();
    assert_eq!(lines.len(), 2, "{status}");
    assert!(lines[0].starts_with("{ \"child-pid\": ") && lines[0].ends_with(" }"), "{status}");
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first.as_object().unwrap(), &info, "the same object on one line");
    assert_eq!(lines[1], "{ \"exit-code\": 42 }");
    // A command that cannot be executed has no exit-code.
    let out = sh(&f, "$BWRAP --ro-bind / / --json-status-fd 4 /nonexistent 4>status.json");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "bwrap: execvp /nonexistent: No such file or directory\n");
    let status = std::fs::read_to_string(f.workspace.join("status.json")).unwrap();
    assert!(status.starts_with("{ \"child-pid\": ") && !status.contains("exit-code"), "{status}");
});

for_each_caller!(args_come_nul_separated_from_a_descriptor, |caller: Caller| {
    let f = Fixture::new(caller);
    let text = ok(
        &f,
        "printf '%s\\0' --dir '/tmp/with space' --setenv X 'a  b c' > args; \
         printf '%s\\0' --symlink target /tmp/link > args2; \
         $BWRAP --ro-bind / / --tmpfs /tmp --args 3 --args 5 -- \
         sh -c 'test -d \"/tmp/with space\" && readlink /tmp/link && printf \"%s\\n\" \"$X\"' 3<args 5<args2",
    );
    assert_eq!(text, "target\na  b c\n");
    // --args inside --args is refused, with bubblewrap's words.
    let out = sh(&f, "printf '%s\\0' --args 4 > nest; $BWRAP --args 3 true 3<nest 4<nest");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "bwrap: --args not supported in arguments file\n");
});

/// A libseccomp program (Python's `seccomp` module, python3-seccomp),
/// exported as raw BPF: `mkdir` fails with `errno`.
fn bpf_denying_mkdir(f: &Fixture, name: &str, errno: &str) {
    let script = format!(
        "import errno, seccomp\n\
         f = seccomp.SyscallFilter(seccomp.ALLOW)\n\
         f.add_rule(seccomp.ERRNO(errno.{errno}), 'mkdir')\n\
         f.add_rule(seccomp.ERRNO(errno.{errno}), 'mkdirat')\n\
         f.export_bpf(open('{name}', 'wb'))\n"
    );
    let out = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .current_dir(&f.workspace)
        .output()
        .unwrap();
    assert!(out.status.success(), "python3-seccomp (scripts/ci-setup.d/45-bwrap-tests.sh): {}", stderr(&out));
}

for_each_caller!(seccomp_programs_from_libseccomp_apply_in_order, |caller: Caller| {
    let f = Fixture::new(caller);
    bpf_denying_mkdir(&f, "eperm.bpf", "EPERM");
    bpf_denying_mkdir(&f, "eacces.bpf", "EACCES");
    let mkdir = "-- sh -c 'mkdir /tmp/x 2>&1; echo rc=$?'";
    let text = ok(&f, &format!("$BWRAP --ro-bind / / --tmpfs /tmp {mkdir}"));
    assert_eq!(text, "rc=0\n", "no filter by default, as bubblewrap");
    let text = ok(&f, &format!("$BWRAP --ro-bind / / --tmpfs /tmp --seccomp 3 {mkdir} 3<eperm.bpf"));
    assert!(text.contains("Operation not permitted") && text.contains("rc=1"), "{text}");
    // Stacked: for the same action the kernel takes the data of the
    // filter installed last.
    let text = ok(
        &f,
        &format!(
            "$BWRAP --ro-bind / / --tmpfs /tmp --add-seccomp-fd 3 --add-seccomp-fd 4 {mkdir} 3<eperm.bpf 4<eacces.bpf"
        ),
    );
    assert!(text.contains("Permission denied") && text.contains("rc=1"), "{text}");
    // Bad programs: bubblewrap's messages.
    let out = sh(&f, "printf 1234567 > short; $BWRAP --ro-bind / / --add-seccomp-fd 3 true 3<short");
    assert_eq!(stderr(&out), "bwrap: Invalid seccomp data, must be multiple of 8\n");
    let out = sh(&f, "$BWRAP --ro-bind / / --seccomp 3 --add-seccomp-fd 4 true 3<eperm.bpf 4<eperm.bpf");
    assert_eq!(stderr(&out), "bwrap: --add-seccomp-fd cannot be combined with --seccomp\n");
    // Our extra: the runtime's default profile on request.
    let text =
        ok(&f, "$BWRAP --ro-bind / / --tx-seccomp default -- sh -c 'unshare -U true 2>&1; echo rc=$?'");
    assert!(text.contains("Operation not permitted"), "{text}");
    assert!(text.contains("rc=1"), "{text}");
});

for_each_caller!(data_and_descriptor_options, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.workspace.join("data"), "payload\n").unwrap();
    let text = ok(
        &f,
        "mkdir -p shown && echo inside > shown/file && \
         $BWRAP --ro-bind / / --dev /dev --unshare-ipc --tmpfs /tmp --file 3 /tmp/file --perms 0640 --bind-data 4 /tmp/bound \
         --ro-bind-data 5 /tmp/ro --bind-fd 6 /mnt --mqueue /tmp/mq -- \
         sh -c 'for f in /tmp/file /tmp/bound /tmp/ro; do stat -c \"%n %a\" $f; cat $f; done; \
                cat /mnt/file; echo x >> /tmp/bound && echo bound-writable; \
                echo x >> /tmp/ro 2>/dev/null || echo ro-refused; grep -c \" /tmp/mq .* mqueue \" /proc/self/mountinfo' \
         3<data 4<data 5<data 6<shown",
    );
    assert_eq!(
        text,
        "/tmp/file 666\npayload\n/tmp/bound 640\npayload\n/tmp/ro 600\npayload\ninside\nbound-writable\nro-refused\n1\n"
    );
    // --chmod, --dir with --perms, --tmpfs with --size.
    let text = ok(
        &f,
        "$BWRAP --ro-bind / / --tmpfs /tmp --perms 0700 --dir /tmp/a/b --dir /tmp/c --chmod 1755 /tmp/c \
         --size 1048576 --tmpfs /tmp/small -- sh -c 'stat -c \"%n %a\" /tmp/a /tmp/a/b /tmp/c; \
         df --output=size --block-size=1K /tmp/small | tail -1 | tr -d \" \"'",
    );
    assert_eq!(text, "/tmp/a 700\n/tmp/a/b 700\n/tmp/c 1755\n1024\n");
    // --block-fd holds COMMAND until the descriptor has data; then it is
    // closed, and --sync-fd is the reaper's, as bubblewrap's: COMMAND has
    // neither (but keeps the descriptors bubblewrap leaves alone).
    let text = ok(
        &f,
        "start=$(date +%s%N); { sleep 0.5; echo go; } | $BWRAP --ro-bind / / --block-fd 0 --sync-fd 4 -- \
         sh -c 'date +%s%N; readlink /proc/self/fd/0 /proc/self/fd/4 || echo closed; readlink /proc/self/fd/5' \
         4<data 5<data | { read t; read rest; echo $(( (t - start) / 100000000 )); echo \"$rest\"; cat; }",
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].parse::<u32>().unwrap() >= 4, "COMMAND waited for the block descriptor: {text}");
    assert_eq!(lines[1..], ["closed", f.workspace.join("data").to_str().unwrap()], "{text}");
});

for_each_caller!(pid_1_locks_overlays_and_nested_userns, |caller: Caller| {
    let f = Fixture::new(caller);
    let text = ok(&f, "$BWRAP --ro-bind / / --unshare-pid --as-pid-1 -- sh -c 'echo $$'");
    assert_eq!(text, "1\n");
    let out = sh(&f, "$BWRAP --ro-bind / / --as-pid-1 true");
    assert_eq!(stderr(&out), "bwrap: Specifying --as-pid-1 requires --unshare-pid\n");
    // --lock-file: held while the sandbox runs (flock(1) would not see a
    // POSIX lock: python's fcntl does).
    let text = ok(
        &f,
        "touch lock; $BWRAP --ro-bind / / --bind $PWD $PWD --lock-file $PWD/lock -- sh -c 'touch started; sleep 1' & \
         while [ ! -e started ]; do sleep 0.05; done; \
         python3 -c 'import fcntl,sys; f=open(\"lock\",\"a\")\ntry: fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print(\"free\")\nexcept OSError: print(\"held\")'; \
         wait; python3 -c 'import fcntl; f=open(\"lock\",\"a\"); fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print(\"free\")'",
    );
    assert_eq!(text, "held\nfree\n");
    // Overlays of the caller's directories.
    let text = ok(
        &f,
        "mkdir -p lo1 lo2 up work && echo 1 > lo1/a && echo 2 > lo2/a && echo 3 > lo1/b && \
         $BWRAP --ro-bind / / --dev /dev --tmpfs /tmp --overlay-src lo1 --overlay-src lo2 --tmp-overlay /tmp/t \
         --overlay-src lo1 --overlay up work /tmp/w --overlay-src lo1 --overlay-src lo2 --ro-overlay /tmp/r -- \
         sh -c 'cat /tmp/t/a /tmp/t/b; echo 9 > /tmp/t/a; cat /tmp/t/a; echo 8 > /tmp/w/b; \
                echo 7 > /tmp/r/a 2>/dev/null || echo ro'; cat lo1/a up/b",
    );
    assert_eq!(text, "2\n3\n9\nro\n1\n8\n");
    // --disable-userns: no user namespace can be made inside.
    let text = ok(
        &f,
        "$BWRAP --ro-bind / / --dev /dev --unshare-user --disable-userns -- sh -c 'unshare -U true 2>/dev/null; echo rc=$?'",
    );
    assert_eq!(text, "rc=1\n");
    // Where user namespaces cannot be made: bubblewrap's words and our hint.
    let out = sh(
        &f,
        "$BWRAP --ro-bind / / --dev /dev --unshare-user --disable-userns -- $BWRAP --ro-bind / / --unshare-user true",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces exceeded (ENOSPC)"
        ) && err.contains("`tuixiu-sandbox check`"),
        "{err}"
    );
    let out = sh(&f, "$BWRAP --ro-bind / / --assert-userns-disabled true");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "bwrap: creation of new user namespaces was not disabled as requested\n");
});

for_each_caller!(bad_input_gets_bubblewraps_messages_and_leaves_nothing_mounted, |caller: Caller| {
    let f = Fixture::new(caller);
    let before = mounts(&f);
    for (args, message) in [
        (
            "--ro-bind / / --bind /nonexistent /x true",
            "Can't find source path /nonexistent: No such file or directory",
        ),
        // Setup failures in bubblewrap's words (as its Debian build says
        // them, SELinux support included, on a host without SELinux).
        ("--ro-bind / / --tmpfs /nonexistent true", "Can't mkdir /nonexistent: Read-only file system"),
        (
            "--ro-bind / / --unshare-ipc --mqueue /nonexistent true",
            "Can't mkdir /nonexistent: Read-only file system",
        ),
        (
            "--ro-bind / / --dir /nonexistent/x true",
            "Can't mkdir parents for /nonexistent/x: Read-only file system",
        ),
        (
            "--ro-bind / / --ro-bind /etc/passwd /nonexistent true",
            "Can't create file at /nonexistent: Read-only file system",
        ),
        (
            "--ro-bind / / --chmod 755 /nonexistent true",
            "Can't chmod 0755 /nonexistent: No such file or directory",
        ),
        (
            "--ro-bind / / --symlink x /nonexistent true",
            "Can't make symlink at /nonexistent: Read-only file system",
        ),
        ("--ro-bind / / --file 0 /nonexistent true", "Can't create file /nonexistent: Read-only file system"),
        ("--bind /etc/passwd /x --dir /x/y true", "Can't mkdir parents for /x/y: Not a directory"),
        ("--exec-label system_u:system_r:container_t:s0 true", "labeling not supported on this system"),
        ("--file-label system_u:object_r:container_file_t:s0 true", "labeling not supported on this system"),
        ("--args 77 true", "Can't read --args data: Bad file descriptor"),
        ("--ro-bind / / --file 77 /tmp/x true", "Can't write data to file /tmp/x: Bad file descriptor"),
        (
            "--ro-bind / / --bind-fd 77 /x true",
            "Can't find source path /proc/self/fd/77: No such file or directory",
        ),
        ("--userns 0 --unshare-user true", "--userns not compatible --unshare-user"),
        ("--perms 0644 --chdir / true", "--perms must be followed by an option that creates a file"),
        ("--size 0 --tmpfs /x true", "--size takes a non-zero number of bytes"),
        ("--hostname x true", "Specifying --hostname requires --unshare-uts"),
        ("--bogus true", "Unknown option --bogus"),
        (
            "--ro-bind / / --lock-file /nonexistent true",
            "Unable to open lock file /nonexistent: No such file or directory",
        ),
        ("--ro-bind / / no-such-command", "execvp no-such-command: No such file or directory"),
        (
            "--tmpfs /tmp --ro-bind / / --symlink a /usr true",
            "Can't make symlink at /usr: destination exists and is not a symlink",
        ),
        (
            "--ro-bind / / --tmpfs /tmp --symlink a /tmp/l --symlink b /tmp/l true",
            "Can't make symlink at /tmp/l: existing destination is a",
        ),
    ] {
        let out = sh(&f, &format!("$BWRAP {args}"));
        assert_eq!(out.status.code(), Some(1), "{args}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.starts_with(&format!("bwrap: {message}")) && err.lines().count() == 1, "{args}: {err}");
    }
    // A failure half-way through the mounts leaves nothing mounted here.
    let out = sh(&f, "$BWRAP --ro-bind / / --tmpfs /tmp --dir /tmp/a --bind /nonexistent /tmp/a true");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(mounts(&f), before);
});

// The same command lines through the host's bubblewrap (Debian's 0.8,
// scripts/ci-setup.d/40-bubblewrap.sh) and ours: same output, same status.
for_each_caller!(side_by_side_with_the_hosts_bubblewrap, |caller: Caller| {
    let f = Fixture::new(caller);
    assert!(Path::new("/usr/bin/bwrap").exists(), "install bubblewrap (scripts/ci-setup.d)");
    std::fs::write(f.workspace.join("data"), "some data\n").unwrap();
    let lines = [
        // codex's sandbox (read-only root, writable workspace, no network).
        "--ro-bind / / --dev /dev --bind $PWD $PWD --unshare-user --unshare-pid --unshare-net --proc /proc \
         --new-session --die-with-parent -- sh -c 'echo hi > $PWD/out; cat $PWD/out; ls /sys/class/net'",
        // Flatpak-like: a composed root, a data file, the environment.
        "--unshare-all --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
         --proc /proc --dev /dev --tmpfs /tmp --dir /run/user/1000 --ro-bind-data 3 /etc/motd --setenv HOME /tmp \
         --chdir /tmp -- sh -c 'cat /etc/motd; pwd; echo $HOME; ls /; test -c /dev/null && echo devnull' 3<data",
        "--ro-bind / / --tmpfs /tmp --dir /tmp/d --symlink d /tmp/l --bind /etc /tmp/l -- sh -c 'ls /tmp/d | head -2'",
        "--ro-bind / / -- sh -c 'exit 7'",
        "--ro-bind / / -- sh -c 'kill -TERM $$'",
        "--ro-bind / / --dev /dev --remount-ro / -- sh -c 'touch /x 2>/dev/null || echo refused'",
        "--ro-bind / / --unshare-ipc --unshare-uts --hostname h --unshare-cgroup-try -- hostname",
        "--ro-bind / / --bind /nonexistent /x true",
        "--ro-bind / / --tmpfs /nonexistent true",
        "--ro-bind / / --dir /nonexistent/x true",
        "--bind /etc/passwd /x --symlink a /x/y true",
        "--exec-label system_u:system_r:container_t:s0 true",
        // Not root, no new ipc namespace: the mqueue mount is refused.
        "--ro-bind / / --tmpfs /tmp --mqueue /tmp/mq true",
        "--ro-bind / / --unshare-user --cap-add ALL --uid 0 -- sh -c 'grep CapEff /proc/self/status'",
        "--ro-bind / / --cap-drop ALL -- sh -c 'grep CapEff /proc/self/status'",
        "--bind / / --args 3 -- sh -c 'echo $A' 3<args",
        "nonexistent",
    ];
    std::fs::write(f.workspace.join("args"), b"--setenv\0A\0from args\0").unwrap();
    for line in lines {
        let theirs = sh(&f, &format!("/usr/bin/bwrap {line}"));
        let ours = sh(&f, &format!("$BWRAP {line}"));
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{line}: {}\n{}",
            stderr(&ours),
            stderr(&theirs)
        );
        assert_eq!(stdout(&ours), stdout(&theirs), "{line}");
        let first = |o: &Output| stderr(o).lines().next().map(str::to_string);
        assert_eq!(first(&ours), first(&theirs), "{line}");
    }
});

for_each_caller!(our_hardening_keeps_pid_1_out_of_reach, |caller: Caller| {
    let f = Fixture::new(caller);
    // PID 1 is a fork of the launcher, outside the command's filter: were
    // it dumpable, COMMAND could write code into it through /proc/1/mem
    // and so get around --tx-seccomp. (--unshare-user: root without a user
    // namespace keeps CAP_SYS_PTRACE, as with bubblewrap, and reaches
    // every process anyway.)
    let probe = "sh -c '(: 3<>/proc/1/mem) 2>/dev/null && echo mem opened || echo mem refused; \
                 (: 3</proc/1/environ) 2>/dev/null && echo environ opened || echo environ refused'";
    for extra in ["--tx-seccomp default", "--tx-landlock"] {
        let text = ok(&f, &format!("$BWRAP {ROOT_VIEW} --unshare-user --unshare-pid {extra} -- {probe}"));
        assert_eq!(text, "mem refused\nenviron refused\n", "{extra}");
    }
    // Without our extras PID 1 stays dumpable, as bubblewrap's: its
    // caller opens /proc/CHILD-PID/ns/*, and COMMAND reaches it too.
    let text = ok(&f, &format!("$BWRAP {ROOT_VIEW} --unshare-user --unshare-pid -- {probe}"));
    assert_eq!(text, "mem opened\nenviron opened\n");
});

/// Runs `sh -c SCRIPT` as the fixture's caller in its workspace, with a
/// `bin` directory of its own first on `PATH`.
fn sh_path(f: &Fixture, script: &str) -> Output {
    let mut cmd = f.caller.command(Path::new("/bin/sh"), &["-c", script]);
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", f.dir.join("bin").display());
    cmd.current_dir(&f.workspace).stdin(Stdio::null()).env("PATH", path).env("LAUNCHER", binary());
    cmd.output().unwrap()
}

// Whatever a consumer does to learn what `bwrap` is: run it with --help or
// --version by name, resolve its links first (codex: `canonicalize`, then
// `<target> --help` looking for `--argv0`), or run the resolved file with
// an argv[0] of its own.
for_each_caller!(answers_as_bwrap_however_it_is_installed, |caller: Caller| {
    let f = Fixture::new(caller);
    let bin = f.dir.join("bin");
    let lib = f.dir.join("libexec");
    for dir in [&bin, &lib] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // The installation docs/bwrap.md gives: the launcher as a file named
    // `bwrap` (a hard link, else a copy), and `bwrap` on PATH a link to it.
    if std::fs::hard_link(binary(), lib.join("bwrap")).is_err() {
        std::fs::copy(binary(), lib.join("bwrap")).unwrap();
    }
    std::os::unix::fs::symlink(lib.join("bwrap"), bin.join("bwrap")).unwrap();
    let probe = "bwrap --version; bwrap --help | head -1 | cut -d' ' -f1; \
                 target=$(readlink -f \"$(command -v bwrap)\"); \"$target\" --help | grep -c -- --argv0; \
                 \"$target\" --version; (exec -a not-bwrap \"$target\" --version); \
                 bwrap --ro-bind / / --unshare-user -- echo sandboxed";
    let out = sh_path(&f, &format!("exec bash -c '{}'", probe.replace('\'', "'\\''")));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "bubblewrap 0.11.1\nusage:\n1\nbubblewrap 0.11.1\nbubblewrap 0.11.1\nsandboxed\n",
        "{}",
        stderr(&out)
    );
    // A link straight to the launcher answers by name, but what it
    // resolves to is `tuixiu-sandbox`, which answers as itself: the
    // reason for the file named `bwrap` above.
    std::fs::remove_file(bin.join("bwrap")).unwrap();
    std::os::unix::fs::symlink(binary(), bin.join("bwrap")).unwrap();
    let out = sh_path(
        &f,
        "bwrap --version; target=$(readlink -f \"$(command -v bwrap)\"); \"$target\" --version | cut -d' ' -f1",
    );
    assert_eq!(stdout(&out), "bubblewrap 0.11.1\ntuixiu-sandbox\n", "{}", stderr(&out));
});
