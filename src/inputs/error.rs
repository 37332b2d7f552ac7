//! Errors of planning, fetching and applying inputs: one line each, with a
//! stable code and the item's id, like the manifest's parse errors:
//! `AGENT_INPUTS_DOWNLOAD_FAILED:skill:x: download failed: 404 Not Found`.
//!
//! The line's text is the [`Cause`]'s, a typed value that keeps what
//! failed (paths, URIs, sizes) and the underlying error as its source. The
//! errors of the other files of `inputs` that a cause holds live here too,
//! so that this file depends on none of them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use reqwest::StatusCode;

use super::zip::ZipError;
use crate::hostfs::root::FsError;
use crate::manifest::Shown;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// A hostPath outside every `--allow-host-path` root.
    HostPathNotAllowed,
    /// A hostPath that does not exist or cannot be read.
    HostPath,
    /// Two items both define the workspace, or a bind target is unusable.
    Conflict,
    /// A download URI that cannot be resolved or is not http(s).
    Uri,
    DownloadFailed,
    DownloadTooLarge,
    DownloadTimeout,
    ContentHashMismatch,
    /// The input cache could not be used.
    Cache,
    /// The archive tries something dangerous.
    ZipUnsafe,
    /// The archive is over a cap.
    ZipLimit,
    /// Not a readable zip.
    ZipInvalid,
    SkillMdMissing,
    GitFailed,
    GitTimeout,
    /// The copy source contains something that cannot be copied.
    CopyFailed,
    /// Writing the target failed.
    TargetFailed,
    BindFailed,
}

impl Code {
    /// Every code (the metrics count failures by code, and only these).
    pub const ALL: [Code; 18] = [
        Code::HostPathNotAllowed,
        Code::HostPath,
        Code::Conflict,
        Code::Uri,
        Code::DownloadFailed,
        Code::DownloadTooLarge,
        Code::DownloadTimeout,
        Code::ContentHashMismatch,
        Code::Cache,
        Code::ZipUnsafe,
        Code::ZipLimit,
        Code::ZipInvalid,
        Code::SkillMdMissing,
        Code::GitFailed,
        Code::GitTimeout,
        Code::CopyFailed,
        Code::TargetFailed,
        Code::BindFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::HostPathNotAllowed => "AGENT_INPUTS_HOST_PATH_NOT_ALLOWED",
            Code::HostPath => "AGENT_INPUTS_HOST_PATH",
            Code::Conflict => "AGENT_INPUTS_CONFLICT",
            Code::Uri => "AGENT_INPUTS_URI",
            Code::DownloadFailed => "AGENT_INPUTS_DOWNLOAD_FAILED",
            Code::DownloadTooLarge => "AGENT_INPUTS_DOWNLOAD_TOO_LARGE",
            Code::DownloadTimeout => "AGENT_INPUTS_DOWNLOAD_TIMEOUT",
            Code::ContentHashMismatch => "AGENT_INPUTS_CONTENT_HASH_MISMATCH",
            Code::Cache => "AGENT_INPUTS_CACHE",
            Code::ZipUnsafe => "AGENT_INPUTS_ZIP_UNSAFE",
            Code::ZipLimit => "AGENT_INPUTS_ZIP_LIMIT",
            Code::ZipInvalid => "AGENT_INPUTS_ZIP_INVALID",
            Code::SkillMdMissing => "AGENT_INPUTS_SKILL_MD_MISSING",
            Code::GitFailed => "AGENT_INPUTS_GIT_FAILED",
            Code::GitTimeout => "AGENT_INPUTS_GIT_TIMEOUT",
            Code::CopyFailed => "AGENT_INPUTS_COPY_FAILED",
            Code::TargetFailed => "AGENT_INPUTS_TARGET_FAILED",
            Code::BindFailed => "AGENT_INPUTS_BIND_FAILED",
        }
    }
}

/// An input that could not be planned, fetched or applied.
#[derive(Debug, thiserror::Error)]
pub struct InputError {
    pub code: Code,
    /// The item's id.
    pub item: String,
    /// What went wrong: the text after the id (boxed: a `Result` with
    /// this error stays small).
    #[source]
    pub cause: Box<Cause>,
}

