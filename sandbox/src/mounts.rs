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
//! Most destinations are siblings of the one before (`/dev`'s nodes and
//! links, `/etc/passwd` and `/etc/group`): [`Dirs`] keeps the last parent
//! directory open, and a destination in it is looked up or created
//! relative to it, refusing symlinks; anything unusual takes the full walk.
//!
//! Nothing here allocates: paths are split into stack buffers.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;

use crate::prepare::{Action, HostSource, Kind, MAX_HOST_SOURCES, OverlayFs, Source};
use crate::procfs;
use crate::sys;

const RESOLVE_IN_ROOT: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
/// Host sources were canonicalized by the launcher; refusing symlinks now
/// means a path swapped for a link since then fails instead of redirecting.
const RESOLVE_CANONICAL: u64 = libc::RESOLVE_NO_SYMLINKS;
const PATH_BUF: usize = 4096;

/// Clones of every host source (binds and deferred binds), made at the
/// start of setup while the host's tree is still the child's root. A fixed
/// array: the child does not allocate.
pub(crate) struct Clones {
    fds: [Option<OwnedFd>; MAX_HOST_SOURCES],
}

impl Clones {
    /// Clones each host source, with its mount attributes applied to every
    /// mount of the copy. On failure returns the index of the source.
    pub(crate) fn make<'a>(
        sources: &'a [HostSource],
        host: BorrowedFd<'_>,
        pool: &mut Pool,
    ) -> std::result::Result<Clones, (usize, Fail<'a>)> {
        let mut fds = [const { None }; MAX_HOST_SOURCES];
        for (i, source) in sources.iter().enumerate() {
            let copy = match (&source.overlay, source.fd) {
                (Some(overlay), _) => overlay_fs(overlay, source.attrs, host, pool).map_err(|f| (i, f))?,
                (None, Some(fd)) => clone_fd(fd, &source.src, source.attrs).map_err(|f| (i, f))?,
                (None, None) => {
                    clone_tree(host, &source.src, RESOLVE_CANONICAL, source.attrs).map_err(|f| (i, f))?
                }
            };
            fds[i] = Some(copy);
        }
        Ok(Clones { fds })
    }

    /// Takes clone `index`; each can be attached once.
    pub(crate) fn take(&mut self, index: usize) -> Option<OwnedFd> {
        self.fds.get_mut(index).and_then(Option::take)
    }
}

/// A recursive copy of the mount tree a descriptor is open on (`what`
/// names it in errors), with `attrs` added to every mount of the copy.
fn clone_fd<'a>(fd: std::os::fd::RawFd, what: &'a CStr, attrs: u64) -> Result<'a, OwnedFd> {
    // SAFETY: a descriptor of the plan (HostSource::fd), open until PID 1
    // closes it after every clone is made.
    let source = unsafe { BorrowedFd::borrow_raw(fd) };
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_EMPTY_PATH as u32
        | libc::AT_RECURSIVE as u32;
    let copy = sys::open_tree(source, c"", flags).map_err(|e| Fail::rooted("open_tree", what, e))?;
    sys::mount_setattr(copy.as_fd(), attrs, true).map_err(|e| Fail::rooted("mount_setattr", what, e))?;
    Ok(copy)
}

/// Where a nested sandbox's tmpfs content lives: new directories of its
/// outer sandbox's pool, a tmpfs of `--tmpfs-size` shared by every nested
/// sandbox of it (one budget), each cloned as a mount of its own. Without
/// one (every other sandbox), a fresh tmpfs each.
pub(crate) struct Pool {
    dir: Option<OwnedFd>,
    next: u32,
}

impl Pool {
    /// `rel` (a nested sandbox's directory of the pool) in `root`, or no
    /// pool.
    pub(crate) fn open<'a>(root: BorrowedFd<'_>, rel: Option<&'a CStr>) -> Result<'a, Pool> {
        let dir = match rel {
            Some(rel) => {
                let how = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
                let dir = sys::openat2(root, rel, libc::O_PATH | libc::O_DIRECTORY, 0, how)
                    .map_err(|e| Fail::new("openat2", rel, e))?;
                Some(dir)
            }
            None => None,
        };
        Ok(Pool { dir, next: 0 })
    }

    /// The same directory as seen from `root` (another mount namespace),
    /// going on with the same names.
    pub(crate) fn reopen<'a>(&mut self, root: BorrowedFd<'_>, rel: Option<&'a CStr>) -> Result<'a, ()> {
        let next = self.next;
        *self = Pool::open(root, rel)?;
        self.next = next;
        Ok(())
    }

    pub(crate) fn is_some(&self) -> bool {
        self.dir.is_some()
    }

