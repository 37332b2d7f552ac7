//! One job's run: its directory, its sandbox, its engine, its result.
//!
//! ```text
//! <data>/runs/<run_id>/
//!   input.json            what was asked (server-owned)
//!   logs/                 prompt.txt stdout.txt stderr.txt
//!   result/result.json    the result (upstream's shape)
//!   home/                 the engine's home for this run; removed afterwards
//!   workspace/            = /workspace in the sandbox (read-write)
//!     uploads/            the promoted upload, bound read-only over itself
//!     artifacts/          where the engine puts its files
//!   bundle/               bundles, built on first download
//! ```
//!
//! The sandbox: the host's system directories read-only, a fresh /proc,
//! /dev and /tmp, the workspace read-write, the per-run home read-write,
//! the skill package read-only at `/skill` (and where the engine looks for
//! skills), no variable from the server's environment unless the engine's
//! configuration names it. The server is multi-threaded, so the sandbox is
//! never created here: the engine runs under `tuixiu-sandbox __exec` (the
//! single-threaded launcher), which reads the spec from descriptor 3. The
//! launcher gets `PR_SET_PDEATHSIG(SIGKILL)`, so a server that dies takes
//! its sandboxes with it (the sandbox's PID 1 dies with its launcher).
//!
//! Time limit and cancel: SIGTERM to the launcher, which relays it into
//! the sandbox; after a grace period SIGKILL, which ends every process of
//! the sandbox.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::memfd::{MFdFlags, memfd_create};
use sandbox::{Access, Home, HostIds, MountOp, Network, SandboxBuilder, SandboxSpec};
use serde_json::{Value, json};

use super::artifacts;
use super::engines::{self, Engine, NetworkChoice};
use super::inputs::{self, Contexts};
use super::package::Skill;
use super::prompt;
use super::store::JobRecord;
use crate::hostfs::beneath as fsio;

/// Where the run directory appears in the sandbox.
pub const GUEST_RUN_DIR: &str = "/workspace";
/// Where the skill package appears in the sandbox.
pub const GUEST_SKILL_DIR: &str = "/skill";
/// The sandbox user's home.
const GUEST_HOME: &str = "/home/agent";
/// Most of stdout read back to find the answer (its end).
const MAX_STDOUT_READ: u64 = 16 << 20;
/// How much of stderr goes into an error.
const STDERR_TAIL: u64 = 4096;

/// The paths of one run.
#[derive(Clone, Debug)]
pub struct RunPaths {
    pub dir: PathBuf,
    pub workspace: PathBuf,
    pub uploads: PathBuf,
    pub logs: PathBuf,
    pub home: PathBuf,
    pub result: PathBuf,
}

impl RunPaths {
    pub fn new(data_dir: &Path, run_id: &str) -> RunPaths {
        let dir = data_dir.join("runs").join(run_id);
        let workspace = dir.join("workspace");
        RunPaths {
            uploads: workspace.join("uploads"),
            logs: dir.join("logs"),
            home: dir.join("home"),
            result: dir.join("result").join("result.json"),
            workspace,
            dir,
        }
    }

    /// Creates the run directory. `uploads` may already have been moved in.
    pub fn create(&self) -> std::io::Result<()> {
        for d in [&self.workspace, &self.uploads, &self.logs, &self.home, &self.workspace.join("artifacts")] {
            std::fs::create_dir_all(d)?;
        }
        std::fs::create_dir_all(self.dir.join("result"))
    }
}

/// Limits of every job.
#[derive(Clone, Debug)]
pub struct JobLimits {
    /// Wall clock of the engine.
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL, for a timeout or a cancel.
    pub kill_grace: Duration,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits { timeout: Duration::from_secs(1200), kill_grace: Duration::from_secs(5) }
    }
}

/// Everything a run needs.
pub struct RunContext<'a> {
    pub skill: &'a Skill,
    pub engine: &'a Engine,
    pub record: &'a JobRecord,
    pub paths: &'a RunPaths,
    pub limits: &'a JobLimits,
    /// Host ids the sandbox user maps onto (root servers only).
    pub host_ids: Option<HostIds>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Succeeded { warnings: Vec<String> },
    Failed { error: Value, warnings: Vec<String> },
    Canceled,
}

/// What was prepared before the engine starts.
pub struct Prepared {
    pub spec: SandboxSpec,
    pub timeout: Duration,
    /// The egress proxy's policy (`network: "allow"`).
    pub egress: Option<crate::egress::Policy>,
}

