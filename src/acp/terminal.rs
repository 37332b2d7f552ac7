//! `terminal/*`: processes the agent starts inside its run's sandbox.
//!
//! Output (stdout and stderr together, in arrival order) is kept in a [`Tail`]
//! bounded by the agent's `outputByteLimit` exactly as given (default 2 MiB, at
//! most 64 MiB): the **tail** is kept and cut forward to a UTF-8 character
//! boundary, so the result may be slightly shorter than the limit, never longer
//! (docs/acp.md, "`terminal/*`"). The Node proxy raised small limits to 4 KiB;
//! this does not. Where the bytes are kept (memory within the run's budget,
//! else an anonymous file) is `super::output`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use super::output::{Budget, OutputError, Tail};
use crate::blocking::Share;
use crate::provider::{ExitStatus, Killer, Process};

pub const DEFAULT_OUTPUT_LIMIT: u64 = 2 * 1024 * 1024;
pub const MAX_OUTPUT_LIMIT: u64 = 64 * 1024 * 1024;

/// Bytes read from a terminal's pipe at a time.
const PUMP_BUFFER: usize = 16 * 1024;

/// How a terminal's command ended, in ACP's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermExit {
    pub exit_code: Option<u32>,
    pub signal: Option<String>,
}

impl TermExit {
    pub fn from_status(status: ExitStatus, killed_by: Option<i32>) -> TermExit {
        match (status.code, status.signal) {
            (_, Some(sig)) => TermExit { exit_code: None, signal: Some(signal_name(sig)) },
            // A launcher folds "killed by N" into 128+N; when we sent the
            // signal, say so.
            (Some(code), None) if killed_by.is_some_and(|s| code == 128 + s) => {
                TermExit { exit_code: None, signal: Some(signal_name(killed_by.unwrap_or(0))) }
            }
            (Some(code), None) => TermExit { exit_code: Some(code.max(0) as u32), signal: None },
            (None, None) => TermExit { exit_code: None, signal: None },
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"exitCode": self.exit_code, "signal": self.signal})
    }
}

pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

/// One running (or finished) terminal.
pub struct Terminal {
    output: Arc<Mutex<Tail>>,
    /// The run's share of the blocking pool (a tail in a file is written
    /// and read there).
    blocking: Share,
    exit: watch::Receiver<Option<TermExit>>,
    killer: Killer,
    killed_by: Arc<Mutex<Option<i32>>>,
}

impl Terminal {
    /// Takes over `process`: its stdout and stderr feed `tail`; its exit
    /// is recorded. `killer` ends it (usually the process group).
    pub fn start(mut process: Process, killer: Killer, tail: Tail, blocking: Share) -> Terminal {
        let output = Arc::new(Mutex::new(tail));
        drop(process.stdin.take());
        let readers: Vec<_> = [
            process.stdout.take().map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>),
            process.stderr.take().map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|r| tokio::spawn(pump(r, output.clone(), blocking.clone())))
        .collect();
        let (tx, rx) = watch::channel(None);
        let killed_by = Arc::new(Mutex::new(None));
        let kb = killed_by.clone();
        tokio::spawn(async move {
            let status = process.wait().await;
            // The exit status is reported once all output is in.
            for r in readers {
                let _ = r.await;
            }
            let killed = *kb.lock().unwrap_or_else(|p| p.into_inner());
            let exit = match status {
                Ok(s) => TermExit::from_status(s, killed),
                Err(e) => {
                    tracing::warn!("terminal: waiting for the process: {e}");
                    TermExit { exit_code: None, signal: None }
                }
            };
            let _ = tx.send(Some(exit));
        });
        Terminal { output, blocking, exit: rx, killer, killed_by }
    }

    /// `terminal/output`, as JSON: the tail read, converted and written on
    /// the blocking pool (it may be a file, and it may be 64 MiB).
    pub async fn output(&self) -> Result<Box<RawValue>, OutputError> {
        #[derive(serde::Serialize)]
        struct Output {
            output: String,
            truncated: bool,
            #[serde(rename = "exitStatus", skip_serializing_if = "Option::is_none")]
            exit_status: Option<Value>,
        }
        // The exit status first: output that came before it is all in.
        let exit_status = self.exit.borrow().as_ref().map(TermExit::to_json);
        let tail = self.output.clone();
        self.blocking
            .run(move || {
                let (output, truncated) = lock(&tail).snapshot()?;
                serde_json::value::to_raw_value(&Output { output, truncated, exit_status })
                    .map_err(|e| OutputError::Io(std::io::Error::other(e)))
            })
            .await?
    }

    /// `terminal/wait_for_exit`.
    pub async fn wait(&self) -> TermExit {
        let mut rx = self.exit.clone();
        loop {
            if let Some(exit) = rx.borrow_and_update().clone() {
                return exit;
            }
            if rx.changed().await.is_err() {
                return TermExit { exit_code: None, signal: None };
            }
        }
    }

    pub fn exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// `terminal/kill`: SIGKILL to the command and what it started.
    pub async fn kill(&self) {
        if self.exited() {
            return;
        }
        *self.killed_by.lock().unwrap_or_else(|p| p.into_inner()) = Some(libc::SIGKILL);
        if let Err(e) = self.killer.kill(libc::SIGKILL).await {
            tracing::warn!("terminal: kill: {e}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Feeds one pipe into the tail: in memory at once, into a file on the
/// blocking pool. A tail that cannot be written (a full disk) is said once
/// in the log; the command runs on.
async fn pump(mut r: Box<dyn AsyncRead + Unpin + Send>, out: Arc<Mutex<Tail>>, blocking: Share) {
    let mut buf = vec![0u8; PUMP_BUFFER];
    let mut failed = false;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let in_file = lock(&out).in_file();
        let pushed = if in_file {
            let (chunk, out) = (buf[..n].to_vec(), out.clone());
            blocking.run(move || lock(&out).push(&chunk)).await.unwrap_or_else(|e| Err(e.into()))
        } else {
            lock(&out).push(&buf[..n])
        };
        if let Err(e) = pushed
            && !std::mem::replace(&mut failed, true)
        {
            tracing::warn!("{e}; later output of this terminal may be missing");
        }
    }
}

/// The terminals of one agent process.
pub struct Terminals {
    map: Mutex<HashMap<String, Arc<Terminal>>>,
    next: AtomicU64,
    /// Terminals held plus those being created (see [`Terminals::reserve`]).
    held: std::sync::atomic::AtomicUsize,
    /// The memory their output may take.
    budget: Arc<Budget>,
}

/// A place for one terminal, taken before it is created (so concurrent
/// `terminal/create` calls cannot all pass the limit); given back when
/// dropped unless the terminal was inserted.
pub struct Slot<'a> {
    terminals: &'a Terminals,
    used: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.terminals.held.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Terminals {
    /// No terminal yet; their output may take `memory` bytes of memory.
    pub fn new(memory: usize) -> Terminals {
        Terminals {
            map: Mutex::default(),
            next: AtomicU64::new(0),
            held: Default::default(),
            budget: Budget::new(memory),
        }
    }

    /// The memory budget of their output.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// A slot if fewer than `max` terminals are held (or being created).
    pub fn reserve(&self, max: usize) -> Option<Slot<'_>> {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Slot { terminals: self, used: false })
    }

    pub fn insert(&self, mut slot: Slot<'_>, t: Terminal) -> String {
        slot.used = true;
        let id = format!("term-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.map.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), Arc::new(t));
        id
    }

    /// Terminals whose command still runs.
    pub fn running(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|t| !t.exited()).count()
    }

    pub fn get(&self, id: &str) -> Option<Arc<Terminal>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Terminal>> {
        let t = self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        if t.is_some() {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
        t
    }

    /// Kills every terminal (the agent went away).
    pub async fn kill_all(&self) {
        let all: Vec<_> =
            self.map.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, t)| t).collect();
        self.held.fetch_sub(all.len(), Ordering::SeqCst);
        for t in all {
            t.kill().await;
        }
    }
}

