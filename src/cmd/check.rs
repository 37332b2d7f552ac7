//! `check`: can `run` work on this host, and what is missing?
//!
//! Each probe asks the kernel directly (never just a version number) and
//! ends in one row: ok, warn (works, but something is weaker or missing) or
//! fail (a sandbox cannot work), with a hint that says what to do. The
//! last word belongs to a throwaway sandbox: the real `run` path with the
//! default hardening, running `/bin/true`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox::{LaunchOptions, SandboxBuilder};
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
    let sandbox_row = throwaway_sandbox(landlock_abi);
    let run_works = sandbox_row.iter().all(|r| r.status != Status::Fail);
    rows.push(landlock(landlock_abi));
    rows.push(seccomp());
    rows.extend(sandbox_row);
    rows.push(cgroups());
    rows.extend(docker());

    if args.json {
        let out = serde_json::json!({ "runWorks": run_works, "checks": rows });
        println!("{out}");
    } else {
        print_table(&rows, run_works);
    }
    if run_works { 0 } else { 1 }
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
        // SAFETY: plain syscalls in the forked child, then _exit.
        unsafe {
            let uid = libc::geteuid();
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                libc::_exit(10 + std::io::Error::last_os_error().raw_os_error().unwrap_or(0).min(99));
            }
            let line = format!("{uid} {uid} 1");
            let ok = std::fs::write("/proc/self/uid_map", line).is_ok();
            libc::_exit(if ok { 0 } else { 2 });
        }
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

/// The real thing: the default sandbox with the default hardening.
fn throwaway_sandbox(landlock_abi: Result<i32, nix::errno::Errno>) -> Vec<Row> {
    let spec = match SandboxBuilder::new("/bin/true").build() {
        Ok(spec) => spec,
        Err(e) => return vec![row("sandbox", Status::Fail, e.to_string(), None)],
    };
    match sandbox::launch(&spec, &LaunchOptions::default()) {
        Ok(status) if status.success() => vec![
            row("mount /proc", Status::Ok, "a fresh /proc mounts in a new pid namespace", None),
            row(
                "sandbox",
                Status::Ok,
                format!(
                    "a throwaway sandbox ran /bin/true with the default seccomp profile and {}",
                    landlock_words(landlock_abi)
                ),
                None,
            ),
        ],
        Ok(status) => {
            vec![row("sandbox", Status::Fail, format!("/bin/true exited with {}", status.code()), None)]
        }
        Err(e) => {
            let message = e.to_string();
            if message.contains("mount proc") {
                vec![row(
                    "mount /proc",
                    Status::Fail,
                    message,
                    Some(
                        "the outer /proc has masked or read-only parts (typical inside docker/podman): \
                         run the container with --security-opt systempaths=unconfined, or use --provider docker",
                    ),
                )]
            } else {
                vec![row("sandbox", Status::Fail, message, None)]
            }
        }
    }
}

fn cgroups() -> Row {
    const ALL: [&str; 3] = ["memory", "cpu", "pids"];
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
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
            let hint = if why.starts_with("EACCES") {
                "only needed for --provider docker: this user may not use the socket (add it to the docker group)"
            } else {
                "only needed for --provider docker: start dockerd (systemctl start docker, or dockerd &)"
            };
            row("docker daemon", Status::Warn, format!("{}: {why}", socket.display()), Some(hint))
        }
    };
    vec![cli_row, daemon_row]
}

fn ping(socket: &Path) -> Result<(), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| sandbox::error::io_error_text(&e))?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    if reply.starts_with("HTTP/1.") && reply.contains(" 200 ") {
        Ok(())
    } else {
        Err(format!("unexpected answer: {}", reply.lines().next().unwrap_or("")))
    }
}
