//! Guest paths resolved on the host: the ACP host's `fs/*` and terminal
//! working directories (`acp/fs.rs`) see a sandbox's files as its agent
//! sees them, without starting a process per call.
//!
//! A [`GuestView`] is a set of directories shown at guest paths (the
//! sandbox's `/`, or the host directories behind `/workspace` and the home)
//! and the guest paths that must not be left (`allowed`). A path resolves
//! in one `openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_SYMLINKS)`
//! under the mount it starts in when it holds no symlink and no `..` (the
//! common case); otherwise it is walked one component at a time
//! (`O_PATH|O_NOFOLLOW`), each symlink read, never followed by the kernel,
//! and its target resolved the same way (relative targets against the
//! link's directory, absolute ones against the guest `/`, magic links as
//! plain text), `..` popping the walk, never past `/`. Either way the
//! result is the canonical guest path, which alone decides whether the
//! path is allowed, and descriptors: nothing is opened by a host path, so a
//! swapped-in link cannot redirect a later step.

use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag, fstat};

/// Symlinks followed in one resolution (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Why a guest path could not be resolved (the ACP host makes each a
/// JSON-RPC error). The four classes select the code; each holds what went
/// wrong.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Not absolute, or not a clean path: -32602.
    #[error(transparent)]
    BadPath(BadPath),
    /// Resolves outside the workspace and home: -32602.
    #[error(transparent)]
    Outside(Outside),
    /// -32002.
    #[error(transparent)]
    NotFound(NotFound),
    /// Too large, not a regular file, I/O errors: -32603.
    #[error(transparent)]
    Failed(Failed),
}

/// A path that cannot name a guest file.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadPath {
    #[error("{path:?} is not an absolute path (ACP paths must be absolute)")]
    NotAbsolute { path: String },
    #[error("the path contains a NUL byte")]
    ContainsNul,
    /// A component (or a name made from one) with a NUL byte.
    #[error("NUL in path")]
    Nul,
    /// [`sandbox::guest_path::normalize`] refused it for `why`.
    #[error("{path:?} {why}")]
    NotClean { path: String, why: &'static str },
    /// Longer or deeper than the daemon accepts ([`super::bounds`]).
    #[error("{0}")]
    Bound(super::bounds::PathBound),
}

/// A path that leads out of the workspace and the home.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Outside {
    #[error("{path} is outside the workspace and the home")]
    Path { path: String },
    /// Resolving `path` (symlinks, `..`) led to `guest`.
    #[error("{path} resolves to {guest}, outside the workspace and the home")]
    ResolvesTo { path: String, guest: String },
    /// A directory `guest` that writing `path` would create.
    #[error("{path}: {guest} is outside the workspace and the home")]
    Creates { path: String, guest: String },
}

/// Nothing at a path.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotFound {
    /// A system call said `ENOENT`.
    #[error("{path}: no such file or directory")]
    Entry { path: String },
    #[error("{path}: no such file")]
    File { path: String },
    #[error("{path}: no such directory")]
    Directory { path: String },
}

/// A path that resolved but could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// A system call on `path` failed (not with `ENOENT`).
    #[error("{call}({path:?}) => {}", errno_text(.source))]
    Sys {
        call: &'static str,
        path: String,
        #[source]
        source: Errno,
    },
    /// Duplicating a mount's descriptor.
    #[error("dup: {0}")]
    Dup(#[source] std::io::Error),
    #[error("read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a directory")]
    NotADirectory { path: String },
    #[error("{path}: is a directory")]
    IsADirectory { path: String },
    #[error("{path}: not a regular file")]
    NotARegularFile { path: String },
    /// The file is `size` bytes, over the read limit `max`.
    #[error(
        "{path} is {size} bytes, over the daemon's read limit of {max} bytes (fs_read_max_bytes); read it in parts with line and limit"
    )]
    TooLarge { path: String, size: i64, max: u64 },
    #[error("{path} grew over the read limit of {max} bytes while being read")]
    Grew { path: String, max: u64 },
    /// Reading lines `start..=last` would read more than `max` bytes.
    #[error(
        "{path}: reading lines {start}..{last} would read more than the daemon's read limit of {max} bytes \
         (fs_read_max_bytes) from the file; ask for fewer or earlier lines"
    )]
    LinesTooLarge { path: String, start: u64, last: u64, max: u64 },
    #[error("{path}: replaced by a symlink while being opened; try again")]
    Replaced { path: String },
}

