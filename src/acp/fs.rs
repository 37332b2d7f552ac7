//! `fs/read_text_file` and `fs/write_text_file`, confined to the run's
//! workspace and home **as the sandbox sees them**, without starting a
//! process per call.
//!
//! Paths are resolved by walking them one component at a time under a
//! descriptor of the sandbox's filesystem:
//!
//! * native: the `/` of the sandbox (`/proc/<pid>/root` of its PID 1, or
//!   of the agent for an unprivileged daemon: `sandbox::reach`), i.e. the agent's
//!   own mount tree (its binds, its home, everything mounted in it);
//! * docker and host: the host directories behind `/workspace` and the
//!   home (nothing else of the container is reachable).
//!
//! Every component is opened with `O_PATH|O_NOFOLLOW` relative to the
//! previous one; a symlink is read (never followed by the kernel) and its
//! target resolved the same way, relative targets against the link's
//! directory and absolute ones against the sandbox's `/`, as the agent
//! itself would see it, magic links included as plain text. `..` pops the
//! walk, never past `/`. Only the resulting guest path decides: it must
//! lie in `/workspace` or the home, so `/workspace/link -> /etc` leads to
//! `/etc/...` and is refused, while a link to another file in the
//! workspace works. Nothing is ever opened by a host path, so a swapped-in
//! link cannot redirect a later step, and the last component is opened
//! with `O_NOFOLLOW`.
//!
//! Writes create missing parents, write a temporary file next to the
//! target and rename it into place: a reader never sees half a file, and
//! a failed write leaves the old content.

use std::ffi::CString;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag, fstat};

/// Symlinks followed in one resolution (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Why an fs call failed; becomes a JSON-RPC error.
#[derive(Debug, PartialEq, Eq)]
pub enum FsError {
    /// Not absolute, or not a clean path: -32602.
    BadPath(String),
    /// Resolves outside the workspace and home: -32602.
    Outside(String),
    /// -32002.
    NotFound(String),
    /// Too large, not a regular file, I/O errors: -32603.
    Failed(String),
}

impl FsError {
    pub fn message(&self) -> &str {
        match self {
            FsError::BadPath(m) | FsError::Outside(m) | FsError::NotFound(m) | FsError::Failed(m) => m,
        }
    }
}

fn sys(call: &str, path: &str, e: Errno) -> FsError {
    match e {
        Errno::ENOENT => FsError::NotFound(format!("{path}: no such file or directory")),
        _ => FsError::Failed(format!(
            "{call}({path:?}) => {}",
            sandbox::error::io_error_text(&std::io::Error::from(e))
        )),
    }
}

/// A filesystem view: where guest paths start, and which are allowed.
pub struct GuestFs {
    /// `(guest path, O_PATH directory)`: `/` for a sandbox root, or the
    /// allowed roots themselves for host directories.
    mounts: Vec<(Vec<String>, OwnedFd)>,
    /// Guest paths (as components) that reads and writes must stay in.
    allowed: Vec<Vec<String>>,
    /// Files and directories we create are given to these ids (a root
    /// daemon writing into a docker volume for the container's user).
    owner: Option<(u32, u32)>,
}

fn components(path: &str) -> Vec<String> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string).collect()
}

fn guest(comps: &[String]) -> String {
    if comps.is_empty() { "/".into() } else { format!("/{}", comps.join("/")) }
}

fn open_dir(path: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(
        |e| format!("open {}: {}", path.display(), sandbox::error::io_error_text(&std::io::Error::from(e))),
    )
}

/// The result of a walk.
struct Walked {
    /// The directory holding the target.
    parent: OwnedFd,
    /// The target's name in `parent` (empty when the target is a mount root).
    name: String,
    /// The target, when it exists (`O_PATH`, not a symlink).
    target: Option<OwnedFd>,
    /// Canonical guest path of the target.
    guest: String,
}

impl GuestFs {
    /// The sandbox's whole tree, from the `/` of the sandbox whose PID 1 is
    /// `pid` (`sandbox::reach`); reads and writes stay in `allowed`.
    pub fn sandbox_root(pid: u32, allowed: &[&str]) -> Result<GuestFs, String> {
        let root = sandbox::reach::open_root(pid as i32).map_err(|e| e.to_string())?;
        Ok(Self::over_root(root, allowed))
    }

