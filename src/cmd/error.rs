//! Errors of the full tool's commands that manage instances and run
//! through providers (`run --provider ...`, `instances`, `inspect`, `stop`,
//! `rm`, `manifest check`, `__extract`). Each renders as the one line
//! printed after `tuixiu-sandbox: ` (tests and docs quote them; keep the
//! texts). `skills` has its own ([`super::skills::SkillsError`]).

use std::io;
use std::path::PathBuf;

use sandbox::error::io_error_text;
use tuixiu_sandbox::inputs::InputError;
use tuixiu_sandbox::inputs::fsx::FsError;
use tuixiu_sandbox::inputs::zip::ZipError;
use tuixiu_sandbox::launcher::error::RunError;
use tuixiu_sandbox::provider::ProviderError;
use tuixiu_sandbox::provider::names::NameError;

use super::engine_check::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The options `run` shares with the native launcher.
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Input(#[from] InputError),
    /// The records of what `run --manifest` landed in a named instance.
    #[error(transparent)]
    Landed(#[from] tuixiu_sandbox::inputs::landed::RecordsError),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// A manifest with a provider (or options) that cannot land it.
    #[error(
        "--manifest: not supported by the {0} provider with these options in this build \
         (native: use it without --instance-name; docker lands manifests in its volumes)"
    )]
    ManifestUnsupported(&'static str),
    #[error("--run-id: only meaningful with --instance-name (or --provider docker)")]
    RunIdWithoutInstance,
    /// An option of the plain native sandbox only (its clap id).
    #[error(
        "--{}: applies to the plain native sandbox only (without --provider docker/host \
         and --instance-name) in this build",
        flag(.0)
    )]
    NativeOnly(&'static str),
    /// A native-only option given to another provider (its clap id).
    #[error("--{}: not supported by the {provider} provider", flag(.id))]
    NotSupportedBy { id: &'static str, provider: &'static str },
    #[error("--network none: only the plain native sandbox can deny IP sockets; use --network off")]
    NetworkNone,
    /// A mount the providers cannot make (its guest path).
    #[error("mount {0}: not supported by providers")]
    MountUnsupported(String),
    #[error(
        "--image: the native provider has no images (it shows the host's system directories \
         read-only); use --provider docker"
    )]
    NativeImage,
    #[error("--run-id: the native provider keeps an instance only with --instance-name")]
    NativeRunId,
    /// The container CLI could not be started.
    #[error("{cli}: cannot run it: {}", spawn_reason(.source))]
    CliSpawn {
        cli: String,
        #[source]
        source: io::Error,
    },
    /// The container CLI returned, but the engine is gone: `status` is the
    /// CLI's, not the command's.
    #[error(
        "{cli}: the container engine was lost while the command ran ({source}): its output may be incomplete, \
         and its exit status ({status}) is not the command's"
    )]
    EngineLost {
        cli: String,
        #[source]
        source: EngineError,
        status: u8,
    },
    /// `__extract`: the archive cannot be opened.
    #[error("{}: {}", .path.display(), io_error_text(.source))]
    Archive {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `__extract`: the target directory cannot be opened.
    #[error("{}: {source}", .path.display())]
    ExtractDir {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{}: not empty", .0.display())]
    DirNotEmpty(PathBuf),
    #[error(transparent)]
    Zip(#[from] ZipError),
}

/// A clap id as its option: `kill_after` → `kill-after`.
fn flag(id: &str) -> String {
    id.replace('_', "-")
}

fn spawn_reason(e: &io::Error) -> String {
    let mut reason = io_error_text(e);
    if e.kind() == io::ErrorKind::NotFound {
        reason.push_str(" (is it installed and in PATH? choose another with --container-cli)");
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        let enoent = || io::Error::from_raw_os_error(libc::ENOENT);
        let e = enoent();
        let path = PathBuf::from("/no/such");
        let cases: Vec<(CmdError, String)> = vec![
            (CmdError::Runtime(enoent()), format!("start the async runtime: {e}")),
            (
                CmdError::ManifestUnsupported("host"),
                format!(
                    "--manifest: not supported by the {} provider with these options in this build \
                     (native: use it without --instance-name; docker lands manifests in its volumes)",
                    "host"
                ),
            ),
            (
                CmdError::RunIdWithoutInstance,
                "--run-id: only meaningful with --instance-name (or --provider docker)".into(),
            ),
            (
                CmdError::NativeOnly("kill_after"),
                format!(
                    "--{}: applies to the plain native sandbox only (without --provider docker/host \
                     and --instance-name) in this build",
                    "kill_after".replace('_', "-")
                ),
            ),
            (
                CmdError::NotSupportedBy { id: "json_status_fd", provider: "docker" },
                format!(
                    "--{}: not supported by the {} provider",
                    "json_status_fd".replace('_', "-"),
                    "docker"
                ),
            ),
            (
                CmdError::NetworkNone,
                "--network none: only the plain native sandbox can deny IP sockets; use --network off".into(),
            ),
            (CmdError::MountUnsupported("/x".into()), "mount /x: not supported by providers".into()),
            (
                CmdError::NativeImage,
                "--image: the native provider has no images (it shows the host's system directories \
                        read-only); use --provider docker"
                    .into(),
            ),
            (
                CmdError::NativeRunId,
                "--run-id: the native provider keeps an instance only with --instance-name".into(),
            ),
            (
                CmdError::CliSpawn { cli: "docker".into(), source: enoent() },
                format!(
                    "docker: cannot run it: {} (is it installed and in PATH? choose another with --container-cli)",
                    io_error_text(&e)
                ),
            ),
            (
                CmdError::CliSpawn {
                    cli: "docker".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                },
                format!(
                    "docker: cannot run it: {}",
                    io_error_text(&io::Error::from_raw_os_error(libc::EACCES))
                ),
            ),
            (
                CmdError::EngineLost {
                    cli: "docker".into(),
                    source: EngineError::NotRunning("i".into()),
                    status: 137,
                },
                format!(
                    "{}: the container engine was lost while the command ran ({}): its output may be incomplete, \
                     and its exit status ({}) is not the command's",
                    "docker", "the engine no longer runs instance i", 137
                ),
            ),
            (
                CmdError::Archive { path: path.clone(), source: enoent() },
                format!("{}: {}", path.display(), io_error_text(&e)),
            ),
            (
                CmdError::ExtractDir { path: path.clone(), source: nix::errno::Errno::ENOENT },
                format!("{}: {}", path.display(), nix::errno::Errno::ENOENT),
            ),
            (CmdError::DirNotEmpty(path.clone()), format!("{}: not empty", path.display())),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
    }
}
