//! Fault: the launcher SIGKILLed at random points of its setup, in a loop
//! (docs/reliability.md's fault matrix). A `run --manifest` with a
//! download and a zip landed in the workspace, a git checkout and a
//! writeFile
//! is killed after a random delay within its usual setup time, for every
//! kind of caller. After each kill nothing of it may keep running (this
//! test is the subreaper, so whatever it orphaned comes to us) and no
//! mount is left on the host; what it had on disk (checkout
//! directories, downloads in progress, staging entries, its cgroup) is
//! removed by the next run. `TUIXIU_FAULT_ITERATIONS` sets the kills per
//! caller (default 12 in CI; `scripts/fault-launcher-kill.sh` runs a long loop),
//! `TUIXIU_FAULT_SEED` the random sequence.

mod common;
mod inputs_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Caller, stderr};
use inputs_support::{HttpServer, Inputs, Reply, ZipEntry, git, zip};
use serde_json::json;

/// xorshift64*: enough randomness for delays, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Every process whose parent is this process (any of its threads).
fn our_children() -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline));
        }
    }
    found
}

/// Reaps our exited children until none is left or `grace` has passed;
/// returns those still there.
fn reap_until_gone(grace: Duration) -> Vec<(u32, String)> {
    let deadline = Instant::now() + grace;
    loop {
        // SAFETY: reaping any exited child of ours, without blocking.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let left = our_children();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Mounts in this (the host's) mount namespace at or from a path under
/// `dir`. Other tests of this machine mount elsewhere at the same time, so
/// the whole table cannot be compared; a sandbox's mounts would be on its
/// fixture's paths.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().skip(3).take(2).any(|f| f.starts_with(dir)))
        .map(str::to_string)
        .collect()
}

/// Names in `dir` (recursively, one level of subdirectories) that a run
/// leaves only when it is killed.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".tuixiu-")
            || name.starts_with("tuixiu-checkout-")
            || name.starts_with("download-")
        {
            found.push(e.path().display().to_string());
        } else if e.file_type().is_ok_and(|t| t.is_dir()) && !name.starts_with('.') {
            found.extend(leftovers(&e.path()));
        }
    }
    found
}

struct Setup {
    t: Inputs,
    tmpdir: std::path::PathBuf,
    _server: HttpServer,
}

fn setup(caller: Caller) -> Setup {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    let data = vec![5u8; 8 << 10];
    let entries: Vec<ZipEntry> = (0..600).map(|i| ZipEntry::file(&format!("s/f{i}"), &data)).collect();
    server.route("/skill.zip", Reply::Body(zip(&entries)));
    // A local repository to check out.
    let work = t.f.dir.join("repo-work");
    let bare = t.host.join("repo.git");
    std::fs::create_dir(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README.md"), "repo\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-qm", "one"]);
    git(&t.f.dir, &["clone", "-q", "--bare", work.to_str().unwrap(), bare.to_str().unwrap()]);
    assert!(Command::new("chmod").args(["-R", "a+rX"]).arg(&bare).status().unwrap().success());
    let tmpdir = t.f.dir.join("tmpdir");
    std::fs::create_dir(&tmpdir).unwrap();
    std::os::unix::fs::chown(&tmpdir, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
    t.write(json!([
        t.workspace_item(),
        {"id": "note", "apply": "writeFile", "source": {"type": "inlineText", "text": "n"},
         "target": {"root": "WORKSPACE", "path": "note.txt"}},
        {"id": "skill", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": server.url("/skill.zip")},
         "target": {"root": "WORKSPACE", "path": "skill"}},
        {"id": "repo", "apply": "checkout", "source": {"type": "git", "repo": bare},
         "target": {"root": "SCRATCH", "path": "repo"}},
    ]));
    Setup { t, tmpdir, _server: server }
}

fn run_command(s: &Setup) -> Command {
    let mut cmd = s.t.command(&[], &["true"]);
    cmd.env("TMPDIR", &s.tmpdir);
    cmd
}

#[test]
fn launcher_killed_at_random_points_of_setup_leaves_nothing_behind() {
    common::require_root();
    // SAFETY: plain prctl on this process: orphans of the runs we start
    // come to us, so nothing they leave running can hide.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }, 0);
    let iterations: u64 =
        std::env::var("TUIXIU_FAULT_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let seed: u64 =
        std::env::var("TUIXIU_FAULT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
    println!("TUIXIU_FAULT_SEED={seed}");
    let mut rng = Rng(seed);
    for caller in [Caller::Root, Caller::Unprivileged, Caller::Nested] {
        let s = setup(caller);
        // How long a whole run takes here: the kills land within it.
        let started = Instant::now();
        let out = run_command(&s).output().unwrap();
        assert!(out.status.success(), "{caller:?}: {}", stderr(&out));
        let whole = started.elapsed();
        let mut killed_running = 0;
        for i in 0..iterations {
            let delay = Duration::from_micros(rng.below(whole.as_micros() as u64 * 11 / 10));
            let mut child = run_command(&s)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(delay);
            // SAFETY: signalling the child we spawned.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let status = child.wait().unwrap();
            if status.code().is_none() {
                killed_running += 1;
            }
            let left = reap_until_gone(Duration::from_secs(5));
            assert!(left.is_empty(), "{caller:?} kill {i} after {delay:?}: left running: {left:?}");
            let mounts = mounts_under(&s.t.f.dir);
            assert!(mounts.is_empty(), "{caller:?} kill {i} after {delay:?}: mounts on the host: {mounts:?}");
        }
        // The next run lands everything and removes what the killed ones left.
        let out = run_command(&s).output().unwrap();
        assert!(out.status.success(), "{caller:?}: {}", stderr(&out));
        assert!(reap_until_gone(Duration::from_secs(5)).is_empty());
        let mut left = leftovers(&s.tmpdir);
        left.extend(leftovers(&s.t.f.workspace));
        left.extend(leftovers(&s.t.cache.join("tmp")));
        assert!(left.is_empty(), "{caller:?}: left on disk after the next run: {left:?}");
        assert_eq!(std::fs::read_to_string(s.t.f.workspace.join("note.txt")).unwrap(), "n");
        println!(
            "{caller:?}: {iterations} kills within {whole:?} ({killed_running} before the run ended): nothing left"
        );
    }
}
