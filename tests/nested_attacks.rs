//! Attacks on the nested-sandbox portal from inside `tuixiu-sandbox run`,
//! as root, as uid 65534 and nested in `unshare -U -r`: each probe is what
//! an agent could try against the portal's socket, its server and the
//! nested sandboxes' PID 1, and each must fail (docs/security.md, "Nested
//! sandboxes"). The attacker programs are in tests/fixtures/attacks/.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{Caller, Fixture, stderr};

/// `tests/fixtures/attacks/NAME.c`, compiled with the host's C compiler
/// into a world-readable directory of this test process.
fn attacker(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tuixiu-attacks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    });
    let out = dir.join(name);
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/attacks/{name}.c"));
        let tmp = dir.join(format!(".{name}.{:?}", std::thread::current().id()));
        let cc = std::process::Command::new("cc").arg("-O2").arg("-o").arg(&tmp).arg(&src).output().unwrap();
        assert!(cc.status.success(), "cc {}: {}", src.display(), stderr(&cc));
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// `KEY=VALUE` words of the attacker's one-line summary.
fn summary(stdout: &[u8]) -> std::collections::BTreeMap<String, String> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().last().unwrap_or_default();
    line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()
}

/// One way the agent runs without Landlock: what it is called, the
/// launcher's options and a variable for the launcher.
struct NoLandlock {
    how: &'static str,
    args: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
}

/// How the agent's own Landlock is turned off for an attack.
const NO_LANDLOCK: [NoLandlock; 2] = [
    NoLandlock { how: "--landlock off", args: &["--landlock", "off"], env: None },
    // A kernel without Landlock under the default best-effort mode.
    NoLandlock {
        how: "no Landlock on this kernel",
        args: &[],
        env: Some((sandbox::landlock::TEST_ABI_ENV, "0")),
    },
];

// A process outside every seccomp filter whose memory the agent may write
// is a way out: code written there runs unfiltered. Nested sandboxes start
// in a loop, each holding its PID 1 with `--block-fd`, while the attacker
// opens /proc/PID/mem read-write for every new pid as fast as it can (a
// nested PID 1 that was dumpable for its three id-map opens lost this
// race within seconds). What it may open (the nested commands, the
// user-namespace helpers) must all run under a filter.
for_each_caller!(no_unfiltered_process_is_ever_writable_by_the_agent, |caller: Caller| {
    let f = Fixture::new(caller);
    let grab = attacker("memgrab");
    let bind = grab.to_str().unwrap();
    for NoLandlock { how, args, env } in NO_LANDLOCK {
        let mut run =
            vec!["run", "--workspace", f.workspace.to_str().unwrap(), "--ro-bind", bind, "/memgrab"];
        run.extend_from_slice(args);
        run.extend_from_slice(&["--", "/memgrab", "3", "--", "bwrap", "--ro-bind", "/", "/"]);
        run.extend_from_slice(&["--unshare-user", "--disable-userns", "--block-fd", "3", "--", "/bin/true"]);
        let mut cmd = f.command(&run);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{how}: {}", stderr(&out));
        let seen = summary(&out.stdout);
        assert_eq!(seen.get("unfiltered").map(String::as_str), Some("0"), "{how}: {seen:?}");
        let runs: u32 = seen["runs"].parse().unwrap();
        let opened: u32 = seen["opened"].parse().unwrap();
        // The loop really raced: nested sandboxes started, and it opened
        // the memory of processes it owns (each filtered: the front ends,
        // and the user-namespace helpers).
        assert!(runs >= 10 && opened >= runs, "{how}: {seen:?}");
    }
});

/// Tries every way a command has to make a set-uid or set-gid file in
/// `DIR` (its first argument) and prints `name=result` for each.
const MAKE_SET_ID: &str = r#"
import ctypes, errno, os, stat, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print(f"{name}=made")
    except OSError as e:
        print(f"{name}={errno.errorcode.get(e.errno, e.errno)}")
def chmod_to(mode):
    p = f"{d}/f-{mode:o}"
    open(p, "w").close()
    os.chmod(p, mode)
