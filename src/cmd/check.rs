//! `check`: can `run` work on this host, and what is missing?
//!
//! Each probe asks the kernel directly (never just a version number) and
//! ends in one row: ok, warn (works, but something is weaker or missing) or
//! fail (a sandbox cannot work), with a hint that says what to do. The
//! last word belongs to a throwaway sandbox: the real `run` path with the
//! default hardening, running `/bin/true`; its `/proc` row says whether
//! sandboxes get a fresh `/proc` here or the outer one bound (`--proc auto`
//! inside containers), also as `"proc": "fresh" | "bind"` with `--json`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox::{LaunchError, LaunchOptions, ProcMode, SandboxBuilder, SpecError};
use serde::Serialize;

use crate::cli::CheckArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
struct Row {
    check: &'static str,
    status: Status,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
}

fn row(check: &'static str, status: Status, detail: impl Into<String>, hint: Option<&str>) -> Row {
    Row { check, status, detail: detail.into(), hint: hint.map(String::from) }
}

pub fn main(args: CheckArgs) -> u8 {
    let mut rows = vec![kernel(), userns_sysctls(), apparmor(), userns_probe()];
    let landlock_abi = sandbox::landlock::probe_abi();
    let (sandbox_row, proc) = throwaway_sandbox(landlock_abi);
    let run_works = sandbox_row.iter().all(|r| r.status != Status::Fail);
    rows.push(landlock(landlock_abi));
    rows.push(seccomp());
    rows.extend(sandbox_row);
    if let Some(proc) = proc.filter(|_| run_works) {
        rows.push(nested(proc));
    }
    rows.push(cgroups());
    rows.extend(docker());
    let daemon_ok = match &args.daemon {
        Some(dir) => {
            let r = daemon(dir);
            let ok = r.status != Status::Fail;
            rows.push(r);
            rows.extend(daemon_paths(dir));
            ok
        }
        None => true,
    };

    if args.json {
        let out = serde_json::json!({
            "runWorks": run_works,
            "daemonAlive": args.daemon.as_ref().map(|_| daemon_ok),
            "proc": proc.map(ProcMode::as_str),
            "checks": rows,
        });
        println!("{out}");
    } else {
        print_table(&rows, run_works);
    }
    if run_works && daemon_ok { 0 } else { 1 }
}

fn print_table(rows: &[Row], run_works: bool) {
    let width = rows.iter().map(|r| r.check.len()).max().unwrap_or(0);
    for r in rows {
        let status = match r.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        println!("{:width$}  {status}  {}", r.check, r.detail);
        if let Some(hint) = &r.hint {
            println!("{:width$}        hint: {hint}", "");
        }
    }
    println!();
    if run_works {
        println!("tuixiu-sandbox run works on this host.");
    } else {
        println!("tuixiu-sandbox run cannot work on this host yet: see the FAIL rows.");
    }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn kernel() -> Row {
    let release = read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into());
    let mut it = release.split(['.', '-']);
    let version: (u32, u32) = (
        it.next().and_then(|m| m.parse().ok()).unwrap_or(0),
        it.next().and_then(|m| m.parse().ok()).unwrap_or(0),
    );
    if version >= (5, 12) {
        row("kernel", Status::Ok, format!("Linux {release}"), None)
    } else {
        row(
            "kernel",
            Status::Fail,
            format!("Linux {release}"),
            Some("Linux 5.12 or newer is needed (open_tree, mount_setattr, openat2)"),
        )
    }
}

fn userns_sysctls() -> Row {
    let mut problems = Vec::new();
    if read_trim("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        problems.push("kernel.unprivileged_userns_clone=0");
    }
    if read_trim("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        problems.push("user.max_user_namespaces=0");
    }
    let max = read_trim("/proc/sys/user/max_user_namespaces").unwrap_or_else(|| "?".into());
    if problems.is_empty() {
        row("user namespace sysctls", Status::Ok, format!("user.max_user_namespaces={max}"), None)
    } else {
        row(
            "user namespace sysctls",
            Status::Fail,
            problems.join(", "),
            Some(
                "sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000 (and persist it in /etc/sysctl.d)",
            ),
        )
    }
}