    /// A new directory of the pool with `mode`, open as a directory.
    fn new_dir(&mut self, mode: u32) -> Result<'static, OwnedFd> {
        let Some(pool) = self.dir.as_ref().map(|d| d.as_fd()) else {
            return Err(Fail::new("open", c"the pool", Errno::ENOENT));
        };
        let mut buf = [0u8; 16];
        let name = numbered(self.next, &mut buf);
        self.next += 1;
        sys::mkdirat(pool, name, mode).map_err(|e| Fail::new("mkdirat", c"the pool", e))?;
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        sys::openat(pool, name, flags, 0).map_err(|e| Fail::new("openat", c"the pool", e))
    }

    /// A new directory of the pool with `mode`, as a detached mount with
    /// `attrs` added (the pool's own are `nosuid`, `nodev`).
    fn mount(&mut self, mode: u32, attrs: u64) -> Result<'static, OwnedFd> {
        let dir = self.new_dir(mode)?;
        let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32;
        let copy =
            sys::open_tree(dir.as_fd(), c"", flags).map_err(|e| Fail::new("open_tree", c"the pool", e))?;
        sys::mount_setattr(copy.as_fd(), attrs, false)
            .map_err(|e| Fail::new("mount_setattr", c"the pool", e))?;
        Ok(copy)
    }

    /// A tmpfs for content of the sandbox's own: a pool directory (`mode`),
    /// or, without a pool, a fresh tmpfs with `options`.
    pub(crate) fn tmpfs<'o>(
        &mut self,
        mode: u32,
        options: &'o [(std::ffi::CString, Option<std::ffi::CString>)],
        attrs: u64,
    ) -> Result<'o, OwnedFd> {
        if self.is_some() {
            return self.mount(mode, attrs);
        }
        let fs = sys::fsopen(c"tmpfs").map_err(|e| Fail::new("fsopen", c"tmpfs", e))?;
        sys::fsconfig_set(fs.as_fd(), c"source", Some(c"tmpfs"))
            .map_err(|e| Fail::new("fsconfig", c"source", e))?;
        for (key, value) in options {
            sys::fsconfig_set(fs.as_fd(), key, value.as_deref())
                .map_err(|e| Fail::new("fsconfig", key, e))?;
        }
        sys::fsconfig_create(fs.as_fd())
            .map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"tmpfs", e))?;
        sys::fsmount(fs.as_fd(), attrs).map_err(|e| Fail::new("fsmount", c"tmpfs", e))
    }
}

/// `n` as the decimal name `nN` in `buf`.
fn numbered(n: u32, buf: &mut [u8; 16]) -> &CStr {
    let mut digits = [0u8; 10];
    let mut len = 0;
    let mut rest = n;
    loop {
        digits[len] = b'0' + (rest % 10) as u8;
        len += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    buf[0] = b'n';
    for i in 0..len {
        buf[1 + i] = digits[len - 1 - i];
    }
    buf[1 + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"n")
}

/// The `mode` option of a tmpfs, octal (0755 without one).
fn mode_of(options: &[(std::ffi::CString, Option<std::ffi::CString>)]) -> u32 {
    let value = options.iter().find(|(k, _)| k.as_c_str() == c"mode").and_then(|(_, v)| v.as_deref());
    value.map_or(0o755, |v| v.to_bytes().iter().fold(0, |m, &d| m * 8 + u32::from(d.wrapping_sub(b'0') & 7)))
}

/// A detached overlay of host directories (`host`'s tree is our root).
/// A `tmp` one writes to a private tmpfs (a directory of the pool for a
/// nested sandbox), which overlayfs wants attached while it is made: on
/// `/tmp` of this namespace's copy of the host's tree for that moment,
/// named relative to it (overlayfs resolves its paths from the working
/// directory), and detached again right after; the pool is attached.
fn overlay_fs<'a>(
    overlay: &'a OverlayFs,
    attrs: u64,
    host: BorrowedFd<'_>,
    pool: &mut Pool,
) -> Result<'a, OwnedFd> {
    let fs = sys::fsopen(c"overlay").map_err(|e| Fail::new("fsopen", c"overlay", e))?;
    sys::fsconfig_set(fs.as_fd(), c"source", Some(c"overlay"))
        .map_err(|e| Fail::new("fsconfig", c"source", e))?;
    for (key, value) in &overlay.options {
        sys::fsconfig_set(fs.as_fd(), key, value.as_deref()).map_err(|e| match value {
            Some(v) => Fail::new("fsconfig", v, e),
            None => Fail::new("fsconfig", key, e),
        })?;
    }
    if !overlay.tmp {
        sys::fsconfig_create(fs.as_fd())
            .map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"overlay", e))?;
        return sys::fsmount(fs.as_fd(), attrs).map_err(|e| Fail::new("fsmount", c"overlay", e));
    }
    let upper_and_work = |fs: BorrowedFd<'_>| {
        for (key, value) in [(c"upperdir", c"upper"), (c"workdir", c"work")] {
            sys::fsconfig_set(fs, key, Some(value)).map_err(|e| Fail::new("fsconfig", key, e))?;
        }
        sys::fsconfig_create(fs).map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"overlay", e))?;
        sys::fsmount(fs, attrs).map_err(|e| Fail::new("fsmount", c"overlay", e))
    };
    if pool.is_some() {
        let dir = pool.new_dir(0o755)?;
        for name in [c"upper", c"work"] {
            sys::mkdirat(dir.as_fd(), name, 0o755).map_err(|e| Fail::new("mkdirat", name, e))?;
        }
        sys::fchdir(dir.as_fd()).map_err(|e| Fail::new("fchdir", c"the pool", e))?;
        return upper_and_work(fs.as_fd());
    }
    let tmp = sys::fsopen(c"tmpfs").map_err(|e| Fail::new("fsopen", c"tmpfs", e))?;
    sys::fsconfig_set(tmp.as_fd(), c"mode", Some(c"755")).map_err(|e| Fail::new("fsconfig", c"mode", e))?;
    sys::fsconfig_create(tmp.as_fd()).map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"tmpfs", e))?;
    let tmp = sys::fsmount(tmp.as_fd(), 0).map_err(|e| Fail::new("fsmount", c"tmpfs", e))?;
    for dir in [c"upper", c"work"] {
        sys::mkdirat(tmp.as_fd(), dir, 0o755).map_err(|e| Fail::new("mkdirat", dir, e))?;
    }
    let how = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let at = sys::openat2(host, c"tmp", libc::O_PATH | libc::O_DIRECTORY, 0, how)
        .map_err(|e| Fail::new("openat2", c"/tmp", e))?;
    sys::move_mount_fd(tmp.as_fd(), at.as_fd()).map_err(|e| Fail::new("move_mount", c"/tmp", e))?;
    sys::fchdir(tmp.as_fd()).map_err(|e| Fail::new("fchdir", c"tmpfs", e))?;
    let made = upper_and_work(fs.as_fd());
    // The overlay keeps its own private copy of the tmpfs.
    sys::umount2(c".", libc::MNT_DETACH).map_err(|e| Fail::new("umount2(MNT_DETACH)", c"/tmp", e))?;
    made
}

