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
pub mod exec;
pub mod run;
pub mod run_inputs;
pub mod units;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use args::{ProviderArg, RunArgs};

/// Exit status for errors of the tool itself (bad arguments, setup failures),
/// as docker and podman use it.
pub const EXIT_TOOL_ERROR: u8 = sandbox::EXIT_SETUP_FAILED;

/// File name of the small launcher binary.
pub const LAUNCHER_NAME: &str = "tuixiu-sandbox";
/// File name of the full tool, installed next to the launcher.
pub const FULL_NAME: &str = "tuixiu-sandbox-full";

/// Prints one error line on stderr, prefixed with the program name.
pub fn report_error(message: impl std::fmt::Display) {
    eprintln!("tuixiu-sandbox: {message}");
}

/// Diagnostics go to stderr only: stdout belongs to the sandboxed command
/// (an ACP agent speaks NDJSON over it). `TUIXIU_LOG` may name a level
/// (`debug`); the full tool also takes tracing filter directives there.
/// The launcher uses this one: a plain level filter keeps the regex engine
/// of the directive parser out of its binary.
pub fn init_logging(verbose: u8) {
    let level = std::env::var("TUIXIU_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::LevelFilter>().ok())
        .unwrap_or(default_level(verbose));
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// As [`init_logging`], with `TUIXIU_LOG` as tracing filter directives
/// (e.g. `info,tuixiu_sandbox::proxy=debug`).
pub fn init_logging_with_directives(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TUIXIU_LOG")
        .unwrap_or_else(|_| EnvFilter::default().add_directive(default_level(verbose).into()));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

fn default_level(verbose: u8) -> tracing_subscriber::filter::LevelFilter {
    use tracing_subscriber::filter::LevelFilter;
    match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Whether a `run` needs the full tool: a manifest (downloads, checkouts),
/// another provider, or a named instance.
pub fn needs_full(args: &RunArgs) -> bool {
    args.manifest.is_some()
        || args.provider.provider != ProviderArg::Native
        || args.provider.instance_name.is_some()
}

/// `name` next to the running executable.
fn sibling(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join(name))
}

/// The full tool, next to the running executable.
pub fn full_exe() -> Result<PathBuf, String> {
    sibling(FULL_NAME).ok_or_else(|| "cannot locate this executable (is /proc mounted?)".to_string())
}

/// The fast launcher for `__exec`: the small binary next to this one when
/// it is there, else this executable (which handles `__exec` too).
pub fn launcher_exe() -> std::io::Result<PathBuf> {
    match sibling(LAUNCHER_NAME) {
        Some(path) if is_executable(&path) => Ok(path),
        _ => std::env::current_exe(),
    }
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Replaces this process with the full tool, same arguments. Returns only
/// on failure, with the exit status to use.
pub fn exec_full(argv: &[OsString]) -> u8 {
    use std::os::unix::process::CommandExt;
    let exe = match full_exe() {
        Ok(exe) => exe,
        Err(e) => {
            report_error(e);
            return EXIT_TOOL_ERROR;
        }
    };
    let err = std::process::Command::new(&exe).arg0(LAUNCHER_NAME).args(argv.iter().skip(1)).exec();
    report_error(format!(
        "cannot run {}: {} (install {FULL_NAME} next to {LAUNCHER_NAME})",
        exe.display(),
        sandbox::error::io_error_text(&err)
    ));
    EXIT_TOOL_ERROR
}
