//! Sockets: the loopback interface, unix sockets (the nested-sandbox portal).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_long};
use nix::errno::Errno;

use super::{SysResult, check, owned};

/// Brings the loopback interface up in the current network namespace. The
/// kernel adds 127.0.0.1/8 and ::1 itself when `lo` goes up.
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: plain socket creation.
    let sock =
        owned(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) } as c_long)?;
    // SAFETY: ifreq is a plain C struct for which all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo".
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: SIOCGIFFLAGS filled in the union's flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: as above, with the flags to set.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) }).map(drop)
}

/// A `sockaddr_un` for `path` and its length, or ENAMETOOLONG.
fn unix_addr(path: &CStr) -> SysResult<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.to_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A new unix stream socket (close-on-exec, non-blocking).
pub fn unix_stream_socket() -> SysResult<OwnedFd> {
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: plain socket creation.
    owned(unsafe { libc::socket(libc::AF_UNIX, kind, 0) } as c_long)
}

/// `bind` a unix socket to `path` (a relative one from the working directory).
pub fn bind_unix(fd: RawFd, path: &CStr) -> SysResult<()> {
    let (addr, len) = unix_addr(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    check(unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
}

pub fn listen(fd: RawFd) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::listen(fd, 64) }).map(drop)
}

/// `connect` a new (blocking, close-on-exec) unix stream socket to `path`.
pub fn connect_unix(path: &CStr) -> SysResult<OwnedFd> {
    let (addr, len) = unix_addr(path)?;
    // SAFETY: plain socket creation.
    let fd =
        owned(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) } as c_long)?;
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        match check(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })
        {
            Ok(_) => return Ok(fd),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `accept4` a connection (close-on-exec, blocking).
pub fn accept(fd: RawFd) -> SysResult<OwnedFd> {
    // SAFETY: null address pointers are allowed; the flags are valid.
    owned(unsafe { libc::accept4(fd, ptr::null_mut(), ptr::null_mut(), libc::SOCK_CLOEXEC) } as c_long)
}
