//! The portal's tmpfs pool: one tmpfs of the sandbox's `--tmpfs-size`
//! holding everything the sandbox's nested sandboxes keep in memory (their
//! roots, their `--tmpfs` and `--dev`, `--bind-data` files, the upper
//! layers of `--tmp-overlay`), so that all of them together stay within
//! one budget however many there are (docs/security.md).
//!
//! The server makes it in a mount namespace of its own, a copy of the
//! sandbox's (the agent never sees it), where it replaces the portal's own
//! mount at [`PORTAL_DIR`]: the workers' view of the sandbox then holds no
//! portal socket at all. There a small unbindable tmpfs (the fence) holds
//! the pool at [`POOL`]: no recursive bind of a nested request carries
//! them (a recursive clone skips an unbindable mount with all below it),
//! a source on either is refused, and the pool itself may be cloned from
//! (its directories are the nested sandboxes' tmpfs) and be an overlay's
//! upper layer. Each worker gets a directory of its own in it, which the
//! nested PID 1 takes its directories from (mounts.rs `Pool`), removed
//! when the nested sandbox has ended (or, for a worker that was killed, by
//! the acceptor that reaps it). A `--tmpfs` with bubblewrap's `--size` is
//! a tmpfs of its own: the worker reserves its size by shrinking the pool
//! while it exists.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::PathBuf;

use super::PORTAL_DIR;
use crate::sys;

/// Where the pool is mounted, below the fence at [`PORTAL_DIR`].
pub(crate) const POOL: &str = "/run/tuixiu/pool";

/// Serializes reservations: the pool's size is read, changed and written.
const LOCK: &str = ".lock";

/// Makes the pool: in a private copy of the sandbox's mount namespace
/// (which this process has entered), the portal's mount detached and the
/// fence in its place, unbindable, with a tmpfs of `size` bytes below it.
/// Needs the capabilities the sandbox's user namespace gives.
pub(crate) fn make(size: u64) -> Result<(), String> {
    let portal = CString::new(PORTAL_DIR).map_err(|e| e.to_string())?;
    sys::unshare(libc::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS) => {e}"))?;
    // Nothing mounted here reaches the sandbox's namespace.
    sys::mount(None, c"/", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(|e| format!("mount(\"/\", MS_SLAVE|MS_REC) => {e}"))?;
    sys::umount2(&portal, libc::MNT_DETACH).map_err(|e| format!("umount2({PORTAL_DIR:?}) => {e}"))?;
    attach_tmpfs(
        PORTAL_DIR,
        &[("source", "tuixiu-fence".into()), ("mode", "755".into()), ("size", "4k".into())],
    )?;
    std::fs::create_dir(POOL).map_err(|e| format!("mkdir({POOL:?}) => {e}"))?;
    let (size, inodes) = crate::limits::tmpfs_sized(size);
    attach_tmpfs(
        POOL,
        &[
            ("source", "tuixiu-pool".into()),
            ("mode", "700".into()),
            ("size", size.to_string()),
            ("nr_inodes", inodes.to_string()),
        ],
    )?;
    sys::mount(None, &portal, None, libc::MS_UNBINDABLE, None)
        .map_err(|e| format!("mount({PORTAL_DIR:?}, MS_UNBINDABLE) => {e}"))?;
    // The fence holds nothing else: read-only.
    sys::mount(None, &portal, None, libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY, None)
        .map_err(|e| format!("mount({PORTAL_DIR:?}, MS_RDONLY) => {e}"))?;
    Ok(())
}

/// A tmpfs with `options`, `nosuid` and `nodev`, attached at `at`.
fn attach_tmpfs(at: &str, options: &[(&str, String)]) -> Result<(), String> {
    let fs = sys::fsopen(c"tmpfs").map_err(|e| format!("fsopen(\"tmpfs\") => {e}"))?;
    for (key, value) in options {
        let (k, v) = (CString::new(*key).expect("no NUL"), CString::new(value.as_str()).expect("no NUL"));
        sys::fsconfig_set(fs.as_fd(), &k, Some(&v)).map_err(|e| format!("fsconfig({key}) => {e}"))?;
    }
    sys::fsconfig_create(fs.as_fd()).map_err(|e| format!("fsconfig(FSCONFIG_CMD_CREATE) => {e}"))?;
    let attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    let mnt = sys::fsmount(fs.as_fd(), attrs).map_err(|e| format!("fsmount(tmpfs) => {e}"))?;
    let path = CString::new(at).map_err(|e| e.to_string())?;
    let target = sys::open(&path, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
        .map_err(|e| format!("open({at:?}) => {e}"))?;
    sys::move_mount_fd(mnt.as_fd(), target.as_fd()).map_err(|e| format!("move_mount({at:?}) => {e}"))
}

/// The devices of the fence and of the pool: a source on either is refused.
pub(crate) fn devs() -> [u64; 2] {
    let dev = |p| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).unwrap_or(0);
    [dev(PORTAL_DIR), dev(POOL)]
}

/// A worker's directory in the pool (and its reservation), removed with
/// everything in it when dropped.
pub(crate) struct WorkerDir {
    path: PathBuf,
    reserved: u64,
}

impl WorkerDir {
    /// The directory of the worker `pid`.
    fn path_of(pid: libc::pid_t) -> PathBuf {
        PathBuf::from(format!("{POOL}/{pid}"))
    }

    /// Makes this worker's directory.
    pub(crate) fn make() -> Result<WorkerDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let path = Self::path_of(nix::unistd::getpid().as_raw());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("mkdir({:?}) => {e}", path.display()))?;
        Ok(WorkerDir { path, reserved: 0 })
    }

    /// The directory, as the nested PID 1 finds it.
    pub(crate) fn path(&self) -> String {
        self.path.display().to_string()
    }

    /// Takes `bytes` out of the pool for tmpfs of their own: the pool
    /// shrinks by them until this is dropped. Fails, saying so, when the
    /// pool has not that much room left.
    pub(crate) fn reserve(&mut self, bytes: u64) -> Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        let _lock = lock()?;
        let (size, used) = usage()?;
        let want = size.checked_sub(bytes).filter(|&left| left >= used).ok_or_else(|| {
            format!(
                "no room for tmpfs of {bytes} bytes (--size): the nested sandboxes' budget (--tmpfs-size) \
                 has {} of {size} bytes left",
                size.saturating_sub(used)
            )
        })?;
        let taken = size - resize(want)?;
        // Recorded once the pool is smaller: a record without it would
        // give back what was never taken.
        self.reserved = taken;
        let record = self.path.with_extension("reserved");
        let _ = std::fs::write(record, taken.to_string());
        Ok(())
    }
}

