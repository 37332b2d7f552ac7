//! The front end's side of the portal: the parsed command line becomes a
//! request, which goes to the launcher with this process's open
//! descriptors (stdio included), and the nested command's status comes back.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use sandbox::nested::wire::{self, Reply};
use std::os::fd::FromRawFd;

use sandbox::nested::{BindMode, DataKind, Op, OverlayKind, Request, Unshare};

use super::error::BwrapError;
use super::parse::{self, Parsed};

/// Sends the request and waits for the nested command; its exit status,
/// or bubblewrap's message for a failure.
pub fn run(parsed: &Parsed) -> Result<u8, BwrapError> {
    let request = request(parsed, 0)?;
    if parsed.die_with_parent {
        // The connection dies with us, and the nested sandbox with it.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    }
    let conn = wire::connect().map_err(BwrapError::NoPortal)?;
    let fds = open_fds(&[conn.as_raw_fd()])?;
    let request = Request { fds: fds.clone(), ..request };
    let body = serde_json::to_vec(&request).map_err(BwrapError::Encode)?;
    // A launcher that refuses at once (too many nested sandboxes) closes
    // the connection while we send: its reply says why.
    let sent = wire::send_request(conn.as_fd(), &body, &fds);
    // The portal has its own copies now. bubblewrap closes these once
    // used: a caller reading `--info-fd` to its end must not wait for us.
    for fd in [request.info_fd, request.userns_block_fd].into_iter().flatten() {
        // SAFETY: the caller's descriptors, given to bwrap to consume.
        unsafe { libc::close(fd) };
    }
    match wire::read_reply(conn.as_fd()) {
        Ok(None) | Err(_) if sent.is_err() => Err(BwrapError::Send(sent.unwrap_err())),
        Ok(Some(Reply::Exit(code))) => Ok(code.clamp(0, 255) as u8),
        Ok(Some(Reply::Error(text))) => Err(BwrapError::Refused(text)),
        Ok(None) => Err(BwrapError::NoStatus),
        Err(e) => Err(BwrapError::Reply(e)),
    }
}

/// The request for a parsed command line (descriptors are added by the
/// caller). `caps_from` is the set `--cap-add`/`--cap-drop` start from.
/// The data of `--file`, `--bind-data` and `--ro-bind-data` is read (and
/// its descriptor closed) here; `--bind-fd` names what its descriptor is
/// open on.
pub fn request(parsed: &Parsed, caps_from: u64) -> Result<Request, BwrapError> {
    let ops = parsed.ops.iter().map(op).collect::<Result<Vec<_>, _>>()?;
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|p| p.into_os_string().into_string().ok())
        .unwrap_or_else(|| "/".into());
    // umask(2) can only be read by setting it: the old value goes back at once.
    let umask = {
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        nix::sys::stat::umask(old);
        old.bits()
    };
    let mut seccomp = parsed.seccomp_programs.clone();
    if let Some(&fd) = parsed.fds.get("--seccomp") {
        let data = read_data(fd, "").map_err(|_| BwrapError::SeccompData)?;
        if data.len() % 8 != 0 {
            return Err(BwrapError::SeccompLength);
        }
        seccomp.push(data);
    }
    let u = &parsed.unshare;
    // The kernel drops capabilities it does not know (`capset`), as
    // bubblewrap leaves it to.
    let known = match sandbox::nested::request::last_cap() {
        last if last >= 63 => u64::MAX,
        last => (1u64 << (last + 1)) - 1,
    };
    Ok(Request {
        command: parsed.command.clone(),
        argv0: parsed.argv0.clone(),
        env: parsed.env.clone(),
        cwd,
        chdir: parsed.chdir.clone(),
        umask: umask as u32,
        ops,
        unshare: Unshare { user: u.user, pid: u.pid, ipc: u.ipc, net: u.net, uts: u.uts, cgroup: u.cgroup },
        // Without a new user namespace these are the caller's own (the
        // parser checked), so nothing to switch to.
        uid: parsed.uid.filter(|_| u.user),
        gid: parsed.gid.filter(|_| u.user),
        hostname: parsed.hostname.clone(),
        caps: parsed.caps(caps_from).map(|c| c & known),
        fds: Vec::new(),
        new_session: parsed.new_session,
        as_pid_1: parsed.as_pid_1,
        seccomp,
        lock_files: parsed.lock_files.clone(),
        block_fd: parsed.fds.get("--block-fd").copied(),
        userns2_fd: parsed.fds.get("--userns2").copied(),
        info_fd: parsed.fds.get("--info-fd").copied(),
        json_status_fd: parsed.fds.get("--json-status-fd").copied(),
        userns_block_fd: parsed.fds.get("--userns-block-fd").copied(),
        disable_userns: parsed.disable_userns,
        assert_userns_disabled: parsed.assert_userns_disabled,
        host_only: parsed.host_only(),
    })
}

