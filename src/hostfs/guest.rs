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

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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
    mounts: Vec<(Vec<String>, OwnedFd)>,
    /// Guest paths (as components) that reads and writes must stay in.
    allowed: Vec<Vec<String>>,
    /// Files and directories we create are given to these ids (a root
    /// daemon writing into a docker volume for the container's user).
    owner: Option<(u32, u32)>,
}

pub fn components(path: &str) -> Vec<String> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string).collect()
}

fn guest(comps: &[String]) -> String {
    if comps.is_empty() { "/".into() } else { format!("/{}", comps.join("/")) }
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
    pub name: String,
    /// The target, when it exists (`O_PATH`, not a symlink).
    pub target: Option<OwnedFd>,
    /// Canonical guest path of the target.
    pub guest: String,
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

impl GuestView {
    /// A whole tree whose `/` is `root` (a sandbox's, opened through
    /// `/proc`); reads and writes stay in `allowed`.
    pub fn over_root(root: OwnedFd, allowed: &[&str]) -> GuestView {
        GuestView {
            mounts: vec![(Vec::new(), root)],
            allowed: allowed.iter().map(|a| components(a)).collect(),
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
            mounts.push((components(g), open_dir(dir)?));
        }
        let allowed = mounts.iter().map(|(g, _)| g.clone()).collect();
        Ok(GuestView { mounts, allowed, owner })
    }

    /// Also shows `dir` at guest path `guest` (nested in an allowed root),
    /// without making it an allowed root of its own.
    pub fn with_mount(mut self, guest: &str, dir: &Path) -> Result<GuestView, ViewError> {
        self.mounts.push((components(guest), open_dir(dir)?));
        Ok(self)
    }

    /// The ids new files are given, if any.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Resolves `path` (absolute); with `create`, makes missing directories
    /// on the way (not the last component).
    pub fn walk(&self, path: &str, create: bool) -> Result<Walked, ResolveError> {
        if !path.starts_with('/') {
            return Err(BadPath::NotAbsolute { path: path.into() }.into());
        }
        if path.contains('\0') {
            return Err(BadPath::ContainsNul.into());
        }
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
        let comps = components(path);
        if comps.iter().any(|c| c == "..") {
            return None;
        }
        let (mount, fd) =
            self.mounts.iter().filter(|(g, _)| comps.starts_with(g)).max_by_key(|(g, _)| g.len())?;
        let rest = &comps[mount.len()..];
        let (name, dirs) = rest.split_last()?;
        let rel = if dirs.is_empty() { ".".to_string() } else { dirs.join("/") };
        let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let parent = super::open::open(
            fd.as_fd(),
            &rel,
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

    pub fn is_allowed(&self, comps: &[String]) -> bool {
        self.allowed.iter().any(|a| comps.len() >= a.len() && comps[..a.len()] == a[..])
    }

    fn mount_at(&self, comps: &[String]) -> Option<Result<OwnedFd, ResolveError>> {
        self.mounts
            .iter()
            .find(|(g, _)| g[..] == comps[..])
            .map(|(_, fd)| fd.try_clone().map_err(|e| Failed::Dup(e).into()))
    }

    /// Walks `path`; with `create`, makes missing directories on the way
    /// (not the last component).
    fn walk_components(&self, path: &str, create: bool) -> Result<Walked, ResolveError> {
        let mut todo: std::collections::VecDeque<String> =
            path.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect();
        let mut cur: Vec<String> = Vec::new();
        // Directory descriptors for `cur[base..]`, `fds[0]` being the mount
        // at `cur[..base]`; empty while outside any mount.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut base = 0;
        let mut links = 0;
        let enter = |cur: &[String], fds: &mut Vec<OwnedFd>, base: &mut usize| -> Result<(), ResolveError> {
            if let Some(fd) = self.mount_at(cur) {
                fds.push(fd?);
                *base = cur.len();
            }
            Ok(())
        };
        enter(&cur, &mut fds, &mut base)?;
        let mut last_file: Option<OwnedFd> = None;
        while let Some(c) = todo.pop_front() {
            last_file = None;
            match c.as_str() {
                "." => continue,
                ".." => {
                    if fds.len() > 1 {
                        fds.pop();
                        cur.pop();
                    } else {
                        cur.pop();
                        fds.clear();
                        enter(&cur, &mut fds, &mut base)?;
                    }
                    continue;
                }
                _ => {}
            }
            let Some(dir) = fds.last() else {
                cur.push(c);
                enter(&cur, &mut fds, &mut base)?;
                if fds.is_empty() && !self.mounts.iter().any(|(g, _)| g.starts_with(&cur)) {
                    return Err(Outside::ResolvesTo { path: path.into(), guest: guest(&cur) }.into());
                }
                continue;
            };
            // A mount nested in another one (the agent's state directory in
            // the home of a docker instance) hides what is below it.
            if self.mounts.len() > 1 {
                let mut next = cur.clone();
                next.push(c.clone());
                if let Some(fd) = self.mount_at(&next) {
                    cur = next;
                    fds.push(fd?);
                    continue;
                }
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
                    let g = guest(&[cur.clone(), vec![c.clone()]].concat());
                    if !self.is_allowed(&[cur.clone(), vec![c.clone()]].concat()) {
                        return Err(Outside::Creates { path: path.into(), guest: g }.into());
                    }
                    match nix::sys::stat::mkdirat(
                        dir.as_fd(),
                        name.as_c_str(),
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(sys("mkdir", &g, e)),
                    }
                    let fd = nix::fcntl::openat(
                        dir.as_fd(),
                        name.as_c_str(),
                        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| sys("open", &g, e))?;
                    self.give(fd.as_fd(), &g);
                    fd
                }
                Err(e) => return Err(sys("open", &guest(&[cur.clone(), vec![c]].concat()), e)),
            };
            let st = fstat(fd.as_fd()).map_err(|e| sys("fstat", &guest(&cur), e))?;
            let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            if kind == SFlag::S_IFLNK {
                links += 1;
                if links > MAX_LINKS {
                    return Err(sys("open", path, Errno::ELOOP));
                }
                let target =
                    nix::fcntl::readlinkat(fd.as_fd(), "").map_err(|e| sys("readlink", &guest(&cur), e))?;
                let target = std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()).to_vec();
                let target = String::from_utf8_lossy(&target).into_owned();
                for t in target.split('/').filter(|t| !t.is_empty()).rev() {
                    todo.push_front(t.to_string());
                }
                if target.starts_with('/') {
                    cur.clear();
                    fds.clear();
                    enter(&cur, &mut fds, &mut base)?;
                }
                continue;
            }
            cur.push(c);
            if kind == SFlag::S_IFDIR {
                fds.push(fd);
            } else if todo.is_empty() {
                last_file = Some(fd);
            } else {
                return Err(sys("open", &guest(&cur), Errno::ENOTDIR));
            }
        }
        let g = guest(&cur);
        if fds.is_empty() {
            return Err(Outside::ResolvesTo { path: path.into(), guest: g }.into());
        }
        if let Some(file) = last_file {
            let parent = fds.pop().expect("checked");
            return Ok(Walked {
                parent,
                name: cur.last().cloned().unwrap_or_default(),
                target: Some(file),
                guest: g,
            });
        }
        // The target is the directory on top of the stack.
        let top = fds.pop().expect("checked");
        match fds.pop() {
            Some(parent) => Ok(Walked {
                parent,
                name: cur.last().cloned().unwrap_or_default(),
                target: Some(top),
                guest: g,
            }),
            None => {
                // A mount root (or `/`): no name in a parent we hold.
                let parent = top.try_clone().map_err(Failed::Dup)?;
                Ok(Walked { parent, name: String::new(), target: Some(top), guest: g })
            }
        }
    }

    pub fn give(&self, fd: BorrowedFd<'_>, what: &str) {
        if let Some((uid, gid)) = self.owner
            && let Err(e) = nix::unistd::fchown(fd, Some(uid.into()), Some(gid.into()))
        {
            tracing::warn!("fs: chown {what} to {uid}:{gid}: {e}");
        }
    }

    pub fn check(&self, path: &str, guest_path: &str) -> Result<(), ResolveError> {
        if self.is_allowed(&components(guest_path)) {
            Ok(())
        } else if guest_path == path {
            Err(Outside::Path { path: path.into() }.into())
        } else {
            Err(Outside::ResolvesTo { path: path.into(), guest: guest_path.into() }.into())
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
