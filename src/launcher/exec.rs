//! `__exec`: the single-threaded launcher for threaded callers.
//!
//! The daemon runs on tokio, and namespace work must not happen in a
//! process with threads (a forked child would inherit locks held by other
//! threads). So it spawns this helper with the serialized spec on a pipe;
//! this fresh process is single-threaded and becomes the sandbox's monitor.

use std::io::Read;
use std::os::fd::FromRawFd;

use sandbox::{MountOp, SandboxSpec};

use super::args::ExecArgs;
use super::{EXIT_TOOL_ERROR, report_error};

pub fn main(args: ExecArgs) -> u8 {
    if args.spec_fd < 3 {
        report_error(format!("--spec-fd {}: must be a descriptor above stderr", args.spec_fd));
        return EXIT_TOOL_ERROR;
    }
    if let Err(e) = super::launch::check_fd(args.spec_fd) {
        report_error(format!("--spec-fd {}: {}", args.spec_fd, sandbox::error::io_error_text(&e)));
        return EXIT_TOOL_ERROR;
    }
    // SAFETY: the descriptor was handed to us for exactly this purpose and
    // nothing else in this process refers to it.
    let mut file = unsafe { std::fs::File::from_raw_fd(args.spec_fd) };
    let mut bytes = Vec::new();
    if let Err(e) = file.read_to_end(&mut bytes) {
        report_error(format!("reading the spec from fd {}: {e}", args.spec_fd));
        return EXIT_TOOL_ERROR;
    }
    drop(file);
    let mut spec = match SandboxSpec::from_json(&bytes) {
        Ok(spec) => spec,
        Err(e) => {
            report_error(format!("invalid sandbox spec on fd {}: {e}", args.spec_fd));
            return EXIT_TOOL_ERROR;
        }
    };
    if let Some(proc) = args.proc {
        for op in &mut spec.mounts {
            if let MountOp::Proc { mode, .. } = op {
                *mode = proc.into();
            }
        }
    }
    if let Some(nested) = args.nested {
        spec.nested = nested == super::args::NestedArg::On;
    }
    let fds = [
        ("--lifeline-fd", args.lifeline_fd),
        ("--egress-fd", args.egress_fd),
        ("--nested-counts-fd", args.nested_counts_fd),
    ];
    for (flag, fd) in fds {
        if let Some(fd) = fd
            && let Err(e) = super::launch::check_fd(fd)
        {
            report_error(format!("{flag} {fd}: {}", sandbox::error::io_error_text(&e)));
            return EXIT_TOOL_ERROR;
        }
    }
    if let Some(fd) = args.cwd_fd
        && let Err(e) = super::launch::check_fd(fd)
    {
        report_error(format!("--cwd-fd {fd}: {}", sandbox::error::io_error_text(&e)));
        return EXIT_TOOL_ERROR;
    }
    // SAFETY: checked open above; handed to us for this, and kept open
    // (never closed here) until the process image is replaced.
    let cwd_dir = args.cwd_fd.map(|fd| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
    match args.join_pid {
        // The status line carries the command's host pid: it leads its own
        // process group (setsid), which is how the caller kills all of it.
        Some(pid) => super::launch::report_launch(args.json_status_fd, None, |options| {
            let fd = options.json_status_fd;
            sandbox::join(&spec, pid, cwd_dir, |child| {
                if let Some(fd) = fd {
                    let line = format!("{{\"child-pid\": {child}}}\n");
                    // SAFETY: writing a buffer to a descriptor we were given.
                    let _ = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
                }
            })
        }),
        // A joined process lives in the sandbox of one that has the
        // lifeline: it ends with that sandbox's PID 1.
        None => super::launch::report_launch(args.json_status_fd, args.egress_fd, |options| {
            let options = sandbox::LaunchOptions {
                lifeline_fd: args.lifeline_fd,
                nested_counts_fd: args.nested_counts_fd,
                ..options.clone()
            };
            sandbox::launch(&spec, &options)
        }),
    }
}