/// A failed syscall during setup, borrowing its argument from the plan.
pub(crate) struct Fail<'a> {
    pub call: &'static str,
    pub arg: Option<&'a CStr>,
    /// `arg` is a path relative to a root; shown with a leading `/`.
    pub rooted: bool,
    pub errno: Errno,
    /// It failed on a missing parent of the destination (bubblewrap's
    /// `Can't mkdir parents for`).
    pub parent: bool,
}

impl<'a> Fail<'a> {
    pub(crate) fn new(call: &'static str, arg: &'a CStr, errno: Errno) -> Self {
        Fail { call, arg: Some(arg), rooted: false, errno, parent: false }
    }

    /// A failure on a path inside one of the roots.
    pub(crate) fn rooted(call: &'static str, arg: &'a CStr, errno: Errno) -> Self {
        Fail { call, arg: Some(arg), rooted: true, errno, parent: false }
    }

    /// The same failure, on a parent of the destination.
    fn in_parent(self) -> Self {
        Fail { parent: true, ..self }
    }
}

type Result<'a, T> = std::result::Result<T, Fail<'a>>;

/// The parent directory of the last destination, open, until a mount may
/// have covered it.
pub(crate) struct Dirs {
    path: [u8; PATH_BUF],
    len: usize,
    fd: Option<OwnedFd>,
    /// The mode of missing parent directories, for the current step.
    parents: u32,
}

impl Dirs {
    pub(crate) fn new() -> Dirs {
        Dirs { path: [0; PATH_BUF], len: 0, fd: None, parents: 0o755 }
    }

    /// Missing parents of the next step's destination get this mode.
    pub(crate) fn set_parents(&mut self, mode: u32) {
        self.parents = mode;
    }

    /// The directory `rel` inside `root` (created if missing, as
    /// [`resolve`] does), reusing the open one when it is the same path.
    fn get<'a>(&mut self, root: BorrowedFd<'_>, rel: &'a CStr) -> Result<'a, BorrowedFd<'_>> {
        let bytes = rel.to_bytes();
        let cached = self.fd.is_some() && self.path[..self.len] == *bytes;
        if !cached {
            self.fd = None;
            let fd = resolve_mode(root, rel, Some(Kind::Dir), self.parents, self.parents)?;
            if bytes.len() <= self.path.len() {
                self.path[..bytes.len()].copy_from_slice(bytes);
                self.len = bytes.len();
                self.fd = Some(fd);
            } else {
                return Err(Fail::rooted("openat2", rel, Errno::ENAMETOOLONG));
            }
        }
        Ok(self.fd.as_ref().expect("set above").as_fd())
    }

    /// Something was mounted on `target`: the open directory is stale if it
    /// lies there or below.
    fn mounted_on(&mut self, target: &CStr) {
        let t = target.to_bytes();
        let cached = &self.path[..self.len];
        if t.is_empty() || (cached.starts_with(t) && (cached.len() == t.len() || cached[t.len()] == b'/')) {
            self.fd = None;
        }
    }
}

/// The destination `dst` of a mount, as [`resolve`] finds or creates it,
/// through the open parent directory when `dst` is a plain name in it: an
/// existing entry is opened without following symlinks, a missing one
/// created. A symlink or any other surprise takes the full walk, which
/// resolves links inside the root and reports errors.
fn target<'a>(root: BorrowedFd<'_>, dirs: &mut Dirs, dst: &'a CStr, kind: Kind) -> Result<'a, OwnedFd> {
    let mut parent_buf = [0u8; PATH_BUF];
    let mut name_buf = [0u8; 256];
    if let Ok((parent, name)) = split_last(dst, &mut parent_buf, &mut name_buf)
        && let Ok(dir) = dirs.get(root, parent)
    {
        let plain = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_BENEATH;
        match sys::openat2(dir, name, libc::O_PATH, 0, plain) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ENOENT) => {
                if let Ok(fd) = create(dir, name, kind) {
                    return Ok(fd);
                }
            }
            Err(_) => {}
        }
    }
    resolve_mode(root, dst, Some(kind), dirs.parents, 0o755)
}

