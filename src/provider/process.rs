//! A started process: its stdio, its exit, and a handle that can signal it
//! from another task.
//!
//! Signals go through a pidfd taken right after spawning
//! (`pidfd_send_signal`), so a kill can never reach a recycled pid. For a
//! docker exec, the signal is delivered *inside* the container (the docker
//! CLI does not forward signals to an exec'd process), to every process
//! carrying the exec's marker variable.

use std::io::{Seek, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;

use nix::sys::memfd::{MFdFlags, memfd_create};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use super::{MemfdStep, ProviderError};

/// How a process ended, as the OS reports it for the process the provider
/// spawned (the sandbox launcher, the docker CLI, or the host process).
/// Launchers fold a command killed by signal N into code 128+N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitStatus {
    pub fn success(self) -> bool {
        self.code == Some(0)
    }

    /// One exit code in the shell's convention: the code, or 128+signal.
    pub fn code_or_signal(self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            (None, None) => 128,
        }
    }

    pub(crate) fn from_std(status: std::process::ExitStatus) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus { code: status.code(), signal: status.signal() }
    }
}

/// A process started in an instance. Dropping it does not kill the
/// process (use [`Killer::kill`], or stop the instance).
pub struct Process {
    child: Child,
    /// The process's stdin when [`super::Stdio::Piped`]; drop it to send end-of-file.
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    killer: Killer,
    /// For a process that leads its own group in a sandbox it joined.
    pub(crate) group_killer: Option<Killer>,
    /// Runs once the process has been reaped (e.g. forgets a process record).
    on_exit: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Process {
    pub(crate) fn new(
        mut child: Child,
        killer: Killer,
        on_exit: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Self {
        Process {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
            killer,
            group_killer: None,
            on_exit,
        }
    }

    /// The host pid of the spawned process (launcher, CLI or command).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// A handle that signals this process; it can be cloned and used from
    /// other tasks while one task waits.
    pub fn killer(&self) -> Killer {
        self.killer.clone()
    }

    /// A handle that signals the process's whole group when it leads one
    /// (a joined terminal), else the process.
    pub fn group_killer(&self) -> Killer {
        self.group_killer.clone().unwrap_or_else(|| self.killer.clone())
    }

    /// Waits for the process to end. Closes its stdin first, as
    /// `tokio::process::Child::wait` does.
    pub async fn wait(&mut self) -> Result<ExitStatus, ProviderError> {
        drop(self.stdin.take());
        let status = self
            .child
            .wait()
            .await
            .map_err(|e| ProviderError::Sys { op: "wait for the process", source: e })?;
        if let Some(on_exit) = self.on_exit.take() {
            on_exit();
        }
        Ok(ExitStatus::from_std(status))
    }
}

/// Signals a process from anywhere. Cheap to clone.
#[derive(Clone)]
pub struct Killer {
    inner: Arc<KillTarget>,
}

enum KillTarget {
    /// The process behind a pidfd; with `group`, its whole process group.
    Pid { pidfd: Option<OwnedFd>, pid: i32, group: bool },
    /// Processes inside a container, found by their exec marker; the local
    /// docker CLI is signalled too when they cannot be reached.
    Container {
        cli: String,
        container: String,
        user: Option<String>,
        exec_id: String,
        cli_pidfd: Option<OwnedFd>,
    },
}

impl Killer {
    pub(crate) fn for_pid(pid: u32, group: bool) -> Killer {
        let pid = pid as i32;
        Killer { inner: Arc::new(KillTarget::Pid { pidfd: crate::pidfd::open(pid), pid, group }) }
    }

    pub(crate) fn for_container_exec(
        cli: &str,
        container: &str,
        user: Option<String>,
        exec_id: &str,
        cli_pid: u32,
    ) -> Killer {
        Killer {
            inner: Arc::new(KillTarget::Container {
                cli: cli.to_string(),
                container: container.to_string(),
                user,
                exec_id: exec_id.to_string(),
                cli_pidfd: crate::pidfd::open(cli_pid as i32),
            }),
        }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`). Signalling a process that
    /// already ended succeeds.
    pub async fn kill(&self, signal: i32) -> Result<(), ProviderError> {
        match &*self.inner {
            KillTarget::Pid { pidfd, pid, group } => {
                if *group {
                    // The group id cannot be reused while any member lives;
                    // once none does, ESRCH is the expected answer.
                    // SAFETY: kill(2) with a negative pid signals a group.
                    let rc = unsafe { libc::kill(-*pid, signal) };
                    if rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                        return Ok(());
                    }
                }
                signal_pidfd(pidfd.as_ref(), signal)
            }
            KillTarget::Container { cli, container, user, exec_id, cli_pidfd } => {
                let mut cmd = tokio::process::Command::from(super::docker::argv::kill_command(
                    cli,
                    container,
                    user.as_deref(),
                    exec_id,
                    signal,
                ));
                let in_container = match cmd.output().await {
                    Ok(out) if out.status.success() => true,
                    Ok(out) => {
                        tracing::debug!(
                            "signalling exec {exec_id} in {container}: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        );
                        false
                    }
                    Err(e) => {
                        tracing::debug!("signalling exec {exec_id} in {container}: {e}");
                        false
                    }
                };
                if !in_container || signal == libc::SIGKILL {
                    signal_pidfd(cli_pidfd.as_ref(), signal)?;
                }
                Ok(())
            }
        }
    }
}

fn signal_pidfd(pidfd: Option<&OwnedFd>, signal: i32) -> Result<(), ProviderError> {
    let Some(fd) = pidfd else {
        // No pidfd was available (the process had already been reaped).
        return Ok(());
    };
    let Err(e) = crate::pidfd::send_signal(fd, signal) else {
        return Ok(());
    };
    if e.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(ProviderError::Signal { signal, source: e })
}

/// An anonymous in-memory file holding `bytes`, positioned at its start,
/// close-on-exec in this process. Used to hand env files and sandbox specs
/// to a child as `/dev/fd/N`: nothing is written to disk, and no other
/// process of this program inherits it.
pub(crate) fn memfd_with(name: &'static str, bytes: &[u8]) -> Result<OwnedFd, ProviderError> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(|e| ProviderError::Memfd {
        step: MemfdStep::Create,
        name,
        source: e.into(),
    })?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(|e| ProviderError::Memfd { step: MemfdStep::Write, name, source: e })?;
    file.rewind().map_err(|e| ProviderError::Memfd { step: MemfdStep::Rewind, name, source: e })?;
    Ok(OwnedFd::from(file))
}

/// Lets `fd` survive into the child's `exec` at the same number (it is
/// close-on-exec here so concurrent spawns from other threads cannot
/// inherit it).
pub(crate) fn pass_fd(cmd: &mut std::process::Command, fd: RawFd) {
    let clear_cloexec = move || {
        // SAFETY: fcntl(F_SETFD) on a number; no memory is touched.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs between fork and exec and only calls fcntl(2),
    // which is async-signal-safe.
    unsafe { cmd.pre_exec(clear_cloexec) };
}

/// 16 random bytes as hex, for exec markers and one-off names.
pub(crate) fn random_hex() -> String {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the remaining length into `buf`.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // getrandom cannot fail on Linux ≥ 3.17 once the pool is ready;
            // fall back to time and pid rather than panic.
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let mix = t.as_nanos() ^ ((std::process::id() as u128) << 64);
            buf.copy_from_slice(&mix.to_le_bytes());
            break;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The standard streams of a started process: all piped, or all inherited.
pub(crate) fn set_stdio(cmd: &mut std::process::Command, stdio: super::Stdio) {
    use std::process::Stdio as S;
    match stdio {
        super::Stdio::Piped => {
            cmd.stdin(S::piped()).stdout(S::piped()).stderr(S::piped());
        }
        super::Stdio::Inherit => {
            cmd.stdin(S::inherit()).stdout(S::inherit()).stderr(S::inherit());
        }
    }
}
