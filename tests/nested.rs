//! Nested sandboxes (issue 13): an agent that runs `bwrap` itself, inside
//! `tuixiu-sandbox run`, as root, as uid 65534 and nested in `unshare -U -r`.
//! The stand-in agent (tests/fixtures/nested/) calls bwrap with codex-acp's
//! exact command lines and Claude Code's sandbox-runtime options.

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
    let out = f.run(&[], &["sh", "-c", "command -v bwrap; bwrap --version"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("/run/tuixiu/bin/bwrap\nbubblewrap 0.11.1 (tuixiu-sandbox"), "{text}");
}

#[test]
fn the_hosts_own_bwrap_is_covered_by_the_front_end() {
    // scripts/ci-setup.d/40-bubblewrap.sh installs bubblewrap: agents that
    // call /usr/bin/bwrap by path get ours too.
    assert!(std::path::Path::new("/usr/bin/bwrap").exists(), "install bubblewrap (scripts/ci-setup.d)");
    let f = Fixture::new(Caller::Unprivileged);
    let out = f.run(&[], &["/usr/bin/bwrap", "--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tuixiu-sandbox"));
    let out = f.run(&["--nested", "off"], &["/usr/bin/bwrap", "--version"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("bubblewrap 0."), "the host's own");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("tuixiu-sandbox"));
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
fn the_front_end_outside_a_sandbox_says_so() {
    let f = Fixture::new(Caller::Root);
    let out = f.command(&["bwrap", "--ro-bind", "/", "/", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("bwrap: nested sandboxes are not available here (/run/tuixiu/nested.sock: "),
        "{err}"
    );
    // --help works anywhere.
    let out = f.command(&["bwrap", "--help"]).output().unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .starts_with("usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]")
    );
}