/// Prepares the run: directories, `input.json`, the contexts (a failure
/// here fails the job before any engine runs, with no `result.json`),
/// the prompt, the engine's home and settings, the sandbox spec.
pub fn prepare(cx: &RunContext<'_>) -> Result<Prepared, Outcome> {
    let failed = |message: String| Outcome::Failed { error: json!({"message": message}), warnings: vec![] };
    let p = cx.paths;
    p.create().map_err(|e| failed(format!("cannot create the run directory {}: {e}", p.dir.display())))?;
    let r = cx.record;
    let input_json = json!({
        "request_id": r.request_id, "skill_id": r.skill_id, "engine": r.engine, "input": r.input,
        "parameter": r.parameter, "model": r.model, "runtime_options": r.runtime_options,
    });
    fsio::write_atomic(
        &p.dir.join("input.json"),
        &serde_json::to_vec_pretty(&input_json).expect("plain data"),
    )
    .map_err(|e| failed(format!("cannot write input.json: {e}")))?;

    let uploads = fsio::open_dir(&p.uploads).map_err(|e| failed(format!("cannot open the uploads: {e}")))?;
    let Contexts { input, parameter } =
        inputs::build(cx.skill, &r.input, &r.parameter, uploads.as_fd(), &format!("{GUEST_RUN_DIR}/uploads"))
            .map_err(|e| failed(e.to_string()))?;

    let skill_path = cx
        .engine
        .skill_path
        .as_ref()
        .map(|t| t.replace("{skill_id}", &cx.skill.id).replace("{home}", GUEST_HOME));
    let vars = prompt::Vars {
        skill: cx.skill,
        input: &input,
        parameter: &parameter,
        run_dir: GUEST_RUN_DIR,
        skill_dir: skill_path.as_deref().unwrap_or(GUEST_SKILL_DIR),
    };
    let text = prompt::build(&r.engine, &vars);
    std::fs::write(p.logs.join("prompt.txt"), &text)
        .map_err(|e| failed(format!("cannot write the prompt: {e}")))?;

    engine_files(cx).map_err(|e| failed(e.to_string()))?;
    let spec = spec(cx, &text, skill_path.as_deref()).map_err(|e| failed(e.to_string()))?;
    let timeout = match r.runtime_options.get("hard_timeout_seconds").and_then(Value::as_u64) {
        Some(s) => Duration::from_secs(s).min(cx.limits.timeout),
        None => cx.limits.timeout,
    };
    let egress = cx.engine.egress_policy().map_err(|e| failed(e.to_string()))?;
    Ok(Prepared { spec, timeout, egress })
}

/// Files the engine expects: host files copied into the home, and the
/// settings file in the run directory.
fn engine_files(cx: &RunContext<'_>) -> Result<(), RunError> {
    let home_file = |what: String| move |source| RunError::HomeFile { what, source };
    for f in &cx.engine.home_files {
        let dst = cx.paths.home.join(&f.dst);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(home_file(f.dst.clone()))?;
        }
        std::fs::copy(&f.src, &dst).map_err(home_file(f.src.display().to_string()))?;
    }
    if let Some(settings) = &cx.engine.settings {
        let mut value = json!({});
        if let Some(rel) = &settings.from_skill {
            let dir = fsio::open_dir(&cx.skill.dir).map_err(RunError::Io)?;
            if let Ok(bytes) = fsio::read_beneath(dir.as_fd(), rel, fsio::Links::Follow, 1 << 20) {
                value = serde_json::from_slice(&bytes)
                    .map_err(|source| RunError::SkillSettings { rel: rel.clone(), source })?;
            }
        }
        engines::merge(&mut value, &settings.enforced);
        let dst = cx.paths.workspace.join(&settings.file);
        let settings_file = |source| RunError::Settings { file: settings.file.clone(), source };
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(settings_file)?;
        }
        std::fs::write(&dst, serde_json::to_vec_pretty(&value).expect("plain data"))
            .map_err(settings_file)?;
    }
    Ok(())
}