impl ResolveError {
    /// The one-line message (the JSON-RPC error's `message`).
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl From<BadPath> for ResolveError {
    fn from(e: BadPath) -> Self {
        ResolveError::BadPath(e)
    }
}

impl From<Outside> for ResolveError {
    fn from(e: Outside) -> Self {
        ResolveError::Outside(e)
    }
}

impl From<NotFound> for ResolveError {
    fn from(e: NotFound) -> Self {
        ResolveError::NotFound(e)
    }
}

impl From<Failed> for ResolveError {
    fn from(e: Failed) -> Self {
        ResolveError::Failed(e)
    }
}

/// A system call `call` on the guest path `path` failed with `e`.
pub fn sys(call: &'static str, path: &str, e: Errno) -> ResolveError {
    match e {
        Errno::ENOENT => NotFound::Entry { path: path.to_string() }.into(),
        _ => Failed::Sys { call, path: path.to_string(), source: e }.into(),
    }
}

/// Why a view could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The sandbox's `/` could not be opened.
    #[error(transparent)]
    Root(#[from] sandbox::error::SyscallError),
    #[error("open {}: {}", .path.display(), errno_text(.errno))]
    Open { path: PathBuf, errno: Errno },
}

fn errno_text(e: &Errno) -> String {
    sandbox::error::io_error_text(&std::io::Error::from(*e))
}

/// Directories shown at guest paths, and the guest paths that are allowed.
pub struct GuestView {
    /// `(guest path, O_PATH directory)`: `/` for a sandbox root, or the
    /// allowed roots themselves for host directories.
    mounts: Vec<(Vec<OsString>, OwnedFd)>,
    /// Guest paths (as components) that reads and writes must stay in.
    allowed: Vec<Vec<OsString>>,
    /// Files and directories we create are given to these ids (a root
    /// daemon writing into a docker volume for the container's user).
    owner: Option<(u32, u32)>,
}

/// The components of an absolute path (empty ones and `.` left out).
pub fn components(path: &[u8]) -> Vec<OsString> {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| OsStr::from_bytes(c).to_os_string())
        .collect()
}

/// The guest path of `comps`, as bytes.
fn guest(comps: &[OsString]) -> OsString {
    if comps.is_empty() {
        return OsString::from("/");
    }
    let mut out = Vec::with_capacity(comps.iter().map(|c| c.len() + 1).sum());
    for c in comps {
        out.push(b'/');
        out.extend_from_slice(c.as_bytes());
    }
    OsString::from_vec(out)
}

/// `path` for a message: as it is when it is UTF-8, any other byte written
/// `\xNN` (the path itself is never changed: only its text).
pub fn shown(path: &OsStr) -> String {
    let mut out = String::with_capacity(path.len());
    for chunk in path.as_bytes().utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The guest path of `comps` then `last`, for a message.
fn shown_in(comps: &[OsString], last: &OsStr) -> String {
    let mut g = guest(comps).into_vec();
    if g != b"/" {
        g.push(b'/');
    }
    g.extend_from_slice(last.as_bytes());
    shown(OsStr::from_bytes(&g))
}

fn open_dir(path: &Path) -> Result<OwnedFd, ViewError> {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|errno| ViewError::Open { path: path.to_path_buf(), errno })
}

/// The result of a walk.
pub struct Walked {
    /// The directory holding the target.
    pub parent: OwnedFd,
    /// The target's name in `parent` (empty when the target is a mount root).
    pub name: OsString,
    /// The target, when it exists (`O_PATH`, not a symlink).
    pub target: Option<OwnedFd>,
    /// Canonical guest path of the target.
    pub guest: OsString,
}