fn apparmor() -> Row {
    match read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() {
        Some("1") => row(
            "AppArmor userns restriction",
            Status::Warn,
            "kernel.apparmor_restrict_unprivileged_userns=1: unconfined programs get no capabilities in new user namespaces",
            Some(
                "install an AppArmor profile that allows `userns,` for this binary (see docs/troubleshooting.md), \
                 or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
            ),
        ),
        Some(v) => row(
            "AppArmor userns restriction",
            Status::Ok,
            format!("apparmor_restrict_unprivileged_userns={v}"),
            None,
        ),
        None => row("AppArmor userns restriction", Status::Ok, "not present on this kernel", None),
    }
}

/// Can this process create a user namespace and map its own id in it?
fn userns_probe() -> Row {
    // SAFETY: `check` is single-threaded; the child only makes syscalls and
    // `_exit`s with a code that says which one failed.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let errno = nix::errno::Errno::last();
        return row(
            "user namespaces",
            Status::Fail,
            format!("not probed: fork() => {errno:?} ({})", errno.desc()),
            Some("this process cannot start another (RLIMIT_NPROC, pids.max or memory): run cannot either"),
        );
    }
    if pid == 0 {
        // Plain syscalls in the forked child, then _exit.
        let uid = nix::unistd::geteuid();
        if let Err(errno) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
            // SAFETY: ends the forked child without running the parent's
            // exit handlers or flushing its buffers.
            unsafe { libc::_exit(10 + (errno as i32).min(99)) };
        }
        let line = format!("{uid} {uid} 1");
        let ok = std::fs::write("/proc/self/uid_map", line).is_ok();
        // SAFETY: as above.
        unsafe { libc::_exit(if ok { 0 } else { 2 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child we forked.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        let errno = nix::errno::Errno::last();
        return row(
            "user namespaces",
            Status::Fail,
            format!("not probed: waitpid() => {errno:?} ({})", errno.desc()),
            None,
        );
    }
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 1 };
    match code {
        0 => row("user namespaces", Status::Ok, "unshare(CLONE_NEWUSER) and a uid map work", None),
        2 => row(
            "user namespaces",
            Status::Fail,
            "unshare(CLONE_NEWUSER) works but writing uid_map is denied",
            Some("an LSM (AppArmor, SELinux) confines user namespaces here: see the AppArmor row"),
        ),
        c => {
            let errno = nix::errno::Errno::from_raw(c - 10);
            row(
                "user namespaces",
                Status::Fail,
                format!("unshare(CLONE_NEWUSER) => {errno:?} ({})", errno.desc()),
                Some(
                    "inside a container, its seccomp profile blocks this (docker: --security-opt seccomp=unconfined); \
                     otherwise see the sysctl row",
                ),
            )
        }
    }
}

fn landlock(abi: Result<i32, nix::errno::Errno>) -> Row {
    match abi {
        Ok(abi) if abi >= 6 => row("Landlock", Status::Ok, format!("ABI {abi}: fully enforced"), None),
        Ok(abi) if abi >= 2 => row(
            "Landlock",
            Status::Warn,
            format!("ABI {abi}: partially enforced (scoping needs ABI 6, device ioctls ABI 5, TCP ABI 4)"),
            Some("Linux 6.12 or newer enforces all of it; --landlock require refuses to run here"),
        ),
        Ok(abi) => row(
            "Landlock",
            Status::Warn,
            format!("ABI {abi}: not used (ABI 1 breaks renames across directories)"),
            Some("Linux 5.19 or newer"),
        ),
        Err(e) => row(
            "Landlock",
            Status::Warn,
            format!("unavailable: {}", sandbox::landlock::probe_error_text(e)),
            Some(
                "sandboxes run without Landlock (the mount namespace still limits the view); --landlock require refuses to run",
            ),
        ),
    }
}

