//! The input applier: lands the items of an `agentInputs` manifest.
//!
//! # Interface
//!
//! ```text
//! let manifest = manifest::parse(&bytes)?;                    // pure validation
//! let plan = inputs::Plan::new(manifest, &inputs::Config {..})?;
//!     // host paths allowlisted, URIs resolved, workspace decided; no I/O
//!     // beyond stat/canonicalize. plan.workspace(), plan.binds(),
//!     // plan.uses(Root::Scratch) tell a provider what to mount.
//! let fetched = plan.fetch(&inputs::FetchOptions {..})?;
//!     // the slow part, before any sandbox exists: downloads into the
//!     // cache (verified by sha256), git clones into private temp dirs
//!     // (held locked, so that a killed run's are swept by the next).
//!     // Leaves the process single-threaded; drop `fetched` after `apply`.
//! inputs::apply(&fetched, &mut dest, &inputs::ApplyOptions {..}, &mut audit)?;
//!     // strictly in manifest order; the first failure stops.
//! ```
//!
//! `dest` is a [`Destination`]: [`SandboxDest`] inside
//! `sandbox::launch_with`'s apply callback (binds are the spec's deferred
//! binds, attached at their turn), or [`HostDirs`] for providers whose
//! roots are host directories (docker volumes, the host provider), where
//! bind items are left to the provider.
//!
//! Every error is an [`InputError`]: one line, a stable code, the item id.
//!
//! # Safety rules
//!
//! * hostPath sources (copy, bindMount, local git) must lie under an
//!   allowed root, symlinks resolved, and are opened without following a
//!   symlink swapped in later;
//! * every write resolves its target under the logical root's descriptor
//!   with `RESOLVE_IN_ROOT`, so symlinks and `..` stay inside that root;
//! * trees (copy, downloadExtract, checkout) are built next to the target
//!   and renamed into place when complete; a failure leaves the old target;
//! * archives go through the safe extractor ([`zip`]).

mod apply;
mod audit;
mod dest;
mod download;
mod error;
pub use crate::hostfs::root as fsx;
mod git;
mod hostpath;
pub mod landed;
mod plan;
pub mod zip;

use std::path::PathBuf;

// The whole interface is exported for the providers (docker, host) and the
// daemon; `run` uses only part of it.
#[allow(unused_imports)]
pub use apply::{ApplyOptions, apply};
#[allow(unused_imports)]
pub use audit::{Audit, Record};
#[allow(unused_imports)]
pub use dest::{BindOutcome, Destination, HostDirs, SandboxDest};
#[allow(unused_imports)]
pub use download::{Cache, DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT, DownloadOptions, Secret, Zip, hash_file};
pub use error::{BindError, CacheError, Cause, Code, CopyError, GitFailure, InputError, LandError};
pub use git::{ASKPASS_ENV, GitCredentials, GitOptions, askpass_main};
#[allow(unused_imports)]
pub use hostpath::{AllowlistError, HostAllowlist, HostPath};
#[allow(unused_imports)]
pub use plan::{
    Config, Described, GitRepo, Layout, MAX_BINDS, Plan, Planned, Step, describe_source, display_url,
};
pub use zip::ZipLimits;

use crate::env::Redactor;

/// How the fetch phase works.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Needed when the plan has downloads.
    pub cache: Option<Cache>,
    pub download: DownloadOptions,
    pub git: GitOptions,
    /// Hides secrets in error messages (git output, HTTP error bodies).
    pub redactor: Redactor,
    /// For a root caller whose sandbox user maps onto other host ids
    /// (`--map-uid`): git checkouts are handed to these ids, since the
    /// apply phase reads them with those filesystem ids.
    pub owner: Option<(u32, u32)>,
}

/// A plan with everything slow done: what `apply` consumes.
pub struct Fetched {
    plan: Plan,
    resources: Vec<Resource>,
    /// Checkouts live here until the fetched inputs are dropped, each
    /// held locked so that a later run knows it is not litter.
    _temp: Vec<(tempfile::TempDir, std::os::fd::OwnedFd)>,
}

