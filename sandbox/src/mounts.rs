//! Executes the prepared mount steps inside the child, between the two
//! `pivot_root` calls.
//!
//! Destinations are resolved with `openat2(RESOLVE_IN_ROOT)` against the new
//! root, creating missing directories one component at a time, so a symlink
//! in a bound host directory is followed *inside* the sandbox and can never
//! lead a mount or a `mkdir` onto a host path. Binds use the new mount API:
//! `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)` makes a detached copy,
//! `mount_setattr(AT_RECURSIVE)` adds read-only/nosuid/nodev to every mount
//! in it (keeping flags the kernel locked, since bits are only added), and
//! `move_mount` attaches it. The copy is read-only before it is ever
//! visible.
//!
//! Nothing here allocates: paths are split into stack buffers.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;

use crate::prepare::{Action, Kind, Tree};
use crate::sys;

const RESOLVE_IN_ROOT: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
/// Host sources were canonicalized by the launcher; refusing symlinks now
/// means a path swapped for a link since then fails instead of redirecting.
const RESOLVE_CANONICAL: u64 = libc::RESOLVE_NO_SYMLINKS;
const PATH_BUF: usize = 4096;

/// Directory descriptors of the three trees a step can refer to.
pub(crate) struct Roots {
    pub host: OwnedFd,
    pub new: OwnedFd,
    pub staging: OwnedFd,
}

/// A failed syscall during setup, borrowing its argument from the plan.
pub(crate) struct Fail<'a> {
    pub call: &'static str,
    pub arg: Option<&'a CStr>,
    /// `arg` is a path relative to a root; shown with a leading `/`.
    pub rooted: bool,
    pub errno: Errno,
}

impl<'a> Fail<'a> {
    pub(crate) fn new(call: &'static str, arg: &'a CStr, errno: Errno) -> Self {
        Fail { call, arg: Some(arg), rooted: false, errno }
    }

    /// A failure on a path inside one of the roots.
    pub(crate) fn rooted(call: &'static str, arg: &'a CStr, errno: Errno) -> Self {
        Fail { call, arg: Some(arg), rooted: true, errno }
    }
}

type Result<'a, T> = std::result::Result<T, Fail<'a>>;

pub(crate) fn run<'a>(action: &'a Action, roots: &Roots) -> Result<'a, ()> {
    match action {
        Action::Bind { from, src, dst, kind, attrs, optional } => {
            let (tree, how) = match from {
                Tree::Host => (roots.host.as_fd(), RESOLVE_CANONICAL),
                Tree::New => (roots.new.as_fd(), RESOLVE_IN_ROOT),
                Tree::Staging => (roots.staging.as_fd(), RESOLVE_IN_ROOT),
            };
            let copy = match clone_tree(tree, src, how, *attrs) {
                Ok(copy) => copy,
                Err(f) if *optional && f.errno == Errno::ENOENT && f.call == "openat2" => return Ok(()),
                Err(f) => return Err(f),
            };
            let target = resolve(roots.new.as_fd(), dst, Some(*kind))?;
            sys::move_mount_fd(copy.as_fd(), target.as_fd()).map_err(|e| Fail::rooted("move_mount", dst, e))
        }
        Action::Fs { fstype, options, attrs, dst } => {
            let fs = sys::fsopen(fstype).map_err(|e| Fail::new("fsopen", fstype, e))?;
            for (key, value) in options {
                sys::fsconfig_set(fs.as_fd(), key, value.as_deref())
                    .map_err(|e| Fail::new("fsconfig", key, e))?;
            }
            sys::fsconfig_create(fs.as_fd())
                .map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", fstype, e))?;
            let mnt = sys::fsmount(fs.as_fd(), *attrs).map_err(|e| Fail::new("fsmount", fstype, e))?;
            let target = resolve(roots.new.as_fd(), dst, Some(Kind::Dir))?;
            sys::move_mount_fd(mnt.as_fd(), target.as_fd()).map_err(|e| Fail::rooted("move_mount", dst, e))
        }
        Action::WriteStaging { name, contents, mode } => {
            let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
            let fd = sys::openat(roots.staging.as_fd(), name, flags, *mode)
                .map_err(|e| Fail::rooted("openat", name, e))?;
            sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&fd), contents)
                .map_err(|e| Fail::rooted("write", name, e))
        }
        Action::Symlink { target, dst } => {
            let mut parent_buf = [0u8; PATH_BUF];
            let mut name_buf = [0u8; 256];
            let (parent, name) =
                split_last(dst, &mut parent_buf, &mut name_buf).map_err(|e| Fail::rooted("split", dst, e))?;
            let dir = resolve(roots.new.as_fd(), parent, Some(Kind::Dir))
                .map_err(|f| Fail::rooted(f.call, dst, f.errno))?;
            match sys::symlinkat(target, dir.as_fd(), name) {
                Ok(()) => Ok(()),
                // Idempotent, as in bubblewrap: an identical link is fine.
                Err(Errno::EEXIST) if same_link(dir.as_fd(), name, target) => Ok(()),
                Err(e) => Err(Fail::rooted("symlinkat", dst, e)),
            }
        }
        Action::Dir { dst, mode } => {
            let mut parent_buf = [0u8; PATH_BUF];
            let mut name_buf = [0u8; 256];
            let (parent, name) =
                split_last(dst, &mut parent_buf, &mut name_buf).map_err(|e| Fail::rooted("split", dst, e))?;
            let dir = resolve(roots.new.as_fd(), parent, Some(Kind::Dir))
                .map_err(|f| Fail::rooted(f.call, dst, f.errno))?;
            match sys::mkdirat(dir.as_fd(), name, *mode) {
                Ok(()) | Err(Errno::EEXIST) => Ok(()),
                Err(e) => Err(Fail::rooted("mkdirat", dst, e)),
            }
        }
        Action::AttachTree { tree, dst, kind } => {
            let target = resolve(roots.new.as_fd(), dst, Some(*kind))?;
            sys::move_mount_fd(tree.as_fd(), target.as_fd()).map_err(|e| Fail::rooted("move_mount", dst, e))
        }
        Action::StagingDir { name, mode } => {
            sys::mkdirat(roots.staging.as_fd(), name, *mode).map_err(|e| Fail::rooted("mkdirat", name, e))
        }
        Action::Remount { dst, attrs } => {
            let target = resolve(roots.new.as_fd(), dst, None)?;
            sys::mount_setattr(target.as_fd(), *attrs, false)
                .map_err(|e| Fail::rooted("mount_setattr", dst, e))
        }
    }
}

