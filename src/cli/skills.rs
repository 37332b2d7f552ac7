//! The arguments of `skills serve`, `skills run` and `skills check`
//! (the commands themselves: `cmd/skills.rs`; docs/skills.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Serve the Skill Runner HTTP API (/v1/skills, /v1/jobs...).
    ///
    /// Each job's engine runs in a fresh sandbox: the run directory is
    /// /workspace, the skill package is read-only at /skill, the engine's
    /// home is private to the run, and nothing from this process's
    /// environment reaches it unless the engines config passes it. Job state
    /// is kept under --data-dir and survives a restart (a job that was
    /// running is then marked failed). Prints `listening on ADDR` on stdout
    /// once the socket is bound.
    #[command(after_help = "Example:\n  \
        tuixiu-sandbox skills serve --skills-dir ./skills --data-dir ./data --listen 127.0.0.1:8000")]
    Serve(ServeArgs),

    /// Run one job locally, through the same code path as the server, and
    /// print its result JSON on stdout. Exit status 0 when it succeeded,
    /// 1 when it failed or was canceled, 125 when it could not be created.
    #[command(after_help = "Example:\n  \
        tuixiu-sandbox skills run --skill ./skills/demo --file input_file=numbers.md \\\n      \
        --input query=primes --parameter divisor=3 --engine codex")]
    Run(RunArgs),

    /// Check every skill package under a directory; print `ok ID` or
    /// `invalid DIR: MESSAGE` per package. Exit 0 when all are valid, 1 when not.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct EngineArgs {
    /// JSON file that changes the built-in engines (codex, gemini, iflow) or
    /// adds engines: {"engines": {"NAME": {"argv": [...], ...}}} (see docs/skills.md)
    #[arg(long, value_name = "FILE")]
    pub engines: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Wall-clock limit of each engine run (e.g. 90s, 20m, 1h); a request may
    /// ask for less with runtime_options.hard_timeout_seconds
    #[arg(long, value_name = "DURATION", default_value = "20m", value_parser = parse_duration)]
    pub job_timeout: Duration,

    /// Grace period between SIGTERM and SIGKILL on timeout or cancel
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub kill_grace: Duration,

    /// Bytes of an engine's stdout, and of its stderr, kept on disk per
    /// engine process: the start and the last 1 MiB, with a line saying
    /// how much was left out between them
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub max_log: u64,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Directory holding one skill package per subdirectory (SKILL.md, assets/runner.json)
    #[arg(long, value_name = "DIR")]
    pub skills_dir: PathBuf,

    /// Where jobs, uploads and runs are kept (created if missing)
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// Address to listen on; port 0 picks a free one
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: std::net::SocketAddr,

    #[command(flatten)]
    pub engines: EngineArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    /// Engines running at the same time
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_concurrent: usize,

    /// Jobs waiting for a slot before creates and uploads get 429
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_queue: usize,

    /// Largest upload (the zip as sent), e.g. 100M
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub max_upload: u64,

    /// Most entries in an upload zip
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub zip_max_entries: u64,

    /// Most bytes one file of an upload zip may extract to
    #[arg(long, value_name = "SIZE", default_value = "20M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub zip_max_file: u64,

    /// Most bytes an upload zip may extract to in total
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub zip_max_total: u64,

    /// Serve temporary skill runs (POST /v1/temp-skill-runs): clients upload
    /// a skill package with each run, checked like an installed one. Off by
    /// default: the package's SKILL.md then tells the engine what to do,
    /// with the engines' credentials and network
    #[arg(long)]
    pub temp_skills: bool,

    /// Serve skill package installs (POST /v1/skill-packages/install):
    /// clients add or update packages in --skills-dir. Off by default, for
    /// the same reason as --temp-skills
    #[arg(long)]
    pub install_skills: bool,

    /// Result-cache entries kept; the least recently used is evicted
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub cache_entries: usize,

    /// Time a client has to send a request's headers (a connection that
    /// is idle or too slow is closed)
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// Time a client has to send a request's body (408 after it)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub body_timeout: Duration,

    /// Connections open at a time; more wait until one closes
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,

    /// Serve Prometheus metrics (jobs by status, queue depth, the result
    /// cache) at http://ADDR/metrics: IP:PORT or unix:/PATH [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<tuixiu_sandbox::metrics::Listen>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The skill package directory
    #[arg(long, value_name = "DIR")]
    pub skill: PathBuf,

    /// Inline input KEY=VALUE (VALUE is read as JSON when it parses, else as a string; repeatable)
    #[arg(long = "input", value_name = "KEY=VALUE", action = clap::ArgAction::Append)]
    pub input: Vec<String>,

    /// File input KEY=PATH, given to the engine as uploads/KEY (repeatable)
    #[arg(long = "file", value_name = "KEY=PATH", action = clap::ArgAction::Append)]
    pub file: Vec<String>,

    /// Parameter KEY=VALUE (VALUE as for --input; repeatable)
    #[arg(long = "parameter", value_name = "KEY=VALUE", action = clap::ArgAction::Append)]
    pub parameter: Vec<String>,

    /// Engine to run
    #[arg(long, value_name = "NAME", default_value = "codex")]
    pub engine: String,

    /// Model to ask the engine for
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,

    /// Where the run is kept [default: a new directory under the temp dir, printed on stderr]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    #[command(flatten)]
    pub engines: EngineArgs,

    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Directory holding one skill package per subdirectory
    #[arg(long, value_name = "DIR")]
    pub skills_dir: PathBuf,

    #[command(flatten)]
    pub engines: EngineArgs,
}

/// A `--job-timeout` or `--kill-grace` that does not parse (clap prints it
/// after the option).
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration (e.g. 90s, 20m, 1h)")]
    NotDuration(String),
    #[error("the duration must be more than 0")]
    Zero,
}

fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| DurationError::NotDuration(s.into()))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)).and_then(nonzero),
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(DurationError::NotDuration(s.into())),
    };
    nonzero(Duration::from_secs(secs))
}

fn nonzero(d: Duration) -> Result<Duration, DurationError> {
    if d.is_zero() { Err(DurationError::Zero) } else { Ok(d) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_errors_keep_their_text() {
        assert_eq!(
            parse_duration("x").unwrap_err().to_string(),
            format!("{:?} is not a duration (e.g. 90s, 20m, 1h)", "x")
        );
        assert_eq!(parse_duration("0s").unwrap_err().to_string(), "the duration must be more than 0");
        assert_eq!(parse_duration("20m").unwrap(), Duration::from_secs(1200));
    }
}
