//! `skills serve`, `skills run`, `skills check`: the Skill Runner protocol
//! (docs/skills.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use crate::inputs::ZipLimits;
use crate::skills::engines::Engines;
use crate::skills::jobs::{ApiError, Config, Family, Service};
use crate::skills::listener::{self, ConnLimits};
use crate::skills::package;
use crate::skills::run::JobLimits;
use crate::{EXIT_TOOL_ERROR, report_error};
use tuixiu_sandbox::metrics::{Endpoint, MetricsError};

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

/// Errors of `skills serve`, `skills run` and `skills check`: one line
/// each, printed after `tuixiu-sandbox: `.
#[derive(Debug, thiserror::Error)]
pub enum SkillsError {
    /// The engines config (its own text).
    #[error("{0}")]
    Engines(#[source] crate::skills::engines::ConfigError),
    /// The job service could not open its data directory (its own text).
    #[error("{0}")]
    Service(#[source] crate::skills::jobs::OpenError),
    #[error("cannot find the launcher executable: {0}")]
    Launcher(#[source] std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("--skills-dir {}: not a directory", .0.display())]
    SkillsDir(PathBuf),
    #[error("--listen {addr}: {}", sandbox::error::io_error_text(.source))]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The bound socket's own address.
    #[error(transparent)]
    LocalAddr(std::io::Error),
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
    /// `--metrics-listen` (its own text).
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("{flag} {item:?}: expected KEY=VALUE")]
    KeyValue { flag: &'static str, item: String },
    #[error("--skill {}: {source}", .path.display())]
    Skill {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--skill {}: not a skill package directory", .0.display())]
    NotSkill(PathBuf),
    #[error("--file {0:?}: expected KEY=PATH")]
    FileArg(String),
    #[error("cannot create a data directory: {0}")]
    DataDir(#[source] std::io::Error),
    /// The job service refused the job (the HTTP API's `detail`).
    #[error("{0}")]
    Job(ApiError),
    #[error("the job vanished")]
    Vanished,
}

pub fn main(command: SkillsCommand) -> u8 {
    match command {
        SkillsCommand::Serve(args) => serve(args),
        SkillsCommand::Run(args) => run(args),
        SkillsCommand::Check(args) => check(args),
    }
}

fn engines(args: &EngineArgs) -> Result<Engines, SkillsError> {
    match &args.engines {
        Some(path) => Engines::load(path).map_err(SkillsError::Engines),
        None => Ok(Engines::builtin()),
    }
}

fn launcher() -> Result<PathBuf, SkillsError> {
    tuixiu_sandbox::launcher::launcher_exe().map_err(SkillsError::Launcher)
}

fn limits(args: &LimitArgs) -> JobLimits {
    JobLimits { timeout: args.job_timeout, kill_grace: args.kill_grace, max_log: args.max_log.max(1024) }
}

fn runtime(multi: bool) -> Result<tokio::runtime::Runtime, SkillsError> {
    let mut b = if multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    b.enable_all().build().map_err(SkillsError::Runtime)
}

fn serve(args: ServeArgs) -> u8 {
    let setup = || -> Result<(tokio::runtime::Runtime, Config, Option<Endpoint>), SkillsError> {
        if !args.skills_dir.is_dir() {
            return Err(SkillsError::SkillsDir(args.skills_dir.clone()));
        }
        let cfg = Config {
            limits: limits(&args.limits),
            max_concurrent: args.max_concurrent.max(1),
            max_queue: args.max_queue,
            max_upload_bytes: args.max_upload,
            zip: ZipLimits {
                max_entries: args.zip_max_entries,
                max_file_bytes: args.zip_max_file,
                max_total_bytes: args.zip_max_total,
            },
            temp_skills: args.temp_skills,
            install_skills: args.install_skills,
            cache_entries: args.cache_entries.max(1),
            body_timeout: args.body_timeout,
            ..Config::new(
                args.skills_dir.clone(),
                args.data_dir.clone(),
                engines(&args.engines)?,
                launcher()?,
            )
        };
        let metrics = args.metrics_listen.as_ref().map(Endpoint::bind).transpose()?;
        Ok((runtime(true)?, cfg, metrics))
    };
    let (rt, cfg, metrics) = match setup() {
        Ok(x) => x,
        Err(e) => {
            report_error(e);
            return EXIT_TOOL_ERROR;
        }
    };
    let result = rt.block_on(async move {
        let svc = Service::open(cfg).await.map_err(SkillsError::Service)?;
        if let Some(endpoint) = metrics {
            tracing::info!("metrics on {}/metrics", endpoint.local());
            tokio::spawn(tuixiu_sandbox::metrics::serve(
                endpoint,
                crate::skills::metrics::render(svc.clone()),
            ));
        }
        if let Ok((_, invalid)) = package::scan(&args.skills_dir, &svc.config().engines.names()) {
            for bad in invalid {
                report_error(format!("skill package {}: {}", bad.dir, bad.message));
            }
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|source| SkillsError::Listen { addr: args.listen, source })?;
        let addr = listener.local_addr().map_err(SkillsError::LocalAddr)?;
        println!("listening on {addr}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let conns =
            ConnLimits { header_timeout: args.header_timeout, max_connections: args.max_connections.max(1) };
        listener::serve(svc, listener, shutdown_signal(), conns).await.map_err(SkillsError::Serve)
    });
    // Blocking tasks still running (a bundle being built, a stalled
    // download's read) do not hold the exit; the sandboxes die with us.
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// `KEY=VALUE` with VALUE as JSON when it parses, else a string.
fn key_values(flag: &'static str, items: &[String]) -> Result<Map<String, Value>, SkillsError> {
    let mut out = Map::new();
    for item in items {
        let (k, v) =
            item.split_once('=').ok_or_else(|| SkillsError::KeyValue { flag, item: item.clone() })?;
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
        out.insert(k.to_string(), value);
    }
    Ok(out)
}

fn run(args: RunArgs) -> u8 {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}

fn run_inner(args: RunArgs) -> Result<u8, SkillsError> {
    let skill_dir = args
        .skill
        .canonicalize()
        .map_err(|source| SkillsError::Skill { path: args.skill.clone(), source })?;
    let (Some(skills_dir), Some(id)) = (skill_dir.parent(), skill_dir.file_name().and_then(|n| n.to_str()))
    else {
        return Err(SkillsError::NotSkill(args.skill.clone()));
    };
    let mut files = Vec::new();
    for item in &args.file {
        let (k, p) = item.split_once('=').ok_or_else(|| SkillsError::FileArg(item.clone()))?;
        files.push((k.to_string(), PathBuf::from(p)));
    }
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            let d = tempfile::Builder::new()
                .prefix("tuixiu-skills-run-")
                .tempdir()
                .map_err(SkillsError::DataDir)?
                .keep();
            eprintln!("tuixiu-sandbox: run data in {}", d.display());
            d
        }
    };
    let cfg = Config {
        limits: limits(&args.limits),
        max_concurrent: 1,
        max_queue: 1,
        max_upload_bytes: u64::MAX,
        ..Config::new(skills_dir.to_path_buf(), data_dir, engines(&args.engines)?, launcher()?)
    };
    let body = json!({
        "skill_id": id,
        "engine": args.engine,
        "input": key_values("--input", &args.input)?,
        "parameter": key_values("--parameter", &args.parameter)?,
        "model": args.model,
    });
    runtime(false)?.block_on(async move {
        let svc = Service::open(cfg).await.map_err(SkillsError::Service)?;
        let created = svc.create_with(&body, !files.is_empty()).await.map_err(SkillsError::Job)?;
        let request_id = created["request_id"].as_str().unwrap_or_default().to_string();
        if created["status"].is_null() {
            svc.upload_files(&request_id, &files).await.map_err(SkillsError::Job)?;
        }
        let job = svc.handle(&request_id).ok_or(SkillsError::Vanished)?;
        let record = job.finished().await;
        let result = svc.result(Family::Jobs, &request_id).await.ok().map(|r| r["result"].clone());
        let printed =
            result.unwrap_or_else(|| json!({"status": "failed", "data": null, "error": record.error}));
        println!("{}", serde_json::to_string_pretty(&printed).expect("plain data"));
        Ok(if record.status == Some(crate::skills::store::Status::Succeeded) { 0 } else { 1 })
    })
}

fn check(args: CheckArgs) -> u8 {
    let names = match engines(&args.engines) {
        Ok(e) => e.names(),
        Err(e) => {
            report_error(e);
            return EXIT_TOOL_ERROR;
        }
    };
    match package::scan(&args.skills_dir, &names) {
        Ok((valid, invalid)) => {
            for s in &valid {
                println!("ok {}", s.id);
            }
            for bad in &invalid {
                println!("invalid {}: {}", bad.dir, bad.message);
            }
            u8::from(!invalid.is_empty())
        }
        Err(e) => {
            report_error(format!("--skills-dir {}: {e}", args.skills_dir.display()));
            EXIT_TOOL_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts, as the `format!`s they replaced wrote them.
    #[test]
    fn error_texts() {
        let e = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        let again = || std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let path = PathBuf::from("/no/such");
        let cases: Vec<(SkillsError, String)> = vec![
            (
                SkillsError::Engines(crate::skills::engines::ConfigError::Name {
                    path: path.clone(),
                    name: "x y".into(),
                }),
                format!("engines config {}: invalid engine name \"x y\"", path.display()),
            ),
            (SkillsError::Launcher(again()), format!("cannot find the launcher executable: {e}")),
            (SkillsError::Runtime(again()), format!("cannot start the async runtime: {e}")),
            (
                SkillsError::SkillsDir(path.clone()),
                format!("--skills-dir {}: not a directory", path.display()),
            ),
            (
                SkillsError::Listen { addr, source: again() },
                format!("--listen {addr}: {}", sandbox::error::io_error_text(&e)),
            ),
            (SkillsError::LocalAddr(again()), e.to_string()),
            (SkillsError::Serve(again()), format!("serving: {e}")),
            (
                SkillsError::KeyValue { flag: "--input", item: "x".into() },
                format!("{} {:?}: expected KEY=VALUE", "--input", "x"),
            ),
            (
                SkillsError::Skill { path: path.clone(), source: again() },
                format!("--skill {}: {e}", path.display()),
            ),
            (
                SkillsError::NotSkill(path.clone()),
                format!("--skill {}: not a skill package directory", path.display()),
            ),
            (SkillsError::FileArg("x".into()), format!("--file {:?}: expected KEY=PATH", "x")),
            (SkillsError::DataDir(again()), format!("cannot create a data directory: {e}")),
            (SkillsError::Job(ApiError::new(404, "Skill 'x' not found")), "Skill 'x' not found".into()),
            (SkillsError::Vanished, "the job vanished".into()),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
        assert_eq!(
            parse_duration("x").unwrap_err().to_string(),
            format!("{:?} is not a duration (e.g. 90s, 20m, 1h)", "x")
        );
        assert_eq!(parse_duration("0s").unwrap_err().to_string(), "the duration must be more than 0");
        assert_eq!(parse_duration("20m").unwrap(), Duration::from_secs(1200));
    }
}
