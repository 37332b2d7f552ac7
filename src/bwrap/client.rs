//! The front end's side of the portal: the parsed command line becomes a
//! request, which goes to the launcher with this process's open
//! descriptors (stdio included), and the nested command's status comes back.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use sandbox::nested::wire::{self, Reply};
use sandbox::nested::{Op, Request, SOCKET, Unshare};

use super::parse::{self, Parsed};

/// Sends the request and waits for the nested command; its exit status,
/// or bubblewrap's message for a failure.
pub fn run(parsed: &Parsed) -> Result<u8, String> {
    let request = request(parsed)?;
    if parsed.die_with_parent {
        // The connection dies with us, and the nested sandbox with it.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    }
    let conn = wire::connect().map_err(|e| {
        format!(
            "nested sandboxes are not available here ({SOCKET}: {}): this bwrap is tuixiu-sandbox's, \
             and works only inside a sandbox started with --nested on",
            sandbox::error::io_error_text(&e)
        )
    })?;
    let fds = open_fds(conn.as_raw_fd())?;
    let request = Request { fds: fds.clone(), ..request };
    let body = serde_json::to_vec(&request).map_err(|e| format!("cannot encode the request: {e}"))?;
    // A launcher that refuses at once (too many nested sandboxes) closes
    // the connection while we send: its reply says why.
    let sent = wire::send_request(conn.as_fd(), &body, &fds);
    match wire::read_reply(conn.as_fd()) {
        Ok(None) | Err(_) if sent.is_err() => Err(format!(
            "cannot send the request to the launcher: {}",
            sandbox::error::io_error_text(&sent.unwrap_err())
        )),
        Ok(Some(Reply::Exit(code))) => Ok(code.clamp(0, 255) as u8),
        Ok(Some(Reply::Error(text))) => Err(text),
        Ok(None) => Err("the launcher ended the nested sandbox without a status".into()),
        Err(e) => Err(format!("reading the launcher's reply: {}", sandbox::error::io_error_text(&e))),
    }
}

/// The request for a parsed command line (descriptors are added by [`run`]).
fn request(parsed: &Parsed) -> Result<Request, String> {
    let mut ops = Vec::with_capacity(parsed.ops.len());
    for op in &parsed.ops {
        ops.push(match op {
            parse::Op::Bind { src, dst, mode, optional } => {
                Op::Bind { src: src.clone(), dst: dst.clone(), mode: *mode, optional: *optional }
            }
            parse::Op::RemountRo { dst } => Op::RemountRo { dst: dst.clone() },
            parse::Op::Tmpfs { dst, perms, size } => {
                Op::Tmpfs { dst: dst.clone(), mode: perms.unwrap_or(0o755), size: *size }
            }
            parse::Op::Dir { dst, perms } => Op::Dir { dst: dst.clone(), mode: perms.unwrap_or(0o755) },
            parse::Op::Symlink { target, dst } => Op::Symlink { target: target.clone(), dst: dst.clone() },
            parse::Op::Proc { dst } => Op::Proc { dst: dst.clone() },
            parse::Op::Dev { dst } => Op::Dev { dst: dst.clone() },
            // Refused before (Parsed::unsupported), kept exhaustive here.
            other => return Err(format!("{other:?} is not supported yet by tuixiu-sandbox's bwrap")),
        });
    }
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|p| p.into_os_string().into_string().ok())
        .unwrap_or_else(|| "/".into());
    // SAFETY: umask cannot fail; the old value is put back at once.
    let umask = unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    };
    let u = &parsed.unshare;
    Ok(Request {
        command: parsed.command.clone(),
        argv0: parsed.argv0.clone(),
        env: parsed.env.clone(),
        cwd,
        chdir: parsed.chdir.clone(),
        umask: umask as u32,
        ops,
        unshare: Unshare { user: u.user, ipc: u.ipc, net: u.net, uts: u.uts, cgroup: u.cgroup },
        uid: parsed.uid,
        gid: parsed.gid,
        hostname: parsed.hostname.clone(),
        caps: parsed.caps(),
        fds: Vec::new(),
    })
}

/// Every descriptor this process has open but `skip`: bwrap's COMMAND
/// inherits them all, at the same numbers.
fn open_fds(skip: RawFd) -> Result<Vec<RawFd>, String> {
    let listed: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        // No /proc: probe the usual range.
        Err(_) => (0..1024).collect(),
    };
    // The listing's own descriptor is closed by now; F_GETFD drops it.
    let mut fds: Vec<RawFd> = listed
        .into_iter()
        // SAFETY: F_GETFD only inspects the descriptor table.
        .filter(|&fd| fd != skip && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
        .collect();
    fds.sort_unstable();
    if fds.len() > wire::MAX_FDS {
        return Err(format!(
            "{} descriptors are open; tuixiu-sandbox's bwrap can pass at most {} to the nested sandbox",
            fds.len(),
            wire::MAX_FDS
        ));
    }
    Ok(fds)
}
