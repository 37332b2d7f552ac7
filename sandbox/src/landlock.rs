//! Landlock: the command may read and execute what its view shows, write
//! only where the view is writable, and reach nothing outside its view
//! (a leaked descriptor, a `/proc/<pid>/fd` magic link to a host file).
//!
//! The launcher probes the kernel's ABI and decides everything: which
//! access rights are handled (the best the kernel and the `landlock` crate
//! both know), which guest paths get which rights, whether TCP is
//! restricted, and how to report it (fully, partially, not). The child
//! (PID 2), after the final pivot, only creates the ruleset, opens the
//! prepared paths and calls `landlock_restrict_self` with raw syscalls.
//!
//! Rules, by guest path:
//! * `/`: read and execute, which covers the system view, extra read-only
//!   binds and generated files (they are all read-only mounts anyway);
//! * every writable mount (workspace, home, `/tmp`, `/dev/shm`, `--bind`,
//!   `--tmpfs`): every right, **including `REFER`**, so renames across
//!   directories keep working for npm and cargo (without it they fail
//!   with EXDEV);
//! * `/dev`: also write and device ioctls; `/proc`: also write.
//!
//! With ABI ≥ 6 the command is also scoped: it cannot connect to abstract
//! unix sockets or signal processes outside its domain (with the host's
//! network, abstract sockets of the host, e.g. X11 or D-Bus, are otherwise
//! reachable). With `--network none` and ABI ≥ 4, TCP bind and connect are
//! handled with no port allowed.

use std::ffi::CString;

use landlock::{ABI, Access, AccessFs, AccessNet, Scope};
use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::error::SpecError;
use crate::sys;

/// What the caller asked for (`--landlock`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Do not use Landlock.
    Off,
    /// Use the best the kernel supports; say so when that is less than all.
    #[default]
    BestEffort,
    /// Fail (exit 125) unless Landlock can be fully enforced.
    Require,
}

/// The lowest ABI that enforces everything this module asks for.
const FULL_ABI: i32 = 6;

/// Test-only, debug builds only: pretend the kernel reports this Landlock
/// ABI (0 = none), so the tests can check `--landlock require` on an
/// "unsupported" kernel honestly (`test_only.rs`).
pub const TEST_ABI_ENV: &str = crate::test_only::LANDLOCK_ABI;

/// How Landlock is enforced for a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enforcement {
    Full { abi: i32 },
    Partial { abi: i32, missing: Vec<&'static str> },
    Not { why: String },
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Enforcement::Full { abi } => write!(f, "fully enforced (ABI {abi})"),
            Enforcement::Partial { abi, missing } => {
                write!(f, "partially enforced (ABI {abi}; not enforced: {})", missing.join(", "))
            }
            Enforcement::Not { why } => write!(f, "not enforced ({why})"),
        }
    }
}

/// Kernel ABI version, or the errno of the probe (ENOSYS: not built,
/// EOPNOTSUPP: built but not enabled at boot).
/// Probed once per process: a nested sandbox's worker decides as its
/// launcher did, after its copy of the launcher's environment is wiped.
pub fn probe_abi() -> Result<i32, Errno> {
    static ABI: std::sync::OnceLock<Result<i32, Errno>> = std::sync::OnceLock::new();
    *ABI.get_or_init(|| {
        if let Some(v) = crate::test_only::var(TEST_ABI_ENV) {
            return match v.parse::<i32>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Errno::EOPNOTSUPP),
            };
        }
        sys::landlock_abi_version()
    })
}

/// Why a probe failed, for messages.
pub fn probe_error_text(e: Errno) -> &'static str {
    match e {
        Errno::ENOSYS => "this kernel is built without Landlock (CONFIG_SECURITY_LANDLOCK)",
        Errno::EOPNOTSUPP => {
            "Landlock is built but not enabled at boot (add `landlock` to the lsm= kernel parameter)"
        }
        _ => "Landlock cannot be queried",
    }
}

/// What a path gets beyond the read/execute granted on `/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grant {
    Write,
    Dev,
    Proc,
}

/// The prepared ruleset: masks and guest paths (absolute).
pub(crate) struct Plan {
    pub handled_fs: u64,
    pub handled_net: u64,
    pub scoped: u64,
    /// `landlock_ruleset_attr` size for this ABI (8, 16 or 24 bytes).
    pub attr_size: usize,
    pub rules: Vec<(CString, u64)>,
}