fn seccomp() -> Row {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    let has_filter = std::fs::exists("/proc/sys/kernel/seccomp/actions_avail").unwrap_or(false);
    match (mode, has_filter) {
        (0, true) => row("seccomp", Status::Ok, "filters available", None),
        (2, true) => row(
            "seccomp",
            Status::Ok,
            "filters available; this process already runs under one (a container?), which may deny what the sandbox needs",
            None,
        ),
        _ => row(
            "seccomp",
            Status::Fail,
            "seccomp filters are not available (CONFIG_SECCOMP_FILTER)",
            Some("use --seccomp unconfined, or a kernel with seccomp filters"),
        ),
    }
}

/// What the default `--landlock best-effort` enforces with this ABI, as the
/// sandbox row says it (the Landlock row has the details).
fn landlock_words(abi: Result<i32, nix::errno::Errno>) -> String {
    match abi {
        Ok(abi) if abi >= 6 => format!("Landlock (ABI {abi})"),
        Ok(abi) if abi >= 2 => format!("Landlock partially enforced (ABI {abi})"),
        Ok(abi) => format!("without Landlock (ABI {abi} is not used)"),
        Err(_) => "without Landlock (unavailable)".into(),
    }
}

/// The real thing: the default sandbox with the default hardening, first
/// with a fresh /proc, then (where that is refused) with the outer /proc
/// bound, as `--proc auto` would.
fn throwaway_sandbox(landlock_abi: Result<i32, nix::errno::Errno>) -> (Vec<Row>, Option<ProcMode>) {
    let (program, args) = trivial_command();
    let launch = |mode: ProcMode| -> Result<(), ProbeError> {
        let spec = SandboxBuilder::new(program.clone()).args(args.iter().copied()).proc(mode).build()?;
        match quietly(|| sandbox::launch(&spec, &LaunchOptions::default()))? {
            status if status.success() => Ok(()),
            status => Err(ProbeError::Exited { program: program.clone(), code: status.code() }),
        }
    };
    let ran = |mode: &str| {
        row(
            "sandbox",
            Status::Ok,
            format!(
                "a throwaway sandbox ran {} ({mode}) with the default seccomp profile and {}",
                shown(&program, args),
                landlock_words(landlock_abi)
            ),
            None,
        )
    };
    match launch(ProcMode::Fresh) {
        Ok(()) => (
            vec![
                row("mount /proc", Status::Ok, "a fresh /proc mounts in a new pid namespace", None),
                ran("fresh /proc"),
            ],
            Some(ProcMode::Fresh),
        ),
        Err(refused) if refused.to_string().contains("mount proc") => match launch(ProcMode::Bind) {
            Ok(()) => (
                vec![
                    row(
                        "mount /proc",
                        Status::Warn,
                        "a fresh /proc is refused here (the outer /proc has masked or read-only parts, as in \
                         containers): sandboxes bind the outer /proc read-only (--proc auto) and see its processes",
                        Some(
                            "for a private /proc, unmask the container's: docker --security-opt systempaths=unconfined, \
                             podman --security-opt unmask=ALL, Kubernetes procMount: Unmasked (docs/troubleshooting.md); \
                             --proc fresh refuses the fallback",
                        ),
                    ),
                    ran("the outer /proc bound"),
                ],
                Some(ProcMode::Bind),
            ),
            Err(e) => (
                vec![
                    row("mount /proc", Status::Fail, refused.to_string(), None),
                    row("sandbox", Status::Fail, format!("with the outer /proc bound: {e}"), None),
                ],
                None,
            ),
        },
        Err(e) => (vec![row("sandbox", Status::Fail, e.to_string(), None)], None),
    }
}

/// Why the throwaway sandbox did not run; its text is a row's detail.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{program} exited with {code}")]
    Exited { program: String, code: i32 },
}

/// What the throwaway sandbox runs: `true`, or where there is none (an
/// image with nothing but these binaries) this tool's `--version`, which
/// the sandbox sees when it lies in a system directory.
fn trivial_command() -> (String, &'static [&'static str]) {
    for path in ["/bin/true", "/usr/bin/true"] {
        if Path::new(path).is_file() {
            return (path.to_string(), &[]);
        }
    }
    match std::env::current_exe() {
        Ok(exe) => (exe.display().to_string(), &["--version"]),
        Err(_) => ("/bin/true".to_string(), &[]),
    }
}

fn shown(program: &str, args: &[&str]) -> String {
    std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}

