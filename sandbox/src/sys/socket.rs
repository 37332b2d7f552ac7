//! Sockets: the loopback interface, unix sockets (the nested-sandbox portal).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_long};
use nix::errno::Errno;

use super::{SysResult, check, check_long, owned};

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

/// A TCP socket listening on `127.0.0.1:port` of the current network
/// namespace (close-on-exec, non-blocking; neither `SO_REUSEADDR` nor
/// `SO_REUSEPORT`, so nobody else in the namespace can bind the port while
/// it is open).
pub fn tcp_listen_loopback(port: u16) -> SysResult<OwnedFd> {
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: plain socket creation.
    let fd = owned(unsafe { libc::socket(libc::AF_INET, kind, 0) } as c_long)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_in of `len` bytes.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), len) })?;
    // SAFETY: integer arguments only.
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Sends one byte with `fd` attached (`SCM_RIGHTS`) on the unix socket
/// `sock`, without allocating (the child uses it between `clone` and
/// `execve`).
pub fn send_fd(sock: RawFd, fd: RawFd) -> SysResult<()> {
    // Room for one cmsghdr and one descriptor, aligned for cmsghdr.
    #[repr(C)]
    struct Control {
        header: libc::cmsghdr,
        fd: RawFd,
        _pad: u32,
    }
    let mut byte = [b'L'];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: plain data for which all-zero is valid.
    let mut control: Control = unsafe { std::mem::zeroed() };
    // SAFETY: CMSG_LEN computes a length from an integer.
    control.header.cmsg_len = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as _;
    control.header.cmsg_level = libc::SOL_SOCKET;
    control.header.cmsg_type = libc::SCM_RIGHTS;
    control.fd = fd;
    // SAFETY: plain data for which all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&mut control as *mut Control).cast();
    // SAFETY: CMSG_SPACE computes a length from an integer.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as _;
    loop {
        // SAFETY: `msg` points at `iov`, `byte` and `control`, all alive
        // for the call, with the lengths given.
        match check_long(unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } as c_long) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}