/// The processes in the pid namespace of host process `pid` (a sandbox's
/// PID 1), counted on the host's `/proc`: the daemon counts them itself,
/// since no kernel limit applies to a sandbox of a root daemon (rlimits
/// exempt host root, and cgroups may not be delegated). `None` when the
/// namespace cannot be read.
///
/// PID 1 is not dumpable: an unprivileged daemon may not look at its
/// `ns/pid`, and reads the namespace through the command's process
/// (`sandbox::reach`), then counts PID 1 itself. (The nested-sandbox
/// portal's processes in there are not dumpable either, and go uncounted
/// by such a daemon.)
pub fn processes_in_pid_ns_of(pid: u32) -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    let through = sandbox::reach::entry(pid as i32).ok()?;
    let ns = std::fs::metadata(format!("/proc/{}/ns/pid", through.pid)).ok()?;
    let key = (ns.dev(), ns.ino());
    let count = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|e| std::fs::metadata(e.path().join("ns/pid")).is_ok_and(|m| (m.dev(), m.ino()) == key))
        .count();
    let pid1_unseen = through.pid != pid as i32;
    Some(count + usize::from(pid1_unseen))
}

/// The limit the agent asked for: default 2 MiB, at most 64 MiB.
pub fn output_limit(v: Option<&Value>) -> Result<usize, BadLimit> {
    match v {
        None | Some(Value::Null) => Ok(DEFAULT_OUTPUT_LIMIT as usize),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(n.min(MAX_OUTPUT_LIMIT) as usize),
            None => Err(BadLimit(v.clone())),
        },
    }
}

/// An `outputByteLimit` that is not a count of bytes.
#[derive(Debug, thiserror::Error)]
#[error("outputByteLimit must be a non-negative integer, got {0}")]
pub struct BadLimit(pub Value);

/// True when `command` (given without `args`) needs a shell: spaces,
/// quotes, redirections, pipes, globs, variables...
pub fn needs_shell(command: &str) -> bool {
    !command.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./+-:@,".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_shell_detection() {
        assert_eq!(output_limit(None).unwrap(), 2 * 1024 * 1024);
        assert_eq!(output_limit(Some(&json!(10))).unwrap(), 10);
        assert_eq!(output_limit(Some(&json!(1u64 << 40))).unwrap(), 64 * 1024 * 1024);
        assert!(output_limit(Some(&json!(-1))).is_err());
        assert!(!needs_shell("/usr/bin/ls"));
        assert!(needs_shell("ls -la"));
        assert!(needs_shell("echo $HOME"));
        assert!(needs_shell("a|b"));
    }

    #[test]
    fn exit_status_shapes() {
        let e = TermExit::from_status(ExitStatus { code: Some(3), signal: None }, None);
        assert_eq!(e.to_json(), json!({"exitCode":3,"signal":null}));
        let e = TermExit::from_status(ExitStatus { code: None, signal: Some(9) }, None);
        assert_eq!(e.to_json(), json!({"exitCode":null,"signal":"SIGKILL"}));
        let e = TermExit::from_status(ExitStatus { code: Some(137), signal: None }, Some(9));
        assert_eq!(e.to_json(), json!({"exitCode":null,"signal":"SIGKILL"}));
    }
}