attempt("chmod_suid", lambda: chmod_to(0o4755))
attempt("chmod_sgid", lambda: chmod_to(0o2755))
attempt("open_creat", lambda: os.close(os.open(f"{d}/c", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("open_tmpfile", lambda: os.close(os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o2755)))
attempt("mkdir_sgid", lambda: os.mkdir(f"{d}/sgid-dir", 0o2775))
attempt("mknod", lambda: os.mknod(f"{d}/n", stat.S_IFREG | 0o4755))
def openat2():
    # struct open_how { flags, mode, resolve }: its mode is out of a filter's sight.
    how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
    fd = libc.syscall(437, -100, f"{d}/o2".encode(), ctypes.byref(how), 24)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "openat2")
    os.close(fd)
attempt("openat2", openat2)
for name in sorted(os.listdir(d)):
    if os.lstat(f"{d}/{name}").st_mode & 0o6000:
        print(f"set_id_file={name}")
"#;

/// Files under `dir` on the host with a set-uid or set-gid bit.
fn set_id_files(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.mode() & 0o6000 != 0 {
                found.push(entry.path().display().to_string());
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    found
}

// A set-uid file the agent leaves in a host directory is a set-uid file on
// the host: as root's sandbox user, a set-uid-root program for every host
// user. No way of making one works, in the sandbox or in a nested one
// (with every capability of its own user namespace, as its root), and
// the nested PID 1's own `--chmod`/`--perms` steps refuse the bits.
for_each_caller!(set_id_bits_are_never_created_inside, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.dir.join("make-set-id.py"), MAKE_SET_ID).unwrap();
    let script = f.dir.join("make-set-id.py");
    let bind = script.to_str().unwrap();
    let each = "for d in outer nested; do mkdir -p /workspace/$d; done; \
                python3 /m.py /workspace/outer; \
                bwrap --ro-bind / / --bind /workspace /workspace --unshare-user --uid 0 --cap-add ALL \
                  -- python3 /m.py /workspace/nested";
    let out = f.run(&["--ro-bind", bind, "/m.py"], &["sh", "-c", each]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let (name, result) = line.split_once('=').unwrap();
        let want = if name == "openat2" { "ENOSYS" } else { "EPERM" };
        assert_eq!(result, want, "{name}: {text}");
    }
    assert_eq!(text.lines().count(), 14, "{text}");
    assert_eq!(set_id_files(&f.workspace), Vec::<String>::new());

    // The nested PID 1's own steps.
    let script = "cd /workspace; touch t; for opts in '--chmod 4755 /workspace/t' '--perms 2755 --dir /d' \
                  '--perms 6755 --file 3 /f' '--perms 3777 --tmpfs /x'; do \
                  bwrap --ro-bind / / --bind /workspace /workspace $opts -- true 3</dev/null; echo \"rc=$?\"; done 2>&1";
    let text = f.sh(&[], script);
    assert_eq!(
        text,
        "bwrap: --chmod 4755: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)\nrc=1\n\
         bwrap: --perms (--dir) 2755: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)\nrc=1\n\
         bwrap: --perms 6755: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)\nrc=1\n\
         bwrap: --perms (--tmpfs) 3777: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)\nrc=1\n"
    );
    assert_eq!(set_id_files(&f.workspace), Vec::<String>::new());
});

// Set-uid files that are already there stay what they are on the host and
// are plain files inside: readable, executable, no privilege (every
// writable mount is `nosuid`, and `no_new_privs` holds anyway).
for_each_caller!(existing_set_id_files_run_as_plain_files, |caller: Caller| {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new(caller);
    let id = f.workspace.join("suid-id");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::os::unix::fs::chown(&id, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let text = f.sh(
        &[],
        "/workspace/suid-id -u; /workspace/suid-id -ru; bwrap --ro-bind / / -- /workspace/suid-id -u",
    );
    assert_eq!(text, "1000\n1000\n1000\n", "no euid of the file's owner");
    let mode = std::fs::metadata(&id).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o4755, "left as it was");
});

