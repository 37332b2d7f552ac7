//! Errors of the providers: [`ProviderError`], with what is refused as
//! invalid ([`InvalidError`]) or as conflicting with an existing instance
//! ([`ConflictError`]) in enums of their own. Each renders as one line a
//! user can act on (tests and docs quote them; keep the texts).

use std::io;
use std::path::PathBuf;

use sandbox::SpecError;
use sandbox::error::io_error_text;

use super::names::NameError;
use super::process::ExitStatus;

/// Errors of the providers. Each renders as one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error(transparent)]
    Invalid(#[from] InvalidError),
    #[error("instance {0} does not exist")]
    Missing(String),
    #[error("instance {name} is {status}, not running: ensure it first")]
    NotRunning { name: String, status: &'static str },
    #[error(
        "container {0} exists but is not managed by tuixiu-sandbox (no acp-proxy.managed=1 label): refusing to touch it"
    )]
    NotManaged(String),
    #[error(transparent)]
    Conflict(#[from] ConflictError),
    /// The container CLI could not be started.
    #[error("{program}: cannot run it: {}{}", io_error_text(.source), cli_hint(.source))]
    CliSpawn {
        program: String,
        #[source]
        source: io::Error,
    },
    /// A process (the launcher, a host command) could not be started.
    #[error("{program}: cannot run it: {}", io_error_text(.source))]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    /// A container CLI call (`{cli} {sub} {target}`) failed; `stderr` is
    /// its own message, clipped.
    #[error("`{cli} {sub} {target}` failed ({}): {stderr}", exit_text(.status))]
    Cli { cli: String, sub: String, target: String, status: std::process::ExitStatus, stderr: String },
    /// `{cli} inspect` succeeded but printed something else than JSON.
    #[error("`{cli} inspect` failed (exit 0): unexpected output (not JSON: {source})")]
    InspectOutput {
        cli: String,
        #[source]
        source: serde_json::Error,
    },
    /// `op` (`write`, `remove`, `open`, ...) on a host path failed.
    #[error("{op} {}: {}", .path.display(), io_error_text(.source))]
    File {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A host path could not be resolved.
    #[error("{}: {}", .path.display(), io_error_text(.source))]
    Canonicalize {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The host directory `host` behind the working directory `guest`.
    #[error("working directory {guest} ({}): {}", .host.display(), io_error_text(.source))]
    WorkingDir {
        guest: String,
        host: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An operation on no path (`pipe2`, `wait for the process`, ...).
    #[error("{op}: {}", io_error_text(.source))]
    Sys {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("pidfd_send_signal(signal {signal}): {}", io_error_text(.source))]
    Signal {
        signal: i32,
        #[source]
        source: io::Error,
    },
    /// A step of filling the in-memory file `name`.
    #[error("{}: {}", memfd_text(.step, .name), io_error_text(.source))]
    Memfd {
        step: MemfdStep,
        name: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "the host provider runs commands directly on this machine without any isolation; \
         it is for development only and must be enabled explicitly \
         (--provider host --i-know-there-is-no-isolation)"
    )]
    HostNotAcknowledged,
}

/// The steps of [`ProviderError::Memfd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemfdStep {
    Create,
    Write,
    Rewind,
}

fn memfd_text(step: &MemfdStep, name: &str) -> String {
    match step {
        MemfdStep::Create => format!("memfd_create({name:?})"),
        MemfdStep::Write => format!("write the {name} memfd"),
        MemfdStep::Rewind => format!("rewind the {name} memfd"),
    }
}

fn cli_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::NotFound {
        " (is it installed and in PATH? choose another with --container-cli)"
    } else {
        ""
    }
}

fn exit_text(status: &std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit {code}"),
        None => "killed".to_string(),
    }
}

