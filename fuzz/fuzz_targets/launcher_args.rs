//! The launcher's fast argument parser (`launcher::fast_args::parse_run`)
//! against clap with the same definitions (`launcher::args::RunArgs`, as
//! src/main.rs builds the command).
//!
//! The input is the arguments after `run`, separated by NUL bytes (any
//! bytes: non-UTF-8 arguments included).
//!
//! Checked: whenever the fast parser takes a command line, clap takes it
//! too and yields the same options, the same record of what was given
//! (mount order, explicit options) and the same `-v` count. A command line
//! the fast parser declines goes to clap, so declining is always allowed.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use clap::{Arg, ArgAction, Args, Command, FromArgMatches};
use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::launcher::args::{RunArgs, RunGiven};
use tuixiu_sandbox::launcher::fast_args::parse_run;

fuzz_target!(|data: &[u8]| {
    let args: Vec<OsString> =
        data.split(|&b| b == 0).take(64).map(|a| OsString::from_vec(a.to_vec())).collect();
    let Some((fast, fast_given, fast_verbose)) = parse_run(&args) else { return };
    let command = RunArgs::augment_args(
        Command::new("run")
            .bin_name("tuixiu-sandbox run")
            .arg(Arg::new("verbose").short('v').long("verbose").action(ArgAction::Count).hide(true)),
    );
    let matches = command
        .try_get_matches_from(std::iter::once(OsString::from("run")).chain(args.iter().cloned()))
        .unwrap_or_else(|e| panic!("the fast parser took {args:?}, clap refused it: {e}"));
    let parsed = RunArgs::from_arg_matches(&matches)
        .unwrap_or_else(|e| panic!("the fast parser took {args:?}, clap refused it: {e}"));
    assert_eq!(format!("{fast:?}"), format!("{parsed:?}"), "options differ for {args:?}");
    assert_eq!(fast_given, RunGiven::from_matches(&matches), "what was given differs for {args:?}");
    assert_eq!(fast_verbose, matches.get_count("verbose"), "-v differs for {args:?}");
});
