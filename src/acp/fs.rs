//! `fs/read_text_file` and `fs/write_text_file`, confined to the run's
//! workspace and home **as the sandbox sees them**, without starting a
//! process per call.
//!
//! Paths are resolved by [`crate::hostfs::guest`] under a descriptor of
//! the sandbox's filesystem:
//!
//! * native: the `/` of the sandbox (`/proc/<pid>/root` of its PID 1, or
//!   of the agent for an unprivileged daemon: `sandbox::reach`), i.e. the agent's
//!   own mount tree (its binds, its home, everything mounted in it);
//! * docker and host: the host directories behind `/workspace` and the
//!   home (nothing else of the container is reachable).
//!
//! Symlinks are resolved as the agent itself would see them (absolute
//! targets against the sandbox's `/`), and only the resulting guest path
//! decides: it must lie in `/workspace` or the home, so `/workspace/link ->
//! /etc` leads to `/etc/...` and is refused, while a link to another file
//! in the workspace works. Nothing is ever opened by a host path, and the
//! last component is opened with `O_NOFOLLOW`.
//!
//! Writes create missing parents, write a temporary file next to the
//! target and rename it into place: a reader never sees half a file, and
//! a failed write leaves the old content.

use std::ffi::{CString, OsStr, OsString};
use std::io::{BufRead, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag, fstat};

use crate::hostfs::guest::{BadPath, Failed, GuestView, NotFound, Walked, sys};

pub use crate::hostfs::guest::{ResolveError as FsError, ViewError as GuestError};

/// A filesystem view: where guest paths start, and which are allowed
/// ([`GuestView`]).
pub struct GuestFs {
    view: GuestView,
}

/// A directory of the guest, resolved: its canonical guest path (bytes,
/// as the guest names it) and an `O_PATH` descriptor of it.
#[derive(Debug)]
pub struct GuestDir {
    pub guest: OsString,
    pub fd: OwnedFd,
}

impl GuestFs {
    /// The sandbox's whole tree, from the `/` of the sandbox whose PID 1 is
    /// `pid` (`sandbox::reach`); reads and writes stay in `allowed`.
    pub fn sandbox_root(pid: u32, allowed: &[&str]) -> Result<GuestFs, GuestError> {
        let root = sandbox::reach::open_root(pid as i32)?;
        Ok(GuestFs { view: GuestView::over_root(root, allowed) })
    }

    /// As [`GuestFs::sandbox_root`], with the sandbox's `/` at `root` (the
    /// unit tests and the `acp_fs` fuzz target use a tree on the host).
    #[doc(hidden)]
    pub fn tree_root(root: &Path, allowed: &[&str]) -> Result<GuestFs, GuestError> {
        Ok(GuestFs { view: GuestView::tree_at(root, allowed)? })
    }

    /// Host directories shown at guest paths (docker volumes, the host
    /// provider); these are also the only allowed roots.
    pub fn host_dirs(dirs: &[(&str, &Path)], owner: Option<(u32, u32)>) -> Result<GuestFs, GuestError> {
        Ok(GuestFs { view: GuestView::host_dirs(dirs, owner)? })
    }

    /// Also shows `dir` at guest path `guest` (nested in an allowed root),
    /// without making it an allowed root of its own.
    pub fn with_mount(self, guest: &str, dir: &Path) -> Result<GuestFs, GuestError> {
        Ok(GuestFs { view: self.view.with_mount(guest, dir)? })
    }

    fn walk(&self, path: &str, create: bool) -> Result<Walked, FsError> {
        self.view.walk(path, create)
    }

    fn check(&self, path: &str, guest_path: &OsStr) -> Result<(), FsError> {
        self.view.check(path, guest_path)
    }

    /// Resolves a directory (a terminal's cwd): its canonical guest path
    /// and an `O_PATH` descriptor of it, which the process to start there
    /// enters (`fchdir`) instead of the path: a directory swapped for a
    /// symlink after this check cannot move it elsewhere.
    pub fn open_dir(&self, path: &str) -> Result<GuestDir, FsError> {
        let w = self.walk(path, false)?;
        self.check(path, &w.guest)?;
        match w.target {
            Some(fd)
                if fstat(fd.as_fd())
                    .is_ok_and(|s| s.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits()) =>
            {
                Ok(GuestDir { guest: w.guest, fd })
            }
            Some(_) => Err(Failed::NotADirectory { path: path.into() }.into()),
            None => Err(NotFound::Directory { path: path.into() }.into()),
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
            return Err(NotFound::File { path: path.into() }.into());
        }
        let file = self.reopen(&w, path)?;
        let st = fstat(file.as_fd()).map_err(|e| sys("fstat", path, e))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(Failed::NotARegularFile { path: path.into() }.into());
        }
        let mut file = std::fs::File::from(file);
        if line.is_none() && limit.is_none() {
            if st.st_size as u64 > max {
                return Err(Failed::TooLarge { path: path.into(), size: st.st_size, max }.into());
            }
            let mut bytes = Vec::with_capacity(st.st_size as usize);
            (&mut file)
                .take(max + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| Failed::Read { path: path.into(), source: e })?;
            if bytes.len() as u64 > max {
                return Err(Failed::Grew { path: path.into(), max }.into());
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
            let buf = reader.fill_buf().map_err(|e| Failed::Read { path: path.into(), source: e })?;
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
            let last = start.saturating_add(limit).saturating_sub(1);
            return Err(Failed::LinesTooLarge { path: path.into(), start, last, max }.into());
        }
        Ok(into_text(out))
    }

