//! SELinux labels for bubblewrap's `--exec-label` and `--file-label`,
//! without libselinux: what bubblewrap (built with SELinux, as Debian's and
//! Fedora's are) does through it comes down to files of selinuxfs and of
//! `/proc/thread-self/attr`, and a mount option.
//!
//! * enabled: selinuxfs mounted read-write (at `/sys/fs/selinux`, `/selinux`
//!   or wherever `/proc/mounts` says) and `/etc/selinux/config` present, as
//!   libselinux's `is_selinux_enabled`;
//! * a label is checked by writing it to selinuxfs's `context` file
//!   (`security_check_context`);
//! * `--file-label`: `/proc/thread-self/attr/fscreate` (`setfscreatecon`),
//!   inherited by the sandbox's PID 1 across `clone`, and `context=LABEL`
//!   on the tmpfs mounts made for the sandbox. Given to `fsconfig` the value
//!   is the bare label: only `mount(2)`'s option string needs bubblewrap's
//!   quotes (`context="..."`), which the kernel strips there;
//! * `--exec-label`: `/proc/thread-self/attr/exec` (`setexeccon`), written
//!   by PID 1 before it starts COMMAND, which inherits it and is executed
//!   in that context.
//!
//! Labels are taken raw: libselinux would first translate an MLS label
//! through mcstransd where that runs.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// selinuxfs's `f_type`.
const SELINUX_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0xf97c_ff8c);

/// Where selinuxfs is mounted read-write, if it is, and SELinux is
/// configured: libselinux's `is_selinux_enabled`.
pub fn enabled() -> Option<PathBuf> {
    if !Path::new("/etc/selinux/config").exists() {
        return None;
    }
    mount_point()
}

fn mount_point() -> Option<PathBuf> {
    for dir in ["/sys/fs/selinux", "/selinux"] {
        if let Some(found) = selinuxfs(Path::new(dir)) {
            return found.then(|| PathBuf::from(dir));
        }
    }
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let dir = mounts_entry(&mounts)?;
    selinuxfs(Path::new(&dir)).filter(|&rw| rw).map(|_| PathBuf::from(dir))
}

/// `Some(writable)` where `dir` is a selinuxfs, `None` otherwise.
fn selinuxfs(dir: &Path) -> Option<bool> {
    let fs = nix::sys::statfs::statfs(dir).ok()?;
    if fs.filesystem_type() != SELINUX_MAGIC {
        return None;
    }
    let vfs = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(!vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// The mount point of the first selinuxfs in `/proc/mounts`' text.
fn mounts_entry(mounts: &str) -> Option<String> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, dir, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "selinuxfs").then(|| dir.to_string())
    })
}

/// `security_check_context`: the kernel refuses a label it does not know.
pub fn check_context(selinuxfs: &Path, label: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(selinuxfs.join("context"))?;
    file.write_all(&attr_bytes(label)?)
}

/// `setfscreatecon`: files this thread creates get `label`.
pub fn set_fscreate(label: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open("/proc/thread-self/attr/fscreate")?;
    file.write_all(&attr_bytes(label)?)
}

/// What libselinux writes to an attribute file: the label and its NUL.
pub(crate) fn attr_bytes(label: &str) -> std::io::Result<Vec<u8>> {
    let label = CString::new(label).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(label.into_bytes_with_nul())
}

/// The `fsconfig` option that labels a tmpfs: `context` = the bare label.
pub(crate) fn mount_option(label: &CString) -> (CString, Option<CString>) {
    (c"context".to_owned(), Some(label.clone()))
}

/// This thread's `exec` attribute, opened while `/proc` is the caller's
/// (the sandbox may have none): written later by the same thread, which
/// the kernel allows only to the thread that opened it.
pub(crate) fn open_exec_attr() -> nix::Result<OwnedFd> {
    crate::sys::open(c"/proc/thread-self/attr/exec", libc::O_WRONLY | libc::O_CLOEXEC, 0)
}

/// `setexeccon` through the descriptor of [`open_exec_attr`]; `label`
/// holds the NUL libselinux writes too ([`attr_bytes`]).
pub(crate) fn set_exec(attr: &OwnedFd, label: &[u8]) -> nix::Result<()> {
    crate::sys::write_all(attr.as_raw_fd(), label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_names_selinuxfs() {
        let mounts = "proc /proc proc rw 0 0\nselinuxfs /sys/fs/selinux selinuxfs rw,relatime 0 0\n";
        assert_eq!(mounts_entry(mounts).as_deref(), Some("/sys/fs/selinux"));
        assert_eq!(mounts_entry("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn labels_are_written_with_their_nul_and_refused_with_one_inside() {
        assert_eq!(
            attr_bytes("system_u:object_r:tmp_t:s0:c1,c2").unwrap(),
            b"system_u:object_r:tmp_t:s0:c1,c2\0"
        );
        assert_eq!(attr_bytes("a\0b").unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn the_mount_option_is_the_bare_label() {
        // fsconfig takes the value as is: no quotes, commas of MLS
        // categories included (mount(2)'s string would need the quotes).
        let label = CString::new("system_u:object_r:container_file_t:s0:c1,c2").unwrap();
        let (key, value) = mount_option(&label);
        assert_eq!(key.as_c_str(), c"context");
        assert_eq!(value.unwrap(), label);
    }

    #[test]
    fn this_host_has_no_selinux_and_no_selinuxfs_is_taken_for_one() {
        // The machines this runs on (Debian, no SELinux): the disabled path.
        if Path::new("/sys/fs/selinux/enforce").exists() {
            return;
        }
        assert_eq!(enabled(), None);
        assert_eq!(selinuxfs(Path::new("/proc")), None);
    }

    #[test]
    fn the_exec_attribute_opens_and_refuses_a_label_without_selinux() {
        // The attribute file exists with any LSM stack; without SELinux
        // the kernel refuses the write (EINVAL), which is the error PID 1
        // would report.
        let Ok(attr) = open_exec_attr() else { return };
        if enabled().is_none() {
            assert!(set_exec(&attr, &attr_bytes("system_u:system_r:bogus_t:s0").unwrap()).is_err());
        }
    }
}