    /// As [`GuestFs::sandbox_root`], with the sandbox's `/` at `root` (the
    /// unit tests and the `acp_fs` fuzz target use a tree on the host).
    #[doc(hidden)]
    pub fn tree_root(root: &Path, allowed: &[&str]) -> Result<GuestFs, String> {
        Ok(Self::over_root(open_dir(root)?, allowed))
    }

    fn over_root(root: OwnedFd, allowed: &[&str]) -> GuestFs {
        GuestFs {
            mounts: vec![(Vec::new(), root)],
            allowed: allowed.iter().map(|a| components(a)).collect(),
            owner: None,
        }
    }

    /// Host directories shown at guest paths (docker volumes, the host
    /// provider); these are also the only allowed roots.
    pub fn host_dirs(dirs: &[(&str, &Path)], owner: Option<(u32, u32)>) -> Result<GuestFs, String> {
        let mut mounts = Vec::new();
        for (g, dir) in dirs {
            mounts.push((components(g), open_dir(dir)?));
        }
        let allowed = mounts.iter().map(|(g, _)| g.clone()).collect();
        Ok(GuestFs { mounts, allowed, owner })
    }

    /// Also shows `dir` at guest path `guest` (nested in an allowed root),
    /// without making it an allowed root of its own.
    pub fn with_mount(mut self, guest: &str, dir: &Path) -> Result<GuestFs, String> {
        self.mounts.push((components(guest), open_dir(dir)?));
        Ok(self)
    }

    fn is_allowed(&self, comps: &[String]) -> bool {
        self.allowed.iter().any(|a| comps.len() >= a.len() && comps[..a.len()] == a[..])
    }

    fn mount_at(&self, comps: &[String]) -> Option<Result<OwnedFd, FsError>> {
        self.mounts
            .iter()
            .find(|(g, _)| g[..] == comps[..])
            .map(|(_, fd)| fd.try_clone().map_err(|e| FsError::Failed(format!("dup: {e}"))))
    }

