//! `tuixiu-sandbox`: the small launcher.
//!
//! A plain native `run`, the `__exec` helper and `bwrap` (the front end of
//! nested sandboxes, also when called as `bwrap`) are handled here, in a
//! binary that links only what they need, so a sandbox starts without
//! paying for the daemon, the HTTP clients and servers, or the full
//! argument parser. `proxy` is handed to the daemon's own binary,
//! `tuixiu-sandbox-proxy`, and every other command (and `--help`) to
//! `tuixiu-sandbox-full`, both next to this binary, with the same arguments.
//!
//! Every sandbox start pays for this binary's own start, so it skips what
//! it does not need of Rust's runtime set-up (`#![no_main]`): the main
//! thread's stack-overflow handler, for which the runtime reads and parses
//! `/proc/self/maps` and maps an alternate signal stack. What the launcher
//! relies on is done in [`main`]: SIGPIPE ignored (a closed stderr or
//! status pipe is an error, not death) and descriptors 0-2 open.
#![no_main]

use std::ffi::OsString;

use clap::{Arg, ArgAction, Args, Command, FromArgMatches};
use tuixiu_sandbox::launcher::args::{ExecArgs, RunArgs, RunGiven};
use tuixiu_sandbox::launcher::{self, EXIT_TOOL_ERROR};

/// The C entry point (glibc calls it with the arguments, which std reads
/// on its own).
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    launcher::runtime_setup();
    libc::c_int::from(launch())
}

fn launch() -> u8 {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Bound as `bwrap` inside a sandbox, called through a link or copy
    // named `bwrap`, installed as a file named `bwrap` (whatever argv[0]
    // says), or called with bubblewrap's options (as `/proc/self/exe
    // --unshare-all ...` from inside a bwrap sandbox): bubblewrap's command
    // line (docs/bwrap.md, "Installing it as bwrap").
    if tuixiu_sandbox::bwrap::called_as_bwrap(argv.first())
        || tuixiu_sandbox::bwrap::bwrap_arguments(&argv[1.min(argv.len())..])
        || tuixiu_sandbox::bwrap::installed_as_bwrap()
    {
        return tuixiu_sandbox::bwrap::main(&argv);
    }
    let (verbose, skipped) = launcher::leading_verbose(&argv[1..]);
    let at = 1 + skipped;
    match argv.get(at).and_then(|a| a.to_str()) {
        Some("run") => run(&argv, at, verbose),
        Some("__exec") => exec(&argv, at, verbose),
        Some("bwrap") => tuixiu_sandbox::bwrap::main(&argv[at..]),
        Some("proxy") => launcher::exec_daemon(&argv),
        _ => launcher::exec_full(&argv),
    }
}

/// Parses `SUB ARGS...` (from `argv[at]`) with the shared argument
/// definitions. `None` means the full tool should answer (help, version).
fn parse<T: Args + FromArgMatches>(
    argv: &[OsString],
    at: usize,
    name: &'static str,
) -> Result<(T, clap::ArgMatches, u8), u8> {
    let command = T::augment_args(
        Command::new(name)
            .bin_name(format!("tuixiu-sandbox {name}"))
            .arg(Arg::new("verbose").short('v').long("verbose").action(ArgAction::Count).hide(true)),
    );
    let matches = match command.try_get_matches_from(&argv[at..]) {
        Ok(m) => m,
        Err(e) => {
            return Err(match e.kind() {
                // The full tool has the complete help texts.
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    launcher::exec_full(argv)
                }
                _ => {
                    let _ = e.print();
                    EXIT_TOOL_ERROR
                }
            });
        }
    };
    let verbose = matches.get_count("verbose");
    match T::from_arg_matches(&matches) {
        Ok(args) => Ok((args, matches, verbose)),
        Err(e) => {
            let _ = e.print();
            Err(EXIT_TOOL_ERROR)
        }
    }
}

fn run(argv: &[OsString], at: usize, verbose: u8) -> u8 {
    let (args, given, more) = match launcher::fast_args::parse_run(&argv[at + 1..]) {
        Some(parsed) => parsed,
        None => match parse::<RunArgs>(argv, at, "run") {
            Ok((args, matches, more)) => (args, RunGiven::from_matches(&matches), more),
            Err(code) => return code,
        },
    };
    if launcher::needs_full(&args) {
        return launcher::exec_full(argv);
    }
    launcher::init_logging(verbose.saturating_add(more));
    launcher::run::plain(args, &given)
}

fn exec(argv: &[OsString], at: usize, verbose: u8) -> u8 {
    let (args, _, more) = match parse::<ExecArgs>(argv, at, "__exec") {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    launcher::init_logging(verbose.saturating_add(more));
    launcher::exec::main(args)
}