// overlayfs keeps a copied-up file's set-uid bit: with the sandbox user
// host root, a nested overlay writing to a host directory is refused; a
// tmp overlay (its upper layer in memory, mounted nosuid) is not.
#[test]
fn a_root_users_nested_overlay_never_writes_to_the_host() {
    let f = Fixture::new(Caller::Root);
    let text = f.sh(
        &[],
        "cd /workspace; mkdir -p up work; \
         bwrap --ro-bind / / --overlay-src /usr/bin --overlay /workspace/up /workspace/work /tmp -- true 2>&1; \
         echo rc=$?; bwrap --ro-bind / / --overlay-src /usr/bin --tmp-overlay /tmp -- touch /tmp/new; echo rc=$?",
    );
    assert!(
        text.starts_with("bwrap: --overlay with a writable host directory is refused inside a sandbox whose user is host root"),
        "{text}"
    );
    assert!(text.ends_with("rc=1\nrc=0\n"), "{text}");
    assert_eq!(set_id_files(&f.workspace), Vec::<String>::new());
}

// Every nested tmpfs was capped at `--tmpfs-size`, but one request could
// make as many as it liked: nothing bounded their sum. Now everything
// nested sandboxes keep in memory (their roots, `--tmpfs`, `--dev`'s shm,
// `--bind-data` files, the upper layers of `--tmp-overlay`; the roots in
// tests/nested.rs) is one tmpfs of `--tmpfs-size`, shared by all of them;
// a `--tmpfs` with its own `--size` takes its size out of it while it
// exists.
for_each_caller!(nested_sandboxes_share_one_tmpfs_budget, |caller: Caller| {
    let f = Fixture::new(caller);
    // Six nested sandboxes at once, each filling everything it can,
    // holding it until all have written.
    let paths = "/tmp/f /dev/shm/g /tmp/data /tmp/o/h";
    let fill = format!(
        "for p in {paths}; do head -c 20000000 /dev/zero > $p 2>/dev/null; done; \
         s=0; for p in {paths}; do s=$((s + $(stat -c %s $p))); done; \
         echo $s > /workspace/sum-$1; while [ $(ls /workspace | grep -c sum-) -lt 6 ]; do sleep 0.05; done"
    );
    let nested = format!(
        "bwrap --ro-bind / / --bind /workspace /workspace --tmpfs /tmp --dev /dev --bind-data 3 /tmp/data \
         --overlay-src /etc --tmp-overlay /tmp/o -- sh -c '{fill}' sh"
    );
    // A `--bind-data` file is a mount of its own, which the kernel lets go
    // of a moment after the nested sandbox's PID 1 is gone: wait for it.
    let script = format!(
        "for i in 1 2 3 4 5 6; do {nested} $i 3</dev/null & done; wait; cat /workspace/sum-*; \
         for i in $(seq 100); do bwrap --ro-bind / / --dev /dev --tmpfs /tmp -- df /tmp | grep -q ' 0 ' && break; \
         sleep 0.05; done; \
         bwrap --ro-bind / / --dev /dev --tmpfs /tmp -- sh -c 'head -c 20000000 /dev/zero > /tmp/f 2>/dev/null; stat -c %s /tmp/f'"
    );
    let out = f.run(&["--tmpfs-size", "16M"], &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let sizes: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(sizes.len(), 7, "{text}");
    let total: u64 = sizes[..6].iter().sum();
    assert!(total <= 16 << 20, "six nested sandboxes held {total} bytes in memory: {text}");
    assert!(total >= 15 << 20, "the budget is usable: {total}");
    // Once they have ended, all of it is free again.
    assert_eq!(sizes[6], 16 << 20, "{text}");

    // A tmpfs of its own (`--size`) is taken out of the budget while it
    // lives: a second one that does not fit is refused, with why.
    let script = "bwrap --ro-bind / / --bind /workspace /workspace --size 12582912 --tmpfs /tmp \
                    -- sh -c 'touch /workspace/up; sleep 1' & \
                  while [ ! -e /workspace/up ]; do sleep 0.05; done; \
                  bwrap --ro-bind / / --size 12582912 --tmpfs /tmp -- true 2>&1; echo rc=$?; wait; \
                  bwrap --ro-bind / / --size 12582912 --tmpfs /tmp -- true; echo rc=$?";
    let text = f.sh(&["--tmpfs-size", "16M"], script);
    assert!(text.starts_with("bwrap: no room for tmpfs of 12582912 bytes (--size)"), "{text}");
    assert!(text.ends_with("rc=1\nrc=0\n"), "{text}");
});

// Where idmapped mounts are impossible, a root caller's sandbox hides
// `/etc`'s secrets with masks (mounts over them). overlayfs shows a
// layer's own files, not the mounts on them: an overlay of `/etc` (or of
// `/`) would show `/etc/shadow` as it is. Such a layer is refused; a bind
// carries the masks along.
#[test]
fn nested_overlays_never_show_what_a_mask_hides() {
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap();
    let secret = shadow.lines().next().unwrap().split(':').take(2).collect::<Vec<_>>().join(":");
    let f = Fixture::new(Caller::Root);
    let ws = f.workspace.to_str().unwrap().to_string();
    let script = "for src in /etc / /etc/ssl; do \
                    bwrap --ro-bind / / --dev /dev --overlay-src $src --tmp-overlay /tmp -- \
                      sh -c 'cat /tmp/shadow /tmp/etc/shadow' 2>&1; echo rc=$?; done; \
                  bwrap --ro-bind / / --ro-bind /etc /tmp -- cat /tmp/shadow 2>&1; echo rc=$?";
    let out = f
        .command(&["run", "--workspace", &ws, "--", "sh", "-c", script])
        .env(sandbox::idmap::TEST_NO_IDMAP_ENV, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(&secret), "a mask was undone: {text}");
    let refused = |src: &str| {
        format!(
            "bwrap: Can't use overlay source {src}: the sandbox masks files below it (see docs/security.md)\nrc=1\n"
        )
    };
    // /etc/ssl/private is masked (not world-readable), so /etc/ssl is refused too.
    let want = format!("{}{}", refused("/etc"), refused("/"));
    assert!(text.starts_with(&want), "{text}");
    if std::path::Path::new("/etc/ssl/private").exists() {
        assert!(text.contains(&refused("/etc/ssl")), "{text}");
    }
    assert!(text.ends_with("cat: /tmp/shadow: Permission denied\nrc=1\n"), "{text}");
}

/// Swaps `/tmp/swap` between a directory and symlinks to `/run`,
/// `/run/tuixiu` and `/`, and `/tmp/d/x` between a directory and a
/// symlink to `/run/tuixiu`, as fast as it can, until killed; with
/// `renameat2(RENAME_EXCHANGE)`, so that the names are never missing.
const SWAPPER: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    libc.renameat2(-100, a.encode(), -100, b.encode(), 2)
os.makedirs("/tmp/swap/tuixiu/x", exist_ok=True)
os.makedirs("/tmp/swap/run", exist_ok=True)
os.makedirs("/tmp/d/x", exist_ok=True)
for name, target in [("l-run", "/run"), ("l-portal", "/run/tuixiu"), ("l-root", "/")]:
    os.symlink(target, f"/tmp/{name}")
os.symlink("/run/tuixiu", "/tmp/d/l")
while True:
    for name in ["l-run", "l-portal", "l-root"]:
        exchange("/tmp/swap", f"/tmp/{name}")
        exchange("/tmp/swap", f"/tmp/{name}")
        exchange("/tmp/d/x", "/tmp/d/l")
"#;

// The worker checked a source by its path and bound what the path named
// later: a path swapped in between once put the live portal socket inside
// a nested sandbox, whose command could then build a sibling with the
// outer network. Now the portal is not mounted in the workers' view at
// all, and every source is opened once and bound from that descriptor.
// Hundreds of requests race a swapper; no nested command may ever find a
// socket where the portal was, or reach the portal.
for_each_caller!(no_race_puts_the_portal_in_a_nested_sandbox, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.dir.join("swap.py"), SWAPPER).unwrap();
    let swap = f.dir.join("swap.py");
    // The swapper's tree is in the workspace: /tmp is the nested view's
    // mount point for the sources.
    let probe = "for p in /tmp /tmp/tuixiu /tmp/run/tuixiu /tmp/x; do \
                   [ -S $p/nested.sock ] && echo FOUND $p; done; \
                 find /tmp -maxdepth 3 -type s 2>/dev/null | sed 's/^/SOCKET /'; echo ok";
    let script = format!(
        "cd /workspace; python3 /swap.py & s=$!; sleep 0.2; \
         for i in $(seq 40); do for src in swap d/x swap/tuixiu swap/run; do \
           bwrap --ro-bind / / --unshare-net --ro-bind-try /workspace/tmp/$src /tmp -- sh -c '{probe}' 2>/dev/null; \
           bwrap --ro-bind / / --overlay-src /workspace/tmp/$src --tmp-overlay /tmp \
             -- sh -c 'ls /tmp/nested.sock /tmp/tuixiu/nested.sock 2>/dev/null; echo ok' 2>/dev/null; \
           done; done | sort | uniq -c; kill $s"
    );
    let swapper = SWAPPER.replace("/tmp/", "/workspace/tmp/");
    std::fs::write(&swap, swapper).unwrap();
    let out = f.run(&["--ro-bind", swap.to_str().unwrap(), "/swap.py"], &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // Only `ok` lines: no socket, ever; and enough nested sandboxes ran
    // (the others met a swapped-out or a refused source).
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines.len(), 1, "{text}");
    let (count, word) = lines[0].split_once(' ').unwrap();
    assert_eq!(word, "ok", "{text}");
    assert!(count.parse::<u32>().unwrap() >= 20, "{text}");
    // And straight: the portal, its fence and its pool are never sources.
    let text = f.sh(
        &[],
        "for src in /run/tuixiu /run/tuixiu/pool /run/tuixiu/nested.sock; do \
           bwrap --ro-bind / / --ro-bind $src /tmp -- true 2>&1; done; \
         bwrap --ro-bind / / --ro-bind /run /tmp -- ls -A /tmp/tuixiu",
    );
    assert_eq!(
        text,
        "bwrap: Can't find source path /run/tuixiu: Permission denied\n\
         bwrap: Can't find source path /run/tuixiu/pool: Permission denied\n\
         bwrap: Can't find source path /run/tuixiu/nested.sock: No such file or directory\n"
    );
});