    /// Walks `path`; with `create`, makes missing directories on the way
    /// (not the last component).
    fn walk(&self, path: &str, create: bool) -> Result<Walked, FsError> {
        if !path.starts_with('/') {
            return Err(FsError::BadPath(format!(
                "{path:?} is not an absolute path (ACP paths must be absolute)"
            )));
        }
        if path.contains('\0') {
            return Err(FsError::BadPath("the path contains a NUL byte".into()));
        }
        let mut todo: std::collections::VecDeque<String> =
            path.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect();
        let mut cur: Vec<String> = Vec::new();
        // Directory descriptors for `cur[base..]`, `fds[0]` being the mount
        // at `cur[..base]`; empty while outside any mount.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut base = 0;
        let mut links = 0;
        let enter = |cur: &[String], fds: &mut Vec<OwnedFd>, base: &mut usize| -> Result<(), FsError> {
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
                    return Err(FsError::Outside(format!(
                        "{path} resolves to {}, outside the workspace and the home",
                        guest(&cur)
                    )));
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
            let name = CString::new(c.as_bytes()).map_err(|_| FsError::BadPath("NUL in path".into()))?;
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
                        return Err(FsError::Outside(format!(
                            "{path}: {g} is outside the workspace and the home"
                        )));
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
            return Err(FsError::Outside(format!(
                "{path} resolves to {g}, outside the workspace and the home"
            )));
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
                let parent = top.try_clone().map_err(|e| FsError::Failed(format!("dup: {e}")))?;
                Ok(Walked { parent, name: String::new(), target: Some(top), guest: g })
            }
        }
    }

    fn give(&self, fd: BorrowedFd<'_>, what: &str) {
        if let Some((uid, gid)) = self.owner
            && let Err(e) = nix::unistd::fchown(fd, Some(uid.into()), Some(gid.into()))
        {
            tracing::warn!("fs: chown {what} to {uid}:{gid}: {e}");
        }
    }

    fn check(&self, path: &str, guest_path: &str) -> Result<(), FsError> {
        if self.is_allowed(&components(guest_path)) {
            Ok(())
        } else if guest_path == path {
            Err(FsError::Outside(format!("{path} is outside the workspace and the home")))
        } else {
            Err(FsError::Outside(format!(
                "{path} resolves to {guest_path}, outside the workspace and the home"
            )))
        }
    }

    /// Resolves a directory (a terminal's cwd): its canonical guest path.
    pub fn resolve_dir(&self, path: &str) -> Result<String, FsError> {
        let w = self.walk(path, false)?;
        self.check(path, &w.guest)?;
        match &w.target {
            Some(fd)
                if fstat(fd.as_fd())
                    .is_ok_and(|s| s.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits()) =>
            {
                Ok(w.guest)
            }
            Some(_) => Err(FsError::Failed(format!("{path}: not a directory"))),
            None if w.name.is_empty() => Ok(w.guest),
            None => Err(FsError::NotFound(format!("{path}: no such directory"))),
        }
    }

    /// `fs/read_text_file`: the whole file (at most `max` bytes), or
    /// `limit` lines from 1-based `line`, terminators kept.
    pub fn read(
        &self,
        path: &str,
        line: Option<u64>,
        limit: Option<u64>,
        max: u64,
    ) -> Result<String, FsError> {
        let w = self.walk(path, false)?;
        self.check(path, &w.guest)?;
        if w.target.is_none() {
            return Err(FsError::NotFound(format!("{path}: no such file")));
        }
        let file = self.reopen(&w, path)?;
        let st = fstat(file.as_fd()).map_err(|e| sys("fstat", path, e))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(FsError::Failed(format!("{path}: not a regular file")));
        }
        let mut file = std::fs::File::from(file);
        if line.is_none() && limit.is_none() {
            if st.st_size as u64 > max {
                return Err(FsError::Failed(format!(
                    "{path} is {} bytes, over the daemon's read limit of {max} bytes (fs_read_max_bytes); read it in parts with line and limit",
                    st.st_size
                )));
            }
            let mut bytes = Vec::with_capacity(st.st_size as usize);
            (&mut file)
                .take(max + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| FsError::Failed(format!("read {path}: {e}")))?;
            if bytes.len() as u64 > max {
                return Err(FsError::Failed(format!(
                    "{path} grew over the read limit of {max} bytes while being read"
                )));
            }
            return Ok(into_text(bytes));
        }
        // By lines: at most `max` bytes are read from the file (whatever
        // the lines are) and only the requested lines are kept, so neither
        // a huge line nor a huge file costs the daemon more than `max`.
        let start = line.unwrap_or(1).max(1);
        let limit = limit.unwrap_or(u64::MAX);
        let mut reader =
            std::io::BufReader::with_capacity(64 * 1024, (&mut file).take(max.saturating_add(1)));
        let mut out = Vec::new();
        let (mut n, mut taken, mut read) = (1u64, 0u64, 0u64);
        while taken < limit {
            let buf = reader.fill_buf().map_err(|e| FsError::Failed(format!("read {path}: {e}")))?;
            if buf.is_empty() {
                break;
            }
            let (len, line_end) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if n >= start {
                out.extend_from_slice(&buf[..len]);
            }
            reader.consume(len);
            read += len as u64;
            if line_end {
                taken += u64::from(n >= start);
                n += 1;
            }
        }
        if read > max {
            return Err(FsError::Failed(format!(
                "{path}: reading lines {start}..{} would read more than the daemon's read limit of {max} bytes \
                 (fs_read_max_bytes) from the file; ask for fewer or earlier lines",
                start.saturating_add(limit).saturating_sub(1)
            )));
        }
        Ok(into_text(out))
    }

    fn reopen(&self, w: &Walked, path: &str) -> Result<OwnedFd, FsError> {
        let name = CString::new(w.name.as_bytes()).map_err(|_| FsError::BadPath("NUL in path".into()))?;
        if w.name.is_empty() {
            return Err(FsError::Failed(format!("{path}: not a regular file")));
        }
        nix::fcntl::openat(
            w.parent.as_fd(),
            name.as_c_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP => {
                FsError::Failed(format!("{path}: replaced by a symlink while being opened; try again"))
            }
            e => sys("open", path, e),
        })
    }

    /// `fs/write_text_file`: creates missing parents; replaces the file
    /// atomically, keeping its mode (and owner, when we may).
    pub fn write(&self, path: &str, content: &str) -> Result<(), FsError> {
        // Refuse early, before creating any directory, what is lexically
        // outside (a symlink may still lead out; checked after the walk).
        let lexical = sandbox::guest_path::normalize(path)
            .map_err(|why| FsError::BadPath(format!("{path:?} {why}")))?;
        self.check(path, &lexical)?;
        let w = self.walk(path, true)?;
        self.check(path, &w.guest)?;
        if w.name.is_empty() {
            return Err(FsError::Failed(format!("{path}: is a directory")));
        }
        let (mode, owner) = match &w.target {
            Some(fd) => {
                let st = fstat(fd.as_fd()).map_err(|e| sys("fstat", path, e))?;
                if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
                    return Err(FsError::Failed(format!("{path}: not a regular file")));
                }
                (st.st_mode & 0o7777, Some((st.st_uid, st.st_gid)))
            }
            None => (0o644, self.owner),
        };
        let tmp = format!(
            ".{}.tuixiu-{}",
            w.name.chars().take(64).collect::<String>(),
            uuid::Uuid::new_v4().simple()
        );
        let tmp_c = CString::new(tmp.as_bytes()).map_err(|_| FsError::BadPath("NUL in path".into()))?;
        let fd = nix::fcntl::openat(
            w.parent.as_fd(),
            tmp_c.as_c_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| sys("create", &format!("{}/{tmp}", parent_of(&w.guest)), e))?;
        let result = (|| {
            let mut file = std::fs::File::from(fd);
            file.write_all(content.as_bytes()).map_err(|e| FsError::Failed(format!("write {path}: {e}")))?;
            nix::sys::stat::fchmod(file.as_fd(), Mode::from_bits_truncate(mode))
                .map_err(|e| sys("fchmod", path, e))?;
            if nix::unistd::geteuid().is_root()
                && let Some((uid, gid)) = owner
            {
                let _ = nix::unistd::fchown(file.as_fd(), Some(uid.into()), Some(gid.into()));
            }
            let name = CString::new(w.name.as_bytes()).map_err(|_| FsError::BadPath("NUL in path".into()))?;
            nix::fcntl::renameat(w.parent.as_fd(), tmp_c.as_c_str(), w.parent.as_fd(), name.as_c_str())
                .map_err(|e| sys("rename", path, e))
        })();
        if result.is_err() {
            let _ = nix::unistd::unlinkat(
                w.parent.as_fd(),
                tmp_c.as_c_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        result
    }
}

