//! What several fuzz targets share: scratch directories, snapshots of a
//! tree (to prove nothing outside a root changed), the one-line rule for
//! error messages, a daemon that can make instances but start no process,
//! and an allocation counter.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tuixiu_sandbox::provider::AnyProvider;
use tuixiu_sandbox::provider::native::NativeProvider;
use tuixiu_sandbox::proxy::Daemon;
use tuixiu_sandbox::proxy::config::Config;

/// A fresh private directory for one input, removed when dropped. Under
/// `$TMPDIR` (scripts/fuzz.sh points it at a tmpfs when there is one).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("tuixiu-fuzz-").tempdir().expect("a scratch directory")
}

/// Error messages are one line (docs: "one clear line saying what was
/// wrong and where").
#[track_caller]
pub fn assert_one_line(what: &str, message: &str) {
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "{what}: a message of several lines: {message:?}"
    );
}

/// One node of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32, content: Vec<u8> },
    Link { target: PathBuf },
    Other { mode: u32 },
}

/// Everything under a directory (symlinks not followed), by relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<PathBuf, Node>);

impl Snapshot {
    /// Walks `root`; `skip` lists relative paths whose subtrees are left out.
    pub fn take(root: &Path, skip: &[&str]) -> Snapshot {
        let mut out = BTreeMap::new();
        walk(root, Path::new(""), skip, &mut out);
        Snapshot(out)
    }

    pub fn files(&self) -> impl Iterator<Item = (&PathBuf, &Vec<u8>)> {
        self.0.iter().filter_map(|(p, n)| match n {
            Node::File { content, .. } => Some((p, content)),
            _ => None,
        })
    }
}

fn walk(root: &Path, rel: &Path, skip: &[&str], out: &mut BTreeMap<PathBuf, Node>) {
    if skip.iter().any(|s| Path::new(s) == rel) {
        return;
    }
    let path = root.join(rel);
    let Ok(meta) = std::fs::symlink_metadata(&path) else { return };
    let mode = meta.permissions().mode() & 0o7777;
    let ft = meta.file_type();
    let node = if ft.is_symlink() {
        Node::Link { target: std::fs::read_link(&path).unwrap_or_default() }
    } else if ft.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&path)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        names.sort();
        for name in names {
            walk(root, &rel.join(name), skip, out);
        }
        Node::Dir { mode }
    } else if ft.is_file() {
        Node::File { mode, content: std::fs::read(&path).unwrap_or_default() }
    } else {
        Node::Other { mode: meta.mode() }
    };
    out.insert(rel.to_path_buf(), node);
}

/// A proxy config for a daemon in `dir`: state in `dir/state`, workspaces
/// under `dir/root`, git pushes off (no process, no network), `extra` TOML
/// lines appended at the top level.
pub fn proxy_config(dir: &Path, extra: &str) -> Config {
    let text = format!(
        "orchestrator_url = \"ws://127.0.0.1:1/ws/agent\"\nstate_dir = \"{0}/state\"\n\
         outbox_max_messages = 1000000\n{extra}\n\
         [sandbox]\nworkspaceHostRoot = \"{0}/root\"\ngitPush = false\nterminalEnabled = true\n",
        dir.display()
    );
    let table: toml::Table = toml::from_str(&text).expect("the fuzz config is TOML");
    Config::from_table("fuzz.toml", table, &BTreeMap::new()).expect("the fuzz config loads").0
}

/// A daemon whose provider is the real native one, with a launcher that
/// does not exist: instances are made and recorded, every process start
/// fails at once (so nothing runs, on this host or in a sandbox).
pub fn daemon(cfg: Config) -> Daemon {
    let missing = cfg.state_dir.join("no-such-launcher");
    let provider = NativeProvider::new(&cfg.state_dir, missing, &cfg.sandbox.instance_prefix)
        .expect("the native provider");
    Daemon::with_provider(cfg, "fuzz-proxy".into(), AnyProvider::Native(provider))
}

/// A current-thread runtime, as the daemon's, with a paused clock: timers
/// (keepalive, permission and request timeouts) fire as soon as nothing
/// else can run.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("a runtime")
}

/// Counts the bytes allocated through it; `peak` since the last `reset`.
pub struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    /// Starts a measurement: the peak becomes the current size.
    pub fn reset() {
        PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub fn current() -> usize {
        CURRENT.load(Ordering::Relaxed)
    }

    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }

    fn grew(by: usize) {
        let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; only
// the sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            Counting::grew(new_size);
        }
        p
    }
}

/// A value the input cannot know in advance: fresh for every input, so
/// finding it in an answer means the answer read it from where it lies.
pub fn marker() -> String {
    let mut bytes = [0u8; 12];
    // SAFETY: writes at most `bytes.len()` bytes into `bytes`.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(n, bytes.len() as isize, "getrandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The guest paths an agent may read and write in [`guest_tree`].
pub const ALLOWED: &[&str] = &["/workspace", "/home/agent"];

/// A sandbox's `/` as a host tree under `root`, for `GuestFs`: the
/// workspace and home (with links that stay inside and links that lead out
/// of them), and `/etc`, `/secret` and a link-free `/outside` that hold
/// `secret`, which no answer may ever contain.
pub fn guest_tree(root: &Path, secret: &str) {
    for d in ["workspace/src", "home/agent/.config", "etc", "outside/deep"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("workspace/src/a.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(root.join("home/agent/.profile"), "export A=1\n").unwrap();
    for f in ["etc/passwd", "etc/secret", "secret", "outside/deep/secret"] {
        std::fs::write(root.join(f), format!("{secret}\n{secret}\n")).unwrap();
    }
    for (link, target) in [
        ("workspace/etc-link", "/etc"),
        ("workspace/up", "../../etc/secret"),
        ("workspace/up-dir", ".."),
        ("workspace/abs", "/workspace/src/a.txt"),
        ("workspace/rel", "src/a.txt"),
        ("workspace/magic", "/proc/self/root/etc"),
        ("workspace/loop", "loop"),
        ("workspace/home", "/home/agent"),
        ("home/agent/ws", "/workspace"),
        ("home/agent/root", "../../.."),
        ("home/agent/.config/out", "../../../outside/deep"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
}

/// What lies outside [`ALLOWED`] in a [`guest_tree`].
pub fn outside_allowed(root: &Path) -> Snapshot {
    Snapshot::take(root, &["workspace", "home/agent"])
}
