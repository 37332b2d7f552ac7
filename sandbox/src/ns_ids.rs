//! The namespace ids of bubblewrap's status lines (`--info-fd`,
//! `--json-status-fd`): which namespaces they name, read from a
//! `/proc/PID/ns`, and the few bytes in which a nested sandbox's PID 1
//! sends its own to the launcher (docs/bwrap.md, "Differences from
//! bubblewrap (nested)").

use std::ffi::CStr;
use std::os::fd::RawFd;

use crate::sys;

/// The namespaces bubblewrap's status lines name, in its order. It names
/// the user namespace never (made after it reports), the mount namespace
/// always, the others when the sandbox has a new one.
pub(crate) const STATUS_NAMESPACES: [(&str, libc::c_int); 6] = [
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("ipc", libc::CLONE_NEWIPC),
    ("mnt", libc::CLONE_NEWNS),
    ("net", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("uts", libc::CLONE_NEWUTS),
];

/// The ids (inode numbers) of [`STATUS_NAMESPACES`], in its order; 0 for
/// one not reported or not readable, which bubblewrap leaves out too.
pub(crate) type NamespaceIds = [u64; STATUS_NAMESPACES.len()];

/// The ids of the namespaces in `ns_dir` (a `/proc/PID/ns`) that a
/// sandbox made with `flags` reports. Allocates nothing: the nested PID 1
/// calls it about itself (`/proc/self/ns`) during setup, because no other
/// process may read its links (docs/bwrap.md).
pub(crate) fn namespace_ids(ns_dir: &CStr, flags: libc::c_ulong) -> NamespaceIds {
    let mut ids = [0; STATUS_NAMESPACES.len()];
    let Ok(dir) = sys::open(ns_dir, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0) else {
        return ids;
    };
    for (id, (name, flag)) in ids.iter_mut().zip(STATUS_NAMESPACES) {
        if flag != libc::CLONE_NEWNS && flags & flag as libc::c_ulong == 0 {
            continue;
        }
        if let Ok(st) = nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::empty()) {
            *id = st.st_ino;
        }
    }
    ids
}

/// The ids a sandbox's PID 1 sent about itself ([`namespace_ids`]); all 0
/// if it sent none.
pub(crate) fn read_namespace_ids(fd: RawFd) -> NamespaceIds {
    let mut bytes = [0u8; size_of::<NamespaceIds>()];
    let mut got = 0;
    while got < bytes.len() {
        match sys::read(fd, &mut bytes[got..]) {
            Ok(0) | Err(_) => return [0; STATUS_NAMESPACES.len()],
            Ok(n) => got += n,
        }
    }
    let mut ids = [0; STATUS_NAMESPACES.len()];
    for (id, chunk) in ids.iter_mut().zip(bytes.chunks_exact(size_of::<u64>())) {
        *id = u64::from_ne_bytes(chunk.try_into().expect("chunks of 8 bytes"));
    }
    ids
}

/// What the child sends for [`read_namespace_ids`].
pub(crate) fn namespace_ids_bytes(ids: &NamespaceIds) -> [u8; size_of::<NamespaceIds>()] {
    let mut bytes = [0u8; size_of::<NamespaceIds>()];
    for (chunk, id) in bytes.chunks_exact_mut(size_of::<u64>()).zip(ids) {
        chunk.copy_from_slice(&id.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn ids_survive_the_trip_and_a_short_message_is_none() {
        let ids: NamespaceIds = [1, 0, 4_026_531_841, u64::MAX, 7, 0];
        let (r, w) = sys::pipe().unwrap();
        sys::write_all(w.as_raw_fd(), &namespace_ids_bytes(&ids)).unwrap();
        assert_eq!(read_namespace_ids(r.as_raw_fd()), ids);
        sys::write_all(w.as_raw_fd(), &[1, 2, 3]).unwrap();
        drop(w);
        assert_eq!(read_namespace_ids(r.as_raw_fd()), [0; STATUS_NAMESPACES.len()]);
    }

    #[test]
    fn the_mount_namespace_always_the_others_when_new() {
        let ids = namespace_ids(c"/proc/self/ns", 0);
        let named: Vec<_> = STATUS_NAMESPACES
            .iter()
            .zip(ids)
            .filter(|(_, id)| *id != 0)
            .map(|((name, _), _)| *name)
            .collect();
        assert_eq!(named, ["mnt"]);
        let all = namespace_ids(
            c"/proc/self/ns",
            libc::CLONE_NEWPID as libc::c_ulong | libc::CLONE_NEWUTS as libc::c_ulong,
        );
        assert_ne!(all[4], 0);
        assert_ne!(all[5], 0);
        assert_eq!(namespace_ids(c"/nonexistent", !0), [0; STATUS_NAMESPACES.len()]);
    }
}
