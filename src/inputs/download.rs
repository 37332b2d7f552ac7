//! Downloading `httpZip` sources into the input cache.
//!
//! * A URI with a `contentHash` is looked up in the cache first
//!   (`<cache>/zips/<sha256>.zip`); a cached file is re-hashed before use,
//!   and a download is stored there only after its hash matched.
//! * The bearer token is sent only to the origin (scheme, host, port) of
//!   the configured inputs base URL, on every hop of a redirect chain; a
//!   redirect to another origin goes on without it, and `https` → `http`
//!   is refused.
//! * Each download has a deadline for the whole transfer and a size cap,
//!   checked against `Content-Length` before the body and against the bytes
//!   received while streaming.
//! * A progress bar is drawn on stderr only when it is a terminal.
//!
//! `sandbox::launch` clones the process and refuses to run with more than
//! one thread, so the HTTP client runs on a current-thread tokio runtime
//! that spawns no threads: name resolution happens inline (no
//! `spawn_blocking` pool), no steady-tick progress thread is used, and the
//! runtime is dropped before this module returns.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use url::Url;

use super::error::{Cause, Code, InputError};
use super::plan::display_url;
use crate::env::Redactor;
use crate::hostfs::atomic::{AtomicFile, Durability};
use crate::hostfs::root as fsx;

pub use crate::env::Secret;

/// Defaults: 60 s per download, 200 MiB.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_BYTES: u64 = 200 << 20;
const MAX_REDIRECTS: usize = 10;

/// The name prefix of a download in progress in the cache's `tmp/`.
const TMP_PREFIX: &str = "download-";

/// How downloads are made.
#[derive(Clone, Debug)]
pub struct DownloadOptions {
    /// Origin of `--inputs-base-url`; the token goes nowhere else.
    pub token_origin: Option<url::Origin>,
    pub token: Option<Secret>,
    pub timeout: Duration,
    /// 0 means no cap.
    pub max_bytes: u64,
    /// Draw a progress bar (only when stderr is a terminal).
    pub progress: bool,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            token_origin: None,
            token: None,
            timeout: DEFAULT_TIMEOUT,
            max_bytes: DEFAULT_MAX_BYTES,
            progress: false,
        }
    }
}

/// A zip ready to extract.
#[derive(Debug)]
pub struct Zip {
    pub file: File,
    pub sha256: String,
    pub bytes: u64,
    /// Served from the cache (no network).
    pub cached: bool,
}

/// The private cache directory: `zips/` holds verified archives by hash,
/// `tmp/` downloads in progress. A download's temporary file is removed
/// when it ends, even on error; one left by a killed process is removed by
/// the next [`Cache::open`]: a live download holds its file locked (other
/// processes may be downloading into the same cache right now).
/// Without a usable directory ([`Cache::none`]) archives are downloaded into
/// unnamed temporary files and nothing is kept.
#[derive(Clone, Debug)]
pub struct Cache {
    root: Option<PathBuf>,
}

impl Cache {
    /// The default location, if one is usable: `$XDG_CACHE_HOME/tuixiu-sandbox/inputs`,
    /// else `$HOME/.cache/...`, else a private per-user directory in the
    /// temporary directory (`$TMPDIR/tuixiu-sandbox-<uid>/inputs`, 0700 and
    /// ours), else none. Never an error: one warning line says which was
    /// unusable and what is used instead.
    pub fn default_location() -> Cache {
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut first_failure: Option<CacheError> = None;
        let candidates = [
            nonempty("XDG_CACHE_HOME").map(|d| d.join("tuixiu-sandbox/inputs")),
            nonempty("HOME").map(|d| d.join(".cache/tuixiu-sandbox/inputs")),
        ];
        for dir in candidates.into_iter().flatten() {
            match Cache::open(&dir) {
                Ok(cache) => return cache.noting(first_failure),
                Err(e) => {
                    first_failure.get_or_insert(e);
                }
            }
        }
        match per_user_temp_dir().and_then(|dir| Cache::open(&dir.join("inputs"))) {
            Ok(cache) => cache.noting(first_failure),
            Err(e) => {
                tracing::warn!(
                    "{}; downloading without a cache (choose one with --inputs-cache or XDG_CACHE_HOME)",
                    first_failure.unwrap_or(e)
                );
                Cache::none()
            }
        }
    }

    /// Downloads without keeping anything.
    pub fn none() -> Cache {
        Cache { root: None }
    }

    /// The one warning of a fallback.
    fn noting(self, failure: Option<CacheError>) -> Cache {
        if let (Some(failure), Some(root)) = (failure, &self.root) {
            tracing::warn!(
                "{failure}; using {} instead (choose one with --inputs-cache or XDG_CACHE_HOME)",
                root.display()
            );
        }
        self
    }