// Without a writable cgroup v2, `--pids` is RLIMIT_NPROC, which the kernel
// counts per user namespace: each nested sandbox started a fresh one
// before any rlimit applied, and twelve of them held hundreds of processes
// under `--pids 40`. The portal's processes now carry the limit from the
// start, so every user namespace made below them counts against it too.
for_each_caller!(nested_sandboxes_count_against_the_process_limit, |caller: Caller| {
    let f = Fixture::new(caller);
    // Each variant under a host uid of its own, which nothing else uses: the
    // count from outside below is then the sandbox's alone. (The kernel
    // counts RLIMIT_NPROC per user namespace, so other processes of the
    // same host uid would not take from the 40 anyway.)
    let uid = match caller {
        Caller::Root => 65530,
        Caller::Unprivileged => 65531,
        Caller::Nested => 65532,
    };
    let (uid_s, ws) = (uid.to_string(), f.workspace.to_str().unwrap().to_string());
    std::os::unix::fs::chown(&f.workspace, Some(uid), Some(uid)).unwrap();
    let mut args = vec!["run", "--workspace", ws.as_str(), "--pids", "40"];
    if caller == Caller::Root {
        // Root's own processes are exempt: the sandbox user maps onto `uid`.
        args.extend(["--map-uid", uid_s.as_str(), "--map-gid", uid_s.as_str()]);
    }
    // Python, not a shell: a shell whose fork fails gives up and its
    // sandbox ends at once, too soon to be counted from outside; these keep
    // what they started alive for 10 s.
    let spawner = r#"
import os, subprocess, sys, time
nested = sys.argv[1:] == ["nested"]
children = []
for _ in range(60 if nested else 12):
    try:
        if nested:
            if os.fork() == 0:
                time.sleep(10)
                os._exit(0)
        else:
            children.append(subprocess.Popen(
                ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--",
                 "python3", "/workspace/spawner.py", "nested"], stderr=subprocess.DEVNULL))
    except OSError:
        pass
time.sleep(10)
for c in children:
    c.wait()
"#;
    std::fs::write(f.workspace.join("spawner.py"), spawner).unwrap();
    args.extend(["--", "python3", "/workspace/spawner.py"]);
    let others = uid_processes(uid);
    let mut cmd = match caller {
        Caller::Root => std::process::Command::new(common::binary()),
        Caller::Unprivileged | Caller::Nested => {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid", &uid_s, "--regid", &uid_s, "--clear-groups"]);
            if caller == Caller::Nested {
                c.args(["unshare", "-U", "-r"]);
            }
            c.arg(common::binary());
            c
        }
    };
    cmd.args(&args).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").current_dir(&f.dir);
    let child = cmd.stdin(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Counted from outside: everything below the launcher (the launcher
    // itself is the caller's, not the sandbox's).
    // For the sandbox's whole life (its sleeps last 10 s, long enough for
    // every start to be attempted on a loaded machine), or at most 60 s.
    let mut child = child;
    let mut most = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < until && child.try_wait().unwrap().is_none() {
        most = most.max(descendants(child.id()).len().saturating_sub(1));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(most <= 40, "{most} processes in the sandbox under --pids 40: {}", stderr(&out));
    assert_eq!(others, 0, "processes of uid {uid} outside the test would share its --pids budget");
    assert!(most >= 30, "the processes did start: {most}: {}", stderr(&out));
});

/// How many processes have `uid` as their real uid.
fn uid_processes(uid: u32) -> usize {
    let real_uid = |p: &str| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
        .filter(|e| real_uid(e.file_name().to_str().unwrap()) == Some(uid))
        .count()
}

/// `pid` and every process below it, by parent pid.
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<(u32, Option<u32>)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .map(|p| (p, parent_of(p)))
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(all.iter().filter(|(_, parent)| *parent == Some(p)).map(|(c, _)| *c));
        i += 1;
    }
    found
}

