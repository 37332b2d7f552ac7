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
//! The engine's stdout and stderr are pipes the server copies into
//! `logs/`, capped ([`super::logcap`]); its stdin is a pipe for a sticky
//! interactive job (the replies), else nothing. Time limit, cancel and
//! the waits of interactive jobs are the job's task's
//! (`super::task`): it signals the launcher, which relays SIGTERM into
//! the sandbox; SIGKILL ends every process of the sandbox.

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
use super::interaction::{self, Turn};
use super::logcap::{self, Summary};
use super::package::Skill;
use super::prompt;
use super::store::{JobRecord, Profile, TakenReply};
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
    /// Wall clock of the engine (not counting an interactive wait).
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL, for a timeout or a cancel.
    pub kill_grace: Duration,
    /// Bytes of stdout, and of stderr, kept on disk per engine process.
    pub max_log: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            timeout: Duration::from_secs(1200),
            kill_grace: Duration::from_secs(5),
            max_log: 16 << 20,
        }
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
    /// An interactive job, and how its engine continues.
    pub interactive: Option<Profile>,
}

/// How a run ended, or paused.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Succeeded {
        warnings: Vec<String>,
    },
    Failed {
        error: Value,
        warnings: Vec<String>,
    },
    Canceled,
    /// A resumable engine asked the user and exited; its session, when
    /// it named one, is what the next turn resumes.
    Waiting {
        pending: Value,
        session: Option<String>,
    },
}

impl Outcome {
    /// A failure with only a message (before or around the engine).
    pub fn failed(message: impl Into<String>) -> Outcome {
        Outcome::Failed { error: json!({"message": message.into()}), warnings: vec![] }
    }

    /// A failure with one of the interactive error codes; the message
    /// starts with the code, as upstream's.
    pub fn coded(code: &str, message: &str) -> Outcome {
        Outcome::Failed {
            error: json!({"code": code, "message": format!("{code}: {message}")}),
            warnings: vec![],
        }
    }
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
    let failed = Outcome::failed;
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

    let skill_path = skill_path(cx);
    let vars = prompt::Vars {
        skill: cx.skill,
        input: &input,
        parameter: &parameter,
        run_dir: GUEST_RUN_DIR,
        skill_dir: skill_path.as_deref().unwrap_or(GUEST_SKILL_DIR),
        interactive: cx.interactive.is_some(),
    };
    let text = prompt::build(&r.engine, &vars);
    std::fs::write(p.logs.join("prompt.txt"), &text)
        .map_err(|e| failed(format!("cannot write the prompt: {e}")))?;

    engine_files(cx).map_err(|e| failed(e.to_string()))?;
    let argv = cx.engine.argv(&text, r.model.as_deref(), &cx.skill.id);
    let spec = spec(cx, argv, skill_path.as_deref()).map_err(|e| failed(e.to_string()))?;
    let egress = cx.engine.egress_policy().map_err(|e| failed(e.to_string()))?;
    Ok(Prepared { spec, timeout: timeout_of(cx), egress })
}

/// Prepares a resumable engine's next turn: the reply is its prompt
/// (`logs/prompt.txt` holds it, as upstream), the session is the one it
/// named; the run directory and the home are the previous turn's.
pub fn prepare_resume(cx: &RunContext<'_>, reply: &TakenReply, session: &str) -> Result<Prepared, Outcome> {
    let text = interaction::reply_prompt(&reply.response);
    std::fs::write(cx.paths.logs.join("prompt.txt"), &text)
        .map_err(|e| Outcome::failed(format!("cannot write the prompt: {e}")))?;
    let Some(argv) = cx.engine.resume_argv(&text, cx.record.model.as_deref(), &cx.skill.id, session) else {
        return Err(Outcome::coded("SESSION_RESUME_FAILED", "the engine has no resume command"));
    };
    let skill_path = skill_path(cx);
    let spec = spec(cx, argv, skill_path.as_deref()).map_err(|e| Outcome::failed(e.to_string()))?;
    let egress = cx.engine.egress_policy().map_err(|e| Outcome::failed(e.to_string()))?;
    Ok(Prepared { spec, timeout: timeout_of(cx), egress })
}

fn skill_path(cx: &RunContext<'_>) -> Option<String> {
    cx.engine.skill_path.as_ref().map(|t| t.replace("{skill_id}", &cx.skill.id).replace("{home}", GUEST_HOME))
}