/// A mount point found where `dst` was: a directory for a directory's
/// mount, anything but one for a file's (bubblewrap's `ensure_dir` and
/// `ensure_file`, whose words bwrap_words.rs gives these failures).
fn fits<'a>(target: &OwnedFd, dst: &'a CStr, kind: Kind) -> Result<'a, ()> {
    match (kind, sys::is_dir(target)) {
        (Kind::Dir, false) => Err(Fail::rooted("mkdirat", dst, Errno::ENOTDIR)),
        (Kind::File, true) => Err(Fail::rooted("create", dst, Errno::EISDIR)),
        _ => Ok(()),
    }
}

/// Creates `name` in `dir` as `kind`, never through a symlink, and opens
/// it: a new file as the descriptor it was created through, a new
/// directory `O_PATH`. The error says which step failed: `Err((false, _))`
/// the creation, `Err((true, _))` opening what was created.
fn create(dir: BorrowedFd<'_>, name: &CStr, kind: Kind) -> std::result::Result<OwnedFd, (bool, Errno)> {
    create_mode(dir, name, kind, 0o755)
}

/// [`create`], a new directory with mode `dir_mode`.
fn create_mode(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: Kind,
    dir_mode: u32,
) -> std::result::Result<OwnedFd, (bool, Errno)> {
    match kind {
        Kind::File => {
            let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
            // bubblewrap's mode for a file made as a mount point.
            sys::openat(dir, name, flags, 0o444).map_err(|e| (false, e))
        }
        Kind::Dir => {
            sys::mkdirat(dir, name, dir_mode).map_err(|e| (false, e))?;
            let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY;
            sys::openat(dir, name, flags, 0).map_err(|e| (true, e))
        }
    }
}

/// Mounts `tree` on `dst` (found or created as `kind`).
fn attach<'a>(
    tree: BorrowedFd<'_>,
    root: BorrowedFd<'_>,
    dirs: &mut Dirs,
    dst: &'a CStr,
    kind: Kind,
) -> Result<'a, ()> {
    let target = target(root, dirs, dst, kind)?;
    fits(&target, dst, kind)?;
    dirs.mounted_on(dst);
    sys::move_mount_fd(tree, target.as_fd()).map_err(|e| Fail::rooted("move_mount", dst, e))
}

/// Attaches the new mount `tree` at `dst`. A mount on the root itself
/// (bwrap's `--ro-bind / /`, `--tmpfs /`) replaces the root instead of
/// covering it: the old one (which it would hide entirely) is detached and
/// the tree takes its place on `base`, so that the later steps see it
/// through its descriptor, and `pivot_root` later finds a single mount
/// where the old root's tree hangs, not a stack of them.
fn attach_owned<'a>(
    tree: OwnedFd,
    new: &mut OwnedFd,
    base: BorrowedFd<'_>,
    dirs: &mut Dirs,
    dst: &'a CStr,
    kind: Kind,
) -> Result<'a, ()> {
    if !dst.is_empty() {
        return attach(tree.as_fd(), new.as_fd(), dirs, dst, kind);
    }
    fits(new, dst, kind)?;
    dirs.mounted_on(dst);
    // umount2 takes a path: the old root is the working directory's mount
    // (nothing is mounted on its root: a root mount always replaces it).
    sys::fchdir(new.as_fd()).map_err(|e| Fail::rooted("fchdir", dst, e))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(|e| Fail::rooted("umount2(MNT_DETACH)", dst, e))?;
    sys::move_mount_fd(tree.as_fd(), base).map_err(|e| Fail::rooted("move_mount", dst, e))?;
    *new = tree;
    Ok(())
}

/// Executes one step on the new root `new`, which sits on `host`: the
/// caller's root, the tree the new root replaces when the sandbox is
/// entered, and where a bind of the caller's `/proc` comes from.
/// `notices` is the report pipe.
pub(crate) fn run<'a>(
    action: &'a Action,
    new: &mut OwnedFd,
    host: BorrowedFd<'_>,
    clones: &mut Clones,
    dirs: &mut Dirs,
    pool: &mut Pool,
    notices: std::os::fd::RawFd,
) -> Result<'a, ()> {
    let root = new.as_fd();
    match action {
        Action::Bind { source, dst, kind } => {
            let Some(copy) = copy_source(source, dst, root, clones)? else { return Ok(()) };
            attach_owned(copy, new, host, dirs, dst, *kind)
        }
        Action::Fs { options, attrs, dst, pooled: true, .. } => {
            let dir = pool.mount(mode_of(options), *attrs)?;
            attach_owned(dir, new, host, dirs, dst, Kind::Dir)
        }
        Action::Fs { fstype, options, attrs, dst, .. } => {
            let mnt = new_fs(fstype, options, *attrs)?;
            attach_owned(mnt, new, host, dirs, dst, Kind::Dir)
        }
        Action::WriteFile { path, contents, mode } => write_new(root, path, contents, *mode),
        // The new root itself is a directory (bubblewrap's `creat` of it).
        Action::CreateFile { dst, .. } if dst.is_empty() => Err(Fail::rooted("openat", dst, Errno::EISDIR)),
        Action::CreateFile { dst, contents, mode } => create_file(root, dirs, dst, contents, *mode),
        Action::BindData { dst, contents, mode, attrs } => {
            let copy = data_file(pool, dst, contents, *mode, *attrs)?;
            attach_owned(copy, new, host, dirs, dst, Kind::File)
        }
        Action::Chmod { dst, mode } => {
            let target = resolve(root, dst, None)?;
            sys::fchmod_path(target.as_fd(), *mode).map_err(|e| Fail::rooted("fchmodat2", dst, e))
        }
        Action::RemoveStaging { files, dir } => remove_staging(root, dirs, files, dir),
        Action::Symlink { dst, .. } if dst.is_empty() => {
            symlink_exists(dst, None, notices);
        }
        Action::Symlink { target, dst } => symlink(root, dirs, target, dst, notices),
        // `--dir /`: the new root is one already.
        Action::Dir { dst, .. } if dst.is_empty() => Ok(()),
        Action::Dir { dst, mode } => make_dir(root, dirs, dst, *mode),
        Action::AttachTree { tree, dst, kind } => attach(tree.as_fd(), root, dirs, dst, *kind),
        Action::Proc(prepared) => proc(prepared, root, host, dirs, notices),
        Action::Move { from, dst } => {
            // The root of the mount at `from` (a tmpfs we mounted there).
            let tree = resolve(root, from, None)?;
            attach(tree.as_fd(), root, dirs, dst, Kind::Dir)
        }
        Action::Remount { dst, attrs } => remount(root, dirs, dst, *attrs),
        Action::Listen { socket, dir, name } => listen(root, *socket, dir, name),
    }
}

