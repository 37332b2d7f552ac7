//! Landing a manifest again over a target that may hold someone's work
//! (docs/manifest.md, "Landing again"): one rule for every landing of
//! the daemon (every `acp_open` and `prompt_send`, with or without `init`,
//! after a restart, an expiry, a crash) and for `run --manifest` on a
//! named instance.
//!
//! After items land, each target gets a [`Record`]: a fingerprint of the
//! target and a digest of the item as it was landed. The next landing
//! decides per item ([`decide`]): a target exactly as landed is left (same
//! item) or replaced (the item changed: only what was landed is
//! replaced); a missing target that was never landed (or a scratch
//! target: the scratch goes with its instance) lands; a target that
//! changed or was removed since it landed, or that exists and was never
//! landed here, is never touched: it is reported, and when the item's
//! content is new, that content lands aside ([`land_aside`]) so both
//! versions can be found.
//!
//! A fingerprint covers metadata only, never content (a target may be a
//! FIFO, a huge file or a tree the agent filled): for every entry of the
//! target, symlinks never followed, its relative path, type, mode, size,
//! inode, modification and change times. The change time (`ctime`) cannot
//! be set by a process, so an edit that restores the old modification time
//! is still seen.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, SFlag, fstat};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::fsx;
use crate::manifest::{Apply, Item, Manifest, Root};

/// Why a target could not be fingerprinted (it is then left alone).
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error(transparent)]
    Fs(#[from] fsx::FsError),
    #[error("more than {} entries", MAX_ENTRIES)]
    TooMany,
    #[error("deeper than {} directories", MAX_DEPTH)]
    TooDeep,
    /// `call` failed on the entry at `path` (relative to the target).
    #[error("{call}({path:?}) => {errno}")]
    Entry { call: &'static str, path: String, errno: Errno },
    #[error("open({path:?}/{name:?}) => {errno}")]
    Child { path: String, name: CString, errno: Errno },
}

/// What was landed for one item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RecordForm")]
pub struct Record {
    /// The target's fingerprint right after it landed.
    pub fingerprint: String,
    /// [`item_digest`] of the item that landed (`None`: a record of an
    /// earlier version, which kept the fingerprint alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
}

/// The forms a record has had on disk: the fingerprint alone, or whole.
#[derive(Deserialize)]
#[serde(untagged)]
enum RecordForm {
    Fingerprint(String),
    Whole {
        fingerprint: String,
        #[serde(default)]
        item: Option<String>,
    },
}

impl From<RecordForm> for Record {
    fn from(f: RecordForm) -> Record {
        match f {
            RecordForm::Fingerprint(fingerprint) => Record { fingerprint, item: None },
            RecordForm::Whole { fingerprint, item } => Record { fingerprint, item },
        }
    }
}

/// Item id → what was landed for it.
pub type Landed = BTreeMap<String, Record>;

/// Entries a fingerprinted target may have; a larger tree is treated as
/// changed (never overwritten).
const MAX_ENTRIES: usize = 200_000;
/// Directory depth a fingerprint walks.
const MAX_DEPTH: usize = 128;

/// What a landing does with one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing of anyone's to lose there: land it.
    Land,
    /// Exactly as landed, from the same item: nothing to do.
    AsLanded,
    /// Left alone and reported, with the reason; `aside`: the item is not
    /// the one that landed there, so its content lands aside.
    LeftAlone { why: &'static str, aside: bool },
}

/// Whether the item lands anything (binds are mounts of the instance).
pub fn lands(item: &Item) -> bool {
    item.apply != Apply::BindMount
}

/// What an item lands (its kind, access, source and target; not its
/// display name), as a digest: a different digest is different content.
pub fn item_digest(item: &Item) -> String {
    let what = serde_json::json!([item.apply, item.access, item.source, item.target]);
    hex(&Sha256::digest(what.to_string().as_bytes()))
}

/// The decision for `item`, whose target was landed as `recorded` (if
/// ever) and is `current` now.
pub fn decide(
    item: &Item,
    recorded: Option<&Record>,
    current: &Result<Option<String>, FingerprintError>,
) -> Decision {
    let digest = item_digest(item);
    // Known to differ from what landed: a record without a digest says
    // nothing, no record at all means nothing of this item is there.
    let new_content = recorded.is_none_or(|r| r.item.as_ref().is_some_and(|d| *d != digest));
    let left = |why| Decision::LeftAlone { why, aside: new_content };
    match (recorded, current) {
        (Some(r), Ok(Some(c))) if r.fingerprint == *c => {
            if r.item.as_deref() == Some(digest.as_str()) {
                Decision::AsLanded
            } else {
                // Only what was landed is replaced.
                Decision::Land
            }
        }
        (_, Ok(None)) if item.target.root == Root::Scratch => Decision::Land,
        (None, Ok(None)) => Decision::Land,
        (Some(_), Ok(None)) => left("was removed since it was applied"),
        (Some(_), Ok(Some(_))) => left("changed since it was applied"),
        (None, Ok(Some(_))) => left("exists and was not applied by this run"),
        (_, Err(_)) => left("cannot be compared with what was applied"),
    }
}

/// An item left alone by a landing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftAlone {
    pub id: String,
    pub root: Root,
    pub path: String,
    pub why: &'static str,
    /// Its content is new: it goes aside.
    pub aside: bool,
}

