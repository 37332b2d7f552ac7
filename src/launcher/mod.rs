//! The commands that launch sandboxes, shared by both binaries.
//!
//! `tuixiu-sandbox` is a small launcher: it runs a plain native `run` and
//! the `__exec` helper itself, in a single-threaded process that links only
//! what those need, because every sandbox start pays for the binary's own
//! start-up (page faults, relocations, the argument parser). Everything
//! else — manifests, docker and host providers, named instances, the
//! daemon, skill jobs — is handled by `tuixiu-sandbox-full`, installed next
//! to it, which the launcher `exec`s with the same arguments. The full tool
//! runs these commands with the same code (this module), so both binaries
//! behave identically.

pub mod args;
pub mod error;
pub mod exec;
pub mod fast_args;
pub mod launch;
pub mod log;
pub mod run;
pub mod run_inputs;
pub mod units;

use std::ffi::OsString;
use std::io::IsTerminal;

use args::{ProviderArg, RunArgs};

/// Exit status for errors of the tool itself (bad arguments, setup failures),
/// as docker and podman use it.
pub const EXIT_TOOL_ERROR: u8 = sandbox::EXIT_SETUP_FAILED;

pub use crate::exe::{DAEMON_NAME, FULL_NAME, LAUNCHER_NAME, full_exe, launcher_exe};

/// What the launcher needs of the set-up Rust's runtime does before `main`,
/// for a binary that skips it (`#![no_main]`): SIGPIPE ignored, so writing
/// to a closed pipe is an error rather than death; and descriptors 0, 1
/// and 2 open (on `/dev/null` if the caller closed one), so that no pipe or
/// file the launcher opens can take their numbers.
pub fn runtime_setup() {
    // SAFETY: ignoring a signal changes no memory; the process is still
    // single-threaded here.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd { fd, events: 0, revents: 0 });
    // SAFETY: three valid pollfd entries; a zero timeout only reports.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for pfd in fds.iter().filter(|pfd| pfd.revents & libc::POLLNVAL != 0) {
        // The lowest free number is the closed one (lower ones are open).
        // SAFETY: opening a path with a valid NUL-terminated name.
        if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != pfd.fd {
            std::process::abort();
        }
    }
}

/// The global `-v`/`-vv`/`--verbose` flags in front of the subcommand:
/// their count, and how many arguments they took.
pub fn leading_verbose(args: &[OsString]) -> (u8, usize) {
    let mut verbose = 0u8;
    let mut taken = 0;
    while let Some(n) = args.get(taken).and_then(|a| a.to_str()).and_then(verbose_flag) {
        verbose = verbose.saturating_add(n);
        taken += 1;
    }
    (verbose, taken)
}

/// How much more verbose `arg` asks for, if it is `--verbose` or `-v...`.
pub fn verbose_flag(arg: &str) -> Option<u8> {
    match arg {
        "--verbose" => Some(1),
        f if f.len() > 1 && f.starts_with('-') && f[1..].bytes().all(|b| b == b'v') => {
            Some((f.len() - 1).min(255) as u8)
        }
        _ => None,
    }
}

/// Prints one error line on stderr, prefixed with the program name.
pub fn report_error(message: impl std::fmt::Display) {
    eprintln!("tuixiu-sandbox: {message}");
}

/// Diagnostics go to stderr only: stdout belongs to the sandboxed command
/// (an ACP agent speaks NDJSON over it). `TUIXIU_LOG` may name a level
/// (`debug`); the full tool also takes tracing filter directives there.
/// The launcher uses this one, with its own small subscriber ([`log`]).
pub fn init_logging(verbose: u8) {
    let level = std::env::var("TUIXIU_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing::level_filters::LevelFilter>().ok())
        .unwrap_or(default_level(verbose));
    log::init(level, std::io::stderr().is_terminal());
}

/// As [`init_logging`], with `TUIXIU_LOG` as tracing filter directives
/// (e.g. `info,tuixiu_sandbox::proxy=debug`).
pub fn init_logging_with_directives(verbose: u8) {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(verbose))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// `TUIXIU_LOG` as tracing filter directives, else the level `-v` asks for.
pub fn log_filter(verbose: u8) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    EnvFilter::try_from_env("TUIXIU_LOG")
        .unwrap_or_else(|_| EnvFilter::default().add_directive(default_level(verbose).into()))
}

fn default_level(verbose: u8) -> tracing::level_filters::LevelFilter {
    use tracing::level_filters::LevelFilter;
    match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Whether a `run` needs the full tool: a manifest (downloads, checkouts),
/// `--network allow` (the egress proxy), another provider, or a named
/// instance.
pub fn needs_full(args: &RunArgs) -> bool {
    args.manifest.is_some()
        || args.network == args::NetworkArg::Allow
        || args.provider.provider != ProviderArg::Native
        || args.provider.instance_name.is_some()
}

/// Replaces this process with the daemon's binary for `proxy` (the full
/// tool when it is not installed), same arguments. Returns only on
/// failure, with the exit status to use.
pub fn exec_daemon(argv: &[OsString]) -> u8 {
    match crate::exe::sibling(DAEMON_NAME) {
        Some(daemon) if crate::exe::is_executable(&daemon) => exec_tool(&daemon, argv),
        _ => exec_full(argv),
    }
}

/// Replaces this process with the full tool, same arguments. Returns only
/// on failure, with the exit status to use.
pub fn exec_full(argv: &[OsString]) -> u8 {
    match full_exe() {
        Ok(exe) => exec_tool(&exe, argv),
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}

fn exec_tool(exe: &std::path::Path, argv: &[OsString]) -> u8 {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe).arg0(LAUNCHER_NAME).args(argv.iter().skip(1)).exec();
    let name = exe.file_name().unwrap_or_default().to_string_lossy();
    report_error(format!(
        "cannot run {}: {} (install {name} next to {LAUNCHER_NAME})",
        exe.display(),
        sandbox::error::io_error_text(&err)
    ));
    EXIT_TOOL_ERROR
}