/// A configuration, a process or a record that a provider refuses.
#[derive(Debug, thiserror::Error)]
pub enum InvalidError {
    #[error("container CLI {cli:?} is not supported (use one of: {})", .supported.join(", "))]
    UnsupportedCli { cli: String, supported: &'static [&'static str] },
    #[error("the docker provider needs an image (--image)")]
    NoImage,
    #[error(
        "the native provider shows the host's system directories read-only and has no images; \
             --image is for --provider docker"
    )]
    NativeImage,
    #[error(
        "the native provider does not apply --cpus, --memory or --pids to named instances yet; \
             run without --instance-name, or use --provider docker"
    )]
    NativeLimits,
    #[error(
        "--network allow (the egress proxy) is served for the native provider only; \
             the docker provider has on and off"
    )]
    DockerProxied,
    /// A proxied network without its policy, or a policy without one.
    #[error("the instance's network and its egress policy disagree (network {network:?})")]
    EgressPolicy { network: sandbox::Network },
    /// What the host provider cannot honour (`--image`, `--cpus`, ...).
    #[error("the host provider cannot honour {what}: it has no isolation (use --provider native or docker)")]
    HostCannot { what: &'static str },
    #[error("user view: {0}")]
    UserView(#[source] SpecError),
    #[error("hostname {hostname:?}: {}", .source.reason)]
    Hostname {
        hostname: String,
        #[source]
        source: NameError,
    },
    /// A guest path (`what`: `working directory`, `mount destination`)
    /// that [`sandbox::guest_path::normalize`] refused for `why`.
    #[error("{what} {path:?} {why}")]
    NotClean { what: &'static str, path: String, why: &'static str },
    #[error("working directory {cwd:?} must be under {} or the home {home}", sandbox::WORKSPACE)]
    CwdOutside { cwd: String, home: String },
    /// A working directory over the path bounds (`hostfs::bounds`).
    #[error("working directory: {0}")]
    CwdBound(#[source] crate::hostfs::bounds::PathBound),
    #[error("working directory {guest} leads out of {} through a symlink", .root.display())]
    SymlinkOut { guest: String, root: PathBuf },
    #[error("mount destination {dst:?} would hide the root, the workspace or the home")]
    HidesMount { dst: String },
    /// A path for the container CLI's comma-separated options.
    #[error("{what} {path:?}: the container CLI cannot express a path with ',', '\"', ':' or a newline")]
    CliPath { what: &'static str, path: String },
    /// A host directory (`what`: `workspace`, `home`) that is something else.
    #[error("{what} {}: not a directory", .dir.display())]
    NotADirectory { what: &'static str, dir: PathBuf },
    #[error("--cpus {0}: must be a positive number")]
    Cpus(f64),
    #[error("--memory and --pids must be positive")]
    ZeroLimit,
    #[error("the command is empty")]
    EmptyCommand,
    /// What was started (`the launcher`, `the docker CLI`, `the process`)
    /// ended before its pid could be known.
    #[error("{0} exited at once")]
    ExitedAtOnce(&'static str),
    /// The sandbox builder refused the process's spec.
    #[error("{0}")]
    Spec(#[source] SpecError),
    /// The launcher ended before the agent ran; `stderr` is its last line.
    #[error("the agent's sandbox did not start (exit {}): {stderr}", .status.code_or_signal())]
    SandboxStart { status: ExitStatus, stderr: String },
    /// The joiner ended before the process ran; `stderr` is its last line.
    #[error("the process could not join the agent's sandbox (exit {}): {stderr}", .status.code_or_signal())]
    JoinFailed { status: ExitStatus, stderr: String },
    /// The instance's status is `error`; `last_error` is what was recorded.
    #[error("instance {name}: {last_error}")]
    InstanceError { name: String, last_error: String },
    #[error("instance record {}: {source}", .path.display())]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("instance record {}: version {version} is not supported (expected {expected})", .path.display())]
    RecordVersion { path: PathBuf, version: u32, expected: u32 },
    #[error("process {pid} ended before it could be recorded")]
    NotRecorded { pid: u32 },
}

/// An existing instance that cannot be used as asked.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConflictError {
    /// The instance's status is `error`; `last_error` is the container's.
    #[error("instance {name} is in error ({last_error}): remove it (tuixiu-sandbox rm {name})")]
    InError { name: String, last_error: String },
    #[error("instance {name} did not stay running (state {state}): {}",
            .last_error.as_deref().unwrap_or("see `docker logs`"))]
    DidNotStay { name: String, state: &'static str, last_error: Option<String> },
    #[error("instance {name} did not reach running within 10 s")]
    NotRunningInTime { name: String },
    /// A container made by the Node acp-proxy (label `label`).
    #[error(
        "container {name} runs its agent as the main process ({label}={agent_mode:?}, made by the Node \
         acp-proxy); it cannot be reused: remove it (tuixiu-sandbox rm {name}) to have it recreated"
    )]
    AgentMode { name: String, label: &'static str, agent_mode: String },
    #[error("instance {name} belongs to run {found:?}, not {wanted:?}")]
    OtherRun { name: String, found: String, wanted: String },
    #[error("instance {name} runs image {existing}, not {image}: remove it first (tuixiu-sandbox rm {name})")]
    OtherImage { name: String, existing: String, image: String },
    #[error(
        "instance {name} exists with workspace {}, not {}: remove it first (tuixiu-sandbox rm {name})",
        .existing.display(), .workspace.display()
    )]
    OtherWorkspace { name: String, existing: PathBuf, workspace: PathBuf },
    #[error("instance {name} already has a running agent (pid {pid})")]
    AgentRunning { name: String, pid: i32 },
    /// The agent's `docker exec` runs as the CLI process `pid`.
    #[error("instance {name} already has a running agent (docker CLI pid {pid})")]
    AgentRunningCli { name: String, pid: i32 },
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        let enoent = || io::Error::from_raw_os_error(libc::ENOENT);
        let e = enoent();
        let text = io_error_text(&e);
        let dir = PathBuf::from("/no/such");
        let name = "tuixiu-run-1";
        let spec = || SpecError::new("bad");
        let json = || serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let status = ExitStatus { code: Some(3), signal: None };
        // The old variants' own formats, fed what their constructors built.
        let old_io = |context: String| format!("{context}: {text}");
        let old_cli = |command: String, status: &str, stderr: String| {
            format!("`{command}` failed ({status}): {stderr}")
        };
        let cases: Vec<(ProviderError, String)> = vec![
            (
                ProviderError::CliSpawn { program: "docker".into(), source: enoent() },
                format!(
                    "{}: cannot run it: {}",
                    "docker",
                    text.clone() + " (is it installed and in PATH? choose another with --container-cli)"
                ),
            ),
            (
                ProviderError::CliSpawn {
                    program: "docker".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                },
                format!(
                    "{}: cannot run it: {}",
                    "docker",
                    io_error_text(&io::Error::from_raw_os_error(libc::EACCES))
                ),
            ),
            (
                ProviderError::Spawn { program: "/bin/launcher".into(), source: enoent() },
                format!("{}: cannot run it: {}", "/bin/launcher", text),
            ),
            (
                ProviderError::Cli {
                    cli: "docker".into(),
                    sub: "rm".into(),
                    target: name.into(),
                    status: std::process::ExitStatus::from_raw(1 << 8),
                    stderr: "no".into(),
                },
                old_cli(format!("{} {} {name}", "docker", "rm"), "exit 1", "no".into()),
            ),
            (
                ProviderError::Cli {
                    cli: "docker".into(),
                    sub: "rm".into(),
                    target: name.into(),
                    status: std::process::ExitStatus::from_raw(libc::SIGKILL),
                    stderr: "".into(),
                },
                old_cli(format!("{} {} {name}", "docker", "rm"), "killed", "".into()),
            ),
            (
                ProviderError::InspectOutput { cli: "podman".into(), source: json() },
                old_cli(
                    format!("{} inspect", "podman"),
                    "exit 0",
                    format!("unexpected output (not JSON: {})", json()),
                ),
            ),
            (
                ProviderError::File { op: "chmod 0700", path: dir.clone(), source: enoent() },
                old_io(format!("chmod 0700 {}", dir.display())),
            ),
            (
                ProviderError::Canonicalize { path: dir.clone(), source: enoent() },
                old_io(dir.display().to_string()),
            ),
            (
                ProviderError::WorkingDir {
                    guest: "/workspace/a".into(),
                    host: dir.clone(),
                    source: enoent(),
                },
                old_io(format!("working directory {} ({})", "/workspace/a", dir.display())),
            ),
            (
                ProviderError::Sys { op: "pipe2 (the sandboxes' lifeline)", source: enoent() },
                old_io("pipe2 (the sandboxes' lifeline)".into()),
            ),
            (
                ProviderError::Signal { signal: 9, source: enoent() },
                old_io(format!("pidfd_send_signal(signal {})", 9)),
            ),
            (
                ProviderError::Memfd {
                    step: MemfdStep::Create,
                    name: "tuixiu-sandbox-env",
                    source: enoent(),
                },
                old_io(format!("memfd_create({:?})", "tuixiu-sandbox-env")),
            ),
            (
                ProviderError::Memfd { step: MemfdStep::Write, name: "tuixiu-sandbox-env", source: enoent() },
                old_io(format!("write the {} memfd", "tuixiu-sandbox-env")),
            ),
            (
                ProviderError::Memfd {
                    step: MemfdStep::Rewind,
                    name: "tuixiu-sandbox-env",
                    source: enoent(),
                },
                old_io(format!("rewind the {} memfd", "tuixiu-sandbox-env")),
            ),
        ];
        let invalid: Vec<(InvalidError, String)> = vec![
            (
                InvalidError::UnsupportedCli { cli: "lxc".into(), supported: &["docker", "podman"] },
                format!(
                    "container CLI {:?} is not supported (use one of: {})",
                    "lxc",
                    ["docker", "podman"].join(", ")
                ),
            ),
            (InvalidError::NoImage, "the docker provider needs an image (--image)".into()),
            (
                InvalidError::NativeImage,
                "the native provider shows the host's system directories read-only and has no images; \
                 --image is for --provider docker"
                    .into(),
            ),
            (
                InvalidError::NativeLimits,
                "the native provider does not apply --cpus, --memory or --pids to named instances yet; \
                 run without --instance-name, or use --provider docker"
                    .into(),
            ),
            (
                InvalidError::HostCannot { what: "--image" },
                format!(
                    "the host provider cannot honour {}: it has no isolation (use --provider native or docker)",
                    "--image"
                ),
            ),
            (InvalidError::UserView(spec()), format!("user view: {}", spec())),
            (
                InvalidError::Hostname {
                    hostname: "a b".into(),
                    source: super::super::names::validate_instance_name("a b", "").unwrap_err(),
                },
                format!(
                    "hostname {:?}: {}",
                    "a b",
                    super::super::names::validate_instance_name("a b", "").unwrap_err().reason
                ),
            ),
            (
                InvalidError::NotClean {
                    what: "working directory",
                    path: "a/../b".into(),
                    why: "is not clean",
                },
                format!("working directory {:?} {}", "a/../b", "is not clean"),
            ),
            (
                InvalidError::NotClean { what: "mount destination", path: "x".into(), why: "is relative" },
                format!("mount destination {:?} {}", "x", "is relative"),
            ),
            (
                InvalidError::CwdOutside { cwd: "/etc".into(), home: "/home/agent".into() },
                format!(
                    "working directory {:?} must be under {} or the home {}",
                    "/etc",
                    sandbox::WORKSPACE,
                    "/home/agent"
                ),
            ),
            (
                InvalidError::SymlinkOut { guest: "/workspace/l".into(), root: dir.clone() },
                format!(
                    "working directory {} leads out of {} through a symlink",
                    "/workspace/l",
                    dir.display()
                ),
            ),
            (
                InvalidError::HidesMount { dst: "/".into() },
                format!("mount destination {:?} would hide the root, the workspace or the home", "/"),
            ),
            (
                InvalidError::CliPath { what: "bind source", path: "a,b".into() },
                format!(
                    "{} {:?}: the container CLI cannot express a path with ',', '\"', ':' or a newline",
                    "bind source", "a,b"
                ),
            ),
            (
                InvalidError::NotADirectory { what: "workspace", dir: dir.clone() },
                format!("{} {}: not a directory", "workspace", dir.display()),
            ),
            (InvalidError::Cpus(-1.5), format!("--cpus {}: must be a positive number", -1.5)),
            (InvalidError::ZeroLimit, "--memory and --pids must be positive".into()),
            (InvalidError::EmptyCommand, "the command is empty".into()),
            (InvalidError::ExitedAtOnce("the launcher"), "the launcher exited at once".into()),
            (InvalidError::Spec(spec()), spec().to_string()),
            (
                InvalidError::SandboxStart { status, stderr: "why".into() },
                format!("the agent's sandbox did not start (exit {}): {}", status.code_or_signal(), "why"),
            ),
            (
                InvalidError::JoinFailed { status, stderr: "why".into() },
                format!(
                    "the process could not join the agent's sandbox (exit {}): {}",
                    status.code_or_signal(),
                    "why"
                ),
            ),
            (
                InvalidError::InstanceError { name: name.into(), last_error: "gone".into() },
                format!("instance {name}: {}", "gone"),
            ),
            (
                InvalidError::Record { path: dir.clone(), source: json() },
                format!("instance record {}: {}", dir.display(), json()),
            ),
            (
                InvalidError::RecordVersion { path: dir.clone(), version: 7, expected: 1 },
                format!("instance record {}: version {} is not supported (expected {})", dir.display(), 7, 1),
            ),
            (
                InvalidError::NotRecorded { pid: 42 },
                format!("process {} ended before it could be recorded", 42),
            ),
        ];
        let conflict: Vec<(ConflictError, String)> = vec![
            (
                ConflictError::InError { name: name.into(), last_error: "oom".into() },
                format!("instance {name} is in error ({}): remove it (tuixiu-sandbox rm {name})", "oom"),
            ),
            (
                ConflictError::DidNotStay { name: name.into(), state: "stopped", last_error: None },
                format!(
                    "instance {name} did not stay running (state {}): {}",
                    "stopped", "see `docker logs`"
                ),
            ),
            (
                ConflictError::DidNotStay {
                    name: name.into(),
                    state: "error",
                    last_error: Some("oom".into()),
                },
                format!("instance {name} did not stay running (state {}): {}", "error", "oom"),
            ),
            (
                ConflictError::NotRunningInTime { name: name.into() },
                format!("instance {name} did not reach running within 10 s"),
            ),
            (
                ConflictError::AgentMode {
                    name: name.into(),
                    label: "acp-proxy.agent_mode",
                    agent_mode: "main".into(),
                },
                format!(
                    "container {name} runs its agent as the main process ({}={:?}, made by the Node \
                     acp-proxy); it cannot be reused: remove it (tuixiu-sandbox rm {name}) to have it recreated",
                    "acp-proxy.agent_mode", "main"
                ),
            ),
            (
                ConflictError::OtherRun { name: name.into(), found: "r1".into(), wanted: "r2".into() },
                format!("instance {name} belongs to run {:?}, not {:?}", "r1", "r2"),
            ),
            (
                ConflictError::OtherImage { name: name.into(), existing: "a:1".into(), image: "b:2".into() },
                format!(
                    "instance {name} runs image {}, not {}: remove it first (tuixiu-sandbox rm {name})",
                    "a:1", "b:2"
                ),
            ),
            (
                ConflictError::OtherWorkspace {
                    name: name.into(),
                    existing: dir.clone(),
                    workspace: "/w".into(),
                },
                format!(
                    "instance {name} exists with workspace {}, not {}: remove it first (tuixiu-sandbox rm {name})",
                    dir.display(),
                    "/w"
                ),
            ),
            (
                ConflictError::AgentRunning { name: name.into(), pid: 7 },
                format!("instance {name} already has a running agent (pid {})", 7),
            ),
            (
                ConflictError::AgentRunningCli { name: name.into(), pid: 7 },
                format!("instance {name} already has a running agent (docker CLI pid {})", 7),
            ),
        ];
        let all = cases
            .into_iter()
            .chain(invalid.into_iter().map(|(e, old)| (ProviderError::from(e), old)))
            .chain(conflict.into_iter().map(|(e, old)| (ProviderError::from(e), old)));
        for (error, old) in all {
            assert_eq!(error.to_string(), old, "{error:?}");
        }
    }

    /// The causes stay reachable for callers.
    #[test]
    fn causes_can_be_matched() {
        let e = ProviderError::File {
            op: "read",
            path: "/x".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(source.and_then(io::Error::raw_os_error), Some(libc::EACCES));
        let e = ProviderError::from(ConflictError::AgentRunning { name: "n".into(), pid: 7 });
        assert!(matches!(e, ProviderError::Conflict(ConflictError::AgentRunning { pid: 7, .. })));
    }
}