    /// Opens (creating it, mode 0700) a cache directory that must belong to
    /// this user and not be writable by others.
    pub fn open(root: &Path) -> Result<Cache, CacheError> {
        for dir in [root.to_path_buf(), root.join("zips"), root.join("tmp")] {
            private_dir(&dir)?;
        }
        let cache = Cache { root: Some(root.to_path_buf()) };
        cache.remove_stale_downloads();
        Ok(cache)
    }

    /// Removes the `download-*` files in `tmp/` that no live download
    /// holds locked: what killed runs left.
    fn remove_stale_downloads(&self) {
        let Some(root) = &self.root else { return };
        let Ok(tmp) =
            nix::fcntl::open(&root.join("tmp"), fsx::dir_read_flags(), nix::sys::stat::Mode::empty())
        else {
            return;
        };
        fsx::sweep_unlocked(tmp.as_fd(), |name| name.starts_with(TMP_PREFIX.as_bytes()), None);
    }

    /// The directory, unless downloads are not cached.
    #[allow(dead_code)] // for providers
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    fn zip_path(&self, sha256: &str) -> Option<PathBuf> {
        // `sha256` was validated as 64 hex digits by the manifest parser.
        Some(self.root.as_ref()?.join("zips").join(format!("{sha256}.zip")))
    }

    /// The cached archive with this hash, re-verified, if present.
    pub fn lookup(&self, sha256: &str) -> Option<Zip> {
        let path = self.zip_path(sha256)?;
        let mut file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
        match hash_file(&mut file) {
            Ok((got, bytes)) if got == sha256 => Some(Zip { file, sha256: got, bytes, cached: true }),
            Ok((got, _)) => {
                tracing::warn!("cached {} has sha256 {got}; discarding it", path.display());
                let _ = std::fs::remove_file(&path);
                None
            }
            Err(e) => {
                tracing::warn!("cached {}: {e}; downloading again", path.display());
                None
            }
        }
    }
}

/// `$TMPDIR/tuixiu-sandbox-<uid>`: created 0700, and used only if it is a
/// directory of ours that nobody else may enter (the temporary directory
/// is shared: another user could have made it first, or a link in its place).
fn per_user_temp_dir() -> Result<PathBuf, CacheError> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("tuixiu-sandbox-{uid}"));
    let shown = |source| CacheError::Io { dir: dir.clone(), source };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(shown(e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(shown)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(CacheError::NotOurs { dir, uid });
    }
    Ok(dir)
}

fn private_dir(dir: &Path) -> Result<(), CacheError> {
    let shown = |source| CacheError::Io { dir: dir.to_path_buf(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(shown)?;
    let meta = std::fs::symlink_metadata(dir).map_err(shown)?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(CacheError::NotPrivate { dir: dir.to_path_buf(), uid });
    }
    Ok(())
}

pub use super::error::CacheError;

/// sha256 (hex) and length of a file, read from its start.
pub fn hash_file(file: &mut File) -> std::io::Result<(String, u64)> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// One archive to fetch.
pub struct Job<'a> {
    pub item: &'a str,
    pub url: &'a Url,
    pub content_hash: Option<&'a str>,
}