impl Walked {
    /// Replaces (or creates) the target with `content` through the atomic
    /// writer ([`super::atomic`]): an anonymous file in the target's
    /// directory (created 0600; a named fallback `O_EXCL|O_NOFOLLOW`)
    /// written, given `mode` (and, as root, `owner`), then linked over the
    /// target; on failure the target is left as it was. `path` names it
    /// in errors.
    pub fn replace(
        &self,
        path: &str,
        content: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(), ResolveError> {
        use super::atomic::{AtomicFile, Durability};
        let name = CString::new(self.name.as_bytes()).map_err(|_| BadPath::Nul)?;
        let mut tmp = AtomicFile::new_at(self.parent.as_fd(), super::root::WRITE_PREFIX, 0o600)
            .map_err(|e| sys("create", path, super::errno_of(&e)))?;
        tmp.file.write_all(content).map_err(|e| Failed::Write { path: path.into(), source: e })?;
        nix::sys::stat::fchmod(tmp.file.as_fd(), Mode::from_bits_truncate(mode))
            .map_err(|e| sys("fchmod", path, e))?;
        if nix::unistd::geteuid().is_root()
            && let Some((uid, gid)) = owner
        {
            let _ = nix::unistd::fchown(tmp.file.as_fd(), Some(uid.into()), Some(gid.into()));
        }
        tmp.commit_at(&name, Durability::Unsynced)
            .map(drop)
            .map_err(|e| sys("rename", path, super::errno_of(&e)))
    }
}

/// Where the walk's current path is with respect to a list of guest paths
/// (the mounts, the allowed roots), kept level by level as the walk goes
/// down and up: which listed paths it is a prefix of, and whether it lies
/// within one of them. Each step costs one comparison per listed path,
/// whatever the depth, so the walk stays linear in it.
struct Prefixes<'a> {
    paths: Vec<&'a [OsString]>,
    /// Per level of the current path (level 0: `/`): the listed paths it is
    /// a prefix of (a bit set), and whether a listed path is a prefix of it.
    levels: Vec<(u64, bool)>,
}

impl<'a> Prefixes<'a> {
    fn new(paths: impl Iterator<Item = &'a [OsString]>) -> Prefixes<'a> {
        let paths: Vec<&[OsString]> = paths.take(64).collect();
        let all = if paths.len() == 64 { u64::MAX } else { (1u64 << paths.len()) - 1 };
        let mut p = Prefixes { paths, levels: Vec::new() };
        let within = p.equal_in(all, 0).is_some();
        p.levels.push((all, within));
        p
    }

    fn top(&self) -> (u64, bool) {
        *self.levels.last().expect("level 0 stays")
    }

    /// The current path's depth.
    fn depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The listed paths the current path followed by `c` is a prefix of.
    fn after(&self, c: &OsStr) -> u64 {
        let (depth, (mut set, _)) = (self.depth(), self.top());
        let mut out = 0;
        while set != 0 {
            let i = set.trailing_zeros() as usize;
            set &= set - 1;
            if self.paths[i].get(depth).is_some_and(|p| p == c) {
                out |= 1 << i;
            }
        }
        out
    }

    fn push(&mut self, c: &OsStr) {
        let within = self.within_child(c);
        let next = self.after(c);
        self.levels.push((next, within));
    }

    fn pop(&mut self) {
        if self.levels.len() > 1 {
            self.levels.pop();
        }
    }

    fn clear(&mut self) {
        self.levels.truncate(1);
    }

    /// The listed path that is exactly the current path.
    fn at(&self) -> Option<usize> {
        self.equal_in(self.top().0, self.depth())
    }

    /// The listed path that is exactly the current path followed by `c`.
    fn at_child(&self, c: &OsStr) -> Option<usize> {
        self.equal_in(self.after(c), self.depth() + 1)
    }

    fn equal_in(&self, mut set: u64, depth: usize) -> Option<usize> {
        while set != 0 {
            let i = set.trailing_zeros() as usize;
            set &= set - 1;
            if self.paths[i].len() == depth {
                return Some(i);
            }
        }
        None
    }

    /// Whether the current path is a prefix of some listed path.
    fn below_any(&self) -> bool {
        self.top().0 != 0
    }

    /// Whether the current path followed by `c` lies within a listed path.
    fn within_child(&self, c: &OsStr) -> bool {
        self.top().1 || self.at_child(c).is_some()
    }
}

impl GuestView {
    /// A whole tree whose `/` is `root` (a sandbox's, opened through
    /// `/proc`); reads and writes stay in `allowed`.
    pub fn over_root(root: OwnedFd, allowed: &[&str]) -> GuestView {
        GuestView {
            mounts: vec![(Vec::new(), root)],
            allowed: allowed.iter().map(|a| components(a.as_bytes())).collect(),
            owner: None,
        }
    }