/// The detached copy a bind attaches at `dst`: the host source opened
/// before the sandbox was entered, or a path of the new root. `None` when
/// an optional path is missing (nothing to bind).
fn copy_source<'a>(
    source: &'a Source,
    dst: &'a CStr,
    root: BorrowedFd<'_>,
    clones: &mut Clones,
) -> Result<'a, Option<OwnedFd>> {
    match source {
        Source::Host(index) => {
            clones.take(*index).map(Some).ok_or(Fail::rooted("open_tree", dst, Errno::EBUSY))
        }
        Source::New { path, attrs, optional } => match clone_tree(root, path, RESOLVE_IN_ROOT, *attrs) {
            Ok(copy) => Ok(Some(copy)),
            Err(f) if *optional && f.errno == Errno::ENOENT && f.call == "openat2" => Ok(None),
            Err(f) => Err(f),
        },
    }
}

/// A new detached mount of `fstype` with `options`.
fn new_fs<'a>(
    fstype: &'a CStr,
    options: &'a [(CString, Option<CString>)],
    attrs: u64,
) -> Result<'a, OwnedFd> {
    let fs = sys::fsopen(fstype).map_err(|e| Fail::new("fsopen", fstype, e))?;
    // The "source" shows up in /proc/mounts; default would be "none".
    sys::fsconfig_set(fs.as_fd(), c"source", Some(fstype))
        .map_err(|e| Fail::new("fsconfig", c"source", e))?;
    for (key, value) in options {
        sys::fsconfig_set(fs.as_fd(), key, value.as_deref()).map_err(|e| Fail::new("fsconfig", key, e))?;
    }
    sys::fsconfig_create(fs.as_fd()).map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", fstype, e))?;
    sys::fsmount(fs.as_fd(), attrs).map_err(|e| Fail::new("fsmount", fstype, e))
}

/// A generated file that must not exist yet at `path`.
fn write_new<'a>(root: BorrowedFd<'_>, path: &'a CStr, contents: &[u8], mode: u32) -> Result<'a, ()> {
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
    let fd = sys::openat(root, path, flags, mode).map_err(|e| Fail::rooted("openat", path, e))?;
    sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&fd), contents).map_err(|e| Fail::rooted("write", path, e))
}

/// The open parent directory of `dst` (its missing parents made) and the
/// name `dst` has in it, held in `bufs`.
fn parent_of<'d, 'a, 'b>(
    root: BorrowedFd<'_>,
    dirs: &'d mut Dirs,
    dst: &'a CStr,
    bufs: &'b mut ([u8; PATH_BUF], [u8; 256]),
) -> Result<'a, (BorrowedFd<'d>, &'b CStr)> {
    let (parent, name) =
        split_last(dst, &mut bufs.0, &mut bufs.1).map_err(|e| Fail::rooted("split", dst, e))?;
    let dir = dirs.get(root, parent).map_err(|f| Fail::rooted(f.call, dst, f.errno).in_parent())?;
    Ok((dir, name))
}

/// A file at `dst` (created or truncated) holding `contents`.
fn create_file<'a>(
    root: BorrowedFd<'_>,
    dirs: &mut Dirs,
    dst: &'a CStr,
    contents: &[u8],
    mode: u32,
) -> Result<'a, ()> {
    let mut bufs = ([0u8; PATH_BUF], [0u8; 256]);
    let (dir, name) = parent_of(root, dirs, dst, &mut bufs)?;
    let flags = libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd =
        sys::openat(dir, name, flags, mode).map_err(|e| not_dir_is_parent(Fail::rooted("openat", dst, e)))?;
    sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&fd), contents).map_err(|e| Fail::rooted("write", dst, e))
}

