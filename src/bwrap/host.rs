//! bwrap on the host: outside any sandbox of ours (no portal socket), the
//! front end runs the request itself through the runtime
//! (`sandbox::nested::run_on_host`), in this process, as bubblewrap would.

use sandbox::nested::{BwrapStatus, HostOptions};

use super::client;
use super::error::BwrapError;
use super::parse::Parsed;

/// Runs the parsed command line; COMMAND's exit status, or bubblewrap's
/// message for a failure.
pub fn run(parsed: &Parsed) -> Result<u8, BwrapError> {
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    // bubblewrap run by root keeps the caller's capabilities, in a user
    // namespace too, and `--cap-add`/`--cap-drop` start from them.
    let root_caps = root.then(effective_caps);
    let mut request = client::request(parsed, root_caps.unwrap_or(0))?;
    let fd = |name: &str| parsed.fds.get(name).copied();
    // What bubblewrap consumes itself does not reach COMMAND (`--userns`
    // and `--pidns` do, bubblewrap leaves them open).
    let consumed: Vec<i32> =
        ["--info-fd", "--json-status-fd", "--userns-block-fd"].iter().filter_map(|name| fd(name)).collect();
    request.fds = client::open_fds(&consumed)?;
    // Served here, by the launcher (`BwrapStatus` below), not from the request.
    (request.info_fd, request.json_status_fd, request.userns_block_fd) = (None, None, None);
    // bubblewrap reads `--block-fd` ignoring errors, and its monitor's
    // `setns` says what is wrong with `--userns2`'s descriptor.
    for slot in [&mut request.block_fd, &mut request.userns2_fd] {
        if slot.is_some_and(|fd| !request.fds.contains(&fd)) {
            *slot = None;
        }
    }
    let seccomp = match parsed.tx_seccomp.as_deref() {
        None => None,
        Some(name) => Some(sandbox::SeccompPolicy::parse(name).map_err(BwrapError::TxSeccomp)?),
    };
    let host = HostOptions {
        userns_fd: fd("--userns"),
        pidns_fd: fd("--pidns"),
        seccomp,
        landlock: if parsed.tx_landlock {
            sandbox::LandlockMode::Require
        } else {
            sandbox::LandlockMode::Off
        },
        root_caps,
        sync_fd: fd("--sync-fd"),
        caller_maps: fd("--userns-block-fd").is_some(),
        exec_label: parsed.exec_label.clone(),
        file_label: parsed.file_label.clone(),
    };
    let status = BwrapStatus {
        info_fd: fd("--info-fd"),
        json_status_fd: fd("--json-status-fd"),
        userns_block_fd: fd("--userns-block-fd"),
        userns2_fd: fd("--userns2"),
    };
    if parsed.die_with_parent {
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    }
    let status = sandbox::nested::run_on_host(&request, &host, status)?;
    Ok(status.code().clamp(0, 255) as u8)
}

/// This process's effective capability set.
fn effective_caps() -> u64 {
    let mut header = libc_cap_header();
    let mut data = [[0u32; 3]; 2];
    // SAFETY: capget with a v3 header and room for its two data records.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return 0;
    }
    u64::from(data[0][0]) | (u64::from(data[1][0]) << 32)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

fn libc_cap_header() -> CapHeader {
    CapHeader { version: 0x2008_0522, pid: 0 }
}