/// Decides what to enforce. `paths` are guest paths with their grant;
/// `deny_tcp` is `--network none`.
pub(crate) fn plan(
    mode: LandlockMode,
    paths: &[(String, Grant)],
    deny_tcp: bool,
) -> Result<(Option<Plan>, Enforcement), SpecError> {
    if mode == LandlockMode::Off {
        return Ok((None, Enforcement::Not { why: "--landlock off".into() }));
    }
    let abi = match probe_abi() {
        Ok(abi) => abi,
        Err(e) => {
            let why = format!(
                "landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION) => {e}: {}",
                probe_error_text(e)
            );
            if mode == LandlockMode::Require {
                return Err(SpecError::new(format!(
                    "--landlock require: {why}; use --landlock best-effort to run without it"
                )));
            }
            return Ok((None, Enforcement::Not { why }));
        }
    };
    if abi < 2 {
        let why = format!(
            "ABI {abi} always denies renames across directories, which breaks npm and cargo; Linux 5.19 or newer is needed"
        );
        if mode == LandlockMode::Require {
            return Err(SpecError::new(format!("--landlock require: {why}")));
        }
        return Ok((None, Enforcement::Not { why }));
    }
    // The crate's tables of rights per ABI, clamped to what it knows.
    let known = ABI::from(abi);
    let all_fs = AccessFs::from_all(known).bits();
    let read = AccessFs::from_read(known).bits();
    let ioctl_dev = (AccessFs::IoctlDev as u64) & all_fs;
    let write_file = AccessFs::WriteFile as u64;
    let handled_net = if deny_tcp { AccessNet::from_all(known).bits() } else { 0 };
    let scoped = Scope::from_all(known).bits();

    let missing = missing_rights(abi, deny_tcp);
    let enforcement =
        if missing.is_empty() { Enforcement::Full { abi } } else { Enforcement::Partial { abi, missing } };
    if mode == LandlockMode::Require
        && let Enforcement::Partial { .. } = enforcement
    {
        return Err(SpecError::new(format!(
            "--landlock require: Landlock would only be {enforcement}; use --landlock best-effort to accept that"
        )));
    }

    let mut rules = vec![(c"/".to_owned(), read)];
    for (path, grant) in paths {
        let access = match grant {
            Grant::Write => all_fs,
            Grant::Dev => read | write_file | ioctl_dev,
            Grant::Proc => read | write_file,
        };
        let c = CString::new(path.as_str())
            .map_err(|_| SpecError::new(format!("Landlock path {path:?} contains a NUL byte")))?;
        rules.push((c, access));
    }
    let attr_size = if scoped != 0 {
        24
    } else if abi >= 4 {
        16
    } else {
        8
    };
    Ok((Some(Plan { handled_fs: all_fs, handled_net, scoped, attr_size, rules }), enforcement))
}

/// What Landlock ABI `abi` cannot enforce of what the runtime asks for
/// (TCP only when `deny_tcp`).
fn missing_rights(abi: i32, deny_tcp: bool) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if abi < 3 {
        missing.push("truncate");
    }
    if abi < 4 && deny_tcp {
        missing.push("TCP bind/connect");
    }
    if abi < 5 {
        missing.push("device ioctls");
    }
    if abi < FULL_ABI {
        missing.push("abstract unix socket and signal scoping");
    }
    missing
}

impl Plan {
    /// The plan without its filesystem part: scoping and network rules
    /// only (`None` when nothing is left). A domain that handles no
    /// filesystem access lets its processes mount, in a mount namespace
    /// they own (a nested command's own, `--nested-userns on`).
    pub(crate) fn without_fs(self) -> Option<Plan> {
        (self.scoped != 0 || self.handled_net != 0).then(|| Plan { handled_fs: 0, rules: Vec::new(), ..self })
    }
}

/// Rights that make sense on a non-directory (the kernel rejects others).
fn file_rights(handled: u64) -> u64 {
    let file = AccessFs::Execute
        | AccessFs::WriteFile
        | AccessFs::ReadFile
        | AccessFs::Truncate
        | AccessFs::IoctlDev;
    handled & file.bits()
}

/// In PID 2: build the ruleset from the plan and restrict this process.
/// Allocation-free. Returns the failing call and errno.
pub(crate) fn apply(plan: &Plan) -> Result<(), (&'static str, Option<&CString>, Errno)> {
    let attr = sys::LandlockRulesetAttr {
        handled_access_fs: plan.handled_fs,
        handled_access_net: plan.handled_net,
        scoped: plan.scoped,
    };
    let ruleset = sys::landlock_create_ruleset(&attr, plan.attr_size)
        .map_err(|e| ("landlock_create_ruleset", None, e))?;
    for (path, access) in &plan.rules {
        let fd = match sys::open(path, libc::O_PATH, 0) {
            Ok(fd) => fd,
            // A path covered by a later mount grants nothing: fail closed.
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(("open", Some(path), e)),
        };
        let access = if sys::is_dir(&fd) { *access } else { file_rights(*access) };
        sys::landlock_add_path_rule(&ruleset, &fd, access)
            .map_err(|e| ("landlock_add_rule", Some(path), e))?;
    }
    sys::landlock_restrict_self(&ruleset).map_err(|e| ("landlock_restrict_self", None, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_and_best_effort_never_fail() {
        let (plan, e) = plan(LandlockMode::Off, &[], false).unwrap();
        assert!(plan.is_none());
        assert!(matches!(e, Enforcement::Not { .. }));
    }

    #[test]
    fn writable_paths_get_refer() {
        // Only meaningful where Landlock exists; the CI machine has ABI 7.
        if probe_abi().is_err() {
            return;
        }
        let (plan, _) =
            plan(LandlockMode::BestEffort, &[("/workspace".into(), Grant::Write)], false).unwrap();
        let plan = plan.unwrap();
        let ws = plan.rules.iter().find(|(p, _)| p.as_bytes() == b"/workspace").unwrap().1;
        assert_ne!(ws & AccessFs::Refer as u64, 0);
        let root = plan.rules[0].1;
        assert_eq!(root & (AccessFs::WriteFile as u64 | AccessFs::Refer as u64), 0);
    }
}