// `--disable-userns` set `user.max_user_namespaces = 1` before the nested
// sandbox's own user namespace existed, i.e. in the outer sandbox's: the
// request failed, and nested sandboxes started afterwards failed too
// (codex's parallel tool calls would). The limit is now set in the nested
// sandbox's own namespace, bubblewrap's order; the outer one is untouched.
for_each_caller!(disable_userns_nested_never_touches_the_sandbox, |caller: Caller| {
    let f = Fixture::new(caller);
    let script = "before=$(cat /proc/sys/user/max_user_namespaces); \
                  bwrap --ro-bind / / --unshare-user --disable-userns --assert-userns-disabled -- true; echo rc=$?; \
                  bwrap --ro-bind / / --unshare-user --assert-userns-disabled -- true 2>&1; echo rc=$?; \
                  pids=; for i in $(seq 12); do bwrap --ro-bind / / --unshare-user -- true & pids=\"$pids $!\"; done; \
                  ok=0; for j in $pids; do wait $j && ok=$((ok + 1)); done; echo ok=$ok; \
                  [ \"$(cat /proc/sys/user/max_user_namespaces)\" = \"$before\" ] && echo unchanged";
    let text = f.sh(&[], script);
    assert_eq!(
        text,
        "rc=0\nbwrap: creation of new user namespaces was not disabled as requested\nrc=1\nok=12\nunchanged\n"
    );
});

