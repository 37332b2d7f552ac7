//! The portal's protocol, over a unix stream socket.
//!
//! ```text
//! front end → launcher   "TXB1" [length: u32 LE] (+ SCM_RIGHTS: the caller's descriptors)
//!                        then `length` bytes: the Request as JSON
//! launcher → front end   one Reply as JSON per line, until end-of-file
//! ```
//!
//! The connection lives as long as the nested sandbox: when the front end
//! goes away, the launcher kills the sandbox.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

/// Largest request body.
pub const MAX_REQUEST: usize = 4 << 20;
/// Most descriptors one request may pass (the kernel's SCM_MAX_FD).
pub const MAX_FDS: usize = 253;

const MAGIC: &[u8; 4] = b"TXB1";
const HEADER: usize = 8;

/// What the launcher tells the front end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reply {
    /// The request failed before COMMAND ran: print `bwrap: TEXT`, exit 1.
    Error(String),
    /// COMMAND ended with this status (its code, or 128+signal).
    Exit(i32),
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("reading the request: {0}")]
    Io(#[from] io::Error),
    #[error("the request does not start with the protocol's header")]
    Header,
    #[error("the request is larger than {MAX_REQUEST} bytes")]
    TooLarge,
    #[error("more than {MAX_FDS} descriptors were passed")]
    TooManyFds,
}

/// Connects to the portal of the sandbox this process runs in.
pub fn connect() -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(super::SOCKET).expect("no NUL in the socket path");
    crate::sys::connect_unix(&path).map_err(io::Error::from)
}

/// Sends the request: the header with `fds` attached, then `body`.
pub fn send_request(sock: BorrowedFd<'_>, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if body.len() > MAX_REQUEST {
        return Err(io::Error::other(format!("the request is larger than {MAX_REQUEST} bytes")));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!("more than {MAX_FDS} open descriptors to pass")));
    }
    let mut header = [0u8; HEADER];
    header[..4].copy_from_slice(MAGIC);
    header[4..].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let iov = [io::IoSlice::new(&header)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent < HEADER {
        // A unix stream socket takes a whole small message or none.
        write_all(sock, &header[sent..])?;
    }
    write_all(sock, body)
}

/// Receives a request: its body and the descriptors that came with it.
pub fn recv_request(sock: BorrowedFd<'_>) -> Result<(Vec<u8>, Vec<OwnedFd>), WireError> {
    let mut header = [0u8; HEADER];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (got, fds, truncated) = loop {
        let mut iov = [io::IoSliceMut::new(&mut header)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        // SAFETY: the kernel just installed these descriptors for us.
                        fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                break (msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    if truncated {
        return Err(WireError::TooManyFds);
    }
    let mut file = SockRead(sock);
    if got < HEADER {
        file.read_exact(&mut header[got..]).map_err(|_| WireError::Header)?;
    }
    if &header[..4] != MAGIC {
        return Err(WireError::Header);
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if len > MAX_REQUEST {
        return Err(WireError::TooLarge);
    }
    let mut body = vec![0u8; len];
    file.read_exact(&mut body)?;
    Ok((body, fds))
}

/// Sends one reply line; a front end that is gone is not an error here.
pub fn send_reply(sock: BorrowedFd<'_>, reply: &Reply) {
    let mut line = serde_json::to_vec(reply).unwrap_or_default();
    line.push(b'\n');
    let _ = write_all(sock, &line);
}

/// Reads reply lines until end-of-file; returns the first final one
/// (`None` if the connection ended without one). A launcher that refused
/// the request at once may reset the connection after its reply: what
/// arrived before counts.
pub fn read_reply(sock: BorrowedFd<'_>) -> io::Result<Option<Reply>> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = loop {
        match SockRead(sock).read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => break Err(e),
        }
    };
    match bytes.split(|&b| b == b'\n').find_map(|line| serde_json::from_slice::<Reply>(line).ok()) {
        Some(reply) => Ok(Some(reply)),
        None => ended.map(|()| None),
    }
}

fn write_all(sock: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match nix::sys::socket::send(sock.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

struct SockRead<'a>(BorrowedFd<'a>);

impl Read for SockRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match nix::unistd::read(self.0, buf) {
                Ok(n) => return Ok(n),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).unwrap()
    }

    #[test]
    fn request_and_descriptors_round_trip() {
        let (a, b) = pair();
        let file = std::fs::File::open("/dev/null").unwrap();
        send_request(a.as_fd(), b"{\"x\":1}", &[file.as_raw_fd(), 0]).unwrap();
        let (body, fds) = recv_request(b.as_fd()).unwrap();
        assert_eq!(body, b"{\"x\":1}");
        assert_eq!(fds.len(), 2);
        send_reply(b.as_fd(), &Reply::Error("no".into()));
        send_reply(b.as_fd(), &Reply::Exit(3));
        drop(b);
        assert_eq!(read_reply(a.as_fd()).unwrap(), Some(Reply::Error("no".into())));
    }

    #[test]
    fn bad_headers_and_sizes_are_refused() {
        let (a, b) = pair();
        write_all(a.as_fd(), b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(recv_request(b.as_fd()), Err(WireError::Header)));
        let (a, b) = pair();
        let mut header = *b"TXB1\0\0\0\0";
        header[4..].copy_from_slice(&(MAX_REQUEST as u32 + 1).to_le_bytes());
        write_all(a.as_fd(), &header).unwrap();
        assert!(matches!(recv_request(b.as_fd()), Err(WireError::TooLarge)));
    }
}
