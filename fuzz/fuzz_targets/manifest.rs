//! The agentInputs manifest: `manifest::parse` and `inputs::Plan::new`.
//!
//! Checked for every input: no panic; every error is one line; a manifest
//! that parses serializes (with the backend's names) to JSON that parses
//! back to the same manifest; targets are normalized (no `..`, no empty or
//! `.` components, no NUL) and stay inside their root; a plan's host paths
//! lie under an allowed root, symlinks resolved (the allowed directory
//! holds links that lead out of it).
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::inputs::{Config, HostAllowlist, Layout, Plan, Step};
use tuixiu_sandbox::manifest::{self, Root};
use tuixiu_sandbox_fuzz::assert_one_line;

struct Host {
    _dir: tempfile::TempDir,
    allowed: PathBuf,
    config: Config,
}

/// `allowed/` (the only allowed root, also the base of relative paths)
/// with a directory, a file, links inside and links out; `outside/` next to it.
fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let dir = tuixiu_sandbox_fuzz::scratch();
        let allowed = dir.path().join("allowed");
        let outside = dir.path().join("outside");
        for d in [allowed.join("skills/demo"), outside.clone()] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(allowed.join("skills/demo/SKILL.md"), "---\nname: demo\n---\n").unwrap();
        std::fs::write(allowed.join("notes.txt"), "notes").unwrap();
        std::fs::write(outside.join("secret"), "secret").unwrap();
        std::os::unix::fs::symlink("skills", allowed.join("link-in")).unwrap();
        std::os::unix::fs::symlink("../outside", allowed.join("link-out")).unwrap();
        std::os::unix::fs::symlink("/etc", allowed.join("link-etc")).unwrap();
        let allowed = std::fs::canonicalize(&allowed).unwrap();
        let config = Config {
            host_paths: HostAllowlist::new(std::slice::from_ref(&allowed)).unwrap(),
            base_dir: allowed.clone(),
            base_url: Some("https://inputs.example/api/v1/".parse().unwrap()),
        };
        Host { _dir: dir, allowed, config }
    })
}

fuzz_target!(|data: &[u8]| {
    let parsed = match manifest::parse(data) {
        Ok(m) => m,
        Err(e) => return assert_one_line("manifest error", &e.to_string()),
    };
    let json = serde_json::to_vec(&parsed).expect("a manifest serializes");
    let again = manifest::parse(&json).unwrap_or_else(|e| {
        panic!("the manifest's own serialization does not parse: {e}\n{}", String::from_utf8_lossy(&json))
    });
    assert_eq!(again, parsed, "serialize + parse changed the manifest");

    let layout = Layout::new("/home/agent");
    for item in &parsed.items {
        let path = &item.target.path;
        assert!(
            path.is_empty()
                || path.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0')),
            "target {path:?} of {} is not normalized",
            item.id
        );
        let guest = layout.guest(item.target.root, path);
        let root = layout.root(item.target.root);
        assert!(sandbox::guest_path::is_within(&guest, root), "{guest} is outside {root}");
        assert!(matches!(item.target.root, Root::Workspace | Root::UserHome | Root::Scratch));
    }

    let host = host();
    let plan = match Plan::new(parsed, &host.config) {
        Ok(p) => p,
        Err(e) => return assert_one_line("plan error", &e.to_string()),
    };
    for line in plan.describe(&layout) {
        assert_one_line("plan line", &line);
    }
    for planned in plan.items() {
        let host_path = match &planned.step {
            Step::Workspace { host, .. } | Step::Bind { host, .. } | Step::Copy { host } => Some(host),
            Step::Checkout { repo: tuixiu_sandbox::inputs::GitRepo::Local(host), .. } => Some(host),
            _ => None,
        };
        if let Some(h) = host_path {
            assert_eq!(h.allowed_root, host.allowed, "{}: not the allowed root", planned.item.id);
            assert!(
                h.canonical.starts_with(&host.allowed) && h.canonical == canonical(&h.canonical),
                "{}: {} is not a canonical path under {}",
                planned.item.id,
                h.canonical.display(),
                host.allowed.display()
            );
        }
        if let Step::Download { url, .. } = &planned.step {
            assert!(matches!(url.scheme(), "http" | "https"), "{}: download from {url}", planned.item.id);
        }
    }
});

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_default()
}