/// One parsed operation as the runtime's; a data descriptor is read (and
/// closed) here, a `--bind-fd` descriptor named by what it is open on.
fn op(op: &parse::Op) -> Result<Op, BwrapError> {
    Ok(match op {
        parse::Op::Bind { src, dst, mode, optional } => {
            Op::Bind { src: src.clone(), dst: dst.clone(), mode: *mode, optional: *optional }
        }
        parse::Op::BindFd { fd, dst, ro } => {
            let link = format!("/proc/self/fd/{fd}");
            let src = match std::fs::read_link(&link) {
                Ok(path) => path.into_os_string().into_string(),
                Err(source) => return Err(BwrapError::SourcePath { link, source }),
            };
            let src = src.map_err(|_| BwrapError::SourcePathUtf8(link))?;
            let mode = if *ro { BindMode::Ro } else { BindMode::Rw };
            Op::Bind { src, dst: dst.clone(), mode, optional: false }
        }
        parse::Op::RemountRo { dst } => Op::RemountRo { dst: dst.clone() },
        parse::Op::Tmpfs { dst, perms, size } => {
            Op::Tmpfs { dst: dst.clone(), mode: perms.unwrap_or(0o755), size: *size }
        }
        parse::Op::Dir { dst, perms } => Op::Dir { dst: dst.clone(), mode: perms.unwrap_or(0o755) },
        parse::Op::Symlink { target, dst } => Op::Symlink { target: target.clone(), dst: dst.clone() },
        parse::Op::Proc { dst } => Op::Proc { dst: dst.clone() },
        parse::Op::Dev { dst } => Op::Dev { dst: dst.clone() },
        parse::Op::Mqueue { dst } => Op::Mqueue { dst: dst.clone() },
        parse::Op::File { fd, dst, perms } => Op::Data {
            dst: dst.clone(),
            contents: read_data(*fd, dst)?,
            mode: perms.unwrap_or(0o666),
            how: DataKind::File,
        },
        parse::Op::BindData { fd, dst, perms, ro } => Op::Data {
            dst: dst.clone(),
            contents: read_data(*fd, dst)?,
            mode: perms.unwrap_or(0o600),
            how: if *ro { DataKind::RoBind } else { DataKind::Bind },
        },
        parse::Op::Chmod { mode, path } => Op::Chmod { dst: path.clone(), mode: *mode },
        parse::Op::Overlay { sources, kind, dst } => Op::Overlay {
            // overlayfs lists layers from the top: the last given first.
            sources: sources.iter().rev().cloned().collect(),
            dst: dst.clone(),
            kind: match kind {
                parse::OverlayKind::Rw { upper, work } => {
                    OverlayKind::Rw { upper: upper.clone(), work: work.clone() }
                }
                parse::OverlayKind::Tmp => OverlayKind::Tmp,
                parse::OverlayKind::Ro => OverlayKind::Ro,
            },
        },
    })
}

/// Reads a data descriptor (for `dst`) to its end and closes it.
fn read_data(fd: i32, dst: &str) -> Result<Vec<u8>, BwrapError> {
    use std::io::Read;
    let failed = |source| BwrapError::Data { dst: dst.to_string(), source };
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(failed(std::io::Error::from_raw_os_error(libc::EBADF)));
    }
    // SAFETY: bubblewrap consumes (and closes) the data descriptors.
    let mut file = std::fs::File::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    let mut data = Vec::new();
    file.read_to_end(&mut data).map_err(failed)?;
    Ok(data)
}

/// Every descriptor this process has open but `skip`: bwrap's COMMAND
/// inherits them all, at the same numbers.
pub fn open_fds(skip: &[RawFd]) -> Result<Vec<RawFd>, BwrapError> {
    let listed: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        // No /proc: probe the usual range.
        Err(_) => (0..1024).collect(),
    };
    // The listing's own descriptor is closed by now; F_GETFD drops it.
    let mut fds: Vec<RawFd> = listed
        .into_iter()
        .filter(|fd| !skip.contains(fd))
        // SAFETY: F_GETFD only inspects the descriptor table.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
        .collect();
    fds.sort_unstable();
    if fds.len() > wire::MAX_FDS {
        return Err(BwrapError::TooManyFds(fds.len()));
    }
    Ok(fds)
}