/// Sends the JSON request of its first argument to the portal as a front
/// end would (with descriptor 0, and with `/proc/self/ns/user` when the
/// request names descriptor 3), and prints the reply.
const RAW_REQUEST: &str = r#"
import json, os, socket, struct, sys
root = {"op": "bind", "src": "/", "dst": "/", "mode": "ro", "optional": False}
req = {"command": ["/bin/true"], "argv0": None, "env": [], "cwd": "/", "chdir": None, "umask": 18, "ops": [root],
       "unshare": {"user": False, "ipc": False, "net": False, "uts": False, "cgroup": False},
       "uid": None, "gid": None, "hostname": None, "caps": None, "fds": [0]}
req.update(json.loads(sys.argv[1]))
fds = [0]
if 3 in req["fds"]:
    fds.append(os.open("/proc/self/ns/user", os.O_RDONLY))
body = json.dumps(req).encode()
s = socket.socket(socket.AF_UNIX)
s.connect("/run/tuixiu/nested.sock")
socket.send_fds(s, [b"TXB1" + struct.pack("<I", len(body))], fds)
s.sendall(body)
print(s.makefile().readline().strip())
"#;

// The front end refused the options about the caller's own namespaces and
// status descriptors, but the worker did not: a raw request's `userns2Fd`
// reached `setns` in the nested PID 1. The worker's check is now the one
// that decides, for the front end too.
for_each_caller!(the_worker_refuses_what_only_the_host_serves, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.dir.join("raw.py"), RAW_REQUEST).unwrap();
    let raw = f.dir.join("raw.py");
    let script = r#"
        python3 /raw.py '{"fds": [0, 3], "userns2Fd": 3}'
        python3 /raw.py '{"hostOnly": ["--pidns"]}'
        python3 /raw.py '{"ops": [{"op": "chmod", "dst": "/tmp", "mode": 2048}]}'
        python3 /raw.py '{}'
        bwrap --userns2 0 --ro-bind / / true 2>&1
        bwrap --userns 0 --ro-bind / / true 2>&1; true"#;
    let text = f.sh(&["--ro-bind", raw.to_str().unwrap(), "/raw.py"], script);
    assert_eq!(
        text,
        "{\"error\":\"--userns2 is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)\"}\n\
         {\"error\":\"--pidns is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)\"}\n\
         {\"error\":\"--chmod 4000: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)\"}\n\
         {\"exit\":0}\n\
         bwrap: --userns2 is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)\n\
         bwrap: --userns is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)\n"
    );
});

