//! `bwrap`: bubblewrap's command line, served by the launcher of the
//! sandbox we run in (nested sandboxes, see `sandbox::nested`). The small
//! launcher answers as this front end when called `bwrap` (the portal
//! binds it at /run/tuixiu/bin/bwrap and over /usr/bin/bwrap) or as
//! `tuixiu-sandbox bwrap`.
//!
//! The front end parses the command line with bubblewrap's rules and
//! messages ([`parse`], over the option table in [`options`]), then hands
//! the request to the launcher over the portal's socket ([`client`]) and
//! exits with the nested command's status. Diagnostics are bubblewrap's:
//! `bwrap: ...` on stderr, exit 1.

pub mod client;
pub mod error;
pub mod host;
pub mod options;
pub mod parse;

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};

use parse::{Io, Outcome};

/// What `--version` prints: bubblewrap's line, word for word, for the
/// programs that parse it (`tuixiu-sandbox --version` says which build).
pub const VERSION: &str = "bubblewrap 0.11.1";

/// Runs the front end with `argv` (`argv[0]` as invoked); returns the exit status.
pub fn main(argv: &[OsString]) -> u8 {
    let argv0 = argv.first().map_or("bwrap".to_string(), |a| a.to_string_lossy().into_owned());
    let mut args = Vec::with_capacity(argv.len());
    for arg in &argv[1.min(argv.len())..] {
        match arg.to_str() {
            Some(s) => args.push(s.to_string()),
            None => {
                return fail(
                    &format!("argument {arg:?} is not valid UTF-8 (tuixiu-sandbox's bwrap needs UTF-8)"),
                    false,
                );
            }
        }
    }
    // Variables that are not UTF-8 cannot travel in the request.
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let parsed = match parse::parse(&args, env, &mut SystemIo) {
        Ok(Outcome::Run(parsed)) => parsed,
        Ok(Outcome::Help) => {
            let _ = std::io::stdout().write_all(options::help(&argv0).as_bytes());
            return 0;
        }
        Ok(Outcome::Version) => {
            println!("{VERSION}");
            return 0;
        }
        Ok(Outcome::Usage) => {
            let _ = std::io::stderr().write_all(options::usage(&argv0).as_bytes());
            return 1;
        }
        Err(e) => return fail(&e.message, e.prefixed),
    };
    // Inside a sandbox of ours the outer launcher serves the request
    // (nested); anywhere else this process runs it itself.
    // What only the host serves is refused by the launcher's worker, which
    // checks every request (the request names those options).
    let nested = std::path::Path::new(sandbox::nested::SOCKET).exists();
    let outcome = if nested { client::run(&parsed) } else { host::run(&parsed) };
    match outcome {
        Ok(code) => code,
        Err(e) => fail(&e.to_string(), parsed.level_prefix),
    }
}

/// One diagnostic line, as bubblewrap prints it; exit status 1.
pub fn fail(message: &str, prefixed: bool) -> u8 {
    let level = if prefixed { "<3>" } else { "" };
    eprintln!("{level}bwrap: {}", parse::one_line(message));
    1
}

struct SystemIo;

impl Io for SystemIo {
    fn read_fd(&mut self, fd: i32) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        // SAFETY: F_GETFD only inspects the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the option hands this descriptor to us to read and close.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        Ok(data)
    }

    fn warn(&mut self, message: &str, prefixed: bool) {
        let level = if prefixed { "<4>" } else { "" };
        eprintln!("{level}bwrap: {message}");
    }

    fn selinux(&self) -> bool {
        sandbox::selinux::enabled().is_some()
    }

    fn check_label(&mut self, label: &str) -> std::io::Result<()> {
        let fs =
            sandbox::selinux::enabled().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        sandbox::selinux::check_context(&fs, label)
    }

    fn file_label(&mut self, label: &str) -> std::io::Result<()> {
        sandbox::selinux::set_fscreate(label)
    }
}

/// Whether this process was called as `bwrap` (the basename of `argv[0]`).
pub fn called_as_bwrap(argv0: Option<&OsString>) -> bool {
    argv0.and_then(|a| std::path::Path::new(a).file_name()).is_some_and(|n| n == "bwrap")
}

/// Whether the file this process runs is named `bwrap` (a copy or hard
/// link of the launcher installed under that name): what a caller that
/// resolves `bwrap`'s links before running it reaches.
pub fn installed_as_bwrap() -> bool {
    std::fs::read_link("/proc/self/exe").is_ok_and(|exe| exe.file_name().is_some_and(|n| n == "bwrap"))
}

/// Whether the arguments start with one of bubblewrap's options that is
/// none of ours (`--help`, `--version` and `-v` stay the launcher's).
pub fn bwrap_arguments(args: &[OsString]) -> bool {
    args.first()
        .and_then(|a| a.to_str())
        .is_some_and(|a| !matches!(a, "--help" | "--version") && options::find(a).is_some())
}