/// A detached copy of a file holding `contents`, written in a private
/// directory (of the pool, or a fresh tmpfs), for a bind at `dst`.
fn data_file<'a>(
    pool: &mut Pool,
    dst: &'a CStr,
    contents: &[u8],
    mode: u32,
    attrs: u64,
) -> Result<'a, OwnedFd> {
    let tmp = match pool.is_some() {
        true => pool.new_dir(0o755)?,
        false => pool.tmpfs(0o755, &[], 0)?,
    };
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
    let file = sys::openat(tmp.as_fd(), c"data", flags, mode).map_err(|e| Fail::rooted("openat", dst, e))?;
    sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&file), contents)
        .map_err(|e| Fail::rooted("write", dst, e))?;
    clone_tree(tmp.as_fd(), c"data", RESOLVE_IN_ROOT, attrs)
}

/// Unlinks the generated `files` and their staging `dir`.
fn remove_staging<'a>(
    root: BorrowedFd<'_>,
    dirs: &mut Dirs,
    files: &'a [CString],
    dir: &'a CStr,
) -> Result<'a, ()> {
    dirs.fd = None;
    for file in files {
        sys::unlinkat(root, file, 0).map_err(|e| Fail::rooted("unlinkat", file, e))?;
    }
    sys::unlinkat(root, dir, libc::AT_REMOVEDIR).map_err(|e| Fail::rooted("unlinkat(AT_REMOVEDIR)", dir, e))
}

/// A symlink at `dst` to `target`; an identical one already there is fine.
fn symlink<'a>(
    root: BorrowedFd<'_>,
    dirs: &mut Dirs,
    target: &CStr,
    dst: &'a CStr,
    notices: std::os::fd::RawFd,
) -> Result<'a, ()> {
    let mut bufs = ([0u8; PATH_BUF], [0u8; 256]);
    let (dir, name) = parent_of(root, dirs, dst, &mut bufs)?;
    match sys::symlinkat(target, dir, name) {
        Ok(()) => Ok(()),
        // Idempotent, as in bubblewrap: an identical link is fine.
        Err(Errno::EEXIST) if same_link(dir, name, target) => Ok(()),
        Err(Errno::EEXIST) => {
            let mut buf = [0u8; PATH_BUF];
            let found = sys::readlinkat(dir, name, &mut buf).ok().map(|n| &buf[..n]);
            symlink_exists(dst, found, notices)
        }
        Err(e) => Err(not_dir_is_parent(Fail::rooted("symlinkat", dst, e))),
    }
}

/// A directory at `dst`; one already there (or a link to one) is fine.
fn make_dir<'a>(root: BorrowedFd<'_>, dirs: &mut Dirs, dst: &'a CStr, mode: u32) -> Result<'a, ()> {
    let mut parent_buf = [0u8; PATH_BUF];
    let mut name_buf = [0u8; 256];
    let (parent, name) =
        split_last(dst, &mut parent_buf, &mut name_buf).map_err(|e| Fail::rooted("split", dst, e))?;
    // Missing parents as bubblewrap makes them: no access for
    // group or others where the directory itself gives none.
    let parents = crate::prepare::parents_for(mode);
    let own;
    let dir = if parents == dirs.parents || parent.is_empty() {
        dirs.get(root, parent).map_err(|f| Fail::rooted(f.call, dst, f.errno).in_parent())?
    } else {
        own = resolve_mode(root, parent, Some(Kind::Dir), parents, parents)
            .map_err(|f| Fail::rooted(f.call, dst, f.errno).in_parent())?;
        own.as_fd()
    };
    match sys::mkdirat(dir, name, mode) {
        Ok(()) => Ok(()),
        // What is there must be a directory, or a link to one.
        Err(Errno::EEXIST) => {
            let there = resolve(root, dst, None)?;
            fits(&there, dst, Kind::Dir)
        }
        Err(e) => Err(not_dir_is_parent(Fail::rooted("mkdirat", dst, e))),
    }
}

/// Sets `attrs` on the mount whose root is at `dst`.
fn remount<'a>(root: BorrowedFd<'_>, dirs: &mut Dirs, dst: &'a CStr, attrs: u64) -> Result<'a, ()> {
    // bubblewrap makes the missing parents, then finds no
    // destination, or no mount there.
    let target = match resolve(root, dst, None) {
        Err(f) if f.errno == Errno::ENOENT => {
            let mut parent_buf = [0u8; PATH_BUF];
            let mut name_buf = [0u8; 256];
            if let Ok((parent, _)) = split_last(dst, &mut parent_buf, &mut name_buf) {
                dirs.get(root, parent).map_err(|f| Fail::rooted(f.call, dst, f.errno).in_parent())?;
            }
            return Err(f);
        }
        other => other?,
    };
    if !sys::is_mount_root(target.as_fd()).map_err(|e| Fail::rooted("statx", dst, e))? {
        return Err(Fail::rooted("statx(STATX_ATTR_MOUNT_ROOT)", dst, Errno::EINVAL));
    }
    sys::mount_setattr(target.as_fd(), attrs, false).map_err(|e| Fail::rooted("mount_setattr", dst, e))
}

/// Binds the listening `socket` as `name` in the directory `dir`.
fn listen<'a>(
    root: BorrowedFd<'_>,
    socket: std::os::fd::RawFd,
    dir: &'a CStr,
    name: &CStr,
) -> Result<'a, ()> {
    // bind() takes a path: from inside the directory, the bare name.
    let dir_fd = resolve(root, dir, None)?;
    sys::fchdir(dir_fd.as_fd()).map_err(|e| Fail::rooted("fchdir", dir, e))?;
    sys::bind_unix(socket, name).map_err(|e| Fail::rooted("bind", dir, e))?;
    sys::listen(socket).map_err(|e| Fail::rooted("listen", dir, e))
}