impl InputError {
    pub fn new(code: Code, item: &str, cause: Cause) -> Self {
        InputError { code, item: item.to_string(), cause: Box::new(cause) }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ids and messages may quote the manifest: one line, as it is.
        write!(f, "{}:{}: {}", self.code.as_str(), Shown(&self.item), Shown(&self.cause.to_string()))
    }
}

/// Why an item failed (the text after `CODE:<item>: `).
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    // Planning.
    #[error("the workspace is already bound by item {first}")]
    WorkspaceTaken { first: String },
    #[error("the workspace {} is not a directory", .path.display())]
    WorkspaceNotDirectory { path: PathBuf },
    #[error("at most {max} bindMount items are supported besides the workspace")]
    TooManyBinds { max: usize },
    #[error("a bind over a whole root needs a directory; {} is a file", .path.display())]
    BindRootNeedsDirectory { path: PathBuf },
    #[error(
        "copying a file over a whole root is not possible; give target.path a file name ({})",
        .path.display()
    )]
    CopyFileOverRoot { path: PathBuf },
    #[error("writeFile needs a file name in target.path, not the root itself")]
    WriteFileOverRoot,
    /// An apply and a source type that do not go together.
    #[error("{apply} cannot use a {source_type} source")]
    Unpaired { apply: &'static str, source_type: &'static str },
    #[error("source.uri {uri:?} is relative; pass --inputs-base-url URL")]
    RelativeUri { uri: String },
    /// Not a URL, or not one relative to the base URL.
    #[error("source.uri {uri:?}: {source}")]
    BadUri { uri: String, source: url::ParseError },
    #[error("source.uri must be http or https, not {scheme}:")]
    UriScheme { scheme: String },
    #[error(
        "source.uri must not carry credentials; the inputs token is given with --inputs-token-file or TUIXIU_INPUTS_TOKEN"
    )]
    UriCredentials,
    /// A `file:` repo URL with no local path.
    #[error("source.repo {repo:?} is not a local path")]
    RepoNotLocal { repo: String },
    #[error(
        "source.repo must not carry a password; give git credentials with \
         TUIXIU_GIT_HTTP_USERNAME/TUIXIU_GIT_HTTP_PASSWORD (--env-file)"
    )]
    RepoPassword,
    #[error("source.repo scheme {scheme}: is not supported (https, http, ssh, git, file)")]
    RepoScheme { scheme: String },

    // Host paths.
    /// The path cannot be resolved (canonicalized).
    #[error("host path {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    HostPath { path: PathBuf, source: std::io::Error },
    /// `path` resolves to `canonical`, under none of `roots`.
    #[error(
        "host path {} is not under an allowed root ({})",
        shown_host_path(.path, .canonical),
        allowed_roots(.roots)
    )]
    HostPathNotAllowed { path: PathBuf, canonical: PathBuf, roots: Vec<PathBuf> },
    /// The resolved path cannot be examined.
    #[error("host path {}: {source}", .path.display())]
    HostPathStat { path: PathBuf, source: std::io::Error },
    #[error("host path {} is neither a directory nor a regular file", .path.display())]
    HostPathKind { path: PathBuf },

    // Checkouts.
    #[error("checkout: {0}")]
    Checkout(#[source] GitFailure),
    #[error("checkout: chown: {0}")]
    CheckoutChown(#[source] std::io::Error),
    #[error("checkout: temporary directory: {0}")]
    CheckoutDir(#[source] std::io::Error),
    #[error("checkout: temporary directory: {}: {source}", .path.display())]
    CheckoutDirOpen { path: PathBuf, source: Errno },
    #[error("checkout: temporary directory: {0}")]
    CheckoutDirLock(#[source] FsError),

    // The input cache.
    #[error("{0}")]
    Cache(#[source] CacheError),
    #[error("no input cache is configured")]
    NoCache,
    /// A file of the cache: a download's temporary file, or its entry.
    #[error("input cache {}: {source}", .path.display())]
    CacheFile { path: PathBuf, source: std::io::Error },
    #[error("input cache: {0}")]
    CacheLock(#[source] FsError),
    #[error("input cache: write: {0}")]
    CacheWrite(#[source] std::io::Error),
    #[error("input cache: {0}")]
    CacheSeek(#[source] std::io::Error),

    // Downloads. `url` fields are shown URLs (no credentials, query or
    // fragment): see `plan::display_url`.
    #[error("cannot start the HTTP client: {0}")]
    HttpRuntime(#[source] std::io::Error),
    #[error("cannot start the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    #[error("download timed out after {}s: {url}", .after.as_secs_f64())]
    DownloadTimeout { after: Duration, url: String },
    #[error("the inputs token is not a valid header value")]
    TokenHeader(#[source] reqwest::header::InvalidHeaderValue),
    /// The request failed (`source` has no URL: it is `url`).
    #[error("download failed: {url}: {}", reqwest_text(.source))]
    Request { url: String, source: reqwest::Error },
    /// Reading the body failed (`source` has no URL: it is `url`).
    #[error("download failed: {url}: {}", reqwest_text(.source))]
    Body { url: String, source: reqwest::Error },
    #[error("download failed: more than {max} redirects")]
    TooManyRedirects { max: usize },
    #[error("download failed: {status} without a Location")]
    NoLocation { status: StatusCode },
    #[error("download failed: bad redirect Location: {0}")]
    BadLocation(#[source] url::ParseError),
    #[error("download failed: redirect to a {scheme}: URL")]
    RedirectScheme { scheme: String },
    #[error("download failed: redirect from https to http refused")]
    RedirectToHttp,
    /// Not a success; `body` is an excerpt of the answer (may be empty).
    #[error(
        "download failed: {} {} from {url}{}",
        .status.as_u16(),
        .status.canonical_reason().unwrap_or(""),
        body_suffix(.body)
    )]
    Status { status: StatusCode, url: String, body: String },
    #[error("download too large: contentLength={length} maxBytes={max}")]
    DeclaredTooLarge { length: u64, max: u64 },
    #[error("download too large: maxBytes={max}")]
    TooLarge { max: u64 },
    #[error("download failed: empty body")]
    EmptyBody,
    #[error("contentHash mismatch: expected sha256 {expected}, got {got} from {url}")]
    HashMismatch { expected: String, got: String, url: String },
    /// A download failure whose text quoted a secret: the text, redacted
    /// (the typed cause, secret included, is not kept).
    #[error("{0}")]
    Redacted(String),

    // Applying.
    /// Landing the item failed; `apply` is its `apply` keyword.
    #[error("{apply}: {failure}")]
    Apply {
        apply: &'static str,
        #[source]
        failure: LandError,
    },
}

/// Why an item could not be landed in its target.
#[derive(Debug, thiserror::Error)]
pub enum LandError {
    /// A file operation at the target (`target` is its guest path).
    #[error("{target}: {source}")]
    Target { target: String, source: FsError },
    /// Writing the target file; the text hints at the usual causes.
    #[error("{guest}: {source}{}", target_hint(.source.errno))]
    TargetWrite { guest: String, source: FsError },
    #[error("{0}")]
    Bind(#[source] BindError),
    #[error("cannot open {}: {source}", .path.display())]
    OpenSource { path: PathBuf, source: FsError },
    /// Duplicating the source file's descriptor.
    #[error("{0}")]
    CloneSource(#[source] std::io::Error),
    #[error("cannot open the checkout: {0}")]
    OpenCheckout(#[source] Errno),
    /// `what` is the source's path, or "the checkout".
    #[error("copy from {what}: {source}")]
    Copy { what: String, source: CopyError },
    /// The archive was refused (never `ZipError::Fs`: that is `Target`).
    #[error("{0}")]
    Zip(#[source] ZipError),
    #[error("SKILL_MD_MISSING: a skill under USER_HOME/.codex/skills/ must have a top-level SKILL.md")]
    SkillMdMissing,
    #[error("the checkout target exists and is not a directory")]
    CheckoutTargetNotDirectory,
    #[error("the checkout target is not empty (git checks out into an empty or missing directory)")]
    CheckoutTargetNotEmpty,
    #[error("internal error: the item was not fetched")]
    NotFetched,
}

impl LandError {
    /// The code of an item that failed so.
    pub fn code(&self) -> Code {
        match self {
            LandError::Target { .. }
            | LandError::TargetWrite { .. }
            | LandError::CheckoutTargetNotDirectory
            | LandError::CheckoutTargetNotEmpty => Code::TargetFailed,
            LandError::Bind(_) => Code::BindFailed,
            LandError::OpenSource { .. } => Code::HostPath,
            LandError::CloneSource(_) | LandError::Copy { .. } => Code::CopyFailed,
            LandError::OpenCheckout(_) => Code::GitFailed,
            LandError::Zip(ZipError::Unsafe(_)) => Code::ZipUnsafe,
            LandError::Zip(ZipError::Limit(_)) => Code::ZipLimit,
            LandError::Zip(ZipError::Invalid(_)) => Code::ZipInvalid,
            LandError::Zip(ZipError::Fs(_)) => Code::TargetFailed,
            LandError::SkillMdMissing => Code::SkillMdMissing,
            LandError::NotFetched => Code::Conflict,
        }
    }
}

fn shown_host_path(path: &Path, canonical: &Path) -> String {
    if canonical == path {
        canonical.display().to_string()
    } else {
        format!("{} (= {})", path.display(), canonical.display())
    }
}

fn allowed_roots(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        "no host paths are allowed; pass --allow-host-path DIR".to_string()
    } else {
        format!("allowed: {}", roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "))
    }
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() { String::new() } else { format!(": {body}") }
}

fn target_hint(errno: Errno) -> &'static str {
    match errno {
        Errno::EISDIR => " (the target is a directory)",
        Errno::EROFS => " (the target is on a read-only mount)",
        Errno::EBUSY => " (the target is a mount point)",
        _ => "",
    }
}

/// A reqwest error and its causes on one line, without the URL (shown
/// apart).
pub(super) fn reqwest_text(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    if e.is_timeout() {
        text.push_str(" (timed out)");
    }
    text
}

/// Why a checkout failed; [`GitFailure::timed_out`] selects the error code.
#[derive(Debug, thiserror::Error)]
pub enum GitFailure {
    /// git's configuration file could not be written.
    #[error("git config: {0}")]
    Config(#[source] std::io::Error),
    /// git's empty home could not be made.
    #[error("git home: {0}")]
    Home(#[source] std::io::Error),
    /// The temporary file for git's stderr.
    #[error("git log file: {0}")]
    LogFile(#[source] std::io::Error),
    #[error("cannot run git: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("waiting for git: {0}")]
    Wait(#[source] std::io::Error),
    /// The deadline passed; git's process group was killed.
    #[error("git {command} timed out")]
    TimedOut { command: String },
    /// git exited unsuccessfully; `stderr` is the last lines of its own
    /// message, joined with ` | ` and redacted.
    #[error("git {command} failed ({status}): {stderr}")]
    Failed { command: String, status: std::process::ExitStatus, stderr: String },
}

impl GitFailure {
    pub fn timed_out(&self) -> bool {
        matches!(self, GitFailure::TimedOut { .. })
    }
}

/// Why the input cache (or a place to download to) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("input cache {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
    Io { dir: PathBuf, source: std::io::Error },
    #[error("input cache {} must be a directory owned by uid {uid} with mode 0700 (it is not ours)", .dir.display())]
    NotOurs { dir: PathBuf, uid: u32 },
    #[error(
        "input cache {} must be a directory owned by uid {uid} and writable only by it (choose another with --inputs-cache)",
        .dir.display()
    )]
    NotPrivate { dir: PathBuf, uid: u32 },
    #[error("no place to download to: {}: {file}; memfd_create => {memfd}", .dir.display())]
    NoPlace { dir: PathBuf, file: std::io::Error, memfd: nix::errno::Errno },
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Fs(#[from] FsError),
    #[error("{0}")]
    Unsupported(String),
}

/// Why a bind item could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("no deferred bind was prepared for this item")]
    NotPrepared,
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{guest} leads out of {root} through a symlink")]
    LeadsOut { guest: String, root: String },
    #[error(transparent)]
    Attach(#[from] sandbox::error::SyscallError),
    #[error("this provider cannot mount binds")]
    Unsupported,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOENT)
    }

    fn fs(errno: Errno) -> FsError {
        FsError { call: "openat2", path: "a/b".into(), errno }
    }

    /// The text of a reqwest error as the download code made it before
    /// `Cause::Request` (its own copy of the old `error_text`).
    fn old_error_text(e: reqwest::Error) -> String {
        let timeout = e.is_timeout();
        let e = e.without_url();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let part = s.to_string();
            if !text.contains(&part) {
                text.push_str(": ");
                text.push_str(&part);
            }
            source = s.source();
        }
        if timeout {
            text.push_str(" (timed out)");
        }
        text
    }

    /// A real connection error (nothing listens on port 1).
    fn refused() -> reqwest::Error {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime
            .block_on(async {
                reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .get("http://127.0.0.1:1/x")
                    .send()
                    .await
            })
            .unwrap_err()
    }

    /// Each variant renders exactly as the `format!` (or literal) it
    /// replaced, fed what the old code fed it.
    #[test]
    fn texts_are_the_old_ones() {
        let e = enoent();
        let path = PathBuf::from("/no/such");
        let shown_path = path.display();
        let uri = "ht tp://x";
        let parse = || url::Url::parse(uri).unwrap_err();
        let url = "https://h/a.zip".to_string();
        let max_binds = 64;
        let git = || GitFailure::TimedOut { command: "clone".into() };
        let cache = || CacheError::NotOurs { dir: path.clone(), uid: 7 };
        let status = StatusCode::NOT_FOUND;
        let header = || reqwest::header::HeaderValue::from_str("a\nb").unwrap_err();
        let cases: Vec<(Cause, String)> = vec![
            (Cause::WorkspaceTaken { first: "w".into() }, format!("the workspace is already bound by item {}", "w")),
            (
                Cause::WorkspaceNotDirectory { path: path.clone() },
                format!("the workspace {} is not a directory", shown_path),
            ),
            (
                Cause::TooManyBinds { max: max_binds },
                format!("at most {max_binds} bindMount items are supported besides the workspace"),
            ),
            (
                Cause::BindRootNeedsDirectory { path: path.clone() },
                format!("a bind over a whole root needs a directory; {} is a file", shown_path),
            ),
            (
                Cause::CopyFileOverRoot { path: path.clone() },
                format!(
                    "copying a file over a whole root is not possible; give target.path a file name ({})",
                    shown_path
                ),
            ),
            (
                Cause::WriteFileOverRoot,
                "writeFile needs a file name in target.path, not the root itself".into(),
            ),
            (
                Cause::Unpaired { apply: "copy", source_type: "httpZip" },
                format!("{} cannot use a {} source", "copy", "httpZip"),
            ),
            (
                Cause::RelativeUri { uri: uri.into() },
                format!("source.uri {uri:?} is relative; pass --inputs-base-url URL"),
            ),
            (Cause::BadUri { uri: uri.into(), source: parse() }, format!("source.uri {uri:?}: {}", parse())),
            (Cause::UriScheme { scheme: "ftp".into() }, format!("source.uri must be http or https, not {}:", "ftp")),
            (
                Cause::UriCredentials,
                "source.uri must not carry credentials; the inputs token is given with --inputs-token-file or TUIXIU_INPUTS_TOKEN".into(),
            ),
            (
                Cause::RepoNotLocal { repo: "file://h/r".into() },
                format!("source.repo {:?} is not a local path", "file://h/r"),
            ),
            (
                Cause::RepoPassword,
                "source.repo must not carry a password; give git credentials with \
                 TUIXIU_GIT_HTTP_USERNAME/TUIXIU_GIT_HTTP_PASSWORD (--env-file)"
                    .into(),
            ),
            (
                Cause::RepoScheme { scheme: "svn".into() },
                format!("source.repo scheme {}: is not supported (https, http, ssh, git, file)", "svn"),
            ),
            (
                Cause::HostPath { path: path.clone(), source: enoent() },
                format!("host path {}: {}", shown_path, sandbox::error::io_error_text(&e)),
            ),
            (
                Cause::HostPathStat { path: path.clone(), source: enoent() },
                format!("host path {}: {}", shown_path, e),
            ),
            (
                Cause::HostPathKind { path: path.clone() },
                format!("host path {} is neither a directory nor a regular file", shown_path),
            ),
            (Cause::Checkout(git()), format!("checkout: {}", git())),
            (Cause::CheckoutChown(enoent()), format!("checkout: chown: {e}")),
            (Cause::CheckoutDir(enoent()), format!("checkout: temporary directory: {}{}", "", e)),
            (
                Cause::CheckoutDirOpen { path: path.clone(), source: Errno::EACCES },
                format!("checkout: temporary directory: {}{}", format_args!("{}: ", shown_path), Errno::EACCES),
            ),
            (
                Cause::CheckoutDirLock(fs(Errno::EIO)),
                format!("checkout: temporary directory: {}{}", "", fs(Errno::EIO)),
            ),
            (Cause::Cache(cache()), cache().to_string()),
            (Cause::NoCache, "no input cache is configured".into()),
            (
                Cause::CacheFile { path: path.join("tmp"), source: enoent() },
                format!("input cache {}: {e}", path.join("tmp").display()),
            ),
            (Cause::CacheLock(fs(Errno::EIO)), format!("input cache: {}", fs(Errno::EIO))),
            (Cause::CacheWrite(enoent()), format!("input cache: write: {e}")),
            (Cause::CacheSeek(enoent()), format!("input cache: {e}")),
            (Cause::HttpRuntime(enoent()), format!("cannot start the HTTP client: {e}")),
            (Cause::HttpClient(refused()), format!("cannot start the HTTP client: {}", refused())),
            (
                Cause::DownloadTimeout { after: Duration::from_millis(1500), url: url.clone() },
                format!("download timed out after {}s: {}", Duration::from_millis(1500).as_secs_f64(), url),
            ),
            (Cause::TokenHeader(header()), "the inputs token is not a valid header value".into()),
            (
                Cause::Request { url: url.clone(), source: refused().without_url() },
                format!("download failed: {}: {}", url, old_error_text(refused())),
            ),
            (
                Cause::Body { url: url.clone(), source: refused().without_url() },
                format!("download failed: {}: {}", url, old_error_text(refused())),
            ),
            (Cause::TooManyRedirects { max: 10 }, format!("download failed: more than {} redirects", 10)),
            (
                Cause::NoLocation { status: StatusCode::FOUND },
                format!("download failed: {} without a Location", StatusCode::FOUND),
            ),
            (Cause::BadLocation(parse()), format!("download failed: bad redirect Location: {}", parse())),
            (
                Cause::RedirectScheme { scheme: "ftp".into() },
                format!("download failed: redirect to a {}: URL", "ftp"),
            ),
            (Cause::RedirectToHttp, "download failed: redirect from https to http refused".into()),
            (Cause::DeclaredTooLarge { length: 9, max: 8 }, format!("download too large: contentLength={} maxBytes={}", 9, 8)),
            (Cause::TooLarge { max: 8 }, format!("download too large: maxBytes={}", 8)),
            (Cause::EmptyBody, "download failed: empty body".into()),
            (
                Cause::HashMismatch { expected: "aa".into(), got: "bb".into(), url: url.clone() },
                format!("contentHash mismatch: expected sha256 {}, got {} from {}", "aa", "bb", url),
            ),
            (Cause::Redacted("download failed: [REDACTED]".into()), "download failed: [REDACTED]".into()),
        ];
        // The status line, with and without an excerpt of the body.
        let old_status = |body: &str| {
            let reason = status.canonical_reason().unwrap_or("");
            let mut message = format!("download failed: {} {reason} from {}", status.as_u16(), url);
            if !body.is_empty() {
                message.push_str(&format!(": {body}"));
            }
            message
        };
        let statuses = ["", "no such file"]
            .map(|body| (Cause::Status { status, url: url.clone(), body: body.into() }, old_status(body)));
        let odd = StatusCode::from_u16(599).unwrap();
        let odd_status = (
            Cause::Status { status: odd, url: url.clone(), body: String::new() },
            format!("download failed: {} {} from {}", 599, "", url),
        );
        // The allowlist refusal: none allowed / some; the path as given or resolved.
        let canonical = PathBuf::from("/real/x");
        let roots = vec![PathBuf::from("/a"), PathBuf::from("/b")];
        let not_allowed = [
            (
                Cause::HostPathNotAllowed {
                    path: canonical.clone(),
                    canonical: canonical.clone(),
                    roots: vec![],
                },
                format!(
                    "host path {} is not under an allowed root ({})",
                    canonical.display(),
                    "no host paths are allowed; pass --allow-host-path DIR"
                ),
            ),
            (
                Cause::HostPathNotAllowed { path: path.clone(), canonical: canonical.clone(), roots },
                format!(
                    "host path {} is not under an allowed root ({})",
                    format_args!("{} (= {})", shown_path, canonical.display()),
                    format_args!("allowed: {}", "/a, /b")
                ),
            ),
        ];
        for (cause, old) in cases.into_iter().chain(statuses).chain([odd_status]).chain(not_allowed) {
            assert_eq!(cause.to_string(), old, "{cause:?}");
        }
    }

    /// The apply phase's texts: `<apply>: ` and what the old `Fail` held.
    #[test]
    fn landing_texts_are_the_old_ones() {
        let target = "WORKSPACE/x".to_string();
        let apply = |failure: LandError| Cause::Apply { apply: "copy", failure };
        let old = |message: String| format!("{}: {message}", "copy");
        let path = PathBuf::from("/host/x");
        let e = fs(Errno::ENOENT);
        let mut cases: Vec<(LandError, String, Code)> = vec![
            (
                LandError::Target { target: target.clone(), source: fs(Errno::ENOENT) },
                format!("{target}: {e}"),
                Code::TargetFailed,
            ),
            (LandError::Bind(BindError::Unsupported), BindError::Unsupported.to_string(), Code::BindFailed),
            (
                LandError::Bind(BindError::Fs(fs(Errno::ENOENT))),
                BindError::Fs(fs(Errno::ENOENT)).to_string(),
                Code::BindFailed,
            ),
            (
                LandError::OpenSource { path: path.clone(), source: fs(Errno::ENOENT) },
                format!("cannot open {}: {e}", path.display()),
                Code::HostPath,
            ),
            (LandError::CloneSource(enoent()), enoent().to_string(), Code::CopyFailed),
            (
                LandError::OpenCheckout(Errno::EMFILE),
                format!("cannot open the checkout: {}", Errno::EMFILE),
                Code::GitFailed,
            ),
            (
                LandError::Copy { what: "the checkout".into(), source: CopyError::Fs(fs(Errno::ENOENT)) },
                format!("copy from {}: {e}", "the checkout"),
                Code::CopyFailed,
            ),
            (
                LandError::Copy {
                    what: "/host/x".into(),
                    source: CopyError::Unsupported("s is a socket".into()),
                },
                format!("copy from {}: {}", "/host/x", "s is a socket"),
                Code::CopyFailed,
            ),
            (LandError::Zip(ZipError::Unsafe("u".into())), "u".into(), Code::ZipUnsafe),
            (LandError::Zip(ZipError::Limit("l".into())), "l".into(), Code::ZipLimit),
            (LandError::Zip(ZipError::Invalid("i".into())), "i".into(), Code::ZipInvalid),
            (
                LandError::SkillMdMissing,
                "SKILL_MD_MISSING: a skill under USER_HOME/.codex/skills/ must have a top-level SKILL.md"
                    .into(),
                Code::SkillMdMissing,
            ),
            (
                LandError::CheckoutTargetNotDirectory,
                "the checkout target exists and is not a directory".into(),
                Code::TargetFailed,
            ),
            (
                LandError::CheckoutTargetNotEmpty,
                "the checkout target is not empty (git checks out into an empty or missing directory)".into(),
                Code::TargetFailed,
            ),
            (LandError::NotFetched, "internal error: the item was not fetched".into(), Code::Conflict),
        ];
        // `target_error`: the guest path, the error, a hint for some errnos.
        for (errno, hint) in [
            (Errno::EISDIR, " (the target is a directory)"),
            (Errno::EROFS, " (the target is on a read-only mount)"),
            (Errno::EBUSY, " (the target is a mount point)"),
            (Errno::EACCES, ""),
        ] {
            let e = fs(errno);
            cases.push((
                LandError::TargetWrite { guest: target.clone(), source: fs(errno) },
                format!("{target}: {e}{hint}"),
                Code::TargetFailed,
            ));
        }
        for (failure, message, code) in cases {
            assert_eq!(failure.code(), code, "{failure:?}");
            let cause = apply(failure);
            assert_eq!(cause.to_string(), old(message), "{cause:?}");
        }
    }

    /// The whole line, through `Shown`, as before.
    #[test]
    fn the_line_is_code_item_cause() {
        let e = InputError::new(Code::Cache, "skill:x", Cause::NoCache);
        assert_eq!(e.to_string(), "AGENT_INPUTS_CACHE:skill:x: no input cache is configured");
        let e = InputError::new(Code::Uri, "a\nb", Cause::RelativeUri { uri: "x\ty".into() });
        assert_eq!(
            e.to_string(),
            format!(
                "{}:{}: {}",
                Code::Uri.as_str(),
                Shown("a\nb"),
                Shown(&format!("source.uri {:?} is relative; pass --inputs-base-url URL", "x\ty"))
            )
        );
        assert!(std::error::Error::source(&e).is_some(), "the cause is the source");
    }
}