    /// As [`GuestView::over_root`] with the tree at a host path.
    pub fn tree_at(root: &Path, allowed: &[&str]) -> Result<GuestView, ViewError> {
        Ok(Self::over_root(open_dir(root)?, allowed))
    }

    /// Host directories shown at guest paths (docker volumes, the host
    /// provider); these are also the only allowed roots.
    pub fn host_dirs(dirs: &[(&str, &Path)], owner: Option<(u32, u32)>) -> Result<GuestView, ViewError> {
        let mut mounts = Vec::new();
        for (g, dir) in dirs {
            mounts.push((components(g.as_bytes()), open_dir(dir)?));
        }
        let allowed = mounts.iter().map(|(g, _)| g.clone()).collect();
        Ok(GuestView { mounts, allowed, owner })
    }

    /// Also shows `dir` at guest path `guest` (nested in an allowed root),
    /// without making it an allowed root of its own.
    pub fn with_mount(mut self, guest: &str, dir: &Path) -> Result<GuestView, ViewError> {
        self.mounts.push((components(guest.as_bytes()), open_dir(dir)?));
        Ok(self)
    }

    /// The ids new files are given, if any.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Resolves `path` (absolute, within the bounds of [`super::bounds`]);
    /// with `create`, makes missing directories on the way (not the last
    /// component).
    pub fn walk(&self, path: &str, create: bool) -> Result<Walked, ResolveError> {
        if !path.starts_with('/') {
            return Err(BadPath::NotAbsolute { path: path.into() }.into());
        }
        if path.contains('\0') {
            return Err(BadPath::ContainsNul.into());
        }
        super::bounds::check(path.as_bytes()).map_err(BadPath::Bound)?;
        match self.resolve_in_root(path) {
            Some(walked) => Ok(walked),
            None => self.walk_components(path, create),
        }
    }

    /// The fast path: a path with no `..` resolved under the deepest mount
    /// it starts in by one `openat2` (its parent; `RESOLVE_NO_SYMLINKS`, so
    /// the result's guest path is the path as written), then its last
    /// component. `None` where that does not apply or does not end well
    /// (a symlink on the way, something missing, any error): the component
    /// walk then gives the answer, and the exact error.
    fn resolve_in_root(&self, path: &str) -> Option<Walked> {
        let comps = components(path.as_bytes());
        if comps.iter().any(|c| c == "..") {
            return None;
        }
        let (mount, fd) =
            self.mounts.iter().filter(|(g, _)| comps.starts_with(g)).max_by_key(|(g, _)| g.len())?;
        let rest = &comps[mount.len()..];
        let (name, dirs) = rest.split_last()?;
        let rel = if dirs.is_empty() { OsString::from(".") } else { guest(dirs) };
        let rel = rel.as_bytes().strip_prefix(b"/").unwrap_or(rel.as_bytes());
        let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let parent = super::open::open(
            fd.as_fd(),
            OsStr::from_bytes(rel),
            dir_flags,
            super::open::Scope::InRoot,
            super::open::Links::Never,
        )
        .ok()?;
        let c_name = CString::new(name.as_bytes()).ok()?;
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let target = match nix::fcntl::openat(parent.as_fd(), c_name.as_c_str(), flags, Mode::empty()) {
            Ok(fd) => {
                let st = fstat(fd.as_fd()).ok()?;
                if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits() {
                    return None;
                }
                Some(fd)
            }
            Err(Errno::ENOENT) => None,
            Err(_) => return None,
        };
        Some(Walked { parent, name: name.clone(), target, guest: guest(&comps) })
    }

    /// Whether the guest path `comps` is in an allowed root.
    pub fn is_allowed(&self, comps: &[OsString]) -> bool {
        self.allowed.iter().any(|a| comps.len() >= a.len() && comps[..a.len()] == a[..])
    }

    fn dup_mount(&self, i: usize) -> Result<OwnedFd, ResolveError> {
        self.mounts[i].1.try_clone().map_err(|e| Failed::Dup(e).into())
    }

