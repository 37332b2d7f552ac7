//! The `proxy` command line, shared by the full tool and the daemon's own
//! binary (`tuixiu-sandbox-proxy`, which the launcher runs for `proxy`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Args, Command, FromArgMatches, ValueEnum};

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

    /// Read the proxy JWT (auth_token) from FILE: a systemd credential, a
    /// mounted secret; wins over ACP_PROXY_AUTH_TOKEN and the config
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// Read the bootstrap registration secret (bootstrap_token) from FILE;
    /// wins over ACP_PROXY_BOOTSTRAP_TOKEN and the config
    #[arg(long, value_name = "FILE")]
    pub bootstrap_token_file: Option<PathBuf>,

    /// Log lines on stderr: `text`, or `json` (one object per line, for
    /// journald and log shippers)
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Serve Prometheus metrics at http://ADDR/metrics: IP:PORT (a loopback
    /// address unless the network is private to the daemon) or unix:/PATH
    /// [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<crate::metrics::Listen>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl ProxyArgs {
    /// The daemon's options, with the token files read.
    pub fn options(self) -> Result<super::Options, TokenFileError> {
        let mut overrides = Vec::new();
        for (flag, file, key) in [
            ("--auth-token-file", &self.auth_token_file, "ACP_PROXY_AUTH_TOKEN"),
            ("--bootstrap-token-file", &self.bootstrap_token_file, "ACP_PROXY_BOOTSTRAP_TOKEN"),
        ] {
            if let Some(path) = file {
                overrides.push((key.to_string(), read_secret(flag, path)?));
            }
        }
        Ok(super::Options {
            config: self.config,
            state_dir: self.state_dir,
            allow_insecure_ws: self.allow_insecure_ws,
            overrides,
            metrics_listen: self.metrics_listen,
        })
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("{flag} {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Read { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{flag} {}: the file is empty", .path.display())]
    Empty { flag: &'static str, path: PathBuf },
    #[error("{flag} {}: more than one line", .path.display())]
    Lines { flag: &'static str, path: PathBuf },
}

/// A secret kept in a file: its contents without the trailing newline.
fn read_secret(flag: &'static str, path: &Path) -> Result<String, TokenFileError> {
    let path_buf = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
        flag,
        path: path_buf(),
        source,
    })?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.trim().is_empty() {
        return Err(TokenFileError::Empty { flag, path: path_buf() });
    }
    if secret.contains(['\n', '\r']) {
        return Err(TokenFileError::Lines { flag, path: path_buf() });
    }
    Ok(secret.to_string())
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
    Some(start(args, verbose))
}

/// Runs the daemon: logging as asked, then [`super::main`].
pub fn start(args: ProxyArgs, verbose: u8) -> u8 {
    init_logging(verbose, args.log_format);
    match args.options() {
        Ok(options) => super::main(options),
        Err(e) => {
            crate::launcher::report_error(format!("proxy: {e}"));
            sandbox::EXIT_SETUP_FAILED
        }
    }
}

/// Logging on stderr as `--log-format` says, with `-v` and `TUIXIU_LOG` as
/// for every command.
fn init_logging(verbose: u8, format: LogFormat) {
    match format {
        LogFormat::Text => crate::launcher::init_logging_with_directives(verbose),
        LogFormat::Json => {
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_env_filter(crate::launcher::log_filter(verbose))
                .with_writer(std::io::stderr)
                .with_target(false)
                .init();
        }
    }
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