impl LeftAlone {
    /// The report of this item, as the backend and the log get it: what
    /// was left alone, why, and (`aside`: how landing its new content
    /// under that directory went) where the backend's content is.
    pub fn report(&self, layout: &super::Layout, aside: Option<&Result<PathBuf, AsideError>>) -> String {
        let target = layout.guest(self.root, &self.path);
        let mut text = format!(
            "agentInputs item {}: {target} {}: left as it is (inputs are never landed over the agent's work)",
            self.id, self.why
        );
        match aside.filter(|_| self.aside) {
            Some(Ok(dir)) => text.push_str(&format!(
                "; the new content for it is at {} on the host",
                aside_path(dir, self.root, &self.path).display()
            )),
            Some(Err(e)) => text.push_str(&format!("; its new content could not be kept aside: {e}")),
            None => {}
        }
        text
    }
}

/// The records kept in `file` (`None`: no file, nothing was landed there yet).
pub fn read_records(file: &Path) -> Result<Option<Landed>, RecordsError> {
    let err = |source| RecordsError::Io { file: file.to_path_buf(), source };
    match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RecordsError::Parse { file: file.to_path_buf(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(e)),
    }
}

/// Replaces `file` with `records` (0600, atomically, synced).
pub fn write_records(file: &Path, records: &Landed) -> Result<(), RecordsError> {
    let bytes = serde_json::to_vec_pretty(records).expect("plain data");
    crate::hostfs::atomic::write(file, &bytes, crate::hostfs::atomic::Durability::Synced)
        .map_err(|source| RecordsError::Io { file: file.to_path_buf(), source })
}

/// A records file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("{}: {}", .file.display(), sandbox::error::io_error_text(.source))]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: {source}", .file.display())]
    Parse { file: PathBuf, source: serde_json::Error },
}

/// Which items of a manifest land now.
#[derive(Debug)]
pub struct Selection {
    /// The items to land at their targets (binds included: they are the
    /// instance's mounts, recorded by the applier).
    pub land: Manifest,
    /// Items left alone whose new content lands aside.
    pub aside: Manifest,
    pub left_alone: Vec<LeftAlone>,
    /// The records of items not landed now.
    pub keep: Landed,
}