/// Why a run could not be prepared or its sandbox not started.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("home_files {what}: {source}")]
    HomeFile { what: String, source: std::io::Error },
    #[error("{rel} in the skill package: {source}")]
    SkillSettings { rel: String, source: serde_json::Error },
    #[error("settings {file}: {source}")]
    Settings { file: String, source: std::io::Error },
    #[error("the engine's command is empty")]
    EmptyCommand,
    #[error("sandbox spec: {0}")]
    Spec(sandbox::SpecError),
    #[error("memfd for the sandbox spec: {0}")]
    Memfd(std::io::Error),
    #[error("cannot start {} __exec: {}", .launcher.display(), sandbox::error::io_error_text(.source))]
    Start { launcher: std::path::PathBuf, source: std::io::Error },
    #[error("waiting for the sandbox: {0}")]
    Wait(std::io::Error),
    #[error("{0}")]
    Io(std::io::Error),
}

fn spec(cx: &RunContext<'_>, prompt: &str, skill_path: Option<&str>) -> Result<SandboxSpec, RunError> {
    let argv = cx.engine.argv(prompt, cx.record.model.as_deref(), &cx.skill.id);
    let (program, args) = argv.split_first().ok_or(RunError::EmptyCommand)?;
    let mut b = SandboxBuilder::new(program.clone())
        .args(args.iter().cloned())
        .workspace(&cx.paths.workspace)
        .home(Home::Bind(cx.paths.home.clone()))
        .network(match cx.engine.network {
            NetworkChoice::On => Network::On,
            NetworkChoice::Off => Network::Off,
            NetworkChoice::Allow => Network::Proxied,
        })
        .hostname("skill-runner")
        .cwd(GUEST_RUN_DIR);
    if let Some(ids) = cx.host_ids {
        b = b.map_to_host(ids);
    }
    let ro = |src: &Path, dst: &str| MountOp::Bind {
        src: src.to_path_buf(),
        dst: dst.to_string(),
        access: Access::Ro,
    };
    b = b.mount(ro(&cx.paths.uploads, &format!("{GUEST_RUN_DIR}/uploads")));
    b = b.mount(ro(&cx.skill.dir, GUEST_SKILL_DIR));
    if let Some(path) = skill_path {
        b = b.mount(ro(&cx.skill.dir, path));
    }
    for bind in &cx.engine.ro_binds {
        b = b.mount(ro(&bind.src, &bind.dst));
    }
    for (k, v) in &cx.engine.env {
        b = b.env(k.clone(), v.clone());
    }
    for k in &cx.engine.pass_env {
        if let Some(v) = std::env::var_os(k) {
            b = b.env(k.clone(), v.to_string_lossy().into_owned());
        }
    }
    b.build().map_err(RunError::Spec)
}

/// Why the engine stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Exited(i32),
    TimedOut,
    Canceled,
}

/// Starts the launcher with the spec on descriptor 3 and waits for it,
/// enforcing the timeout and the cancel signal.
pub async fn execute(
    launcher: &Path,
    paths: &RunPaths,
    prepared: &Prepared,
    grace: Duration,
    mut cancel: tokio::sync::watch::Receiver<bool>,
) -> Result<(Stop, Duration), RunError> {
    let spec_fd = spec_memfd(&prepared.spec.to_json()).map_err(RunError::Memfd)?;
    let stdout = std::fs::File::create(paths.logs.join("stdout.txt")).map_err(RunError::Io)?;
    let stderr = std::fs::File::create(paths.logs.join("stderr.txt")).map_err(RunError::Io)?;
    let mut cmd = std::process::Command::new(launcher);
    cmd.arg("__exec").arg("--spec-fd=3");
    cmd.env_clear();
    if let Some(filter) = std::env::var_os("TUIXIU_LOG") {
        cmd.env("TUIXIU_LOG", filter);
    }
    cmd.stdin(std::process::Stdio::null()).stdout(stdout).stderr(stderr);
    // Its own process group: a Ctrl-C meant for the server reaches the
    // sandbox only through the server's own shutdown.
    cmd.process_group(0);
    let raw = spec_fd.as_raw_fd();
    let parent = nix::unistd::getpid().as_raw();
    let hook = move || {
        let ok = if raw == 3 {
            // SAFETY: fcntl on a descriptor number; no memory is touched.
            unsafe { libc::fcntl(3, libc::F_SETFD, 0) }
        } else {
            // SAFETY: dup2 on descriptor numbers; no memory is touched.
            unsafe { libc::dup2(raw, 3) }
        };
        if ok < 0 {
            return Err(std::io::Error::last_os_error());
        }
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        // The server may have died before the death signal was set.
        if nix::unistd::getppid().as_raw() != parent {
            // SAFETY: ends the forked child at once, running nothing of
            // the parent's (no exit handlers, no buffers flushed).
            unsafe { libc::_exit(125) };
        }
        Ok(())
    };
    // SAFETY: only async-signal-safe calls (dup2, fcntl, prctl, getppid,
    // _exit) run between fork and exec.
    unsafe { cmd.pre_exec(hook) };
    let egress = pass_egress(&mut cmd, prepared)?;
    let started = Instant::now();
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| RunError::Start { launcher: launcher.to_path_buf(), source })?;
    drop(spec_fd);
    let _proxy = serve_egress(egress, prepared, paths)?;
    tracing::debug!("{}: the launcher was started in {:?}", paths.dir.display(), started.elapsed());
    let pid = child.id().map(|p| p as libc::pid_t);
    let signal = |sig: libc::c_int| {
        if let Some(pid) = pid {
            // SAFETY: `pid` is our child and is not reaped until
            // `child.wait()` returns in this task, so it cannot be reused.
            unsafe { libc::kill(pid, sig) };
        }
    };
    let deadline = tokio::time::Instant::now() + prepared.timeout;
    let mut stop = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = tokio::time::sleep_until(deadline), if stop.is_none() => {
                stop = Some(Stop::TimedOut);
                signal(libc::SIGTERM);
            }
            changed = cancel.changed(), if stop.is_none() => {
                if changed.is_err() || *cancel.borrow() {
                    stop = Some(Stop::Canceled);
                    signal(libc::SIGTERM);
                }
            }
            _ = tokio::time::sleep(grace), if stop.is_some() => signal(libc::SIGKILL),
        }
    };
    let status = status.map_err(RunError::Wait)?;
    let elapsed = started.elapsed();
    Ok(match stop {
        Some(s) => (s, elapsed),
        None => {
            use std::os::unix::process::ExitStatusExt;
            let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            (Stop::Exited(code), elapsed)
        }
    })
}