/// Runs `f` with stdout and stderr on /dev/null: the throwaway sandbox's
/// command inherits them, and `check`'s own output (`--json`) must stay
/// what it says. Its outcome comes back as a value, not as output.
fn quietly<T>(f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else { return f() };
    let _ = std::io::stdout().flush();
    // SAFETY: copies of this process's own standard descriptors (close on
    // exec); `check` is single-threaded.
    let saved = [1, 2].map(|fd| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) });
    for fd in [1, 2] {
        // SAFETY: as above.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    let out = f();
    for (fd, old) in [1, 2].into_iter().zip(saved).filter(|(_, old)| *old >= 0) {
        // SAFETY: restoring the copy made above onto its standard stream.
        unsafe { libc::dup2(old, fd) };
        // SAFETY: the copy is ours and nothing else refers to it.
        unsafe { libc::close(old) };
    }
    out
}

/// `--daemon DIR`: the daemon's liveness from its status file.
fn daemon(dir: &Path) -> Row {
    match tuixiu_sandbox::proxy::status::check(dir) {
        Ok((s, age)) if s.connected => row(
            "daemon",
            Status::Ok,
            format!(
                "proxy {} (pid {}): registered with the backend, {} run(s), status {age} s old",
                s.proxy_id, s.pid, s.runs
            ),
            None,
        ),
        Ok((s, age)) => row(
            "daemon",
            Status::Warn,
            format!(
                "proxy {} (pid {}): alive, not registered with the backend (reconnecting), status {age} s old",
                s.proxy_id, s.pid
            ),
            Some("see the daemon's log: the backend may be down, or refuse its token"),
        ),
        Err(why) => row(
            "daemon",
            Status::Fail,
            why.to_string(),
            Some("is `tuixiu-sandbox proxy` running with this --state-dir?"),
        ),
    }
}

/// `--daemon DIR`: what the daemon warned about its directories at
/// startup (its workspace root or state directory where sandboxes see).
fn daemon_paths(dir: &Path) -> Vec<Row> {
    let Ok((status, _)) = tuixiu_sandbox::proxy::status::check(dir) else { return Vec::new() };
    status
        .warnings
        .into_iter()
        .map(|w| {
            row(
                "daemon paths",
                Status::Warn,
                w,
                Some("move it outside the system directories and sandbox.volumes, then restart the daemon"),
            )
        })
        .collect()
}

/// A throwaway sandbox whose command is codex's bwrap probe (the front end
/// itself, so no shell is needed): nested sandboxes (served by the
/// launcher) work here. `proc` is how the throwaway sandbox got its /proc,
/// which the nested one follows.
fn nested(proc: ProcMode) -> Row {
    let (program, args) = trivial_command();
    let probe = ["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--unshare-pid", "--unshare-net"];
    let spec = SandboxBuilder::new(sandbox::nested::PORTAL_BIN)
        .args(
            probe.into_iter().chain(["--proc", "/proc", "--", program.as_str()]).chain(args.iter().copied()),
        )
        .proc(proc)
        .build();
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => return row("nested sandboxes", Status::Warn, e.to_string(), None),
    };
    let options = LaunchOptions {
        bwrap_front_end: tuixiu_sandbox::launcher::launcher_exe().ok(),
        ..LaunchOptions::default()
    };
    let hint = "run `tuixiu-sandbox run -- bwrap --ro-bind / / --unshare-user --unshare-pid --proc /proc true` \
                to see bwrap's error; agents that sandbox their tools with bwrap (codex-acp) need this";
    match quietly(|| sandbox::launch(&spec, &options)) {
        Ok(status) if status.success() => row(
            "nested sandboxes",
            Status::Ok,
            match proc {
                ProcMode::Bind => {
                    "`bwrap` inside a sandbox built a nested one, with the outer /proc bound as the sandbox's \
                     (--nested off disables it)"
                }
                _ => {
                    "`bwrap` inside a sandbox built a nested one with a fresh /proc (--nested off disables it)"
                }
            },
            None,
        ),
        Ok(status) => row(
            "nested sandboxes",
            Status::Warn,
            format!("bwrap inside a sandbox exited {}", status.code()),
            Some(hint),
        ),
        Err(e) => row("nested sandboxes", Status::Warn, e.to_string(), Some(hint)),
    }
}