fn parent_of(g: &str) -> &str {
    g.rsplit_once('/').map_or("/", |(p, _)| if p.is_empty() { "/" } else { p })
}

fn into_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sandbox root on the host: `/workspace`, `/home/agent`, `/etc`.
    fn tree() -> (tempfile::TempDir, GuestFs) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        for d in ["workspace/src", "home/agent", "etc"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("etc/passwd"), "root:x:0:0\n").unwrap();
        std::fs::write(r.join("workspace/src/a.txt"), "one\ntwo\nthree\n").unwrap();
        std::os::unix::fs::symlink("/etc", r.join("workspace/etc-link")).unwrap();
        std::os::unix::fs::symlink("/workspace/src/a.txt", r.join("workspace/abs-link")).unwrap();
        std::os::unix::fs::symlink("src/a.txt", r.join("workspace/rel-link")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", r.join("workspace/src/up-link")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc", r.join("workspace/magic")).unwrap();
        let fs = GuestFs::tree_root(r, &["/workspace", "/home/agent"]).unwrap();
        (t, fs)
    }

    #[test]
    fn reads_follow_links_only_inside() {
        let (_t, fs) = tree();
        assert_eq!(fs.read("/workspace/src/a.txt", None, None, 1 << 20).unwrap(), "one\ntwo\nthree\n");
        assert_eq!(fs.read("/workspace/abs-link", None, None, 1 << 20).unwrap(), "one\ntwo\nthree\n");
        assert_eq!(fs.read("/workspace/rel-link", Some(2), Some(1), 1 << 20).unwrap(), "two\n");
        assert_eq!(fs.read("/workspace/src/a.txt", Some(3), None, 1 << 20).unwrap(), "three\n");
        assert_eq!(fs.read("/workspace/src/a.txt", Some(9), None, 1 << 20).unwrap(), "");
        for bad in [
            "/etc/passwd",
            "/workspace/../etc/passwd",
            "/workspace/etc-link/passwd",
            "/workspace/src/up-link",
            "/workspace/magic/passwd",
        ] {
            let e = fs.read(bad, None, None, 1 << 20).unwrap_err();
            assert!(matches!(e, FsError::Outside(_) | FsError::NotFound(_)), "{bad}: {e:?}");
            assert!(!matches!(e, FsError::NotFound(_)) || bad == "/workspace/magic/passwd", "{bad}: {e:?}");
        }
        assert!(matches!(fs.read("workspace/src/a.txt", None, None, 1 << 20), Err(FsError::BadPath(_))));
        assert!(matches!(fs.read("/workspace/nope", None, None, 1 << 20), Err(FsError::NotFound(_))));
        let e = fs.read("/workspace/src/a.txt", None, None, 4).unwrap_err();
        assert!(e.message().contains("over the daemon's read limit of 4 bytes"), "{e:?}");
        assert!(matches!(fs.read("/workspace/src", None, None, 1 << 20), Err(FsError::Failed(_))));
    }

    #[test]
    fn line_reads_never_read_or_keep_more_than_the_limit() {
        let (t, fs) = tree();
        let long = format!("{}\nshort\nlast", "x".repeat(100));
        std::fs::write(t.path().join("workspace/long.txt"), &long).unwrap();
        let path = "/workspace/long.txt";
        // Line 2 lies past the 100-byte first line: over a 50-byte limit.
        let e = fs.read(path, Some(2), Some(1), 50).unwrap_err();
        assert!(e.message().contains("fs_read_max_bytes"), "{e:?}");
        assert_eq!(fs.read(path, Some(2), Some(1), 200).unwrap(), "short\n");
        assert_eq!(fs.read(path, Some(3), None, 200).unwrap(), "last");
        assert!(fs.read(path, Some(1), Some(1), 10).is_err());
        // Exactly at the limit is fine; one byte over is not.
        assert_eq!(fs.read(path, Some(1), Some(2), 107).unwrap(), format!("{}\nshort\n", "x".repeat(100)));
        assert!(fs.read(path, Some(1), Some(3), 110).is_err());
        assert_eq!(fs.read(path, Some(1), Some(3), 111).unwrap(), long);
    }

    #[test]
    fn writes_create_parents_and_stay_inside() {
        let (t, fs) = tree();
        fs.write("/workspace/new/dir/f.txt", "hi").unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("workspace/new/dir/f.txt")).unwrap(), "hi");
        fs.write("/workspace/abs-link", "replaced").unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("workspace/src/a.txt")).unwrap(), "replaced");
        assert!(
            std::fs::symlink_metadata(t.path().join("workspace/abs-link")).unwrap().file_type().is_symlink()
        );
        fs.write("/home/agent/.config/x", "y").unwrap();
        for bad in [
            "/etc/passwd",
            "/workspace/etc-link/passwd",
            "/workspace/../../x",
            "/x",
            "/workspace/src/up-link",
        ] {
            assert!(
                matches!(fs.write(bad, "pwned"), Err(FsError::Outside(_) | FsError::BadPath(_))),
                "{bad}"
            );
        }
        assert_eq!(std::fs::read_to_string(t.path().join("etc/passwd")).unwrap(), "root:x:0:0\n");
        assert!(!t.path().join("x").exists());
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(t.path().join("workspace/src"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(fs.resolve_dir("/workspace/new/../src").unwrap(), "/workspace/src");
        assert!(fs.resolve_dir("/workspace/etc-link").is_err());
    }

    #[test]
    fn host_dirs_see_only_their_roots() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("ws")).unwrap();
        std::fs::create_dir_all(t.path().join("home")).unwrap();
        std::fs::write(t.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink("/home/agent/f", t.path().join("ws/to-home")).unwrap();
        std::os::unix::fs::symlink("../secret", t.path().join("ws/up")).unwrap();
        std::fs::write(t.path().join("home/f"), "home file").unwrap();
        let fs = GuestFs::host_dirs(
            &[("/workspace", &t.path().join("ws")), ("/home/agent", &t.path().join("home"))],
            None,
        )
        .unwrap();
        assert_eq!(fs.read("/workspace/to-home", None, None, 100).unwrap(), "home file");
        assert!(matches!(fs.read("/workspace/up", None, None, 100), Err(FsError::Outside(_))));
        assert!(matches!(fs.read("/etc/passwd", None, None, 100), Err(FsError::Outside(_))));
        fs.write("/workspace/a/b", "c").unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("ws/a/b")).unwrap(), "c");
    }
}