/// `/proc` as procfs.rs decided: a fresh procfs with its covers, or the
/// caller's (below `host`) bound recursively and read-only, announced on
/// `notices` when it replaces a refused fresh one.
fn proc<'a>(
    p: &'a procfs::Prepared,
    new: BorrowedFd<'_>,
    host: BorrowedFd<'_>,
    dirs: &mut Dirs,
    notices: std::os::fd::RawFd,
) -> Result<'a, ()> {
    if p.mode == crate::spec::ProcMode::Caller {
        let copy = clone_tree(
            host,
            procfs::OUTER,
            RESOLVE_CANONICAL,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        )?;
        attach(copy.as_fd(), new, dirs, &p.dst, Kind::Dir)?;
        return proc_covers(p, new, dirs);
    }
    if p.tries_fresh() {
        match fresh_proc(p, new, dirs) {
            Ok(()) => return Ok(()),
            Err(f) if p.falls_back(f.call, f.errno) => procfs::announce_fallback(f.errno, notices),
            Err(f) => return Err(f),
        }
    }
    // Recursive: the outer /proc's masks come along (and the kernel would
    // refuse a copy without its locked submounts).
    let copy = clone_tree(host, procfs::OUTER, RESOLVE_CANONICAL, libc::MOUNT_ATTR_RDONLY | procfs::ATTRS)?;
    attach(copy.as_fd(), new, dirs, &p.dst, Kind::Dir)
}

fn fresh_proc<'a>(p: &'a procfs::Prepared, new: BorrowedFd<'_>, dirs: &mut Dirs) -> Result<'a, ()> {
    let fs = sys::fsopen(c"proc").map_err(|e| Fail::new("fsopen", c"proc", e))?;
    sys::fsconfig_set(fs.as_fd(), c"source", Some(c"proc"))
        .map_err(|e| Fail::new("fsconfig", c"source", e))?;
    sys::fsconfig_create(fs.as_fd()).map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"proc", e))?;
    let mnt = sys::fsmount(fs.as_fd(), procfs::ATTRS).map_err(|e| Fail::new("fsmount", c"proc", e))?;
    attach(mnt.as_fd(), new, dirs, &p.dst, Kind::Dir)?;
    proc_covers(p, new, dirs)
}