fn cgroups() -> Row {
    const ALL: [&str; 3] = ["memory", "cpu", "pids"];
    let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    // `run`'s sandbox user maps onto the caller's ids by default.
    let host_root = sandbox::idmap::host_root(uid, gid).0;
    let (detail, usable) = match sandbox::limits::delegation(&ALL) {
        Ok((dir, usable)) if usable.len() == ALL.len() => {
            return row(
                "cgroup v2 delegation",
                Status::Ok,
                format!("{}: memory, cpu, pids", dir.display()),
                None,
            );
        }
        Ok((dir, usable)) => (format!("{}: only {}", dir.display(), usable.join(", ")), usable),
        Err(why) => (why, Vec::new()),
    };
    let fallbacks: Vec<&str> = ALL
        .iter()
        .filter(|c| !usable.iter().any(|u| u == *c))
        .map(|c| match *c {
            "memory" => "--memory falls back to RLIMIT_AS",
            "cpu" => "--cpus is not applied",
            // The kernel exempts root's processes from RLIMIT_NPROC.
            _ if host_root => {
                "--pids is not applied (the sandbox user maps onto host root, which RLIMIT_NPROC \
                 does not limit; --map-uid maps it elsewhere)"
            }
            _ => "--pids falls back to RLIMIT_NPROC",
        })
        .collect();
    let hint = format!(
        "{}; run under a delegated cgroup v2 (systemd-run --user --scope -p Delegate=yes) for real limits \
         (see docs/security.md)",
        fallbacks.join(", ")
    );
    row("cgroup v2 delegation", Status::Warn, detail, Some(&hint))
}

fn docker() -> Vec<Row> {
    let cli = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("docker")).find(|p| p.is_file()));
    let cli_row = match &cli {
        Some(path) => row("docker CLI", Status::Ok, path.display().to_string(), None),
        None => row(
            "docker CLI",
            Status::Warn,
            "not found in PATH",
            Some("only needed for --provider docker: apt-get install docker.io"),
        ),
    };
    let socket = match std::env::var("DOCKER_HOST") {
        Ok(host) => match host.strip_prefix("unix://") {
            Some(path) => PathBuf::from(path),
            None => {
                return vec![
                    cli_row,
                    row(
                        "docker daemon",
                        Status::Warn,
                        format!("DOCKER_HOST={host} is not a unix socket; not probed"),
                        None,
                    ),
                ];
            }
        },
        Err(_) => PathBuf::from("/var/run/docker.sock"),
    };
    let daemon_row = match ping(&socket) {
        Ok(()) => row("docker daemon", Status::Ok, format!("{} answers /_ping", socket.display()), None),
        Err(why) => {
            let hint = if why.is_permission_denied() {
                "only needed for --provider docker: this user may not use the socket (add it to the docker group)"
            } else {
                "only needed for --provider docker: start dockerd (systemctl start docker, or dockerd &)"
            };
            row("docker daemon", Status::Warn, format!("{}: {why}", socket.display()), Some(hint))
        }
    };
    vec![cli_row, daemon_row]
}

/// Why the docker daemon's socket did not answer `/_ping`.
#[derive(Debug, thiserror::Error)]
enum PingError {
    #[error("{}", sandbox::error::io_error_text(.0))]
    Connect(#[source] std::io::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The first line of the answer.
    #[error("unexpected answer: {0}")]
    Unexpected(String),
}

impl PingError {
    /// The socket refused this user (EACCES): a group matter, not a dead daemon.
    fn is_permission_denied(&self) -> bool {
        matches!(self, PingError::Connect(e) if e.raw_os_error() == Some(libc::EACCES))
    }
}

fn ping(socket: &Path) -> Result<(), PingError> {
    let mut s = UnixStream::connect(socket).map_err(PingError::Connect)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    if reply.starts_with("HTTP/1.") && reply.contains(" 200 ") {
        Ok(())
    } else {
        Err(PingError::Unexpected(reply.lines().next().unwrap_or("").to_string()))
    }
}
