//! `skills serve`, `skills run`, `skills check`: the Skill Runner protocol
//! (docs/skills.md).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::cli::skills::{CheckArgs, EngineArgs, LimitArgs, RunArgs, ServeArgs, SkillsCommand};
use crate::inputs::ZipLimits;
use crate::skills::engines::Engines;
use crate::skills::jobs::{ApiError, Config, Family, Service};
use crate::skills::listener::{self, ConnLimits};
use crate::skills::package;
use crate::skills::run::JobLimits;
use crate::{EXIT_TOOL_ERROR, report_error};
use tuixiu_sandbox::metrics::{Endpoint, MetricsError};

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
    }
}