#[allow(dead_code)] // for providers
impl Fetched {
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The fetched archive of item `index`, if it is a download.
    pub fn zip(&self, index: usize) -> Option<&Zip> {
        match self.resources.get(index) {
            Some(Resource::Zip(z)) => Some(z),
            _ => None,
        }
    }
}

/// What the fetch phase prepared for one item.
pub(crate) enum Resource {
    None,
    /// A downloaded (or cached) archive.
    Zip(Zip),
    /// A checkout in a private temporary directory (its `repo`).
    ///
    /// Directories, copy sources included, are opened only during the
    /// apply phase: a descriptor open when the sandbox is cloned would be
    /// inherited by its PID 1, a handle on a host tree reachable through
    /// `/proc/1/fd` from inside.
    Tree(PathBuf),
}

impl Plan {
    /// Downloads and clones what the items need, in order; the first
    /// failure stops. Call it before the sandbox is launched: it may take a
    /// while and uses the network.
    pub fn fetch(self, options: &FetchOptions) -> Result<Fetched, InputError> {
        let mut resources: Vec<Resource> = Vec::with_capacity(self.items().len());
        let mut temp = Vec::new();

        let jobs: Vec<download::Job<'_>> = self
            .items()
            .iter()
            .filter_map(|p| match &p.step {
                Step::Download { url, content_hash } => {
                    Some(download::Job { item: &p.item.id, url, content_hash: content_hash.as_deref() })
                }
                _ => None,
            })
            .collect();
        let mut zips = if jobs.is_empty() {
            Vec::new()
        } else {
            let cache = need_cache(options, jobs[0].item)?;
            download::fetch_all(&jobs, cache, &options.download, &options.redactor)?
        }
        .into_iter();
        drop(jobs);

        for planned in self.items() {
            let id = planned.item.id.as_str();
            let resource = match &planned.step {
                Step::Download { .. } => Resource::Zip(zips.next().expect("one archive per download item")),
                // Checked now (exists, allowed); opened at its turn.
                Step::Copy { .. } => Resource::None,
                Step::Checkout { repo, git_ref } => {
                    let (scratch, lock) = checkout_dir(id)?;
                    let dir = scratch.path().join("repo");
                    git::checkout(
                        repo,
                        git_ref.as_deref(),
                        &dir,
                        scratch.path(),
                        &options.git,
                        &options.redactor,
                    )
                    .map_err(|f| {
                        let code = if f.timed_out() { Code::GitTimeout } else { Code::GitFailed };
                        InputError::new(code, id, Cause::Checkout(f))
                    })?;
                    if let Some((uid, gid)) = options.owner {
                        chown_tree(scratch.path(), uid, gid)
                            .map_err(|e| InputError::new(Code::GitFailed, id, Cause::CheckoutChown(e)))?;
                    }
                    temp.push((scratch, lock));
                    Resource::Tree(dir)
                }
                Step::Workspace { .. } | Step::Bind { .. } | Step::WriteFile { .. } => Resource::None,
            };
            resources.push(resource);
        }
        Ok(Fetched { plan: self, resources, _temp: temp })
    }
}

/// The name prefix of checkout directories in the temporary directory.
const CHECKOUT_PREFIX: &str = "tuixiu-checkout-";

