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

/// The spec read from `--spec-fd` (a descriptor above stderr, read to
/// its end and closed), with the `--proc` and `--nested` overrides.
fn read_spec(args: &ExecArgs) -> Result<SandboxSpec, String> {
    if args.spec_fd < 3 {
        return Err(format!("--spec-fd {}: must be a descriptor above stderr", args.spec_fd));
    }
    if let Err(e) = super::launch::check_fd(args.spec_fd) {
        return Err(format!("--spec-fd {}: {}", args.spec_fd, sandbox::error::io_error_text(&e)));
    }
    // SAFETY: the descriptor was handed to us for exactly this purpose and
    // nothing else in this process refers to it.
    let mut file = unsafe { std::fs::File::from_raw_fd(args.spec_fd) };
    let mut bytes = Vec::new();
    if let Err(e) = file.read_to_end(&mut bytes) {
        return Err(format!("reading the spec from fd {}: {e}", args.spec_fd));
    }
    drop(file);
    let mut spec = SandboxSpec::from_json(&bytes)
        .map_err(|e| format!("invalid sandbox spec on fd {}: {e}", args.spec_fd))?;
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
    Ok(spec)
}

/// Every other descriptor handed over is open.
fn check_fds(args: &ExecArgs) -> Result<(), String> {
    let fds = [
        ("--lifeline-fd", args.lifeline_fd),
        ("--egress-fd", args.egress_fd),
        ("--nested-counts-fd", args.nested_counts_fd),
        ("--cwd-fd", args.cwd_fd),
    ];
    for (flag, fd) in fds {
        if let Some(fd) = fd
            && let Err(e) = super::launch::check_fd(fd)
        {
            return Err(format!("{flag} {fd}: {}", sandbox::error::io_error_text(&e)));
        }
    }
    Ok(())
}

pub fn main(args: ExecArgs) -> u8 {
    let spec = match read_spec(&args).and_then(|spec| check_fds(&args).map(|()| spec)) {
        Ok(spec) => spec,
        Err(message) => {
            report_error(message);
            return EXIT_TOOL_ERROR;
        }
    };
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