    /// Walks `path`; with `create`, makes missing directories on the way
    /// (not the last component). Each component costs a fixed number of
    /// system calls and comparisons, so the walk is linear in the path's
    /// length (and in its symlinks' targets, at most [`MAX_LINKS`] of them,
    /// each at most `PATH_MAX`); what it resolves to is bounded in depth
    /// like the path itself.
    ///
    /// One loop on purpose: the guest path, the mount and allowed-root
    /// cursors and the descriptor stack change together at each component.
    fn walk_components(&self, path: &str, create: bool) -> Result<Walked, ResolveError> {
        let mut todo: std::collections::VecDeque<OsString> = components(path.as_bytes()).into();
        let mut cur: Vec<OsString> = Vec::new();
        // Where the current path is with respect to the mounts and the
        // allowed roots.
        let mut mounts = Prefixes::new(self.mounts.iter().map(|(g, _)| g.as_slice()));
        let mut allowed = Prefixes::new(self.allowed.iter().map(Vec::as_slice));
        // Directory descriptors for `cur[base..]`, `fds[0]` being the mount
        // at `cur[..base]`; empty while outside any mount.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut links = 0;
        // Entering a level: a mount exactly there starts a new stack.
        let enter = |mounts: &Prefixes<'_>, fds: &mut Vec<OwnedFd>| -> Result<(), ResolveError> {
            if let Some(i) = mounts.at() {
                fds.push(self.dup_mount(i)?);
            }
            Ok(())
        };
        enter(&mounts, &mut fds)?;
        let mut last_file: Option<OwnedFd> = None;
        while let Some(c) = todo.pop_front() {
            last_file = None;
            if c == ".." {
                cur.pop();
                mounts.pop();
                allowed.pop();
                if fds.len() > 1 {
                    fds.pop();
                } else {
                    fds.clear();
                    enter(&mounts, &mut fds)?;
                }
                continue;
            }
            if cur.len() >= super::bounds::MAX_PATH_DEPTH {
                return Err(BadPath::Bound(super::bounds::PathBound::ResolvesTooDeep).into());
            }
            let Some(dir) = fds.last() else {
                // Outside any mount: only the way to one is walked.
                mounts.push(&c);
                allowed.push(&c);
                cur.push(c);
                enter(&mounts, &mut fds)?;
                if fds.is_empty() && !mounts.below_any() {
                    return Err(Outside::ResolvesTo { path: path.into(), guest: shown(&guest(&cur)) }.into());
                }
                continue;
            };
            // A mount nested in another one (the agent's state directory in
            // the home of a docker instance) hides what is below it.
            if let Some(i) = mounts.at_child(&c) {
                let fd = self.dup_mount(i)?;
                mounts.push(&c);
                allowed.push(&c);
                cur.push(c);
                fds.push(fd);
                continue;
            }
            let name = CString::new(c.as_bytes()).map_err(|_| BadPath::Nul)?;
            let opened = nix::fcntl::openat(
                dir.as_fd(),
                name.as_c_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            );
            let fd = match opened {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if todo.is_empty() => {
                    cur.push(c);
                    let parent = fds.pop().expect("inside a mount");
                    return Ok(Walked {
                        parent,
                        name: cur.last().cloned().unwrap_or_default(),
                        target: None,
                        guest: guest(&cur),
                    });
                }
                Err(Errno::ENOENT) if create => {
                    if !allowed.within_child(&c) {
                        return Err(Outside::Creates { path: path.into(), guest: shown_in(&cur, &c) }.into());
                    }
                    self.make_dir(dir.as_fd(), &name, || shown_in(&cur, &c))?
                }
                Err(e) => return Err(sys("open", &shown_in(&cur, &c), e)),
            };
            let st = fstat(fd.as_fd()).map_err(|e| sys("fstat", &shown_in(&cur, &c), e))?;
            let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            if kind == SFlag::S_IFLNK {
                links += 1;
                if links > MAX_LINKS {
                    return Err(sys("open", path, Errno::ELOOP));
                }
                // The target as bytes, as the guest's kernel would read it.
                let target = nix::fcntl::readlinkat(fd.as_fd(), "")
                    .map_err(|e| sys("readlink", &shown_in(&cur, &c), e))?;
                let target = target.as_bytes();
                for t in components(target).into_iter().rev() {
                    todo.push_front(t);
                }
                if target.starts_with(b"/") {
                    cur.clear();
                    mounts.clear();
                    allowed.clear();
                    fds.clear();
                    enter(&mounts, &mut fds)?;
                }
                continue;
            }
            mounts.push(&c);
            allowed.push(&c);
            cur.push(c);
            if kind == SFlag::S_IFDIR {
                fds.push(fd);
            } else if todo.is_empty() {
                last_file = Some(fd);
            } else {
                return Err(sys("open", &shown(&guest(&cur)), Errno::ENOTDIR));
            }
        }
        walked(path, cur, fds, last_file)
    }