impl Drop for WorkerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if self.reserved != 0 {
            release(&self.path.with_extension("reserved"));
        }
    }
}

/// What a worker `pid` that did not clean up left: its directory and its
/// reservation (the acceptor calls this when it reaps one).
pub(crate) fn clean_after(pid: libc::pid_t) {
    let path = WorkerDir::path_of(pid);
    let _ = std::fs::remove_dir_all(&path);
    release(&path.with_extension("reserved"));
}

/// Gives back the reservation recorded in `record`, if there is one.
fn release(record: &std::path::Path) {
    let Ok(text) = std::fs::read_to_string(record) else { return };
    let Ok(bytes) = text.trim().parse::<u64>() else { return };
    let Ok(_lock) = lock() else { return };
    if let Ok((size, _)) = usage()
        && resize(size.saturating_add(bytes)).is_ok()
    {
        let _ = std::fs::remove_file(record);
    }
}

/// The pool's lock, held until dropped.
fn lock() -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    let path = format!("{POOL}/{LOCK}");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("open({path:?}) => {e}"))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("flock({path:?}) => {e}"))
}

/// The pool's size and the bytes in use, from `statvfs`.
fn usage() -> Result<(u64, u64), String> {
    let st = nix::sys::statvfs::statvfs(POOL).map_err(|e| format!("statvfs({POOL:?}) => {e}"))?;
    let block = st.fragment_size();
    Ok((st.blocks() * block, (st.blocks() - st.blocks_free()) * block))
}

/// Sets the pool's size (and its inodes, one per 4 KiB as every tmpfs;
/// at least a page: a tmpfs of size 0 would have no limit); returns the
/// size set.
fn resize(size: u64) -> Result<u64, String> {
    let pool = CString::new(POOL).map_err(|e| e.to_string())?;
    let fs = sys::fspick(&pool).map_err(|e| format!("fspick({POOL:?}) => {e}"))?;
    let (size, inodes) = crate::limits::tmpfs_sized(size);
    for (key, value) in [("size", size), ("nr_inodes", inodes)] {
        let (k, v) = (CString::new(key).expect("no NUL"), CString::new(value.to_string()).expect("digits"));
        sys::fsconfig_set(fs.as_fd(), &k, Some(&v)).map_err(|e| format!("fsconfig({key}={value}) => {e}"))?;
    }
    sys::fsconfig_reconfigure(fs.as_fd())
        .map_err(|e| format!("fsconfig(FSCONFIG_CMD_RECONFIGURE) => {e}"))?;
    Ok(size)
}