/// A private directory (0700) in the system's temporary directory for one
/// checkout, reachable by the ids the apply phase uses, and held locked
/// (the descriptor; the sandbox's PID 1 closes its copy first thing). The
/// first one of a run sweeps what killed runs of this user left there.
fn checkout_dir(id: &str) -> Result<(tempfile::TempDir, std::os::fd::OwnedFd), InputError> {
    use std::os::fd::AsFd;
    let fail = |cause: Cause| InputError::new(Code::GitFailed, id, cause);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if let Ok(tmp) =
            nix::fcntl::open(&std::env::temp_dir(), fsx::dir_read_flags(), nix::sys::stat::Mode::empty())
        {
            let uid = nix::unistd::geteuid().as_raw();
            fsx::sweep_unlocked(tmp.as_fd(), is_checkout_name, Some(uid));
        }
    });
    loop {
        let scratch = tempfile::Builder::new()
            .prefix(CHECKOUT_PREFIX)
            .tempdir()
            .map_err(|e| fail(Cause::CheckoutDir(e)))?;
        let fd = nix::fcntl::open(scratch.path(), fsx::dir_read_flags(), nix::sys::stat::Mode::empty())
            .map_err(|source| fail(Cause::CheckoutDirOpen { path: scratch.path().to_path_buf(), source }))?;
        if fsx::lock_new(fd.as_fd(), c"checkout").map_err(|e| fail(Cause::CheckoutDirLock(e)))? {
            return Ok((scratch, fd));
        }
    }
}

/// `tuixiu-checkout-` and the six random characters `tempfile` adds.
fn is_checkout_name(name: &[u8]) -> bool {
    name.strip_prefix(CHECKOUT_PREFIX.as_bytes())
        .is_some_and(|rest| rest.len() == 6 && rest.iter().all(u8::is_ascii_alphanumeric))
}

/// The cache `plan`'s downloads need: `None` without downloads; `dir` when
/// one is configured (an unusable one fails as the first download item's
/// `AGENT_INPUTS_CACHE` error); else [`Cache::default_location`], which
/// never fails.
pub fn cache_for(plan: &Plan, dir: Option<&std::path::Path>) -> Result<Option<Cache>, InputError> {
    let Some(first) = plan.items().iter().find(|p| matches!(p.step, Step::Download { .. })) else {
        return Ok(None);
    };
    match dir {
        Some(dir) => Cache::open(dir)
            .map(Some)
            .map_err(|e| InputError::new(Code::Cache, &first.item.id, Cause::Cache(e))),
        None => Ok(Some(Cache::default_location())),
    }
}

fn need_cache<'o>(options: &'o FetchOptions, item: &str) -> Result<&'o Cache, InputError> {
    options.cache.as_ref().ok_or_else(|| InputError::new(Code::Cache, item, Cause::NoCache))
}