/// The engine's time limit: the server's, or less when the request asks.
fn timeout_of(cx: &RunContext<'_>) -> Duration {
    match cx.record.runtime_options.get("hard_timeout_seconds").and_then(Value::as_u64) {
        Some(s) => Duration::from_secs(s).min(cx.limits.timeout),
        None => cx.limits.timeout,
    }
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

fn spec(cx: &RunContext<'_>, argv: Vec<String>, skill_path: Option<&str>) -> Result<SandboxSpec, RunError> {
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
    /// A sticky engine's question went unanswered for the whole wait.
    WaitTimedOut,
    /// A sticky engine exited while its question was waiting.
    ProcessLost,
}

/// How the engine's standard streams are set up.
#[derive(Clone, Copy, Debug)]
pub struct Streams {
    /// A pipe on stdin (a sticky job's replies), else `/dev/null`.
    pub stdin: bool,
    /// Hand on the lines of stdout that may be questions.
    pub asks: bool,
    /// Bytes kept of each of stdout and stderr.
    pub max_log: u64,
}

/// A started engine: the launcher process, its stdin (when piped), its
/// questions (when asked for), and the relays copying its output.
pub struct Proc {
    pub child: tokio::process::Child,
    pub stdin: Option<tokio::process::ChildStdin>,
    pub asks: Option<tokio::sync::mpsc::Receiver<logcap::Line>>,
    stdout: tokio::task::JoinHandle<std::io::Result<Summary>>,
    stderr: tokio::task::JoinHandle<std::io::Result<Summary>>,
    pid: Option<libc::pid_t>,
    /// The egress proxy of `network: "allow"`, served as long as the
    /// engine may run (a sticky engine's wait included).
    _egress: Option<crate::egress::ServeTask>,
}

impl Proc {
    /// What signals the launcher, usable while the process is awaited.
    pub fn signaller(&self) -> Signaller {
        Signaller(self.pid)
    }

    /// Waits for the relays once the launcher exited: what they kept of
    /// stdout and stderr. Something in the sandbox that still holds the
    /// pipes (it dies with the sandbox) is given a few seconds.
    pub async fn logs(self) -> std::io::Result<(Summary, Summary)> {
        let join = |h: tokio::task::JoinHandle<std::io::Result<Summary>>| async move {
            match tokio::time::timeout(Duration::from_secs(5), h).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => Err(std::io::Error::other(e)),
                Err(_) => Err(std::io::Error::other("the engine's output did not end with it")),
            }
        };
        Ok((join(self.stdout).await?, join(self.stderr).await?))
    }
}

/// Signals a started launcher (which relays SIGTERM into the sandbox).
#[derive(Clone, Copy, Debug)]
pub struct Signaller(Option<libc::pid_t>);

