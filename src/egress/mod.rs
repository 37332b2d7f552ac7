//! The egress proxy of `--network allow`: a sandbox with a private network
//! namespace reaches the outside only through a listener on its loopback
//! (`sandbox::egress`), served here, outside the confinement, by whoever
//! started it: a child process of `run`'s launcher ([`spawn_for_run`]), or
//! the daemon and the skill jobs' server on their own runtime
//! ([`Handoff`]). docs/security.md says what it closes and what not.
//!
//! | file | job |
//! |---|---|
//! | `policy.rs` | the allowlist (`--allow-host`), the operator's ranges (`--allow-range`), narrowing a run's list |
//! | `guard.rs` | the address guard: special ranges refused after resolution |
//! | `request.rs` | parsing what clients send: HTTP heads, SOCKS5 (pure, fuzzed) |
//! | `resolve.rs` | the system resolver, and the test builds' mapping |
//! | `serve.rs` | accept, decide, connect, count, report |
//! | `relay.rs` | the bytes both ways, by `splice(2)` through a pipe per direction |

mod guard;
pub mod policy;
mod relay;
pub mod request;
pub mod resolve;
mod serve;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

pub use guard::special;
pub use policy::{PatternError, Policy, Range, Rule};
pub use resolve::Resolver;
pub use serve::{Counts, Denial, Events, Limits, LogEvents, Proxy, Stats};

/// The file, in a named instance's directory, holding its proxies' counters.
pub const COUNTS_FILE: &str = "egress.json";

/// The counters kept in `path` (`instances` and `inspect` read them), from
/// what it already holds: a task on the current runtime (enter
/// [`proxies`] to use that one) writes them back
/// at most once a second while they change, and a last time when the
/// returned counters are dropped.
pub fn keep_counts(path: std::path::PathBuf) -> Arc<Stats> {
    let stats = Arc::new(Stats::from_counts(read_counts(&path).unwrap_or_default()));
    let writer = stats.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            // Only the writer's reference left: the last write.
            let last = Arc::strong_count(&writer) == 1;
            if writer.take_changed() || last {
                write_counts(&path, &writer.counts());
            }
            if last {
                break;
            }
        }
    });
    stats
}

/// The counters in `path`, if it holds some.
pub fn read_counts(path: &std::path::Path) -> Option<Counts> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn write_counts(path: &std::path::Path, counts: &Counts) {
    let bytes = serde_json::to_vec(counts).expect("plain data");
    if let Err(e) = crate::hostfs::atomic::write(path, &bytes, crate::hostfs::atomic::Durability::Unsynced) {
        tracing::debug!("egress proxy: {}: {e}", path.display());
    }
}

/// A unix socket pair for a sandbox's egress listener: the launcher's end
/// (`LaunchOptions::egress_fd`, `__exec --egress-fd`) and ours.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).map_err(io::Error::from)
}

/// Our end of a socket pair, on which a sandbox's listener will arrive.
pub struct Handoff(OwnedFd);

impl Handoff {
    pub fn new(ours: OwnedFd) -> Handoff {
        Handoff(ours)
    }

    /// Waits (on tokio's blocking pool) for the listener, then serves it
    /// with `proxy` until the returned task is aborted (or dropped, with
    /// [`ServeTask`]). A sandbox that ended before making one ends it.
    /// The proxies of a process run on a thread of their own
    /// ([`proxies`]): a sandbox's bulk traffic never holds up the caller's
    /// runtime (the daemon's one thread).
    pub fn serve(self, proxy: Arc<Proxy>) -> io::Result<ServeTask> {
        Ok(ServeTask(proxies()?.spawn(async move {
            let received =
                tokio::task::spawn_blocking(move || sandbox::egress::receive_listener(self.0.as_fd()));
            let listener = match received.await {
                Ok(Ok(Some(fd))) => fd,
                Ok(Ok(None)) => return,
                Ok(Err(e)) => return tracing::warn!("egress proxy: receiving the sandbox's listener: {e}"),
                Err(e) => return tracing::warn!("egress proxy: receiving the sandbox's listener: {e}"),
            };
            match tokio::net::TcpListener::from_std(std::net::TcpListener::from(listener)) {
                Ok(listener) => proxy.serve(listener).await,
                Err(e) => tracing::warn!("egress proxy: the sandbox's listener: {e}"),
            }
        })))
    }
}