/// Fetches every job, cache first, in order; the first failure stops.
pub fn fetch_all(
    jobs: &[Job<'_>],
    cache: &Cache,
    options: &DownloadOptions,
    redactor: &Redactor,
) -> Result<Vec<Zip>, InputError> {
    let mut results: Vec<Option<Zip>> =
        jobs.iter().map(|j| j.content_hash.and_then(|h| cache.lookup(h))).collect();
    if results.iter().all(Option::is_some) {
        return Ok(results.into_iter().flatten().collect());
    }
    let first_missing = jobs[results.iter().position(Option::is_none).unwrap_or(0)].item;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| InputError::new(Code::DownloadFailed, first_missing, Cause::HttpRuntime(e)))?;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(options.timeout)
        .user_agent(concat!("tuixiu-sandbox/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(InlineResolver)
        .build()
        .map_err(|e| InputError::new(Code::DownloadFailed, first_missing, Cause::HttpClient(e)))?;
    let mut outcome = Ok(());
    for (job, slot) in jobs.iter().zip(results.iter_mut()) {
        if slot.is_some() {
            continue;
        }
        let fetched = runtime.block_on(async {
            match tokio::time::timeout(options.timeout, download(&client, job, cache, options, redactor))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(InputError::new(
                    Code::DownloadTimeout,
                    job.item,
                    Cause::DownloadTimeout { after: options.timeout, url: display_url(job.url) },
                )),
            }
        });
        match fetched {
            Ok(zip) => *slot = Some(zip),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // Connections, then the runtime: nothing of the client outlives this call.
    drop(client);
    drop(runtime);
    outcome.map(|()| results.into_iter().flatten().collect())
}

async fn download(
    client: &reqwest::Client,
    job: &Job<'_>,
    cache: &Cache,
    options: &DownloadOptions,
    redactor: &Redactor,
) -> Result<Zip, InputError> {
    let fail = |code: Code, cause: Cause| redacted(InputError::new(code, job.item, cause), redactor);
    let (mut response, url) = follow_redirects(client, job, options, &fail).await?;
    let status = response.status();
    if !status.is_success() {
        let mut body = String::new();
        // A short excerpt helps; the error page itself is not worth a wait.
        if let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(2), response.chunk()).await {
            body = String::from_utf8_lossy(&chunk[..chunk.len().min(200)])
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
                .trim()
                .to_string();
        }
        return Err(fail(Code::DownloadFailed, Cause::Status { status, url: display_url(&url), body }));
    }
    let max = options.max_bytes;
    let declared = response.content_length();
    if let Some(length) = declared
        && max > 0
        && length > max
    {
        return Err(fail(Code::DownloadTooLarge, Cause::DeclaredTooLarge { length, max }));
    }

    let mut staged = staging_file(cache, &fail)?;
    let progress = progress_bar(options.progress, declared, &crate::manifest::shown(job.item));
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                return Err(fail(
                    Code::DownloadFailed,
                    Cause::Body { url: display_url(&url), source: e.without_url() },
                ));
            }
        };
        received += chunk.len() as u64;
        if max > 0 && received > max {
            return Err(fail(Code::DownloadTooLarge, Cause::TooLarge { max }));
        }
        hasher.update(&chunk);
        staged.file.write_all(&chunk).map_err(|e| fail(Code::Cache, Cause::CacheWrite(e)))?;
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    if received == 0 {
        return Err(fail(Code::DownloadFailed, Cause::EmptyBody));
    }
    let sha256 = hex::encode(hasher.finalize());
    let mut file = match job.content_hash {
        Some(expected) if expected != sha256 => {
            return Err(fail(
                Code::ContentHashMismatch,
                Cause::HashMismatch { expected: expected.to_string(), got: sha256, url: display_url(&url) },
            ));
        }
        Some(_) => match cache.zip_path(&sha256) {
            Some(dest) => staged
                .commit(&dest, Durability::Unsynced)
                .map_err(|source| fail(Code::Cache, Cause::CacheFile { path: dest, source }))?,
            None => staged.discard(),
        },
        // Nothing to key a cache entry by: the archive lives as an open,
        // already unlinked file until it is extracted.
        None => staged.discard(),
    };
    file.seek(SeekFrom::Start(0)).map_err(|e| fail(Code::Cache, Cause::CacheSeek(e)))?;
    Ok(Zip { file, sha256, bytes: received, cached: false })
}

/// Sends the request and follows its redirects (at most
/// [`MAX_REDIRECTS`], http(s) only, never from https to http); the token
/// goes only to its origin. Returns the first answer that is not a
/// redirect, and the URL that gave it.
async fn follow_redirects(
    client: &reqwest::Client,
    job: &Job<'_>,
    options: &DownloadOptions,
    fail: &impl Fn(Code, Cause) -> InputError,
) -> Result<(reqwest::Response, Url), InputError> {
    let mut url = job.url.clone();
    let mut hops = 0;
    loop {
        let mut request = client.get(url.clone()).header(reqwest::header::ACCEPT, "application/zip, */*");
        if let (Some(token), Some(origin)) = (&options.token, &options.token_origin)
            && url.origin() == *origin
        {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .map_err(|e| fail(Code::DownloadFailed, Cause::TokenHeader(e)))?;
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = request.send().await.map_err(|e| {
            fail(Code::DownloadFailed, Cause::Request { url: display_url(&url), source: e.without_url() })
        })?;
        if !response.status().is_redirection() {
            return Ok((response, url));
        }
        hops += 1;
        if hops > MAX_REDIRECTS {
            return Err(fail(Code::DownloadFailed, Cause::TooManyRedirects { max: MAX_REDIRECTS }));
        }
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| fail(Code::DownloadFailed, Cause::NoLocation { status: response.status() }))?;
        let next = url.join(location).map_err(|e| fail(Code::DownloadFailed, Cause::BadLocation(e)))?;
        if next.scheme() != "http" && next.scheme() != "https" {
            return Err(fail(
                Code::DownloadFailed,
                Cause::RedirectScheme { scheme: next.scheme().to_string() },
            ));
        }
        if url.scheme() == "https" && next.scheme() == "http" {
            return Err(fail(Code::DownloadFailed, Cause::RedirectToHttp));
        }
        url = next;
    }
}

