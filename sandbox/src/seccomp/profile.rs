//! Seccomp profiles in a subset of the OCI/Docker JSON format.
//!
//! ```json
//! { "defaultAction": "SCMP_ACT_ALLOW",
//!   "syscalls": [
//!     { "names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1 },
//!     { "names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
//!       "args": [{ "index": 1, "value": 4294967295, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ" }] } ] }
//! ```
//!
//! Supported: `defaultAction`, `defaultErrnoRet`, and per entry `names`,
//! `action`, `errnoRet`, `args` (ANDed, 64-bit, libseccomp's operators),
//! `comment`, and `includes`/`excludes` by `arches`, `caps` and
//! `minKernel`. `archMap`/`architectures`/`flags` are accepted and ignored:
//! the filter always allows the native architecture only, which is
//! stricter. Everything else (an unknown key, action, operator, or a
//! syscall name this architecture does not have) is an error naming the
//! entry: a profile is never loaded partially.

use serde::Deserialize;

use super::bpf::{self, Cond, Op, Rule};

/// A syscall's fate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Errno(u16),
    KillProcess,
    KillThread,
    Trap,
    Log,
}

impl Action {
    /// The inverse of [`Action::ret`], for precompiled profiles.
    pub(crate) fn from_ret(ret: u32) -> Action {
        match ret & 0xffff_0000 {
            bpf::RET_ALLOW => Action::Allow,
            bpf::RET_ERRNO => Action::Errno(ret as u16),
            bpf::RET_KILL_PROCESS => Action::KillProcess,
            bpf::RET_TRAP => Action::Trap,
            bpf::RET_LOG => Action::Log,
            _ => Action::KillThread,
        }
    }

    pub(crate) fn ret(self) -> u32 {
        match self {
            Action::Allow => bpf::RET_ALLOW,
            Action::Errno(e) => bpf::RET_ERRNO | u32::from(e),
            Action::KillProcess => bpf::RET_KILL_PROCESS,
            Action::KillThread => bpf::RET_KILL_THREAD,
            Action::Trap => bpf::RET_TRAP,
            Action::Log => bpf::RET_LOG,
        }
    }
}

