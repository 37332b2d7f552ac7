//! The egress listener of a sandbox with [`Network::Proxied`]: a TCP socket
//! on `127.0.0.1:PORT` inside the sandbox's own network namespace, made by
//! PID 1 once loopback is up and handed out on a unix socket the launcher's
//! caller gave ([`crate::LaunchOptions::egress_fd`]). Whoever receives it
//! serves the egress proxy from outside the sandbox: no process of ours
//! runs inside for it, and the namespace has no other way out.
//!
//! [`Network::Proxied`]: crate::Network::Proxied

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

/// The listener's port on the sandbox's loopback (squid's, the usual port
/// of an HTTP proxy). The namespace is the sandbox's own, so every sandbox
/// can use the same one.
pub const PORT: u16 = 3128;

/// The proxy's URL as the sandbox's programs are told it.
pub const HTTP_URL: &str = "http://127.0.0.1:3128";
/// The same listener as a SOCKS5 proxy that resolves names itself (`h`):
/// there is no DNS inside.
pub const SOCKS_URL: &str = "socks5h://127.0.0.1:3128";
/// Destinations programs should reach directly: the sandbox's own loopback.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The variables that point programs at the proxy: both spellings, as
/// curl, git, Python, Node (`NODE_USE_ENV_PROXY`, Node 22.21 and 24 on),
/// Rust's reqwest, npm and pip read them.
pub fn proxy_env() -> Vec<(String, String)> {
    let mut env = Vec::with_capacity(9);
    for (key, value) in [("HTTP_PROXY", HTTP_URL), ("HTTPS_PROXY", HTTP_URL), ("ALL_PROXY", SOCKS_URL)] {
        env.push((key.to_string(), value.to_string()));
        env.push((key.to_ascii_lowercase(), value.to_string()));
    }
    env.push(("NO_PROXY".into(), NO_PROXY.into()));
    env.push(("no_proxy".into(), NO_PROXY.into()));
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    env
}

/// Waits for the listener on `sock` (the end of the caller's unix socket
/// that is not the launcher's). `None` when the sandbox ended before it made
/// one (its launcher's report says why).
pub fn receive_listener(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!(std::os::fd::RawFd);
    loop {
        let mut iov = [io::IoSliceMut::new(&mut byte)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut listener = None;
                for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(fds) = cmsg {
                        for fd in fds {
                            // SAFETY: the kernel installed this descriptor
                            // in our table for this message; nothing else
                            // refers to it.
                            let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                            listener.get_or_insert(owned);
                        }
                    }
                }
                if msg.bytes == 0 {
                    return Ok(None);
                }
                return match listener {
                    Some(fd) => Ok(Some(fd)),
                    None => Err(io::Error::other("the sandbox sent no listener with its message")),
                };
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// PID 1's step: listen on [`PORT`] and send the socket out on `to`; PID 1
/// keeps no copy. Allocation-free.
pub(crate) fn hand_out(to: std::os::fd::RawFd) -> Result<(), (&'static str, nix::errno::Errno)> {
    let listener = crate::sys::tcp_listen_loopback(PORT).map_err(|e| ("bind(127.0.0.1:3128)", e))?;
    crate::sys::send_fd(to, listener.as_raw_fd()).map_err(|e| ("sendmsg(SCM_RIGHTS)", e))
}