/// A proxied network (`network: "allow"`): the launcher gets
/// `--egress-fd`, on which the sandbox's listener comes back to us.
fn pass_egress(
    cmd: &mut std::process::Command,
    prepared: &Prepared,
) -> Result<Option<(OwnedFd, OwnedFd)>, RunError> {
    if prepared.egress.is_none() {
        return Ok(None);
    }
    let (launcher_end, ours) = egress_pair().map_err(RunError::Io)?;
    let fd = launcher_end.as_raw_fd();
    cmd.arg(format!("--egress-fd={fd}"));
    // SAFETY: fcntl on a descriptor number; no memory is touched.
    let keep = move || match unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    };
    // SAFETY: only fcntl runs between fork and exec.
    unsafe { cmd.pre_exec(keep) };
    Ok(Some((launcher_end, ours)))
}

/// The job's egress proxy, served while the launcher runs (the task ends
/// when the returned handle is dropped).
fn serve_egress(
    pair: Option<(OwnedFd, OwnedFd)>,
    prepared: &Prepared,
    paths: &RunPaths,
) -> Result<Option<crate::egress::ServeTask>, RunError> {
    let (Some((launcher_end, ours)), Some(policy)) = (pair, &prepared.egress) else { return Ok(None) };
    drop(launcher_end);
    let proxy = crate::egress::Proxy {
        policy: policy.clone(),
        limits: crate::egress::Limits::default(),
        resolver: crate::egress::Resolver::from_env().map_err(RunError::Io)?,
        stats: Default::default(),
        events: std::sync::Arc::new(JobEvents { log: paths.logs.join("egress.txt") }),
    };
    crate::egress::Handoff::new(ours).serve(std::sync::Arc::new(proxy)).map(Some).map_err(RunError::Io)
}

/// The egress listener's socket pair, the launcher's end above the
/// descriptors the hook above moves (3): nothing can land on it.
fn egress_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (launcher_end, ours) = crate::egress::socket_pair()?;
    let high = nix::fcntl::fcntl(&launcher_end, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that only we hold.
    Ok((unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) }, ours))
}

/// A job's egress refusals: one line each in `logs/egress.txt` (next to
/// the engine's stdout and stderr) and in the server's log.
struct JobEvents {
    log: std::path::PathBuf,
}

impl crate::egress::Events for JobEvents {
    fn denied(&self, denial: &crate::egress::Denial) {
        tracing::info!("{}: egress proxy: {denial}", self.log.display());
        let line = format!("{denial}\n");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.log);
        if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!("{}: {e}", self.log.display());
        }
    }
}