/// The entries of `/proc` covered read-only (each bound over itself).
fn proc_covers<'a>(p: &'a procfs::Prepared, new: BorrowedFd<'_>, dirs: &mut Dirs) -> Result<'a, ()> {
    for path in &p.covers {
        if p.covers_if_writable {
            match sys::faccessat(new, path, libc::W_OK) {
                Ok(()) => {}
                Err(Errno::EACCES | Errno::ENOENT | Errno::EROFS) => continue,
                Err(e) => return Err(Fail::rooted("access", path, e)),
            }
        }
        let copy = match clone_tree(new, path, RESOLVE_IN_ROOT, libc::MOUNT_ATTR_RDONLY | procfs::ATTRS) {
            Ok(copy) => copy,
            Err(f) if f.errno == Errno::ENOENT && f.call == "openat2" => continue,
            Err(f) => return Err(f),
        };
        let kind = if sys::is_dir(&copy) { Kind::Dir } else { Kind::File };
        attach(copy.as_fd(), new, dirs, path, kind)?;
    }
    Ok(())
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

/// ENOTDIR creating a name in a directory we opened: it is no directory,
/// a parent of the destination.
fn not_dir_is_parent(f: Fail<'_>) -> Fail<'_> {
    if f.errno == Errno::ENOTDIR { f.in_parent() } else { f }
}

/// bubblewrap's words for a symlink whose destination is taken: by
/// another link (`found`, its target), or by something else; PID 1 ends.
fn symlink_exists(dst: &CStr, found: Option<&[u8]>, notices: std::os::fd::RawFd) -> ! {
    let mut report = crate::report::Report::new();
    let at = crate::report::Lossy(dst.to_bytes());
    let _ = match found {
        Some(target) => std::fmt::Write::write_fmt(
            &mut report,
            format_args!(
                "Can't make symlink at /{at}: existing destination is {}",
                crate::report::Lossy(target)
            ),
        ),
        None => std::fmt::Write::write_fmt(
            &mut report,
            format_args!("Can't make symlink at /{at}: destination exists and is not a symlink"),
        ),
    };
    report.send(notices, crate::error::EXIT_SETUP_FAILED);
    sys::exit_now(crate::error::EXIT_SETUP_FAILED as i32)
}

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
    resolve_mode(root, rel, create, 0o755, 0o755)
}

/// [`resolve`], creating missing directories with mode `parents`, the
/// last one (a directory) with `last`.
fn resolve_mode<'a>(
    root: BorrowedFd<'_>,
    rel: &'a CStr,
    create: Option<Kind>,
    parents: u32,
    last_mode: u32,
) -> Result<'a, OwnedFd> {
    let whole = if rel.is_empty() { c"." } else { rel };
    match sys::openat2(root, whole, libc::O_PATH, 0, RESOLVE_IN_ROOT) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) if create.is_some() => {}
        // A component on the way is no directory.
        Err(Errno::ENOTDIR) => return Err(Fail::rooted("openat2", rel, Errno::ENOTDIR).in_parent()),
        Err(e) => return Err(Fail::rooted("openat2", rel, e)),
    }
    let bytes = rel.to_bytes();
    let mut prefix_buf = [0u8; PATH_BUF];
    let mut name_buf = [0u8; 256];
    if bytes.len() >= prefix_buf.len() {
        return Err(Fail::rooted("openat2", rel, Errno::ENAMETOOLONG));
    }
    // Walk forward while components exist (resolved in the root, so links
    // stay inside). From the first missing component on, every directory is
    // one we just created, so the rest are made and opened relative to
    // their parent with O_NOFOLLOW, without re-resolving from the root.
    let mut parent: Option<OwnedFd> = None;
    let mut fresh = false;
    let mut start = 0;
    loop {
        let end = bytes[start..].iter().position(|&b| b == b'/').map_or(bytes.len(), |i| start + i);
        let last = end == bytes.len();
        let component = &bytes[start..end];
        if component.len() >= name_buf.len() {
            return Err(Fail::rooted("openat2", rel, Errno::ENAMETOOLONG));
        }
        name_buf[..component.len()].copy_from_slice(component);
        name_buf[component.len()] = 0;
        let name =
            CStr::from_bytes_until_nul(&name_buf).map_err(|_| Fail::rooted("openat2", rel, Errno::EINVAL))?;

        let existing = if fresh {
            Err(Errno::ENOENT)
        } else {
            prefix_buf[..end].copy_from_slice(&bytes[..end]);
            prefix_buf[end] = 0;
            let prefix = CStr::from_bytes_until_nul(&prefix_buf)
                .map_err(|_| Fail::rooted("openat2", rel, Errno::EINVAL))?;
            sys::openat2(root, prefix, libc::O_PATH, 0, RESOLVE_IN_ROOT)
        };
        let fd = match existing {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                let dir = parent.as_ref().map_or(root, |p| p.as_fd());
                let kind = if last && create == Some(Kind::File) { Kind::File } else { Kind::Dir };
                match self::create_mode(dir, name, kind, if last { last_mode } else { parents }) {
                    Ok(fd) => {
                        fresh = true;
                        fd
                    }
                    // The name exists but did not resolve inside the root: a
                    // symlink whose target is missing there. Never follow it.
                    Err((false, Errno::EEXIST)) if !fresh => {
                        return Err(Fail::rooted("openat2", rel, Errno::ENOENT));
                    }
                    Err((false, e)) if last => return Err(Fail::rooted("create", rel, e)),
                    Err((false, e)) => return Err(Fail::rooted("mkdirat", rel, e).in_parent()),
                    Err((true, e)) => return Err(Fail::rooted("openat", rel, e)),
                }
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

    /// A root with `inside/`, next to it `outside/`, and two absolute links
    /// in the root, which a naive walk would follow onto the host: `in` →
    /// `/inside`, `out` → the host path of `outside`.
    fn linked_root(tag: &str) -> (std::path::PathBuf, OwnedFd) {
        let dir = std::env::temp_dir().join(format!("sandbox-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("root/inside")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::os::unix::fs::symlink("/inside", dir.join("root/in")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("root/out")).unwrap();
        let root_path = std::ffi::CString::new(dir.join("root").to_str().unwrap()).unwrap();
        let root = sys::open(&root_path, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        (dir, root)
    }

    #[test]
    fn resolve_creates_inside_root_and_symlinks_stay_inside() {
        let (dir, root) = linked_root("resolve");

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

    #[test]
    fn targets_through_the_open_parent_match_the_full_walk() {
        let (dir, root) = linked_root("target");
        let mut dirs = Dirs::new();

        // Siblings in a new directory: created there, the parent kept open.
        for name in [c"dev/null", c"dev/zero"] {
            assert!(target(root.as_fd(), &mut dirs, name, Kind::File).is_ok());
        }
        assert!(dir.join("root/dev/null").is_file() && dir.join("root/dev/zero").is_file());
        assert_eq!(&dirs.path[..dirs.len], b"dev");
        assert!(target(root.as_fd(), &mut dirs, c"dev/pts", Kind::Dir).is_ok());
        assert!(dir.join("root/dev/pts").is_dir());

        // A symlink as the last component takes the full walk, which
        // resolves it inside the root: /inside, not the host's path.
        assert!(target(root.as_fd(), &mut dirs, c"in", Kind::Dir).is_ok());
        assert!(target(root.as_fd(), &mut dirs, c"out", Kind::Dir).is_err());
        assert!(std::fs::read_dir(dir.join("outside")).unwrap().next().is_none());

        // A mount on the open directory or above it makes it stale.
        assert!(dirs.get(root.as_fd(), c"dev").is_ok());
        dirs.mounted_on(c"dev/null");
        assert!(dirs.fd.is_some(), "a mount below the open directory keeps it");
        dirs.mounted_on(c"de");
        assert!(dirs.fd.is_some(), "only whole components count");
        dirs.mounted_on(c"dev");
        assert!(dirs.fd.is_none());
        assert!(dirs.get(root.as_fd(), c"dev").is_ok());
        dirs.mounted_on(c"");
        assert!(dirs.fd.is_none(), "a mount on the root covers everything");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
