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

/// How the agent's own Landlock is turned off for an attack.
const NO_LANDLOCK: [(&str, &[&str], Option<(&str, &str)>); 2] = [
    ("--landlock off", &["--landlock", "off"], None),
    // A kernel without Landlock under the default best-effort mode.
    ("no Landlock on this kernel", &[], Some((sandbox::landlock::TEST_ABI_ENV, "0"))),
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
    for (how, args, env) in NO_LANDLOCK {
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
