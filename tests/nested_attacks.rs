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