/// Hands a tree this process made to other ids (never following links).
fn chown_tree(dir: &std::path::Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        if std::fs::symlink_metadata(&path)?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Threads still running after the input fetch.
#[derive(Debug, thiserror::Error)]
#[error("the input fetch left {0} threads running; the sandbox needs a single-threaded launcher")]
pub struct ThreadsLeft(pub usize);

/// Waits (briefly) until this process has a single thread again, as
/// `sandbox::launch` requires: a joined thread can linger in
/// `/proc/self/task` for a moment after `join` returns.
pub fn wait_single_threaded() -> Result<(), ThreadsLeft> {
    let count = || std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let n = count();
        if n <= 1 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(ThreadsLeft(n));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkout_directory_names_are_recognised_and_nothing_else() {
        assert!(is_checkout_name(b"tuixiu-checkout-Ab3xY9"));
        for other in [
            "tuixiu-checkout-",
            "tuixiu-checkout-abc",
            "tuixiu-checkout-abcdefg",
            "tuixiu-checkout-ab.d-f",
            "x-checkout-abcdef",
        ] {
            assert!(!is_checkout_name(other.as_bytes()), "{other}");
        }
    }
    use crate::manifest::parse_value;
    use serde_json::json;

    /// The providers' way: roots are plain host directories, binds are
    /// their volumes.
    #[test]
    fn lands_into_host_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let (ws, home, src) = (tmp.path().join("ws"), tmp.path().join("home"), tmp.path().join("src"));
        for d in [&ws, &home, &src] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(src.join("f.txt"), "f\n").unwrap();
        std::os::unix::fs::symlink("f.txt", src.join("link")).unwrap();
        let manifest = parse_value(&json!({"version": 1, "items": [
            {"id": "w", "apply": "writeFile", "source": {"type": "inlineText", "text": "hello"},
             "target": {"root": "WORKSPACE", "path": "a/b.txt"}},
            {"id": "c", "apply": "copy", "source": {"type": "hostPath", "path": src}, "target": {"root": "USER_HOME", "path": "pkg"}},
            {"id": "v", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": src},
             "target": {"root": "WORKSPACE", "path": "vendor"}},
            {"id": "x", "apply": "writeFile", "source": {"type": "inlineText", "text": "extra"},
             "target": {"root": "USER_HOME", "path": "pkg/extra"}}
        ]}))
        .unwrap();
        let config = Config {
            host_paths: HostAllowlist::new(std::slice::from_ref(&src)).unwrap(),
            base_dir: tmp.path().to_path_buf(),
            base_url: None,
        };
        let plan = Plan::new(manifest, &config).unwrap();
        let options = FetchOptions {
            cache: None,
            download: DownloadOptions::default(),
            git: GitOptions::default(),
            redactor: Redactor::default(),
            owner: None,
        };
        let fetched = plan.fetch(&options).unwrap();
        let mut dest = HostDirs {
            layout: Layout::new("/home/agent"),
            workspace: Some(ws.clone()),
            home: Some(home.clone()),
            scratch: None,
            binds_are_volumes: true,
        };
        let log = tmp.path().join("audit.jsonl");
        let mut audit = Audit::open(&log).unwrap();
        apply(&fetched, &mut dest, &ApplyOptions::default(), &mut audit).unwrap();

        assert_eq!(std::fs::read_to_string(ws.join("a/b.txt")).unwrap(), "hello");
        assert_eq!(std::fs::read_to_string(home.join("pkg/f.txt")).unwrap(), "f\n");
        assert_eq!(std::fs::read_link(home.join("pkg/link")).unwrap(), std::path::Path::new("f.txt"));
        assert_eq!(std::fs::read_to_string(home.join("pkg/extra")).unwrap(), "extra");
        // The bind's mount point exists; mounting it is the provider's job.
        assert!(ws.join("vendor").is_dir());
        let records: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 4);
        assert_eq!(records[2]["note"], "mounted by the provider as a volume");
        assert_eq!(records[0]["target"], "/workspace/a/b.txt");

        // Without volumes, a bind item is an error naming the item.
        dest.binds_are_volumes = false;
        let err = apply(&fetched, &mut dest, &ApplyOptions::default(), &mut Audit::log_only()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AGENT_INPUTS_BIND_FAILED:v: bindMount: this provider cannot mount binds"
        );
        // A missing root is an error too, not a write elsewhere.
        dest.workspace = None;
        let err = apply(&fetched, &mut dest, &ApplyOptions::default(), &mut Audit::log_only()).unwrap_err();
        assert!(err.to_string().starts_with("AGENT_INPUTS_TARGET_FAILED:w: writeFile: "), "{err}");
    }

    #[test]
    fn replacing_a_tree_keeps_the_old_one_on_failure() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("t")).unwrap();
        std::fs::write(tmp.path().join("t/old"), "old").unwrap();
        let root = nix::fcntl::open(
            tmp.path(),
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        use std::os::fd::AsFd;
        let failed: Result<(), fsx::FsError> = fsx::replace_tree(
            root.as_fd(),
            "t",
            |stage| {
                fsx::create_file(stage, c"half", 0o644)?;
                Err(fsx::fs_err("fill", "t", nix::errno::Errno::EIO))
            },
            |_| Ok(()),
        );
        assert!(failed.is_err());
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("t")]);
        assert_eq!(std::fs::read_to_string(tmp.path().join("t/old")).unwrap(), "old");

        fsx::replace_tree(
            root.as_fd(),
            "t",
            |stage| fsx::create_file(stage, c"new", 0o644).map(drop),
            |_| Ok::<(), fsx::FsError>(()),
        )
        .unwrap();
        let names: Vec<_> =
            std::fs::read_dir(tmp.path().join("t")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("new")]);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "a staging directory was left");
    }
}