    fn reopen(&self, w: &Walked, path: &str) -> Result<OwnedFd, FsError> {
        let name = CString::new(w.name.as_bytes()).map_err(|_| BadPath::Nul)?;
        if w.name.is_empty() {
            return Err(Failed::NotARegularFile { path: path.into() }.into());
        }
        nix::fcntl::openat(
            w.parent.as_fd(),
            name.as_c_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP => Failed::Replaced { path: path.into() }.into(),
            e => sys("open", path, e),
        })
    }

    /// `fs/write_text_file`: creates missing parents; replaces the file
    /// atomically, keeping its mode (and owner, when we may).
    pub fn write(&self, path: &str, content: &str) -> Result<(), FsError> {
        // Refuse early, before creating any directory, what is lexically
        // outside (a symlink may still lead out; checked after the walk).
        let lexical = sandbox::guest_path::normalize(path)
            .map_err(|why| BadPath::NotClean { path: path.into(), why })?;
        crate::hostfs::bounds::check(lexical.as_bytes()).map_err(BadPath::Bound)?;
        self.check(path, OsStr::new(&lexical))?;
        let w = self.walk(path, true)?;
        self.check(path, &w.guest)?;
        if w.name.is_empty() {
            return Err(Failed::IsADirectory { path: path.into() }.into());
        }
        let (mode, owner) = match &w.target {
            Some(fd) => {
                let st = fstat(fd.as_fd()).map_err(|e| sys("fstat", path, e))?;
                if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
                    return Err(Failed::NotARegularFile { path: path.into() }.into());
                }
                (st.st_mode & 0o7777, Some((st.st_uid, st.st_gid)))
            }
            None => (0o644, self.view.owner()),
        };
        w.replace(path, content.as_bytes(), mode, owner)
    }
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
        assert_eq!(fs.open_dir("/workspace/new/../src").unwrap().guest, "/workspace/src");
        assert!(fs.open_dir("/workspace/etc-link").is_err());
    }

    /// Names are bytes all the way: a link to a non-UTF-8 name reaches that
    /// file, not one whose name is its lossy rendering.
    #[test]
    fn links_to_non_utf8_names_resolve_as_the_guest_sees_them() {
        use std::os::unix::ffi::OsStrExt;
        let (t, fs) = tree();
        let ws = t.path().join("workspace");
        let odd = ws.join(std::ffi::OsStr::from_bytes(b"\xff"));
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("f"), "the guest's file").unwrap();
        std::fs::create_dir_all(ws.join("\u{fffd}")).unwrap();
        std::fs::write(ws.join("\u{fffd}/f"), "another file").unwrap();
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"\xff/f"), ws.join("link")).unwrap();
        assert_eq!(fs.read("/workspace/link", None, None, 100).unwrap(), "the guest's file");
        fs.write("/workspace/link", "written").unwrap();
        assert_eq!(std::fs::read_to_string(odd.join("f")).unwrap(), "written");
        assert_eq!(std::fs::read_to_string(ws.join("\u{fffd}/f")).unwrap(), "another file");
        // A directory reached through such a link keeps its exact name.
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"\xff"), ws.join("dirlink")).unwrap();
        let dir = fs.open_dir("/workspace/dirlink").unwrap();
        assert_eq!(dir.guest.as_bytes(), b"/workspace/\xff");
        // Messages show the byte, escaped.
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"/etc/\xfe"), ws.join("out")).unwrap();
        let e = fs.read("/workspace/out", None, None, 100).unwrap_err();
        assert!(e.message().contains("/etc/\\xfe"), "{e:?}");
    }

    /// Paths over the bounds are refused before anything is opened or made;
    /// at the bounds they work.
    #[test]
    fn paths_are_bounded_in_length_and_depth() {
        use crate::hostfs::bounds::{MAX_PATH_BYTES, MAX_PATH_DEPTH};
        let (t, fs) = tree();
        let deepest = format!("/workspace{}", "/d".repeat(MAX_PATH_DEPTH - 2));
        fs.write(&format!("{deepest}/f"), "deep").unwrap();
        assert_eq!(fs.read(&format!("{deepest}/f"), None, None, 100).unwrap(), "deep");
        let too_deep = format!("{deepest}/d/f");
        for e in [fs.write(&too_deep, "x").unwrap_err(), fs.read(&too_deep, None, None, 100).unwrap_err()] {
            assert!(matches!(e, FsError::BadPath(BadPath::Bound(_))), "{e:?}");
            assert!(e.message().contains("more than the 256"), "{e:?}");
        }
        assert!(!t.path().join(&too_deep[1..]).parent().unwrap().exists(), "nothing made");
        let long = format!("/workspace/{}", "x/".repeat(MAX_PATH_BYTES / 2));
        let e = fs.write(&long, "x").unwrap_err();
        assert!(e.message().contains("PATH_MAX"), "{e:?}");
        assert!(matches!(fs.open_dir(&long), Err(FsError::BadPath(_))));
        // A link chain that resolves deeper than the bound.
        let ws = t.path().join("workspace");
        std::fs::create_dir_all(t.path().join(&deepest[1..]).join("d/d")).unwrap();
        std::os::unix::fs::symlink(&deepest, ws.join("deep")).unwrap();
        let e = fs.read("/workspace/deep/d/d/f", None, None, 100).unwrap_err();
        assert!(e.message().contains("resolves to a path deeper"), "{e:?}");
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

    /// Each error renders exactly as the `format!` it replaced.
    #[test]
    fn error_texts_are_the_old_ones() {
        use crate::hostfs::guest::Outside;
        let p = "/workspace/a b";
        let g = "/etc";
        let eio = || std::io::Error::from_raw_os_error(libc::EIO);
        let e = eio();
        let (start, limit, max) = (3u64, 5u64, 4096u64);
        let cases: Vec<(FsError, String)> = vec![
            (
                BadPath::NotAbsolute { path: p.into() }.into(),
                format!("{p:?} is not an absolute path (ACP paths must be absolute)"),
            ),
            (BadPath::ContainsNul.into(), "the path contains a NUL byte".into()),
            (BadPath::Nul.into(), "NUL in path".into()),
            (
                BadPath::NotClean { path: p.into(), why: "is not clean" }.into(),
                format!("{p:?} {}", "is not clean"),
            ),
            (Outside::Path { path: p.into() }.into(), format!("{p} is outside the workspace and the home")),
            (
                Outside::ResolvesTo { path: p.into(), guest: g.into() }.into(),
                format!("{p} resolves to {g}, outside the workspace and the home"),
            ),
            (
                Outside::Creates { path: p.into(), guest: g.into() }.into(),
                format!("{p}: {g} is outside the workspace and the home"),
            ),
            (sys("open", p, Errno::ENOENT), format!("{p}: no such file or directory")),
            (NotFound::File { path: p.into() }.into(), format!("{p}: no such file")),
            (NotFound::Directory { path: p.into() }.into(), format!("{p}: no such directory")),
            (
                sys("fstat", p, Errno::EACCES),
                format!(
                    "{}({p:?}) => {}",
                    "fstat",
                    sandbox::error::io_error_text(&std::io::Error::from(Errno::EACCES))
                ),
            ),
            (Failed::Dup(eio()).into(), format!("dup: {e}")),
            (Failed::Read { path: p.into(), source: eio() }.into(), format!("read {p}: {e}")),
            (Failed::Write { path: p.into(), source: eio() }.into(), format!("write {p}: {e}")),
            (Failed::NotADirectory { path: p.into() }.into(), format!("{p}: not a directory")),
            (Failed::IsADirectory { path: p.into() }.into(), format!("{p}: is a directory")),
            (Failed::NotARegularFile { path: p.into() }.into(), format!("{p}: not a regular file")),
            (
                Failed::TooLarge { path: p.into(), size: 5000, max }.into(),
                format!(
                    "{p} is {} bytes, over the daemon's read limit of {max} bytes (fs_read_max_bytes); read it in parts with line and limit",
                    5000
                ),
            ),
            (
                Failed::Grew { path: p.into(), max }.into(),
                format!("{p} grew over the read limit of {max} bytes while being read"),
            ),
            (
                Failed::LinesTooLarge {
                    path: p.into(),
                    start,
                    last: start.saturating_add(limit).saturating_sub(1),
                    max,
                }
                .into(),
                format!(
                    "{p}: reading lines {start}..{} would read more than the daemon's read limit of {max} bytes \
                     (fs_read_max_bytes) from the file; ask for fewer or earlier lines",
                    start.saturating_add(limit).saturating_sub(1)
                ),
            ),
            (
                Failed::Replaced { path: p.into() }.into(),
                format!("{p}: replaced by a symlink while being opened; try again"),
            ),
        ];
        for (error, old) in cases {
            assert_eq!(error.message(), old, "{error:?}");
        }
        // The cause stays reachable: an errno a caller can match.
        let e = sys("open", p, Errno::ELOOP);
        assert!(matches!(e, FsError::Failed(Failed::Sys { source: Errno::ELOOP, .. })), "{e:?}");
    }
}