/// A detached, recursive copy of the mount tree at `src` (in `tree`), with
/// `attrs` added to every mount of the copy before anyone can see it.
pub(crate) fn clone_tree<'a>(
    tree: BorrowedFd<'_>,
    src: &'a CStr,
    how: u64,
    attrs: u64,
) -> Result<'a, OwnedFd> {
    let source =
        sys::openat2(tree, src, libc::O_PATH, 0, how).map_err(|e| Fail::rooted("openat2", src, e))?;
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_EMPTY_PATH as u32
        | libc::AT_RECURSIVE as u32;
    let copy = sys::open_tree(source.as_fd(), c"", flags).map_err(|e| Fail::rooted("open_tree", src, e))?;
    sys::mount_setattr(copy.as_fd(), attrs, true).map_err(|e| Fail::rooted("mount_setattr", src, e))?;
    Ok(copy)
}

/// Host sources of deferred binds are cloned with the same resolution rule.
pub(crate) const RESOLVE_HOST: u64 = RESOLVE_CANONICAL;

fn same_link(dir: BorrowedFd<'_>, name: &CStr, target: &CStr) -> bool {
    let mut buf = [0u8; PATH_BUF];
    matches!(sys::readlinkat(dir, name, &mut buf), Ok(n) if &buf[..n] == target.to_bytes())
}

/// Splits `a/b/c` into (`a/b`, `c`) in the given buffers; `c` alone gives ("", `c`).
fn split_last<'b>(
    path: &CStr,
    parent_buf: &'b mut [u8],
    name_buf: &'b mut [u8],
) -> std::result::Result<(&'b CStr, &'b CStr), Errno> {
    let bytes = path.to_bytes();
    let (parent, name) = match bytes.iter().rposition(|&b| b == b'/') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (&bytes[..0], bytes),
    };
    if parent.len() >= parent_buf.len() || name.len() >= name_buf.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() {
        return Err(Errno::EINVAL);
    }
    parent_buf[..parent.len()].copy_from_slice(parent);
    parent_buf[parent.len()] = 0;
    name_buf[..name.len()].copy_from_slice(name);
    name_buf[name.len()] = 0;
    // Both buffers now hold exactly one NUL, at the end of the copied bytes.
    let parent = CStr::from_bytes_until_nul(parent_buf).map_err(|_| Errno::EINVAL)?;
    let name = CStr::from_bytes_until_nul(name_buf).map_err(|_| Errno::EINVAL)?;
    Ok((parent, name))
}

