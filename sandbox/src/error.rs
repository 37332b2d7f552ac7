//! Errors of the sandbox runtime. Each one renders as a single line that
//! names the step, the syscall with its arguments, the errno, and a hint when
//! one is known, e.g.
//! `write /proc/4242/uid_map ("1000 1000 1") => EPERM (Operation not permitted); hint: ...`.

use std::fmt;

use nix::errno::Errno;

/// Exit status when the sandbox itself could not be set up.
pub const EXIT_SETUP_FAILED: u8 = 125;
/// Exit status when the command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit status when the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// A spec that cannot describe a valid sandbox (bad path, bad name...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SpecError {
    message: String,
}

impl SpecError {
    pub fn new(message: impl Into<String>) -> Self {
        SpecError { message: message.into() }
    }
}

/// Why a sandbox could not be launched, or what it reported while starting.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// A syscall failed in the launcher (outside the sandbox).
    #[error("{0}")]
    Syscall(SyscallError),
    /// The caller's apply callback failed; the command was not started.
    #[error("{0}")]
    Apply(Box<dyn std::error::Error + Send + Sync>),
    /// The sandbox reported a failure from inside (setup or exec); the
    /// message was rendered there, `code` is 125, 126 or 127.
    #[error("{message}")]
    Child { code: u8, message: String },
}

impl LaunchError {
    /// The exit status a CLI should use for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchError::Child { code, .. } => *code,
            _ => EXIT_SETUP_FAILED,
        }
    }
}

impl From<SyscallError> for LaunchError {
    fn from(e: SyscallError) -> Self {
        LaunchError::Syscall(e)
    }
}

/// A failed syscall with enough context to paste into a bug report.
#[derive(Debug, Clone)]
pub struct SyscallError {
    /// What we were doing, e.g. "writing the uid map".
    pub step: String,
    /// The call with its arguments, e.g. `open("/proc/1/uid_map")`.
    pub call: String,
    pub errno: Errno,
    pub hint: Option<String>,
}

impl SyscallError {
    pub fn new(step: impl Into<String>, call: impl Into<String>, errno: Errno) -> Self {
        SyscallError { step: step.into(), call: call.into(), errno, hint: None }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for SyscallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} => {}", self.step, self.call, ErrnoText(self.errno))?;
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SyscallError {}

/// Renders an I/O error as `ENOENT (No such file or directory)`, the same
/// shape as syscall failures, instead of Rust's "(os error 2)".
pub fn io_error_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => ErrnoText(Errno::from_raw(raw)).to_string(),
        None => e.to_string(),
    }
}

/// The C library's text for an errno, as `strerror` gives it (what
/// bubblewrap prints): `No such file or directory`.
pub fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Renders an errno as `EPERM (Operation not permitted)` without allocating,
/// so the sandbox child can use it too.
pub(crate) struct ErrnoText(pub Errno);

impl fmt::Display for ErrnoText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({})", self.0, self.0.desc())
    }
}