/// Decides every item of `manifest` against `recorded`.
pub fn select(manifest: &Manifest, recorded: &Landed, roots: &Roots) -> Selection {
    let empty =
        || Manifest { version: manifest.version, env_patch: manifest.env_patch.clone(), items: Vec::new() };
    let mut selection =
        Selection { land: empty(), aside: empty(), left_alone: Vec::new(), keep: Landed::new() };
    for item in &manifest.items {
        if !lands(item) {
            selection.land.items.push(item.clone());
            continue;
        }
        let r = recorded.get(&item.id);
        match decide(item, r, &roots.fingerprint(item)) {
            Decision::Land => selection.land.items.push(item.clone()),
            Decision::AsLanded => {
                selection.keep.insert(item.id.clone(), r.cloned().expect("as landed: recorded"));
            }
            Decision::LeftAlone { why, aside } => {
                if let Some(r) = r {
                    selection.keep.insert(item.id.clone(), r.clone());
                }
                if aside {
                    selection.aside.items.push(item.clone());
                }
                selection.left_alone.push(LeftAlone {
                    id: item.id.clone(),
                    root: item.target.root,
                    path: item.target.path.clone(),
                    why,
                    aside,
                });
            }
        }
    }
    selection
}

/// The records after landing `landed` (all of them, or the first ones
/// when one failed: whatever changed since `before` landed now); the
/// items whose target could not be fingerprinted, with why.
pub fn record(
    landed: &Manifest,
    before: &Landed,
    roots: &Roots,
) -> (Landed, Vec<(String, FingerprintError)>) {
    let (mut out, mut failed) = (Landed::new(), Vec::new());
    // Every item after all of them: a later item may land inside an
    // earlier one's tree.
    for item in landed.items.iter().filter(|i| lands(i)) {
        let old = before.get(&item.id);
        match roots.fingerprint(item) {
            Ok(Some(fp)) => {
                let record = match old {
                    // Untouched: not reached (a failure stopped the walk).
                    Some(r) if r.fingerprint == fp => r.clone(),
                    _ => Record { fingerprint: fp, item: Some(item_digest(item)) },
                };
                out.insert(item.id.clone(), record);
            }
            Ok(None) => {}
            Err(e) => failed.push((item.id.clone(), e)),
        }
    }
    (out, failed)
}

/// The three roots of a landing, by descriptors opened once (by the
/// caller: a writer that takes another user's filesystem ids can still
/// reach them through [`Roots::host_dirs`], whatever their parents allow).
#[derive(Debug)]
pub struct Roots {
    fds: [Option<OwnedFd>; 3],
}

/// Why a root could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("open {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
pub struct OpenRootError {
    pub dir: PathBuf,
    pub source: std::io::Error,
}

fn slot(root: Root) -> usize {
    match root {
        Root::Workspace => 0,
        Root::UserHome => 1,
        Root::Scratch => 2,
    }
}

impl Roots {
    /// Opens the directories behind the roots (`None`: the root is not there).
    pub fn open(workspace: &Path, home: &Path, scratch: Option<&Path>) -> Result<Roots, OpenRootError> {
        let open = |dir: &Path| {
            nix::fcntl::open(
                dir,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| OpenRootError { dir: dir.to_path_buf(), source: e.into() })
        };
        Ok(Roots { fds: [Some(open(workspace)?), Some(open(home)?), scratch.map(open).transpose()?] })
    }

    pub fn fd(&self, root: Root) -> Option<BorrowedFd<'_>> {
        self.fds[slot(root)].as_ref().map(|fd| fd.as_fd())
    }

    /// The fingerprint of `item`'s target (`None`: nothing there, or no root).
    pub fn fingerprint(&self, item: &Item) -> Result<Option<String>, FingerprintError> {
        match self.fd(item.target.root) {
            Some(fd) => fingerprint(fd, &item.target.path),
            None => Ok(None),
        }
    }

    /// The roots as the applier's host directories, by `/proc/self/fd`
    /// paths of these descriptors (valid in this process while `self` lives).
    pub fn host_dirs(&self, layout: super::Layout) -> super::HostDirs {
        let path = |root| self.fd(root).map(|fd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())));
        super::HostDirs {
            workspace: path(Root::Workspace),
            home: path(Root::UserHome),
            scratch: path(Root::Scratch),
            layout,
            binds_are_volumes: true,
        }
    }
}

/// Why items could not be landed aside.
#[derive(Debug, thiserror::Error)]
pub enum AsideError {
    #[error("{call} {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Dir { call: &'static str, path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Inputs(#[from] super::InputError),
}