/// Opens `rel` (relative, normalized) inside `root` as an `O_PATH` descriptor,
/// resolving symlinks as if `root` were `/`. With `create`, missing
/// components are created as directories, and the last one as `create` says.
pub(crate) fn resolve<'a>(root: BorrowedFd<'_>, rel: &'a CStr, create: Option<Kind>) -> Result<'a, OwnedFd> {
    let whole = if rel.is_empty() { c"." } else { rel };
    match sys::openat2(root, whole, libc::O_PATH, 0, RESOLVE_IN_ROOT) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) if create.is_some() => {}
        Err(e) => return Err(Fail::rooted("openat2", rel, e)),
    }
    let bytes = rel.to_bytes();
    let mut prefix_buf = [0u8; PATH_BUF];
    let mut name_buf = [0u8; 256];
    if bytes.len() >= prefix_buf.len() {
        return Err(Fail::rooted("openat2", rel, Errno::ENAMETOOLONG));
    }
    let mut parent: Option<OwnedFd> = None;
    let mut start = 0;
    loop {
        let end = bytes[start..].iter().position(|&b| b == b'/').map_or(bytes.len(), |i| start + i);
        let last = end == bytes.len();
        let component = &bytes[start..end];
        if component.len() >= name_buf.len() {
            return Err(Fail::rooted("openat2", rel, Errno::ENAMETOOLONG));
        }
        prefix_buf[..end].copy_from_slice(&bytes[..end]);
        prefix_buf[end] = 0;
        name_buf[..component.len()].copy_from_slice(component);
        name_buf[component.len()] = 0;
        let prefix = CStr::from_bytes_until_nul(&prefix_buf)
            .map_err(|_| Fail::rooted("openat2", rel, Errno::EINVAL))?;
        let name =
            CStr::from_bytes_until_nul(&name_buf).map_err(|_| Fail::rooted("openat2", rel, Errno::EINVAL))?;

        let fd = match sys::openat2(root, prefix, libc::O_PATH, 0, RESOLVE_IN_ROOT) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                let dir = parent.as_ref().map_or(root, |p| p.as_fd());
                let created = if last && create == Some(Kind::File) {
                    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
                    sys::openat(dir, name, flags, 0o644).map(drop)
                } else {
                    sys::mkdirat(dir, name, 0o755)
                };
                match created {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(Fail::rooted(if last { "create" } else { "mkdirat" }, rel, e));
                    }
                }
                sys::openat2(root, prefix, libc::O_PATH, 0, RESOLVE_IN_ROOT)
                    .map_err(|e| Fail::rooted("openat2", rel, e))?
            }
            Err(e) => return Err(Fail::rooted("openat2", rel, e)),
        };
        if last {
            return Ok(fd);
        }
        parent = Some(fd);
        start = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_last_handles_nested_and_top_level() {
        let mut p = [0u8; 64];
        let mut n = [0u8; 64];
        let (parent, name) = split_last(c"etc/passwd", &mut p, &mut n).unwrap();
        assert_eq!((parent.to_bytes(), name.to_bytes()), (&b"etc"[..], &b"passwd"[..]));
        let mut p = [0u8; 64];
        let mut n = [0u8; 64];
        let (parent, name) = split_last(c"tmp", &mut p, &mut n).unwrap();
        assert_eq!((parent.to_bytes(), name.to_bytes()), (&b""[..], &b"tmp"[..]));
    }

    #[test]
    fn resolve_creates_inside_root_and_symlinks_stay_inside() {
        let dir = std::env::temp_dir().join(format!("sandbox-resolve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("root/inside")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        // Absolute links, which a naive walk would follow onto the host.
        std::os::unix::fs::symlink("/inside", dir.join("root/in")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("root/out")).unwrap();
        let root_path = std::ffi::CString::new(dir.join("root").to_str().unwrap()).unwrap();
        let root = sys::open(&root_path, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();

        // "/inside" is resolved against the root: directories land in root/inside.
        assert!(resolve(root.as_fd(), c"in/a/b", Some(Kind::Dir)).is_ok());
        assert!(dir.join("root/inside/a/b").is_dir());

        // The host path behind "out" does not exist inside the root, so the
        // walk fails instead of creating anything in the real `outside`.
        let err = resolve(root.as_fd(), c"out/a", Some(Kind::Dir)).expect_err("dangling in-root link");
        assert_eq!(err.errno, Errno::ENOENT);
        assert!(!dir.join("outside/a").exists());

        // A file destination is created as an empty regular file.
        assert!(resolve(root.as_fd(), c"etc/passwd", Some(Kind::File)).is_ok());
        assert!(dir.join("root/etc/passwd").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