fn spec_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create(c"tuixiu-skill-spec", MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

/// Reads the answer, validates it, checks the required artifacts, and
/// writes `result/result.json`.
pub fn finish(cx: &RunContext<'_>, stop: Stop, timeout: Duration) -> Outcome {
    let p = cx.paths;
    let stderr_tail = tail(&p.logs.join("stderr.txt"), STDERR_TAIL);
    let artifacts = artifacts::list(&p.workspace);
    let mut warnings = Vec::new();
    let mut output_errors = Vec::new();
    let mut data = Value::Null;
    let mut repaired = false;
    let mut code = Value::Null;
    let message = match stop {
        Stop::Canceled => return write_canceled(p),
        Stop::TimedOut => {
            code = json!("TIMEOUT");
            Some(format!("TIMEOUT: engine execution exceeded hard timeout ({}s)", timeout.as_secs()))
        }
        Stop::Exited(status @ (125..=127)) if setup_failure(&stderr_tail).is_some() => {
            code = json!("SANDBOX_FAILED");
            Some(format!(
                "the sandbox could not start the engine (exit {status}): {}",
                setup_failure(&stderr_tail).unwrap()
            ))
        }
        Stop::Exited(0) => {
            let stdout = tail(&p.logs.join("stdout.txt"), MAX_STDOUT_READ);
            match cx.engine.answer(&stdout) {
                Err(e) => output_errors.push(e.to_string()),
                Ok((text, enveloped)) => match engines::extract_json(&text) {
                    None => output_errors.push("Output JSON missing or unreadable".to_string()),
                    Some((value, repair)) => {
                        repaired = repair || enveloped;
                        output_errors.extend(
                            cx.skill
                                .output
                                .validator
                                .iter_errors(&value)
                                .map(|e| super::messages::schema_line("Output validation error", &e)),
                        );
                        data = value;
                    }
                },
            }
            let missing = artifacts::missing_required(&p.workspace, &cx.skill.artifacts);
            if !missing.is_empty() {
                output_errors.push(format!("Missing required artifacts: {}", missing.join(", ")));
            }
            (!output_errors.is_empty()).then(|| output_errors.join("; "))
        }
        Stop::Exited(status) => Some(format!("Exit code {status}")),
    };
    if repaired && message.is_none() {
        warnings.push("OUTPUT_REPAIRED_GENERIC".to_string());
    }
    let error = message.as_ref().map(|m| json!({"code": code, "message": m, "stderr": stderr_tail}));
    let result = json!({
        "status": if error.is_none() { "success" } else { "failed" },
        "data": if error.is_none() { data } else { Value::Null },
        "artifacts": artifacts,
        "repair_level": if repaired { "deterministic_generic" } else { "none" },
        "validation_warnings": warnings,
        "error": error,
    });
    // Not synced here: the client may see the outcome as soon as it is
    // written, and the job's task syncs it before the terminal record
    // (`Service::run_job`), which is what must never point at a lost file.
    if let Err(e) = fsio::write_replace(&p.result, &serde_json::to_vec_pretty(&result).expect("plain data")) {
        return Outcome::Failed {
            error: json!({"message": format!("cannot write result.json: {e}")}),
            warnings,
        };
    }
    match error {
        None => Outcome::Succeeded { warnings },
        Some(error) => Outcome::Failed { error, warnings },
    }
}

/// The canceled result (upstream's shape).
pub fn write_canceled(p: &RunPaths) -> Outcome {
    let result = json!({
        "status": "canceled", "data": null, "artifacts": [], "repair_level": "none",
        "validation_warnings": [],
        "error": {"code": "CANCELED_BY_USER", "message": "Canceled by user request"},
    });
    let _ = std::fs::create_dir_all(p.dir.join("result"));
    let _ = fsio::write_atomic(&p.result, &serde_json::to_vec_pretty(&result).expect("plain data"));
    Outcome::Canceled
}

/// The launcher's own failure line (`tuixiu-sandbox: ...`), if stderr ends with one.
fn setup_failure(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("tuixiu-sandbox: "))
        .map(str::to_string)
}

/// The last `max` bytes of a file, as text.
pub fn tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        let _ = f.seek(SeekFrom::Start(len - max));
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Removes the engine's home (it may hold credentials).
pub fn cleanup(p: &RunPaths) {
    if let Err(e) = std::fs::remove_dir_all(&p.home)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove the engine home {}: {e}", p.home.display());
    }
}