/// The runtime the proxies of this process run on: one worker thread,
/// started with the first proxied sandbox.
pub fn proxies() -> io::Result<&'static tokio::runtime::Handle> {
    static PROXIES: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> = std::sync::OnceLock::new();
    let runtime = PROXIES.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("egress-proxy")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the egress proxies' thread: {e}"))
    });
    match runtime {
        Ok(runtime) => Ok(runtime.handle()),
        Err(e) => Err(io::Error::other(e.clone())),
    }
}

/// The task serving one sandbox's proxy; dropping it stops the proxy and
/// its connections.
#[derive(Debug)]
pub struct ServeTask(tokio::task::JoinHandle<()>);

impl Drop for ServeTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `run`'s proxy: a child of this (single-threaded) process, which serves
/// the listener the sandbox will send on the returned socket (the
/// launcher's end) on a runtime of its own, and dies with this process.
/// It leaves this process's session (a terminal's ^C is the command's to
/// handle, relayed by the launcher) and keeps only stderr, for `-v`'s
/// lines on refusals.
pub fn spawn_for_run(policy: Policy, counts: Option<std::path::PathBuf>) -> io::Result<OwnedFd> {
    let resolver = Resolver::from_env()?;
    let (launcher_end, ours) = socket_pair()?;
    let parent = nix::unistd::getpid();
    // SAFETY: the caller is single-threaded (the launcher checks it before
    // it clones the sandbox, and nothing since has started a thread), so
    // the child's copy of the process has no lock held by a thread that
    // does not exist there.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(ours);
            Ok(launcher_end)
        }
        nix::unistd::ForkResult::Child => {
            drop(launcher_end);
            let code = match run_child(parent, ours, policy, resolver, counts) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::warn!("egress proxy: {e}");
                    1
                }
            };
            std::process::exit(code)
        }
    }
}

fn run_child(
    parent: nix::unistd::Pid,
    ours: OwnedFd,
    policy: Policy,
    resolver: Resolver,
    counts: Option<std::path::PathBuf>,
) -> io::Result<()> {
    // SIGTERM, handled below: the counters' last write before leaving.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(io::Error::from)?;
    if nix::unistd::getppid() != parent {
        return Ok(());
    }
    let _ = nix::unistd::setsid();
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    nix::unistd::dup2_stdin(&null).map_err(io::Error::from)?;
    nix::unistd::dup2_stdout(&null).map_err(io::Error::from)?;
    drop(null);
    // Nothing of the caller's but stderr, and our socket.
    close_all_but(ours.as_raw_fd());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        // Before anything can be counted, so that no SIGTERM is missed.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // Nothing else runs in this process: waiting here blocks nobody.
        let listener = match sandbox::egress::receive_listener(ours.as_fd())? {
            Some(fd) => fd,
            None => return Ok(()),
        };
        drop(ours);
        let listener = tokio::net::TcpListener::from_std(std::net::TcpListener::from(listener))?;
        let stats = Arc::new(Stats::default());
        let file = counts.map(|path| (keep_counts(path.clone()), path));
        let proxy = Proxy {
            policy,
            limits: Limits::default(),
            resolver,
            stats: file.as_ref().map_or(stats, |(kept, _)| kept.clone()),
            events: Arc::new(LogEvents),
        };
        let proxy = Arc::new(proxy);
        tokio::select! {
            _ = proxy.clone().serve(listener) => {}
            _ = term.recv() => {}
        }
        if let Some((kept, path)) = file {
            write_counts(&path, &Counts { open: 0, ..kept.counts() });
        }
        Ok(())
    })
}

/// Closes every descriptor from 3 up but `keep`.
fn close_all_but(keep: std::os::fd::RawFd) {
    let keep = keep as u32;
    for (first, last) in [(3, keep.wrapping_sub(1)), (keep + 1, u32::MAX)] {
        if first <= last && keep >= 3 {
            // SAFETY: integer arguments only; this child owns every
            // descriptor it has, and uses none in the range.
            unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
        }
    }
}
