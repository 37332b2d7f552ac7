//! Hardening: Landlock, capabilities, seccomp, rlimits.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;

use libc::{c_int, c_uint, c_void};

use super::{SysResult, check, check_long, owned};

/// `struct landlock_ruleset_attr` (ABI 6 layout; shorter sizes are passed
/// for older ABIs).
#[repr(C)]
pub struct LandlockRulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

/// `struct landlock_path_beneath_attr`, which the kernel declares packed.
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;

const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;

/// The kernel's Landlock ABI version.
pub fn landlock_abi_version() -> SysResult<i32> {
    // SAFETY: a null attr with size 0 and the VERSION flag only queries.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            ptr::null::<c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })
    .map(|v| v as i32)
}

pub fn landlock_create_ruleset(attr: &LandlockRulesetAttr, size: usize) -> SysResult<OwnedFd> {
    debug_assert!(size <= std::mem::size_of::<LandlockRulesetAttr>());
    // SAFETY: `attr` is valid for at least `size` bytes.
    owned(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const LandlockRulesetAttr,
            size,
            0 as c_uint,
        )
    })
}

pub fn landlock_add_path_rule(ruleset: &OwnedFd, parent: &OwnedFd, access: u64) -> SysResult<()> {
    let attr = LandlockPathBeneathAttr { allowed_access: access, parent_fd: parent.as_raw_fd() };
    // SAFETY: valid descriptors and a valid, packed attr struct.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0 as c_uint,
        )
    })
    .map(drop)
}

pub fn landlock_restrict_self(ruleset: &OwnedFd) -> SysResult<()> {
    // SAFETY: valid descriptor, no flags.
    check_long(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0 as c_uint) })
        .map(drop)
}

/// Sets the effective, permitted and inheritable capability sets to `caps`
/// (a bit mask of capability numbers).
pub fn capset_to(caps: u64) -> SysResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let (low, high) = (caps as u32, (caps >> 32) as u32);
    let data = [
        Data { effective: low, permitted: low, inheritable: low },
        Data { effective: high, permitted: high, inheritable: high },
    ];
    // SAFETY: a v3 header and two data structs, as capset(2) requires.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) }).map(drop)
}

/// Installs a seccomp filter (no_new_privs must be set).
/// As [`seccomp_set_filter`], through `prctl(PR_SET_SECCOMP)`, as
/// bubblewrap installs its callers' programs (a program installed before
/// may allow `prctl` and not `seccomp`).
pub fn seccomp_prctl_filter(filter: &[libc::sock_filter]) -> SysResult<()> {
    let prog =
        libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `filter`, which outlives the call; the kernel copies it.
    check(unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog)
    })
    .map(drop)
}

pub fn seccomp_set_filter(filter: &[libc::sock_filter]) -> SysResult<()> {
    let prog =
        libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `filter`, which outlives the call; the kernel copies it.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as c_uint,
            &prog as *const libc::sock_fprog,
        )
    })
    .map(drop)
}

pub fn setrlimit(resource: c_int, value: u64) -> SysResult<()> {
    let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: `lim` is a valid rlimit.
    check(unsafe { libc::setrlimit(resource as _, &lim) }).map(drop)
}