/// The file a download is written to before it is checked.
fn staging_file(cache: &Cache, fail: &impl Fn(Code, Cause) -> InputError) -> Result<AtomicFile, InputError> {
    match &cache.root {
        // Anonymous (`O_TMPFILE`) where the filesystem can: a killed
        // download leaves nothing. A named one is locked while we write
        // it: a file nobody holds is a killed download's, which the next
        // `Cache::open` removes.
        Some(root) => loop {
            let tmp = AtomicFile::new_in(&root.join("tmp"), TMP_PREFIX)
                .map_err(|source| fail(Code::Cache, Cause::CacheFile { path: root.join("tmp"), source }))?;
            if tmp.name().is_none()
                || fsx::lock_new(tmp.file.as_fd(), c"download")
                    .map_err(|e| fail(Code::Cache, Cause::CacheLock(e)))?
            {
                return Ok(tmp);
            }
            // A sweeper took it for litter: another name.
            drop(tmp.discard());
        },
        None => Ok(AtomicFile::anonymous(unnamed_file().map_err(|e| fail(Code::Cache, Cause::Cache(e)))?)),
    }
}

/// Where a download goes without a cache: an unnamed file in the temporary
/// directory, else in memory (bounded by the download's size cap).
fn unnamed_file() -> Result<File, CacheError> {
    tempfile::tempfile().or_else(|file| {
        nix::sys::memfd::memfd_create(c"tuixiu-download", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map(File::from)
            .map_err(|memfd| CacheError::NoPlace { dir: std::env::temp_dir(), file, memfd })
    })
}

fn progress_bar(enabled: bool, length: Option<u64>, item: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    // No steady tick: it would start a thread.
    let bar = indicatif::ProgressBar::with_draw_target(length, indicatif::ProgressDrawTarget::stderr());
    let template = if length.is_some() {
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}"
    } else {
        "{msg} {bytes} {bytes_per_sec}"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("downloading {item}"));
    bar
}

/// `error` as it is when its text quotes none of `redactor`'s secrets;
/// else the redacted text alone ([`Cause::Redacted`]).
fn redacted(error: InputError, redactor: &Redactor) -> InputError {
    let text = error.cause.to_string();
    match redactor.redact(&text) {
        std::borrow::Cow::Borrowed(_) => error,
        std::borrow::Cow::Owned(shown) => InputError { cause: Box::new(Cause::Redacted(shown)), ..error },
    }
}

/// Resolves names on the calling thread, so the runtime never starts its
/// blocking pool (whose threads would make the process unfit for
/// `sandbox::launch`).
struct InlineResolver;

impl reqwest::dns::Resolve for InlineResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let result = (host.as_str(), 0)
            .to_socket_addrs()
            .map(|addrs| Box::new(addrs.collect::<Vec<SocketAddr>>().into_iter()) as reqwest::dns::Addrs)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure quoting a secret keeps only the redacted text (the same
    /// line as before); any other keeps its typed cause.
    #[test]
    fn failures_quoting_a_secret_are_redacted() {
        let mut redactor = Redactor::default();
        redactor.add("s3cr3t-token");
        let status = reqwest::StatusCode::FORBIDDEN;
        let leaky =
            Cause::Status { status, url: "https://h/a.zip".into(), body: "bad token s3cr3t-token".into() };
        let old = redactor.redact(&leaky.to_string()).into_owned();
        let e = redacted(InputError::new(Code::DownloadFailed, "x", leaky), &redactor);
        assert!(matches!(&*e.cause, Cause::Redacted(text) if *text == old), "{e:?}");
        assert_eq!(
            e.to_string(),
            "AGENT_INPUTS_DOWNLOAD_FAILED:x: download failed: 403 Forbidden from https://h/a.zip: bad token [REDACTED]"
        );
        let plain = Cause::Status { status, url: "https://h/a.zip".into(), body: "no".into() };
        let e = redacted(InputError::new(Code::DownloadFailed, "x", plain), &redactor);
        assert!(matches!(&*e.cause, Cause::Status { .. }), "{e:?}");
    }

    #[test]
    fn open_removes_only_downloads_a_killed_process_left_behind() {
        use std::os::fd::AsRawFd;
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("tmp");
        Cache::open(root.path()).unwrap();
        let stale = tmp.join("download-stale");
        let live = tmp.join("download-live");
        let other = tmp.join("notes.txt");
        for f in [&stale, &live, &other] {
            std::fs::write(f, b"partial").unwrap();
        }
        // A download in progress holds its file locked.
        let holder = File::open(&live).unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        let outside = root.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.join("download-link")).unwrap();

        Cache::open(root.path()).unwrap();
        assert!(!stale.exists(), "a download nobody holds is removed");
        assert!(live.exists(), "a download in progress stays");
        assert!(other.exists(), "only download-* files are ours to remove");
        assert!(tmp.join("download-link").symlink_metadata().is_ok(), "symlinks are not followed or removed");
        assert!(outside.exists());
        drop(holder);
        Cache::open(root.path()).unwrap();
        assert!(!live.exists(), "a download whose process is gone is removed");
    }
}