impl Signaller {
    /// Sends `sig`. Used only before the task that owns the [`Proc`] has
    /// seen the launcher exit.
    pub fn send(self, sig: libc::c_int) {
        if let Some(pid) = self.0 {
            // SAFETY: `pid` is our child, reaped only by `child.wait()` in
            // the task that owns the `Proc`, which stops signalling once
            // that returned: the pid cannot have been reused.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Starts the launcher with the spec on descriptor 3.
pub fn spawn(
    launcher: &Path,
    paths: &RunPaths,
    prepared: &Prepared,
    streams: Streams,
) -> Result<Proc, RunError> {
    let spec_fd = spec_memfd(&prepared.spec.to_json()).map_err(RunError::Memfd)?;
    let log = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(paths.logs.join(name))
            .map_err(RunError::Io)
    };
    let (stdout_file, stderr_file) = (log("stdout.txt")?, log("stderr.txt")?);
    let mut cmd = launcher_command(launcher, spec_fd.as_raw_fd(), streams.stdin);
    let egress = pass_egress(&mut cmd, prepared)?;
    let started = Instant::now();
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| RunError::Start { launcher: launcher.to_path_buf(), source })?;
    drop(spec_fd);
    let egress = serve_egress(egress, prepared, paths)?;
    tracing::debug!("{}: the launcher was started in {:?}", paths.dir.display(), started.elapsed());
    let (asks_tx, asks) = match streams.asks {
        true => {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let max = streams.max_log;
    Ok(Proc {
        pid: child.id().map(|p| p as libc::pid_t),
        stdin: child.stdin.take(),
        asks,
        stdout: tokio::spawn(async move { logcap::relay(out, stdout_file, max, "stdout", asks_tx).await }),
        stderr: tokio::spawn(async move { logcap::relay(err, stderr_file, max, "stderr", None).await }),
        child,
        _egress: egress,
    })
}

/// `launcher __exec --spec-fd=3`, the spec moved to descriptor 3, with no
/// variable of the server's but `TUIXIU_LOG`, stdout and stderr piped
/// (and stdin when `stdin`), in its own process group, with a
/// parent-death signal.
fn launcher_command(launcher: &Path, raw: std::os::fd::RawFd, stdin: bool) -> std::process::Command {
    let mut cmd = std::process::Command::new(launcher);
    cmd.arg("__exec").arg("--spec-fd=3");
    cmd.env_clear();
    if let Some(filter) = std::env::var_os("TUIXIU_LOG") {
        cmd.env("TUIXIU_LOG", filter);
    }
    let stdin = if stdin { std::process::Stdio::piped() } else { std::process::Stdio::null() };
    cmd.stdin(stdin).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    // Its own process group: a Ctrl-C meant for the server reaches the
    // sandbox only through the server's own shutdown.
    cmd.process_group(0);
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
    cmd
}

/// How the launcher exited, as a code (128 + signal for a signal).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
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

/// Reads the answer (the engine's stdout from `answer_from`, a file
/// offset: this turn's, or after a sticky engine's last question),
/// validates it, checks the required artifacts, and writes
/// `result/result.json`. An interactive engine's question makes a
/// resumable job wait ([`Outcome::Waiting`]).
pub fn finish(cx: &RunContext<'_>, stop: Stop, timeout: Duration, answer_from: u64) -> Outcome {
    let p = cx.paths;
    let stderr_tail = tail(&p.logs.join("stderr.txt"), STDERR_TAIL);
    let coded = |c: &str, m: &str| (json!(c), format!("{c}: {m}"));
    let (code, message) = match stop {
        Stop::Canceled => return write_canceled(p),
        Stop::TimedOut => (
            json!("TIMEOUT"),
            format!("TIMEOUT: engine execution exceeded hard timeout ({}s)", timeout.as_secs()),
        ),
        Stop::WaitTimedOut => coded("INTERACTION_WAIT_TIMEOUT", "the user did not reply in time"),
        Stop::ProcessLost => {
            coded("INTERACTION_PROCESS_LOST", "the engine exited while its question was waiting for the user")
        }
        Stop::Exited(status @ (125..=127)) if setup_failure(&stderr_tail).is_some() => (
            json!("SANDBOX_FAILED"),
            format!(
                "the sandbox could not start the engine (exit {status}): {}",
                setup_failure(&stderr_tail).unwrap()
            ),
        ),
        Stop::Exited(0) => match read_answer(cx, answer_from) {
            Answered::Output { data, repaired, errors } => {
                let message = (!errors.is_empty()).then(|| errors.join("; "));
                return write_result(cx, Value::Null, message, data, repaired, &stderr_tail);
            }
            Answered::Waiting(outcome) => return outcome,
            Answered::Failed(c, m) => coded(c, m),
        },
        Stop::Exited(status) => (Value::Null, format!("Exit code {status}")),
    };
    write_result(cx, code, Some(message), Value::Null, false, &stderr_tail)
}

/// What a turn that exited 0 answered.
enum Answered {
    /// Its output (checked: `errors` lists what is wrong with it).
    Output { data: Value, repaired: bool, errors: Vec<String> },
    /// A resumable engine's question: the job waits.
    Waiting(Outcome),
    /// A question the job cannot wait on: code and reason.
    Failed(&'static str, &'static str),
}

/// Reads and checks the answer of a turn that exited 0.
fn read_answer(cx: &RunContext<'_>, answer_from: u64) -> Answered {
    let p = cx.paths;
    let stdout = read_from(&p.logs.join("stdout.txt"), answer_from, MAX_STDOUT_READ);
    let mut errors = Vec::new();
    let (mut data, mut repaired) = (Value::Null, false);
    match cx.engine.answer(&stdout).map(|(text, enveloped)| (engines::extract_json(&text), enveloped)) {
        Err(e) => errors.push(e.to_string()),
        Ok((None, _)) => errors.push("Output JSON missing or unreadable".to_string()),
        Ok((Some((value, repair)), enveloped)) => {
            repaired = repair || enveloped;
            let turn = match cx.interactive {
                None => Turn::Final(value),
                Some(_) => interaction::interpret(value),
            };
            match turn {
                Turn::Final(value) => {
                    errors.extend(
                        cx.skill
                            .output
                            .validator
                            .iter_errors(&value)
                            .map(|e| super::messages::schema_line("Output validation error", &e)),
                    );
                    data = value;
                }
                Turn::InvalidAsk => errors.push("Invalid ask_user payload".to_string()),
                Turn::Ask(pending) => {
                    return match asked(cx, pending, &stdout) {
                        Ok(waiting) => Answered::Waiting(waiting),
                        Err((c, m)) => Answered::Failed(c, m),
                    };
                }
            }
        }
    }
    let missing = artifacts::missing_required(&p.workspace, &cx.skill.artifacts);
    if !missing.is_empty() {
        errors.push(format!("Missing required artifacts: {}", missing.join(", ")));
    }
    Answered::Output { data, repaired, errors }
}

/// Writes `result/result.json` for a turn that ended (upstream's shape):
/// a success when there is no `message`.
fn write_result(
    cx: &RunContext<'_>,
    code: Value,
    message: Option<String>,
    data: Value,
    repaired: bool,
    stderr_tail: &str,
) -> Outcome {
    let mut warnings = Vec::new();
    if repaired && message.is_none() {
        warnings.push("OUTPUT_REPAIRED_GENERIC".to_string());
    }
    let error = message.as_ref().map(|m| json!({"code": code, "message": m, "stderr": stderr_tail}));
    let result = json!({
        "status": if error.is_none() { "success" } else { "failed" },
        "data": if error.is_none() { data } else { Value::Null },
        "artifacts": artifacts::list(&cx.paths.workspace),
        "repair_level": if repaired { "deterministic_generic" } else { "none" },
        "validation_warnings": warnings,
        "error": error,
        "pending_interaction": null,
        "interactive_profile": profile_json(cx.interactive, cx.record),
    });
    // Not synced here: the client may see the outcome as soon as it is
    // written, and the job's task syncs it before the terminal record
    // (`Service::run_job`), which is what must never point at a lost file.
    let bytes = serde_json::to_vec_pretty(&result).expect("plain data");
    if let Err(e) = fsio::write_replace(&cx.paths.result, &bytes) {
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

/// An interactive engine asked and exited: a resumable job waits (with
/// the session the engine named); a sticky engine should have kept
/// running, so its job fails.
fn asked(cx: &RunContext<'_>, pending: Value, stdout: &str) -> Result<Outcome, (&'static str, &'static str)> {
    if cx.interactive != Some(Profile::Resumable) {
        return Err((
            "INTERACTION_PROCESS_LOST",
            "the engine asked and exited; a sticky engine must keep running while it waits",
        ));
    }
    let session = cx.engine.resumable().and_then(|from| from.find(stdout));
    if session.is_none() {
        return Err(("SESSION_RESUME_FAILED", "the engine named no session to resume"));
    }
    write_waiting(cx.paths, &pending, profile_json(cx.interactive, cx.record));
    Ok(Outcome::Waiting { pending, session })
}

/// `result.json` while the job waits for the user (upstream's shape).
pub fn write_waiting(p: &RunPaths, pending: &Value, profile: Value) {
    let result = json!({
        "status": "waiting_user", "data": null, "artifacts": artifacts::list(&p.workspace),
        "repair_level": "none", "validation_warnings": [], "error": null,
        "pending_interaction": pending, "interactive_profile": profile,
    });
    let _ = fsio::write_replace(&p.result, &serde_json::to_vec_pretty(&result).expect("plain data"));
}

/// A failed `result.json` for a failure decided outside a turn (an
/// unanswered question).
pub fn write_failed(p: &RunPaths, error: &Value) {
    let result = json!({
        "status": "failed", "data": null, "artifacts": artifacts::list(&p.workspace),
        "repair_level": "none", "validation_warnings": [], "error": error,
        "pending_interaction": null, "interactive_profile": null,
    });
    let _ = fsio::write_replace(&p.result, &serde_json::to_vec_pretty(&result).expect("plain data"));
}

/// Upstream's `interactive_profile` of a job (`null` for an auto job).
pub fn profile_json(profile: Option<Profile>, record: &JobRecord) -> Value {
    let Some(profile) = profile else { return Value::Null };
    let session_timeout = record.runtime_options.get("session_timeout_sec").cloned().unwrap_or(Value::Null);
    json!({"kind": profile.as_str(), "reason": "engines_config", "session_timeout_sec": session_timeout})
}

/// The canceled result (upstream's shape).
pub fn write_canceled(p: &RunPaths) -> Outcome {
    let result = json!({
        "status": "canceled", "data": null, "artifacts": [], "repair_level": "none",
        "validation_warnings": [],
        "error": {"code": "CANCELED_BY_USER", "message": "Canceled by user request"},
        "pending_interaction": null, "interactive_profile": null,
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

/// A file from `offset` to its end, at most its last `max` bytes, as text.
pub fn read_from(path: &Path, offset: u64, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = offset.max(len.saturating_sub(max)).min(len);
    let _ = f.seek(SeekFrom::Start(start));
    let mut buf = Vec::new();
    let _ = f.take(len - start).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
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
