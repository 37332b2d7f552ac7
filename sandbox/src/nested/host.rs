//! bwrap on the host: `tuixiu-sandbox bwrap ...` (or the launcher called
//! `bwrap`) outside any sandbox of ours runs the request itself, with the
//! runtime's plan, child and monitor, as bubblewrap would: its namespaces,
//! its id map, its capabilities, and no seccomp filter or Landlock unless
//! asked for (`--tx-seccomp`, `--tx-landlock`).

use std::os::fd::RawFd;

use super::plan::{self, HostOptions};
use super::request::{Request, RequestError};
use crate::error::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, LaunchError};
use crate::launch::{self, BwrapStatus, ExitStatus, LaunchOptions, Watch};

/// Why a bwrap run failed: bubblewrap's message (after `bwrap: `).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{0}")]
    Request(#[from] RequestError),
    #[error("{0}")]
    Launch(String),
}

/// Runs `req` on the host and returns COMMAND's status. The caller's
/// descriptors named in `req.fds` pass to COMMAND at the same numbers.
pub fn run_on_host(req: &Request, host: &HostOptions, status: BwrapStatus) -> Result<ExitStatus, HostError> {
    launch::ensure_single_threaded().map_err(|e| HostError::Launch(e.to_string()))?;
    let strerror = |e: nix::errno::Errno| crate::error::strerror(e as i32);
    if let Some(fd) = host.userns_fd {
        if let Err(e) = crate::sys::setns(fd, libc::CLONE_NEWUSER) {
            return Err(HostError::Launch(if e == nix::errno::Errno::EINVAL {
                "Joining the specified user namespace failed, it might not be a descendant of the current user namespace.".into()
            } else {
                format!("Joining specified user namespace failed: {}", strerror(e))
            }));
        }
    }
    // Our children start in that pid namespace. bubblewrap's child joins it
    // once the status descriptors have its pid: its failure comes from the
    // sandbox's PID 1 here.
    let mut fail_at_start = None;
    if let Some(fd) = host.pidns_fd
        && let Err(e) = crate::sys::setns(fd, libc::CLONE_NEWPID)
    {
        fail_at_start = Some(format!("Setting pidns failed: {}", strerror(e)));
    }
    let mut fds = Vec::with_capacity(req.fds.len());
    for &fd in &req.fds {
        let copy = crate::sys::dup_cloexec(fd, 0).map_err(|e| {
            HostError::Launch(format!("descriptor {fd}: {}", crate::error::io_error_text(&e.into())))
        })?;
        fds.push(copy);
    }
    let floor = highest_open_fd();
    let mut plan = match plan::prepare_host(req, fds, floor, host) {
        Ok(plan) => plan,
        // bubblewrap meets these inside the sandbox it has made (after the
        // status descriptors have its pid): so does ours, with a sandbox
        // made of the same namespaces and nothing else.
        Err(e) => {
            let bare = Request {
                ops: Vec::new(),
                fds: Vec::new(),
                seccomp: Vec::new(),
                lock_files: Vec::new(),
                block_fd: None,
                userns2_fd: None,
                command: vec!["true".into()],
                hostname: None,
                ..req.clone()
            };
            let bare_host = HostOptions { sync_fd: None, exec_label: None, file_label: None, ..host.clone() };
            let plan = plan::prepare_host(&bare, Vec::new(), floor, &bare_host).map_err(|_| e.clone())?;
            fail_at_start.get_or_insert(e.to_string());
            plan
        }
    };
    if let Some(child) = plan.nested.as_mut().and_then(|n| n.host.as_mut()) {
        child.fail_at_start = fail_at_start;
    }
    let options = LaunchOptions {
        return_before_teardown: true,
        bwrap_status: Some(status),
        ..LaunchOptions::default()
    };
    launch::execute(&plan, &options, None, Watch::Nothing)
        .map_err(|e| HostError::Launch(bwrap_message(e, &plan.exec.program)))
}

/// bubblewrap's words for a launch failure.
pub(crate) fn bwrap_message(e: LaunchError, program: &str) -> String {
    match e {
        LaunchError::Child { code: EXIT_NOT_FOUND, .. } => {
            format!("execvp {program}: {}", crate::error::strerror(libc::ENOENT))
        }
        // The child says `execve("X") => EACCES (Permission denied): ...`:
        // bubblewrap says the error's text alone.
        LaunchError::Child { code: EXIT_CANNOT_EXECUTE, message } => {
            let text = message
                .split_once("=> ")
                .and_then(|(_, rest)| rest.split_once(" ("))
                .and_then(|(_, rest)| rest.split_once(')'))
                .map_or(message.as_str(), |(text, _)| text);
            format!("execvp {program}: {text}")
        }
        // bubblewrap's words where the namespaces cannot be made, and
        // where to look.
        LaunchError::Syscall(e) if e.call.starts_with("clone(") => {
            let why = match e.errno {
                nix::errno::Errno::EINVAL => {
                    "Creating new namespace failed, likely because the kernel does not support \
                     user namespaces.  bwrap must be installed setuid on such systems."
                        .to_string()
                }
                nix::errno::Errno::EPERM => {
                    "No permissions to create a new namespace, likely because the kernel does \
                     not allow non-privileged user namespaces. On e.g. debian this can be enabled with \
                     'sysctl kernel.unprivileged_userns_clone=1'."
                        .to_string()
                }
                nix::errno::Errno::ENOSPC => "Creating new namespace failed: nesting depth or \
                     /proc/sys/user/max_*_namespaces exceeded (ENOSPC)"
                    .to_string(),
                errno => format!("Creating new namespace failed: {}", errno.desc()),
            };
            // Inside a sandbox without a portal (`--nested off`, the
            // docker provider, or a nested sandbox, which never gets one)
            // a seccomp filter is what refuses.
            let filtered = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
                s.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Seccomp:", "2"])
            });
            let inside = if filtered && e.errno == nix::errno::Errno::EPERM {
                "; this process runs under a seccomp filter: inside a tuixiu-sandbox sandbox, `bwrap` needs \
                 `--nested on`, and a nested sandbox cannot make another"
            } else {
                ""
            };
            format!(
                "{why} (tuixiu-sandbox has no setuid mode; `tuixiu-sandbox check` tells what this host allows{inside})"
            )
        }
        // bubblewrap's monitor: the info descriptor, the id maps.
        LaunchError::Syscall(e) => {
            let step = match e.step.as_str() {
                "write the sandbox's uid_map" => "setting up uid map",
                "write the sandbox's setgroups" => "error writing to setgroups",
                "write the sandbox's gid_map" => "setting up gid map",
                step @ ("Write to info_fd" | "Setting userns2 failed") => step,
                _ => return e.to_string(),
            };
            format!("{step}: {}", crate::error::strerror(e.errno as i32))
        }
        e => e.to_string(),
    }
}

/// The highest descriptor number open in this process.
fn highest_open_fd() -> RawFd {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).max().unwrap_or(2))
        .unwrap_or(1023)
}