/// Where an item's content lands aside under `dir`: `workspace/`,
/// `home/` or `scratch/`, then the item's target path.
pub fn aside_path(dir: &Path, root: Root, path: &str) -> PathBuf {
    let base = dir.join(match root {
        Root::Workspace => "workspace",
        Root::UserHome => "home",
        Root::Scratch => "scratch",
    });
    if path.is_empty() { base } else { base.join(path) }
}

/// Lands the items of `aside` (a plan of [`Selection::aside`]) under
/// `dir` ([`aside_path`]), as the caller's user, replacing whatever an
/// earlier landing put there; the directories are 0700 (the content may
/// be as private as the targets').
pub fn land_aside(
    aside: super::Plan,
    options: &super::FetchOptions,
    layout: super::Layout,
    dir: &Path,
) -> Result<(), AsideError> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |call, path: &Path| {
        let path = path.to_path_buf();
        move |source| AsideError::Dir { call, path, source }
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", dir)(e)),
    }
    let mut made = std::fs::DirBuilder::new();
    made.recursive(true).mode(0o700);
    for root in [Root::Workspace, Root::UserHome, Root::Scratch] {
        let sub = aside_path(dir, root, "");
        made.create(&sub).map_err(io("mkdir", &sub))?;
    }
    let roots = Roots::open(
        &aside_path(dir, Root::Workspace, ""),
        &aside_path(dir, Root::UserHome, ""),
        Some(&aside_path(dir, Root::Scratch, "")),
    )
    .map_err(|e| AsideError::Dir { call: "open", path: e.dir, source: e.source })?;
    let fetched = aside.fetch(options)?;
    let mut dest = roots.host_dirs(layout);
    super::apply(&fetched, &mut dest, &super::ApplyOptions::default(), &mut super::Audit::log_only())?;
    Ok(())
}

/// The fingerprint of what is at `rel` under the directory `root`, never
/// following a symlink; `None` when nothing is there.
pub fn fingerprint(root: BorrowedFd<'_>, rel: &str) -> Result<Option<String>, FingerprintError> {
    let top = match fsx::open_in_root(root, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(fd) => fd,
        Err(e) if e.errno == Errno::ENOENT => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut hash = Sha256::new();
    let mut entries = 0usize;
    // Depth-first, names sorted, one descriptor per level.
    let mut stack: Vec<(String, OwnedFd, usize)> = vec![(String::new(), top, 0)];
    while let Some((path, fd, depth)) = stack.pop() {
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(FingerprintError::TooMany);
        }
        let st = fstat(fd.as_fd()).map_err(|errno| FingerprintError::Entry {
            call: "fstat",
            path: path.clone(),
            errno,
        })?;
        add(&mut hash, &path, &st);
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFLNK {
            let target = nix::fcntl::readlinkat(fd.as_fd(), "").map_err(|errno| FingerprintError::Entry {
                call: "readlink",
                path: path.clone(),
                errno,
            })?;
            hash.update(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()));
            hash.update([0]);
        } else if kind == SFlag::S_IFDIR {
            if depth >= MAX_DEPTH {
                return Err(FingerprintError::TooDeep);
            }
            let mut names = fsx::list_dir(fd.as_fd())?;
            names.sort();
            // Reversed onto the stack, so they come off in order.
            for name in names.into_iter().rev() {
                let child = open_child(fd.as_fd(), &name).map_err(|errno| FingerprintError::Child {
                    path: path.clone(),
                    name: name.clone(),
                    errno,
                })?;
                let child_path = format!("{path}/{}", name.to_string_lossy());
                if let Some(child) = child {
                    stack.push((child_path, child, depth + 1));
                }
            }
        }
    }
    Ok(Some(hex(&hash.finalize())))
}