/// The architectures a profile can be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    #[cfg(target_arch = "x86_64")]
    pub const NATIVE: Arch = Arch::X86_64;
    #[cfg(target_arch = "aarch64")]
    pub const NATIVE: Arch = Arch::Aarch64;

    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// `AUDIT_ARCH_*` as seen in `seccomp_data.arch`.
    pub(crate) fn audit(self) -> u32 {
        match self {
            Arch::X86_64 => 0xC000_003E,
            Arch::Aarch64 => 0xC000_00B7,
        }
    }

    /// Names used in OCI `includes.arches` (Go's and the kernel's).
    fn matches(self, name: &str) -> bool {
        match self {
            Arch::X86_64 => matches!(name, "amd64" | "x86_64" | "SCMP_ARCH_X86_64"),
            Arch::Aarch64 => matches!(name, "arm64" | "aarch64" | "SCMP_ARCH_AARCH64"),
        }
    }

    pub(crate) fn syscall_nr(self, name: &str) -> Option<u32> {
        use std::str::FromStr;
        // The kernel's name; the syscalls crate calls it `fstatat` on aarch64.
        let name = match (self, name) {
            (Arch::Aarch64, "newfstatat") => "fstatat",
            _ => name,
        };
        let id = match self {
            Arch::X86_64 => syscalls::x86_64::Sysno::from_str(name).ok()?.id(),
            Arch::Aarch64 => syscalls::aarch64::Sysno::from_str(name).ok()?.id(),
        };
        u32::try_from(id).ok()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    default_action: String,
    default_errno_ret: Option<u32>,
    #[serde(default)]
    syscalls: Vec<Entry>,
    // Accepted for compatibility with Docker's files, not used (see the module docs).
    #[serde(default, rename = "archMap")]
    _arch_map: serde_json::Value,
    #[serde(default, rename = "architectures")]
    _architectures: serde_json::Value,
    #[serde(default, rename = "flags")]
    _flags: serde_json::Value,
    #[serde(default, rename = "comment")]
    _comment: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    #[serde(default)]
    names: Vec<String>,
    /// Docker's older single-name form.
    name: Option<String>,
    action: String,
    errno_ret: Option<u32>,
    #[serde(default)]
    args: Vec<Arg>,
    includes: Option<Condition>,
    excludes: Option<Condition>,
    #[serde(default, rename = "comment")]
    _comment: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Arg {
    index: u8,
    value: u64,
    #[serde(default)]
    value_two: u64,
    op: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Condition {
    #[serde(default)]
    arches: Vec<String>,
    #[serde(default)]
    caps: Vec<String>,
    min_kernel: Option<String>,
}

/// Facts about the target that `includes`/`excludes` test.
#[derive(Clone, Debug)]
pub struct Target {
    pub arch: Arch,
    /// (major, minor) of the running kernel.
    pub kernel: (u32, u32),
}

impl Target {
    pub fn native() -> Target {
        Target { arch: Arch::NATIVE, kernel: kernel_version() }
    }
}

/// A parsed profile, resolved for one architecture.
#[derive(Clone, Debug)]
pub struct Profile {
    pub default: Action,
    pub rules: Vec<Rule>,
}

/// Parses `json` (from `source`, used in messages) for `target`.
pub fn parse(source: &str, json: &str, target: &Target) -> Result<Profile, String> {
    // serde names an unknown field as it was written: escaped, so the
    // error stays one line.
    let file: File = serde_json::from_str(json).map_err(|e| {
        format!("seccomp profile {source}: invalid JSON: {}", escape_controls(&e.to_string()))
    })?;
    let at = |what: String| format!("seccomp profile {source}: {what}");
    let default = action(&file.default_action, file.default_errno_ret, None)
        .map_err(|e| at(format!("defaultAction: {e}")))?;
    let mut rules = Vec::new();
    for (i, entry) in file.syscalls.iter().enumerate() {
        let names: Vec<&str> = entry.names.iter().map(String::as_str).chain(entry.name.as_deref()).collect();
        let label = match names.first() {
            Some(first) if names.len() == 1 => format!("syscalls[{i}] ({first:?})"),
            Some(first) => format!("syscalls[{i}] ({first:?}, ...)"),
            None => format!("syscalls[{i}]"),
        };
        if names.is_empty() {
            return Err(at(format!("{label}: no syscall names")));
        }
        let act = action(&entry.action, entry.errno_ret, file.default_errno_ret)
            .map_err(|e| at(format!("{label}: {e}")))?;
        let mut conds = Vec::with_capacity(entry.args.len());
        for (j, arg) in entry.args.iter().enumerate() {
            conds.push(cond(arg).map_err(|e| at(format!("{label}: args[{j}]: {e}")))?);
        }
        let applies = condition_holds(entry.includes.as_ref(), target, true)
            .and_then(|inc| Ok(inc && !condition_holds(entry.excludes.as_ref(), target, false)?))
            .map_err(|e| at(format!("{label}: {e}")))?;
        if !applies {
            continue;
        }
        for name in names {
            let nr = target.arch.syscall_nr(name).ok_or_else(|| {
                at(format!(
                    "{label}: unknown syscall {name:?} on {} (restrict the entry with \"includes\": {{\"arches\": [...]}} if it exists elsewhere)",
                    target.arch.name()
                ))
            })?;
            rules.push(Rule { nr, conds: conds.clone(), ret: act.ret() });
        }
    }
    Ok(Profile { default, rules })
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`).
fn escape_controls(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

fn action(name: &str, errno_ret: Option<u32>, fallback_errno: Option<u32>) -> Result<Action, String> {
    let errno = |n: Option<u32>| -> Result<u16, String> {
        match n {
            None => Ok(libc::EPERM as u16),
            Some(n) if (1..4096).contains(&n) => Ok(n as u16),
            Some(n) => Err(format!("errnoRet {n} is out of range (1-4095)")),
        }
    };
    if errno_ret.is_some() && name != "SCMP_ACT_ERRNO" {
        return Err(format!("errnoRet is only valid with SCMP_ACT_ERRNO, not {}", name.escape_debug()));
    }
    Ok(match name {
        "SCMP_ACT_ALLOW" => Action::Allow,
        "SCMP_ACT_ERRNO" => Action::Errno(errno(errno_ret.or(fallback_errno))?),
        "SCMP_ACT_KILL_PROCESS" => Action::KillProcess,
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => Action::KillThread,
        "SCMP_ACT_TRAP" => Action::Trap,
        "SCMP_ACT_LOG" => Action::Log,
        "SCMP_ACT_NOTIFY" | "SCMP_ACT_TRACE" => {
            return Err(format!("action {name} needs a supervisor and is not supported"));
        }
        other => return Err(format!("unknown action {other:?}")),
    })
}

fn cond(arg: &Arg) -> Result<Cond, String> {
    if arg.index > 5 {
        return Err(format!("index {} is out of range (0-5)", arg.index));
    }
    let op = match arg.op.as_str() {
        "SCMP_CMP_EQ" => Op::Eq(arg.value),
        "SCMP_CMP_NE" => Op::Ne(arg.value),
        "SCMP_CMP_LT" => Op::Lt(arg.value),
        "SCMP_CMP_LE" => Op::Le(arg.value),
        "SCMP_CMP_GT" => Op::Gt(arg.value),
        "SCMP_CMP_GE" => Op::Ge(arg.value),
        "SCMP_CMP_MASKED_EQ" => Op::MaskedEq { mask: arg.value, value: arg.value_two },
        other => return Err(format!("unknown operator {other:?}")),
    };
    Ok(Cond { arg: arg.index, op })
}

/// Whether an `includes` (`empty_is = true`) or `excludes` (`false`)
/// condition holds. The command runs with no capabilities, so a condition
/// on any capability never holds.
fn condition_holds(c: Option<&Condition>, target: &Target, empty_is: bool) -> Result<bool, String> {
    let Some(c) = c else { return Ok(empty_is) };
    let mut parts = Vec::new();
    if !c.arches.is_empty() {
        parts.push(c.arches.iter().any(|a| target.arch.matches(a)));
    }
    if !c.caps.is_empty() {
        parts.push(false);
    }
    if let Some(min) = &c.min_kernel {
        let want = parse_kernel(min).ok_or_else(|| format!("minKernel {min:?} is not MAJOR.MINOR"))?;
        parts.push(target.kernel >= want);
    }
    if parts.is_empty() {
        return Ok(empty_is);
    }
    // OCI: includes need every listed condition; excludes apply if any holds.
    Ok(if empty_is { parts.iter().all(|p| *p) } else { parts.iter().any(|p| *p) })
}

fn parse_kernel(s: &str) -> Option<(u32, u32)> {
    let mut it = s.split(['.', '-']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

fn kernel_version() -> (u32, u32) {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|s| parse_kernel(s.trim()))
        .unwrap_or((0, 0))
}

/// Removes every rule for `nr` and makes sure the syscall is allowed.
pub(crate) fn allow(profile: &mut Profile, nr: u32) {
    profile.rules.retain(|r| r.nr != nr);
    if profile.default != Action::Allow {
        profile.rules.push(Rule { nr, conds: Vec::new(), ret: Action::Allow.ret() });
    }
}
