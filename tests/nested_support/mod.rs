//! The stand-in agent of the nested-sandbox tests (tests/fixtures/nested/)
//! and what it must observe, shared by the `run` and daemon tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// The fixture files, by name.
pub const FILES: &[(&str, &str)] = &[
    ("agent.sh", include_str!("../fixtures/nested/agent.sh")),
    ("inside.sh", include_str!("../fixtures/nested/inside.sh")),
    ("helper.py", include_str!("../fixtures/nested/helper.py")),
    ("probe.py", include_str!("../fixtures/nested/probe.py")),
    ("own_namespaces.py", include_str!("../fixtures/nested/own_namespaces.py")),
];

/// Writes the stand-in agent into `dir` (readable by every caller).
pub fn install(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, text) in FILES {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// A workspace as codex finds it: a git repository, `.codex` and `.agents`.
pub fn prepare_workspace(ws: &Path, uid: u32) {
    for dir in [".git", ".codex", ".agents"] {
        std::fs::create_dir_all(ws.join(dir)).unwrap();
    }
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join(".codex/config.toml"), "model = \"x\"\n").unwrap();
    for path in
        [ws.to_path_buf(), ws.join(".git"), ws.join(".git/config"), ws.join(".codex"), ws.join(".agents")]
    {
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
    }
}

/// The stand-in's `KEY=VALUE` lines.
pub fn observations(stdout: &str) -> BTreeMap<String, String> {
    stdout.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn get<'a>(seen: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    seen.get(key)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("the stand-in did not report {key}: {seen:#?}"))
}

/// Asserts everything a nested sandbox promises (docs/security.md,
/// "Nested sandboxes"), on what the
/// stand-in saw (`ws` is the workspace on the host, `uid` who owns what
/// the sandbox writes there).
pub fn assert_codex_and_sandbox_runtime(seen: &BTreeMap<String, String>, ws: &Path, uid: u32) {
    let expect = |key: &str, value: &str| assert_eq!(get(seen, key), value, "{key}: {seen:#?}");
    // codex: bwrap --help (bubblewrap 0.11's option list), its probe, its call.
    expect("help_rc", "0");
    // bubblewrap's 70 lines, then our 6 (an empty line, a heading, two
    // extras of two lines each).
    expect("help_lines", "76");
    expect("help_argv0", "1");
    expect("probe_rc", "0");
    expect("codex_rc", "0");
    // WS writable, WS/.git read-only, .codex and .agents empty and read-only,
    // / read-only, nothing writable outside WS.
    expect("ws_write", "ok");
    let written = ws.join("from-nested.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "written\n");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&written).unwrap()), uid);
    expect("git_write", "failed");
    assert_eq!(std::fs::read_to_string(ws.join(".git/config")).unwrap(), "[core]\n");
    expect("codex_entries", "0");
    expect("codex_write", "failed");
    expect("agents_entries", "0");
    expect("agents_write", "failed");
    assert!(!ws.join(".codex/x").exists() && ws.join(".codex/config.toml").exists());
    for key in ["root_write", "tmp_write", "home_write"] {
        expect(key, "failed");
    }
    // A private /proc with only the nested processes; loopback only (the
    // agent itself has the host's interfaces).
    let procs: u32 = get(seen, "procs").parse().unwrap();
    assert!((2..=6).contains(&procs), "processes in the nested /proc: {procs}");
    expect("agent_visible", "0");
    expect("interfaces", "lo,");
    assert!(get(seen, "agent_interfaces").split(',').any(|i| !i.is_empty() && i != "lo"), "{seen:#?}");
    // codex-linux-sandbox's own filter stacks on ours; no privileges; the
    // portal is not reachable from a nested sandbox.
    expect("stacked_mkdir", "denied");
    assert!(!ws.join("stacked").exists());
    expect("seccomp_filters", "2");
    expect("no_new_privs", "1");
    expect("capeff", "0000000000000000");
    expect("portal", "0");
    // stdin, stdout and the exit status pass through.
    expect("pipe_rc", "7");
    expect("pipe_out", "hello");
    // The outer seccomp profile holds in the nested command, and the agent's
    // own namespace and mount calls still fail. The nested command may make
    // its own user namespace and call mount (the kernel, not the filter,
    // answers its null arguments), as under bubblewrap (`--nested-userns`).
    for who in ["nested", "agent"] {
        for call in ["keyctl", "bpf"] {
            expect(&format!("{who}_{call}"), "EPERM");
        }
    }
    expect("agent_unshare", "EPERM");
    expect("agent_mount", "EPERM");
    expect("nested_unshare", "ok");
    expect("nested_mount", "EFAULT");
    assert_ne!(get(seen, "agent_unshare_cmd"), "0");
    // The front end's death, or its parent's with --die-with-parent, ends
    // the nested command.
    expect("killed_front_end", "stopped");
    expect("killed_parent", "stopped");
    // Bad requests: bubblewrap's words, exit 1, no mount left behind.
    expect("missing_rc", "1");
    expect("missing_err", "bwrap: Can't find source path /nonexistent: No such file or directory");
    expect("outside_rc", "1");
    expect("outside_err", "bwrap: Can't use destination /../../x: it is outside the new root");
    expect("unknown_rc", "1");
    expect("unknown_err", "bwrap: Unknown option --frobnicate");
    expect("not_yet_rc", "1");
    expect(
        "not_yet_err",
        "bwrap: --userns is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)",
    );
    expect("mounts", "unchanged");
    // Claude Code's sandbox runtime: --args, --setenv/--unsetenv, --tmpfs,
    // --dev-bind, --cap-drop; --cap-add keeps a capability only inside the
    // nested user namespace.
    expect("srt_env", "yes");
    expect("srt_tmp", "t,");
    expect("srt_devnull", "ok");
    expect("srt_capeff", "0000000000000000");
    expect("srt_rc", "0");
    expect("cap_add", "0000000000001000");
}

/// Host processes whose command line contains `needle` (other than us).
pub fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) {
                found.push(format!("{name}: {text}"));
            }
        }
    }
    found
}

/// Waits up to 5 s until no host process mentions `needle`.
pub fn assert_nothing_left_running(needle: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = processes_with(needle);
        if left.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "still running: {left:#?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
