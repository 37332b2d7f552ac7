//! Why the front end could not run a parsed command line: one line each,
//! printed after `bwrap: ` by [`super::fail`]. Where bubblewrap has a
//! message for the same failure, the text is bubblewrap's, word for word
//! (tests/bwrap_host.rs compares them with bubblewrap's own output).

use std::io;

use sandbox::nested::{HostError, SOCKET};

/// The C library's text for an I/O error, as bubblewrap prints it.
pub(super) fn io_text(e: &io::Error) -> String {
    sandbox::error::strerror(e.raw_os_error().unwrap_or(libc::EIO))
}

#[derive(Debug, thiserror::Error)]
pub enum BwrapError {
    /// No portal socket to reach the outer launcher through.
    #[error(
        "nested sandboxes are not available here ({}: {}): this bwrap is tuixiu-sandbox's, \
         and works only inside a sandbox started with --nested on",
        SOCKET,
        sandbox::error::io_error_text(.0)
    )]
    NoPortal(#[source] io::Error),
    #[error("cannot encode the request: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot send the request to the launcher: {}", sandbox::error::io_error_text(.0))]
    Send(#[source] io::Error),
    /// The outer launcher refused or failed the request; its reply is the
    /// message, already in bubblewrap's words where bubblewrap has some.
    #[error("{0}")]
    Refused(String),
    #[error(
        "the nested sandbox ended without a status: the portal's process serving it is gone (killed from inside the sandbox, or the sandbox is ending)"
    )]
    NoStatus,
    #[error("reading the launcher's reply: {}", sandbox::error::io_error_text(.0))]
    Reply(#[source] io::Error),
    /// `--bind-fd`: what the descriptor is open on cannot be named.
    #[error("Can't find source path {link}: {}", io_text(.source))]
    SourcePath {
        link: String,
        #[source]
        source: io::Error,
    },
    #[error("Can't find source path {0}: not UTF-8")]
    SourcePathUtf8(String),
    /// A data option's descriptor (`--file`, `--bind-data`, ...).
    #[error("Can't write data to file {dst}: {}", io_text(.source))]
    Data {
        dst: String,
        #[source]
        source: io::Error,
    },
    #[error("Can't read seccomp data: {}", sandbox::error::strerror(libc::EBADF))]
    SeccompData,
    #[error("Invalid seccomp data, must be multiple of 8")]
    SeccompLength,
    #[error(
        "{0} descriptors are open; tuixiu-sandbox's bwrap can pass at most {max} to the nested sandbox",
        max = sandbox::nested::wire::MAX_FDS
    )]
    TooManyFds(usize),
    #[error("--tx-seccomp: {0}")]
    TxSeccomp(#[source] sandbox::SpecError),
    /// bwrap on the host: the runtime's error, in bubblewrap's words where it has them.
    #[error(transparent)]
    Host(#[from] HostError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        let ebadf = || io::Error::from_raw_os_error(libc::EBADF);
        let e = ebadf();
        let strerror = sandbox::error::strerror;
        let cases: Vec<(BwrapError, String)> = vec![
            (
                BwrapError::NoPortal(ebadf()),
                format!(
                    "nested sandboxes are not available here ({SOCKET}: {}): this bwrap is tuixiu-sandbox's, \
                     and works only inside a sandbox started with --nested on",
                    sandbox::error::io_error_text(&e)
                ),
            ),
            (
                BwrapError::Send(ebadf()),
                format!("cannot send the request to the launcher: {}", sandbox::error::io_error_text(&e)),
            ),
            (
                BwrapError::Refused("Can't mkdir /x: Permission denied".into()),
                "Can't mkdir /x: Permission denied".into(),
            ),
            (BwrapError::NoStatus, "the nested sandbox ended without a status: the portal's process serving it is gone (killed from inside the sandbox, or the sandbox is ending)".into()),
            (
                BwrapError::Reply(ebadf()),
                format!("reading the launcher's reply: {}", sandbox::error::io_error_text(&e)),
            ),
            (
                BwrapError::SourcePath { link: "/proc/self/fd/9".into(), source: ebadf() },
                format!("Can't find source path /proc/self/fd/9: {}", strerror(libc::EBADF)),
            ),
            (
                BwrapError::SourcePathUtf8("/proc/self/fd/9".into()),
                "Can't find source path /proc/self/fd/9: not UTF-8".into(),
            ),
            (
                BwrapError::Data { dst: "/etc/x".into(), source: ebadf() },
                format!("Can't write data to file /etc/x: {}", strerror(libc::EBADF)),
            ),
            (
                BwrapError::Data { dst: "/etc/x".into(), source: io::Error::other("no errno") },
                format!("Can't write data to file /etc/x: {}", strerror(libc::EIO)),
            ),
            (BwrapError::SeccompData, format!("Can't read seccomp data: {}", strerror(libc::EBADF))),
            (BwrapError::SeccompLength, "Invalid seccomp data, must be multiple of 8".into()),
            (
                BwrapError::TooManyFds(300),
                format!(
                    "{} descriptors are open; tuixiu-sandbox's bwrap can pass at most {} to the nested sandbox",
                    300,
                    sandbox::nested::wire::MAX_FDS
                ),
            ),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
        let bad = sandbox::SeccompPolicy::parse("nonesuch").unwrap_err();
        let old = format!("--tx-seccomp: {bad}");
        assert_eq!(BwrapError::TxSeccomp(bad).to_string(), old);
    }
}