    /// Makes a missing directory on the way (`create`), opens it and
    /// gives it to the view's owner.
    fn make_dir(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        shown: impl Fn() -> String,
    ) -> Result<OwnedFd, ResolveError> {
        match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(sys("mkdir", &shown(), e)),
        }
        let fd = nix::fcntl::openat(
            dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| sys("open", &shown(), e))?;
        self.give(fd.as_fd(), shown);
        Ok(fd)
    }

    /// Gives a directory we made to the view's owner; `what` names it in
    /// the warning when that fails.
    pub fn give(&self, fd: BorrowedFd<'_>, what: impl FnOnce() -> String) {
        if let Some((uid, gid)) = self.owner
            && let Err(e) = nix::unistd::fchown(fd, Some(uid.into()), Some(gid.into()))
        {
            tracing::warn!("fs: chown {} to {uid}:{gid}: {e}", what());
        }
    }

    /// Whether the canonical guest path `guest_path` of `path` may be used.
    pub fn check(&self, path: &str, guest_path: &OsStr) -> Result<(), ResolveError> {
        if self.is_allowed(&components(guest_path.as_bytes())) {
            Ok(())
        } else if guest_path.as_bytes() == path.as_bytes() {
            Err(Outside::Path { path: path.into() }.into())
        } else {
            Err(Outside::ResolvesTo { path: path.into(), guest: shown(guest_path) }.into())
        }
    }
}

/// What a finished walk resolved to: the last file, or the directory on
/// top of the stack, with the directory holding it.
fn walked(
    path: &str,
    cur: Vec<OsString>,
    mut fds: Vec<OwnedFd>,
    last_file: Option<OwnedFd>,
) -> Result<Walked, ResolveError> {
    let g = guest(&cur);
    let name = cur.last().cloned().unwrap_or_default();
    let Some(top) = fds.pop() else {
        return Err(Outside::ResolvesTo { path: path.into(), guest: shown(&g) }.into());
    };
    if let Some(file) = last_file {
        return Ok(Walked { parent: top, name, target: Some(file), guest: g });
    }
    match fds.pop() {
        Some(parent) => Ok(Walked { parent, name, target: Some(top), guest: g }),
        None => {
            // A mount root (or `/`): no name in a parent we hold.
            let parent = top.try_clone().map_err(Failed::Dup)?;
            Ok(Walked { parent, name: OsString::new(), target: Some(top), guest: g })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &Walked, b: &Walked) -> bool {
        let id = |fd: &OwnedFd| fstat(fd.as_fd()).map(|s| (s.st_dev, s.st_ino)).unwrap();
        a.name == b.name
            && a.guest == b.guest
            && id(&a.parent) == id(&b.parent)
            && a.target.as_ref().map(id) == b.target.as_ref().map(id)
    }

    /// The `openat2` path and the component walk agree wherever the first
    /// answers, and it declines symlinks and `..`.
    #[test]
    fn one_openat2_agrees_with_the_walk() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("workspace/src/deep")).unwrap();
        std::fs::create_dir_all(r.join("home/agent")).unwrap();
        std::fs::write(r.join("workspace/src/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("src", r.join("workspace/link")).unwrap();
        let views = [
            GuestView::tree_at(r, &["/workspace", "/home/agent"]).unwrap(),
            GuestView::host_dirs(
                &[("/workspace", &r.join("workspace")), ("/home/agent", &r.join("home/agent"))],
                None,
            )
            .unwrap(),
        ];
        for view in &views {
            for path in
                ["/workspace/src/a.txt", "/workspace/src", "/workspace/src/deep/", "/workspace/./src/new"]
            {
                let fast = view.resolve_in_root(path).unwrap_or_else(|| panic!("{path}: no fast answer"));
                let walked = view.walk_components(path, false).unwrap();
                assert!(same(&fast, &walked), "{path}");
            }
            for path in ["/workspace/link/a.txt", "/workspace/src/../src/a.txt", "/workspace/nope/x"] {
                assert!(view.resolve_in_root(path).is_none(), "{path}");
            }
        }
    }
}
