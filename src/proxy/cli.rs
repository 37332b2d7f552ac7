//! The `proxy` command line, shared by the full tool and the daemon's own
//! binary (`tuixiu-sandbox-proxy`, which the launcher runs for `proxy`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Args, Command, FromArgMatches};

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The TOML config file (the Node acp-proxy's keys are accepted; see docs/proxy.toml.example)
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// State directory (identity, lock, run state) [default: state_dir, else $XDG_STATE_HOME/tuixiu-sandbox]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Allow plain ws:// to a non-loopback backend (tokens travel unencrypted; testing only)
    #[arg(long)]
    pub allow_insecure_ws: bool,
}

impl ProxyArgs {
    pub fn options(self) -> super::Options {
        super::Options {
            config: self.config,
            state_dir: self.state_dir,
            allow_insecure_ws: self.allow_insecure_ws,
        }
    }
}

/// Parses `[-v...] proxy [OPTIONS]` (`argv` without the program name) with
/// the `proxy` options alone, and the `-v` count; `None` when the command
/// line is not that, or asks for help, or is wrong: the full tool's parser
/// then answers, with every command's help and its error messages.
///
/// The daemon lives long, and whatever it touches while starting stays
/// mapped: building the parser of every command (their options and help
/// texts) would map code and data it never uses again.
pub fn parse(argv: &[OsString]) -> Option<(ProxyArgs, u8)> {
    let (verbose, at) = crate::launcher::leading_verbose(argv);
    if argv.get(at).is_none_or(|a| a != "proxy") {
        return None;
    }
    let command = ProxyArgs::augment_args(
        Command::new("proxy").arg(Arg::new("verbose").short('v').long("verbose").action(ArgAction::Count)),
    );
    let matches = command.try_get_matches_from(&argv[at..]).ok()?;
    let args = ProxyArgs::from_arg_matches(&matches).ok()?;
    Some((args, verbose.saturating_add(matches.get_count("verbose"))))
}

/// Runs the daemon when `argv` (without the program name) is a `proxy`
/// command line [`parse`] takes; `None` otherwise.
pub fn run(argv: &[OsString]) -> Option<u8> {
    let (args, verbose) = parse(argv)?;
    crate::launcher::init_logging_with_directives(verbose);
    Some(super::main(args.options()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Option<(String, u8)> {
        let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse(&argv).map(|(a, v)| (format!("{a:?}"), v))
    }

    #[test]
    fn takes_proxy_options_and_leaves_the_rest() {
        let (args, verbose) =
            parse_strs(&["-v", "proxy", "--config", "p.toml", "-vv", "--allow-insecure-ws"]).unwrap();
        assert!(args.contains("\"p.toml\"") && args.contains("allow_insecure_ws: true"), "{args}");
        assert_eq!(verbose, 3);
        assert!(parse_strs(&["proxy", "-c", "p.toml", "--state-dir", "/s"]).is_some());
        for other in
            [&["run", "--", "true"][..], &["proxy", "--help"], &["proxy", "--bogus"], &[], &["--", "proxy"]]
        {
            assert_eq!(parse_strs(other), None, "{other:?}");
        }
    }
}
