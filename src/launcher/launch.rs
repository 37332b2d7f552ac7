//! Launching a prepared spec in this process, and the exit status and
//! error line of the outcome: shared by `run` (with or without a manifest)
//! and `__exec`.

use std::collections::HashMap;

use sandbox::{ExitStatus, LaunchError, LaunchOptions, SandboxSpec};

use super::{EXIT_TOOL_ERROR, report_error};
use crate::inputs::Layout;

/// Exit status when `--timeout` ended the command, as coreutils' `timeout`.
pub const EXIT_TIMED_OUT: u8 = 124;

/// A spec, and where the manifest's roots and binds ended up in it.
pub struct Built {
    pub spec: SandboxSpec,
    pub layout: Layout,
    /// Plan position of a bind item → index of its deferred bind.
    pub binds: HashMap<usize, usize>,
}

/// Launches `spec` in this (single-threaded) process and maps the outcome to
/// an exit status, printing one line on stderr for failures.
pub fn launch_and_report(spec: &SandboxSpec, json_status_fd: Option<i32>, egress_fd: Option<i32>) -> u8 {
    report_launch(json_status_fd, egress_fd, |options| sandbox::launch(spec, options))
}

/// Checks `--json-status-fd`, runs `launch` with the CLI's launch options
/// (and the egress proxy's socket of a proxied network), and maps the
/// outcome to an exit status (one line on stderr on failure).
pub fn report_launch(
    json_status_fd: Option<i32>,
    egress_fd: Option<i32>,
    launch: impl FnOnce(&LaunchOptions) -> Result<ExitStatus, LaunchError>,
) -> u8 {
    if let Some(fd) = json_status_fd
        && let Err(e) = check_fd(fd)
    {
        report_error(format!("--json-status-fd {fd}: {}", sandbox::error::io_error_text(&e)));
        return EXIT_TOOL_ERROR;
    }
    // Every caller exits right after the launch, so PID 1's teardown of
    // the namespaces need not hold up the caller of `run`/`__exec`.
    // The small launcher answers as `bwrap` inside the sandbox.
    let bwrap_front_end = super::launcher_exe().ok();
    let options = LaunchOptions {
        json_status_fd,
        release_stdio: true,
        return_before_teardown: true,
        bwrap_front_end,
        egress_fd,
        ..LaunchOptions::default()
    };
    match launch(&options) {
        Ok(status) if status.timed_out() => {
            report_error(format!(
                "the command was stopped by --timeout (its own status was {})",
                status.code()
            ));
            EXIT_TIMED_OUT
        }
        Ok(status) => status.code().clamp(0, 255) as u8,
        Err(e) => {
            report_error(&e);
            e.exit_code()
        }
    }
}

/// Checks that `fd` is an open descriptor.
pub fn check_fd(fd: i32) -> Result<(), std::io::Error> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}