fn open_child(dir: BorrowedFd<'_>, name: &CString) -> Result<Option<OwnedFd>, Errno> {
    match nix::fcntl::openat(
        dir,
        name.as_c_str(),
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        // Removed while we walked: it is not part of the tree any more.
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn add(hash: &mut Sha256, path: &str, st: &FileStat) {
    hash.update(path.as_bytes());
    hash.update([0]);
    for n in [
        st.st_mode as i64,
        st.st_size,
        st.st_ino as i64,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    ] {
        hash.update(n.to_le_bytes());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Access, Source, Target};

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        nix::fcntl::open(
            p,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn fingerprints_see_edits_additions_and_links() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("skill/sub")).unwrap();
        std::fs::write(t.path().join("skill/a.md"), "a").unwrap();
        std::fs::write(t.path().join("note.txt"), "n").unwrap();
        let root = dir_fd(t.path());
        let fp = |rel: &str| fingerprint(root.as_fd(), rel).unwrap();
        let (tree, note) = (fp("skill"), fp("note.txt"));
        assert!(tree.is_some() && note.is_some());
        assert_eq!(fp("skill"), tree, "stable");
        assert_eq!(fp("missing"), None);
        std::fs::write(t.path().join("skill/sub/new"), "x").unwrap();
        assert_ne!(fp("skill"), tree, "an added file");
        std::fs::write(t.path().join("note.txt"), "m").unwrap();
        assert_ne!(fp("note.txt"), note, "an edit");
        // A symlink is fingerprinted as a link, never followed.
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        let link = fp("link");
        std::fs::remove_file(t.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/usr", t.path().join("link")).unwrap();
        assert_ne!(fp("link"), link);
    }

    #[test]
    fn decisions() {
        let item = |root, text: &str| Item {
            id: "i".into(),
            name: None,
            apply: Apply::WriteFile,
            access: Access::Rw,
            source: Source::InlineText { text: text.into() },
            target: Target { root, path: "f".into() },
        };
        let ws = item(Root::Workspace, "");
        let rec = |fp: &str, it: Option<&Item>| Record { fingerprint: fp.into(), item: it.map(item_digest) };
        let some = |s: &str| Ok(Some(s.to_string()));
        let same = rec("a", Some(&ws));
        let other = rec("a", Some(&item(Root::Workspace, "new")));
        let old = rec("a", None);
        let left = |aside| move |d: Decision| matches!(d, Decision::LeftAlone { aside: a, .. } if a == aside);
        assert_eq!(decide(&ws, Some(&same), &some("a")), Decision::AsLanded);
        // The item changed, the target did not: only what landed is replaced.
        assert_eq!(decide(&ws, Some(&other), &some("a")), Decision::Land);
        assert_eq!(decide(&ws, Some(&old), &some("a")), Decision::Land);
        assert_eq!(decide(&ws, None, &Ok(None)), Decision::Land);
        // Changed or removed: never landed over; new content goes aside.
        assert!(left(false)(decide(&ws, Some(&same), &some("b"))));
        assert!(left(true)(decide(&ws, Some(&other), &some("b"))));
        assert!(left(false)(decide(&ws, Some(&old), &some("b"))));
        assert!(left(false)(decide(&ws, Some(&same), &Ok(None))));
        assert!(left(true)(decide(&ws, Some(&other), &Ok(None))));
        assert!(left(true)(decide(&ws, None, &some("b"))));
        assert!(left(false)(decide(&ws, Some(&same), &Err(FingerprintError::TooDeep))));
        assert_eq!(decide(&item(Root::Scratch, ""), Some(&same), &Ok(None)), Decision::Land);
    }

    #[test]
    fn records_read_both_forms() {
        let landed: Landed =
            serde_json::from_str(r#"{"a": "f1", "b": {"fingerprint": "f2", "item": "d"}}"#).unwrap();
        assert_eq!(landed["a"], Record { fingerprint: "f1".into(), item: None });
        assert_eq!(landed["b"], Record { fingerprint: "f2".into(), item: Some("d".into()) });
        let back: Landed = serde_json::from_str(&serde_json::to_string(&landed).unwrap()).unwrap();
        assert_eq!(back, landed);
    }
}
