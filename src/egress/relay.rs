//! Relaying a connection's bytes both ways without copying them through
//! the proxy: `splice(2)` from one socket into a pipe and from the pipe
//! into the other socket, driven by tokio's readiness. The proxy then
//! costs two system calls per 64 KiB and no user-space buffer, which keeps
//! a download through it close to a direct one and an open connection at a
//! few hundred bytes of the proxy's own memory (the pipes' pages are the
//! kernel's, and only while data is in flight).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most one `splice` moves, and each pipe's capacity: fewer, larger
/// moves than a pipe's default 64 KiB (pages are only taken while data is
/// in flight).
const CHUNK: usize = 1024 * 1024;

/// Where a direction's bytes are counted, and the connection's last
/// activity (milliseconds since `start`).
pub struct Meter<'a> {
    pub bytes: &'a AtomicU64,
    pub changed: &'a std::sync::atomic::AtomicBool,
    pub last: &'a AtomicU64,
    pub start: Instant,
}

impl Meter<'_> {
    fn moved(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.changed.store(true, Ordering::Relaxed);
        self.last.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Both directions until both ends have finished (each end-of-file passed
/// on as a write shutdown), the first error, or `idle` without a byte
/// either way.
pub async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    out: Meter<'_>,
    inbound: Meter<'_>,
    idle: Duration,
) -> io::Result<()> {
    let last = out.last;
    let start = out.start;
    let both =
        async { tokio::try_join!(pump(client, upstream, &out), pump(upstream, client, &inbound)).map(drop) };
    tokio::pin!(both);
    let tick = (idle / 4).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            done = &mut both => return done,
            _ = tokio::time::sleep(tick) => {
                let quiet = start.elapsed().saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                if quiet >= idle {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, format!("idle for {idle:?}")));
                }
            }
        }
    }
}

/// One direction: `from` → pipe → `to`, until `from`'s end-of-file, then
/// `to`'s write side is shut down.
async fn pump(from: &TcpStream, to: &TcpStream, meter: &Meter<'_>) -> io::Result<()> {
    let (pipe_r, pipe_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    // Larger where the limit allows (fs.pipe-max-size; default 1 MiB);
    // else the default 64 KiB, and splices of that much.
    let chunk = match nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as i32)) {
        Ok(size) if size > 0 => (size as usize).min(CHUNK),
        _ => 64 * 1024,
    };
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || splice(from.as_raw_fd(), pipe_w.as_raw_fd(), chunk)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
            return Ok(());
        }
        drain(&pipe_r, to, n).await?;
        meter.moved(n);
    }
}

/// Moves the `n` bytes in the pipe into `to`.
async fn drain(pipe_r: &OwnedFd, to: &TcpStream, mut n: usize) -> io::Result<()> {
    while n > 0 {
        to.writable().await?;
        match to.try_io(Interest::WRITABLE, || splice(pipe_r.as_fd().as_raw_fd(), to.as_raw_fd(), n)) {
            Ok(moved) => n -= moved,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    loop {
        // SAFETY: both descriptors are open for the call (borrowed from
        // live owners); null offsets mean "the current position", as
        // sockets and pipes require.
        let n = unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
