//! Errors of preparing a `run`: the command line, the manifest, the
//! environment pipeline and the inputs, before anything is launched. Each
//! renders as the one line the CLI prints after `tuixiu-sandbox: `
//! (tests and docs quote them; keep the texts).

use std::io;
use std::path::PathBuf;

use sandbox::SpecError;
use sandbox::error::io_error_text;

use super::units::UnitError;
use crate::env::EnvError;
use crate::inputs::{AllowlistError, InputError, ThreadsLeft};
use crate::manifest::ManifestError;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("--workspace: cannot use the current directory: {0}")]
    CurrentDir(#[source] io::Error),
    #[error("{flag} {}: not a directory", .dir.display())]
    NotADirectory { flag: &'static str, dir: PathBuf },
    #[error("{flag} {}: {}", .dir.display(), io_error_text(.source))]
    Dir {
        flag: &'static str,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--seccomp: {0}")]
    Seccomp(#[source] SpecError),
    #[error("--allow-host: {0}")]
    Allowlist(#[source] crate::egress::PatternError),
    #[error("--allow-hosts-file {0}")]
    AllowHostsFile(String),
    #[error("--allow-host, --allow-hosts-file and --allow-range need --network allow")]
    AllowlistWithoutAllow,
    #[error("starting the egress proxy: {0}")]
    EgressProxy(#[source] io::Error),
    /// A limit option (`--memory`, `--timeout`, ...) that does not parse.
    #[error("{flag}: {source}")]
    Limit {
        flag: &'static str,
        #[source]
        source: UnitError,
    },
    #[error("--pids/--nofile: must be more than 0")]
    ZeroLimit,
    #[error("--pass-env {0:?}: not a variable name")]
    PassEnvName(String),
    #[error("--map-uid/--map-gid: only a root caller can map the sandbox user onto other host ids")]
    MapIdsNotRoot,
    /// The sandbox builder refused the spec.
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Env(#[from] EnvError),
    /// Never the value: it may be a secret. The argument's position, from 1.
    #[error("--env: expected KEY=VALUE, got a value without '=' or with an empty key (argument {0})")]
    EnvPair(usize),
    #[error("--manifest {}: {}", .path.display(), io_error_text(.source))]
    ManifestRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Larger than `max` bytes.
    #[error("--manifest {}: larger than {} MiB", .path.display(), .max >> 20)]
    ManifestTooLarge { path: PathBuf, max: u64 },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Input(#[from] InputError),
    /// An `--allow-host-path` directory that cannot be used.
    #[error("{0}")]
    AllowHostPath(#[source] AllowlistError),
    #[error("--inputs-base-url {raw:?}: {source}")]
    BaseUrl {
        raw: String,
        #[source]
        source: url::ParseError,
    },
    #[error("--inputs-base-url {0:?}: must be an http or https URL")]
    BaseUrlScheme(String),
    #[error("--inputs-base-url must not carry credentials; use --inputs-token-file")]
    BaseUrlCredentials,
    #[error("--home-path {0:?}: must be an absolute path")]
    HomePathRelative(String),
    /// The user view of the flags (`--user` or `--home-path`) is invalid.
    #[error("{flag}: {source}")]
    User {
        flag: &'static str,
        #[source]
        source: SpecError,
    },
    /// The user view moved by the manifest's envPatch is invalid.
    #[error("envPatch: {0}")]
    EnvPatchUser(#[source] SpecError),
    #[error("envPatch.USER {patch:?} conflicts with --user {flag:?}")]
    UserConflict { patch: String, flag: String },
    #[error("envPatch.HOME {patch:?} conflicts with --home-path {flag:?}")]
    HomeConflict { patch: String, flag: String },
    #[error("--audit-log {}: {}", .path.display(), io_error_text(.source))]
    AuditLog {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--inputs-token-file {}: {}", .path.display(), io_error_text(.source))]
    TokenFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The process did not become single-threaded before the launch.
    #[error("{0}")]
    Threads(#[source] ThreadsLeft),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        let enoent = || io::Error::from_raw_os_error(libc::ENOENT);
        let e = enoent();
        let dir = PathBuf::from("/no/such");
        let cases: Vec<(RunError, String)> = vec![
            (RunError::CurrentDir(enoent()), format!("--workspace: cannot use the current directory: {e}")),
            (
                RunError::NotADirectory { flag: "--home", dir: dir.clone() },
                format!("--home {}: not a directory", dir.display()),
            ),
            (
                RunError::Dir { flag: "--workspace", dir: dir.clone(), source: enoent() },
                format!("--workspace {}: {}", dir.display(), io_error_text(&e)),
            ),
            (
                RunError::Limit { flag: "--memory", source: UnitError::SizeZero("0".into()) },
                format!("--memory: {:?} must be more than 0", "0"),
            ),
            (RunError::ZeroLimit, "--pids/--nofile: must be more than 0".into()),
            (RunError::PassEnvName("A=B".into()), format!("--pass-env {:?}: not a variable name", "A=B")),
            (
                RunError::MapIdsNotRoot,
                "--map-uid/--map-gid: only a root caller can map the sandbox user onto other host ids".into(),
            ),
            (
                RunError::EnvPair(2),
                "--env: expected KEY=VALUE, got a value without '=' or with an empty key (argument 2)".into(),
            ),
            (
                RunError::Env(EnvError::File { file: "f".into(), source: enoent() }),
                format!("--env-file f: {}", io_error_text(&e)),
            ),
            (
                RunError::ManifestRead { path: dir.clone(), source: enoent() },
                format!("--manifest {}: {}", dir.display(), io_error_text(&e)),
            ),
            (
                RunError::ManifestTooLarge { path: dir.clone(), max: 16 << 20 },
                format!("--manifest {}: larger than {} MiB", dir.display(), 16),
            ),
            (
                RunError::AllowHostPath(AllowlistError::NotADirectory(dir.clone())),
                format!("--allow-host-path {}: not a directory", dir.display()),
            ),
            (
                RunError::BaseUrlScheme("ftp://x".into()),
                format!("--inputs-base-url {:?}: must be an http or https URL", "ftp://x"),
            ),
            (
                RunError::BaseUrlCredentials,
                "--inputs-base-url must not carry credentials; use --inputs-token-file".into(),
            ),
            (
                RunError::HomePathRelative("h".into()),
                format!("--home-path {:?}: must be an absolute path", "h"),
            ),
            (
                RunError::User { flag: "--user", source: SpecError::new("bad") },
                format!("--user: {}", SpecError::new("bad")),
            ),
            (RunError::EnvPatchUser(SpecError::new("bad")), format!("envPatch: {}", SpecError::new("bad"))),
            (
                RunError::UserConflict { patch: "a".into(), flag: "b".into() },
                format!("envPatch.USER {:?} conflicts with --user {:?}", "a", "b"),
            ),
            (
                RunError::HomeConflict { patch: "/a".into(), flag: "/b".into() },
                format!("envPatch.HOME {:?} conflicts with --home-path {:?}", "/a", "/b"),
            ),
            (
                RunError::AuditLog { path: dir.clone(), source: enoent() },
                format!("--audit-log {}: {}", dir.display(), io_error_text(&e)),
            ),
            (
                RunError::TokenFile { path: dir.clone(), source: enoent() },
                format!("--inputs-token-file {}: {}", dir.display(), io_error_text(&e)),
            ),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
        let raw = "http://[x";
        let source = url::Url::parse(raw).unwrap_err();
        assert_eq!(
            RunError::BaseUrl { raw: raw.into(), source }.to_string(),
            format!("--inputs-base-url {raw:?}: {source}")
        );
    }
}