// The portal's processes are forks of the launcher: their command line was
// the launcher's (bind sources, `--env` values, the workspace's host
// path), readable by every process of the sandbox. At the end of most runs
// with nested sandboxes the launcher warned that the portal's server had
// ended, and once per kill when the agent killed it. Now they are named
// `tuixiu-sandbox-portal`; where the agent may kill them (without
// Landlock, whose scoping refuses it signals to processes outside its
// domain), killing them ends only the nested sandboxes they served, with a
// clear error, and the next request gets a new server; the launcher says
// nothing.
for_each_caller!(the_portal_shows_nothing_of_the_launcher_and_survives_its_killers, |caller: Caller| {
    let f = Fixture::new(caller);
    let marker = format!("launcher-argv-{}", std::process::id());
    let env = format!("SECRET_VALUE={marker}");
    let ws = f.workspace.to_str().unwrap().to_string();
    // While the nested command runs, the acceptor and the worker serving
    // it are there: every command line is read, then the portal's
    // processes are killed (the worker may be gone with the acceptor
    // already), then the nested command is let go.
    let script = "rm -f /workspace/up /workspace/stop; \
                  bwrap --ro-bind / / --bind /workspace /workspace --dev /dev -- \
                    sh -c 'touch /workspace/up; until [ -e /workspace/stop ]; do sleep 0.05; done' \
                    2>/workspace/err & b=$!; \
                  until [ -e /workspace/up ]; do sleep 0.05; done; \
                  for p in /proc/[0-9]*; do tr -s '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done > /workspace/cmdlines; \
                  grep -c '^tuixiu-sandbox-portal $' /workspace/cmdlines; \
                  k=; for p in /proc/[0-9]*; do [ \"$(tr -s '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'tuixiu-sandbox-portal ' ] \
                    && k=\"$k ${p#/proc/}\"; done; kill -9 $k 2>&1 | grep -q 'not permitted' && echo refused || echo killed; \
                  touch /workspace/stop; wait $b; echo rc=$?; cat /workspace/err; bwrap --ro-bind / / -- echo again";
    let landlock_on = NoLandlock { how: "Landlock on", args: &[], env: None };
    for NoLandlock { how, args, env: var } in [landlock_on].into_iter().chain(NO_LANDLOCK) {
        let mut run = vec!["run", "--workspace", &ws, "--env", &env, "--ro-bind", &ws, "/ws-bind"];
        run.extend_from_slice(args);
        run.extend_from_slice(&["--", "sh", "-c", script]);
        let mut cmd = f.command(&run);
        if let Some((k, v)) = var {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{how}: {text}: {}", stderr(&out));
        let cmdlines = std::fs::read_to_string(f.workspace.join("cmdlines")).unwrap();
        assert!(!cmdlines.contains(&marker) && !cmdlines.contains(&ws), "{how}: {cmdlines}");
        let want = if how == "Landlock on" {
            "2\nrefused\nrc=0\nagain\n".to_string()
        } else {
            "2\nkilled\nrc=1\nbwrap: the nested sandbox ended without a status: the portal's process \
             serving it is gone (killed from inside the sandbox, or the sandbox is ending)\nagain\n"
                .to_string()
        };
        assert_eq!(text, want, "{how}");
        // Nothing about the portal (a kernel without Landlock is warned of).
        let warned = stderr(&out);
        assert!(!warned.contains("nested sandboxes") && !warned.contains("portal"), "{how}: {warned}");
    }
});
