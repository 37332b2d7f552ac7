//! Seccomp: which profile the command runs under, compiled to BPF in the
//! launcher (before clone) and installed by PID 2 as the very last step
//! before `execve`, after `no_new_privs`.
//!
//! Profiles are JSON files (see [`profile`]); `default` and `strict` are
//! compiled into the binary from `seccomp-profiles/`. The compiled program
//! always starts with the architecture check and rejects x32 syscall
//! numbers. The network policy adds socket-family rules in front of the
//! profile's own, so a profile cannot accidentally re-allow them.

pub mod bpf;
pub mod profile;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{SpecError, io_error_text};
use bpf::{Cond, Op, Rule};
use profile::{Action, Target};

/// The profiles shipped in the binary, by name, with their JSON.
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../../../seccomp-profiles/default.json")),
    ("strict", include_str!("../../../seccomp-profiles/strict.json")),
];

/// The same profiles compiled by build.rs for the target architecture:
/// (name, default action, [(nr, action, [(arg, op, value, value2)])]).
mod precompiled {
    include!(concat!(env!("OUT_DIR"), "/builtin_profiles.rs"));
}

/// A built-in profile's rules, as build.rs resolved them.
fn builtin_profile(name: &str) -> Option<profile::Profile> {
    let (_, default, rules) = precompiled::BUILTIN.iter().find(|(n, ..)| *n == name)?;
    let op = |kind: u8, a: u64, b: u64| match kind {
        0 => Op::Eq(a),
        1 => Op::Ne(a),
        2 => Op::Lt(a),
        3 => Op::Le(a),
        4 => Op::Gt(a),
        5 => Op::Ge(a),
        _ => Op::MaskedEq { mask: a, value: b },
    };
    Some(profile::Profile {
        default: Action::from_ret(*default),
        rules: rules
            .iter()
            .map(|(nr, ret, conds)| Rule {
                nr: *nr,
                ret: *ret,
                conds: conds
                    .iter()
                    .map(|(arg, kind, a, b)| Cond { arg: *arg, op: op(*kind, *a, *b) })
                    .collect(),
            })
            .collect(),
    })
}

/// Syscalls that `allow_ptrace` lets through.
pub const PTRACE_SYSCALLS: &[&str] = &["ptrace", "process_vm_readv", "process_vm_writev"];

/// The seccomp filter a sandbox's command runs under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SeccompPolicy {
    /// A profile compiled into the binary (`default`, `strict`).
    Builtin(String),
    /// A profile read from a JSON file when the sandbox is prepared.
    File(PathBuf),
    /// No filter at all.
    Unconfined,
}

impl Default for SeccompPolicy {
    fn default() -> Self {
        SeccompPolicy::Builtin("default".into())
    }
}

impl SeccompPolicy {
    /// `NAME`, a path (anything with a `/` or ending in `.json`), or `unconfined`.
    pub fn parse(value: &str) -> Result<SeccompPolicy, SpecError> {
        if value == "unconfined" {
            Ok(SeccompPolicy::Unconfined)
        } else if value.contains('/') || value.ends_with(".json") {
            Ok(SeccompPolicy::File(PathBuf::from(value)))
        } else if BUILTIN.iter().any(|(n, _)| *n == value) {
            Ok(SeccompPolicy::Builtin(value.to_string()))
        } else {
            Err(SpecError::new(format!(
                "seccomp profile {value:?}: no such built-in profile (built in: {}; give a path to a JSON file, or `unconfined`)",
                BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            )))
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SeccompPolicy::Builtin(name) => format!("built-in profile {name:?}"),
            SeccompPolicy::File(path) => format!("profile {}", path.display()),
            SeccompPolicy::Unconfined => "unconfined".into(),
        }
    }
}

/// Which socket families the command may create, beyond what the profile says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// Whatever the profile allows.
    Profile,
    /// Only AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
    LocalAndInet,
    /// Only AF_UNIX and AF_NETLINK (no IP at all), and no io_uring.
    UnixOnly,
}

/// A compiled filter, ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
#[derive(Clone)]
pub(crate) struct Program {
    pub filter: Vec<libc::sock_filter>,
}

/// Loads, checks and compiles the policy for the native architecture.
pub(crate) fn compile(
    policy: &SeccompPolicy,
    allow_ptrace: bool,
    sockets: Sockets,
) -> Result<Option<Program>, SpecError> {
    compile_with(policy, allow_ptrace, sockets, false)
}

/// The filter of a nested sandbox's command when it may make namespaces
/// of its own (`--nested-userns on`): the sandbox's, with
/// [`own_namespace_rules`] in front of the profile's rules.
pub(crate) fn compile_nested(
    policy: &SeccompPolicy,
    allow_ptrace: bool,
    sockets: Sockets,
) -> Result<Option<Program>, SpecError> {
    compile_with(policy, allow_ptrace, sockets, true)
}

fn compile_with(
    policy: &SeccompPolicy,
    allow_ptrace: bool,
    sockets: Sockets,
    own_namespaces: bool,
) -> Result<Option<Program>, SpecError> {
    let arch = profile::Arch::NATIVE;
    let (source, mut profile) = match policy {
        SeccompPolicy::Unconfined => return Ok(None),
        SeccompPolicy::Builtin(name) => {
            let profile = builtin_profile(name).ok_or_else(|| {
                SpecError::new(format!("seccomp profile {name:?}: no such built-in profile"))
            })?;
            (name.clone(), profile)
        }
        SeccompPolicy::File(path) => {
            let json = std::fs::read_to_string(path).map_err(|e| {
                SpecError::new(format!("seccomp profile {}: {}", path.display(), io_error_text(&e)))
            })?;
            let source = path.display().to_string();
            // Only a file's `minKernel` needs the kernel version.
            let profile = profile::parse(&source, &json, &Target::native()).map_err(SpecError::new)?;
            (source, profile)
        }
    };
    let rules = assemble(&mut profile, allow_ptrace, sockets, own_namespaces, arch);
    let filter = bpf::compile(&native_filter(&rules, profile.default.ret()));
    // The kernel's limit (BPF_MAXINSNS).
    if filter.len() > 4096 {
        return Err(SpecError::new(format!(
            "seccomp profile {source}: compiles to {} BPF instructions, more than the kernel's 4096",
            filter.len()
        )));
    }
    Ok(Some(Program { filter }))
}

/// What the sandbox's PID 1 calls once the command runs: waiting, relaying
/// signals, the exit pipe's write, leaving. Anything else kills it (and
/// with it the whole sandbox): whatever made it call something else is not
/// the reaper any more.
const REAPER_SYSCALLS: &[&str] = &[
    "wait4",
    "waitid",
    "kill",
    "write",
    "rt_sigreturn",
    "rt_sigprocmask",
    "restart_syscall",
    "exit",
    "exit_group",
];

/// PID 1's own filter: an allowlist of [`REAPER_SYSCALLS`], stricter than
/// any profile the command may run under.
pub(crate) fn reaper() -> Program {
    let rules: Vec<Rule> = REAPER_SYSCALLS
        .iter()
        .filter_map(|name| profile::Arch::NATIVE.syscall_nr(name))
        .map(|nr| Rule { nr, conds: Vec::new(), ret: bpf::RET_ALLOW })
        .collect();
    Program { filter: bpf::compile(&native_filter(&rules, bpf::RET_KILL_PROCESS)) }
}

/// The built-in `default` profile for a container engine (the docker
/// provider passes it as `--security-opt seccomp=FILE`), with the set-uid
/// rules of [`no_set_id_rules`] first, in the engine's JSON format: the
/// engine's own default profile has no such rules, and with
/// `no-new-privileges` a set-uid file is powerless only inside the
/// container, not in the host directories it writes to.
pub fn engine_profile() -> String {
    let (_, json) =
        BUILTIN.iter().find(|(name, _)| *name == "default").expect("the default profile is built in");
    let mut profile: serde_json::Value = serde_json::from_str(json).expect("built-in profiles are JSON");
    let entry = |name: &str, errno: i32, args: Vec<(u8, u64)>| {
        let args: Vec<serde_json::Value> = args
            .into_iter()
            .map(|(index, bits)| {
                serde_json::json!({ "index": index, "value": bits, "valueTwo": bits, "op": "SCMP_CMP_MASKED_EQ" })
            })
            .collect();
        serde_json::json!({ "names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno, "args": args })
    };
    let creating = [libc::O_CREAT as u64, (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64];
    let mut rules = Vec::new();
    for &(name, mode, flags) in MODE_ARGS {
        for bit in SET_ID_BITS {
            match flags {
                None => rules.push(entry(name, libc::EPERM, vec![(mode, bit)])),
                Some(flags) => {
                    for create in creating {
                        rules.push(entry(name, libc::EPERM, vec![(flags, create), (mode, bit)]));
                    }
                }
            }
        }
    }
    for name in ["openat2", "io_uring_setup", "io_uring_enter", "io_uring_register"] {
        rules.push(entry(name, libc::ENOSYS, Vec::new()));
    }
    if let Some(serde_json::Value::Array(own)) = profile.get_mut("syscalls") {
        rules.append(own);
    }
    profile["syscalls"] = serde_json::Value::Array(rules);
    profile.to_string()
}

/// What the helper that makes a nested sandbox's user namespace calls once
/// it is dumpable (child.rs): tell PID 1 it is ready, wait to be released,
/// leave. `prctl` only as `PR_SET_DUMPABLE`, the call that opens its
/// `/proc` files to PID 1 (and to the agent, whose code written there can
/// then do no more than these).
const HOLDER_SYSCALLS: &[&str] = &["read", "write", "rt_sigreturn", "restart_syscall", "exit", "exit_group"];

/// The user-namespace helper's filter: [`HOLDER_SYSCALLS`] and
/// `prctl(PR_SET_DUMPABLE, ...)`; anything else kills it.
pub(crate) fn userns_holder() -> Program {
    let arch = profile::Arch::NATIVE;
    let mut rules: Vec<Rule> = HOLDER_SYSCALLS
        .iter()
        .filter_map(|name| arch.syscall_nr(name))
        .map(|nr| Rule { nr, conds: Vec::new(), ret: bpf::RET_ALLOW })
        .collect();
    if let Some(nr) = arch.syscall_nr("prctl") {
        let conds = vec![Cond { arg: 0, op: Op::Eq(libc::PR_SET_DUMPABLE as u64) }];
        rules.push(Rule { nr, conds, ret: bpf::RET_ALLOW });
    }
    Program { filter: bpf::compile(&native_filter(&rules, bpf::RET_KILL_PROCESS)) }
}

/// The rules of the program: the network policy's socket rules in front of
/// the profile's, with the ptrace syscalls allowed when asked, and a
/// nested command's own namespaces (`own_namespaces`) allowed after the
/// socket and set-id rules, which they cannot re-allow.
fn assemble(
    profile: &mut profile::Profile,
    allow_ptrace: bool,
    sockets: Sockets,
    own_namespaces: bool,
    arch: profile::Arch,
) -> Vec<Rule> {
    if allow_ptrace {
        for name in PTRACE_SYSCALLS {
            if let Some(nr) = arch.syscall_nr(name) {
                profile::allow(profile, nr);
            }
        }
    }
    let mut rules = socket_rules(sockets, arch);
    rules.extend(no_set_id_rules(arch));
    if own_namespaces {
        rules.extend(own_namespace_rules(arch));
    }
    rules.append(&mut profile.rules);
    rules
}

/// The namespaces a nested sandbox's command may make itself, as it may
/// under bubblewrap: user, mount and pid. No network namespace (a new one
/// owned by a new user namespace would give it `CAP_NET_ADMIN` there:
/// netfilter, the most exploited surface of unprivileged namespaces), no
/// ipc, uts, cgroup or time namespace (nothing it needs).
pub(crate) const OWN_NAMESPACES: u64 = (libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) as u64;

/// `unshare` flags that make no namespace.
const UNSHARE_PLAIN: u64 = (libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SYSVSEM) as u64;

/// The `CLONE_NEW*` flags `clone` takes (`CLONE_NEWTIME` shares its bit
/// with the exit signal there, and is only `unshare`'s and `clone3`'s).
const CLONE_NEW_ALL: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// Allow rules for [`OWN_NAMESPACES`]: `unshare` with those flags (and
/// the ones that make no namespace), `clone` without any other
/// `CLONE_NEW*` flag, and `mount`, `umount2` and `pivot_root`, which the
/// kernel lets through only with `CAP_SYS_ADMIN` over the mount namespace,
/// so only in one the command made with its own user namespace. `setns`,
/// `chroot`, `clone3` (its flags are in memory) and the new mount API stay
/// as the profile has them. docs/security.md lists what this adds.
fn own_namespace_rules(arch: profile::Arch) -> Vec<Rule> {
    let allow = bpf::RET_ALLOW;
    let mut rules = Vec::new();
    let mut add = |name: &str, conds: Vec<Cond>| {
        if let Some(nr) = arch.syscall_nr(name) {
            rules.push(Rule { nr, conds, ret: allow });
        }
    };
    // unshare(2) takes its 64 bits as they are (unknown ones are EINVAL):
    // any bit outside the allowed ones falls through to the profile.
    let unshare_others = !(OWN_NAMESPACES | UNSHARE_PLAIN);
    add("unshare", vec![Cond { arg: 0, op: Op::MaskedEq { mask: unshare_others, value: 0 } }]);
    // clone(2) reads only the low 32 bits of its flags.
    let clone_others = CLONE_NEW_ALL & !OWN_NAMESPACES;
    add("clone", vec![Cond { arg: 0, op: Op::MaskedEq { mask: clone_others, value: 0 } }]);
    for name in ["mount", "umount2", "pivot_root"] {
        add(name, Vec::new());
    }
    rules
}

/// The mode bits no file made inside a sandbox may carry.
const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];

/// Where each call that sets a mode takes it: `(name, mode argument,
/// flags argument)`; with flags, only when they create a file (`O_CREAT`
/// or `O_TMPFILE`, whose file `linkat` may name later).
const MODE_ARGS: &[(&str, u8, Option<u8>)] = &[
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("mkdir", 1, None),
    ("mkdirat", 2, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("creat", 1, None),
    ("open", 2, Some(1)),
    ("openat", 3, Some(2)),
];

/// No set-uid or set-gid bit is ever set from inside a sandbox: what
/// systemd's `RestrictSUIDSGID=` denies (EPERM for a mode with either bit
/// to the `chmod` family, or to calls that create files, directories and
/// nodes), plus `fchmodat2` and `O_TMPFILE`; `openat2` (its mode is in
/// memory, out of the filter's sight) and io_uring (which creates files
/// without syscalls) answer ENOSYS, so that callers fall back to what the
/// filter can see. In front of every profile's own rules, which cannot
/// re-allow them. docs/security.md says why.
fn no_set_id_rules(arch: profile::Arch) -> Vec<Rule> {
    let eperm = Action::Errno(libc::EPERM as u16).ret();
    let creating = [libc::O_CREAT as u64, (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64];
    let mut rules = Vec::new();
    for &(name, mode, flags) in MODE_ARGS {
        let Some(nr) = arch.syscall_nr(name) else { continue };
        for bit in SET_ID_BITS {
            let set = Cond { arg: mode, op: Op::MaskedEq { mask: bit, value: bit } };
            match flags {
                None => rules.push(Rule { nr, conds: vec![set], ret: eperm }),
                Some(flags) => {
                    for create in creating {
                        let create = Cond { arg: flags, op: Op::MaskedEq { mask: create, value: create } };
                        rules.push(Rule { nr, conds: vec![create, set], ret: eperm });
                    }
                }
            }
        }
    }
    let enosys = Action::Errno(libc::ENOSYS as u16).ret();
    for name in ["openat2", "io_uring_setup", "io_uring_enter", "io_uring_register"] {
        if let Some(nr) = arch.syscall_nr(name) {
            rules.push(Rule { nr, conds: Vec::new(), ret: enosys });
        }
    }
    rules
}

fn native_filter(rules: &[Rule], default: u32) -> bpf::Filter<'_> {
    let arch = profile::Arch::NATIVE;
    bpf::Filter { audit_arch: arch.audit(), reject_x32: arch == profile::Arch::X86_64, rules, default }
}

/// For the `seccomp_profile` fuzz target (fuzz/): a profile file's JSON
/// through `compile`'s steps (parse for `target`, assemble, compile), with
/// the filter the program was made from, for `bpf::check`. `sockets` picks
/// the network policy (0: the profile's, 1: local and inet, 2: unix only).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn compile_for_check(
    json: &str,
    target: &Target,
    allow_ptrace: bool,
    sockets: u8,
) -> Result<(Vec<Rule>, u32, Vec<libc::sock_filter>), String> {
    let mut profile = profile::parse("fuzz.json", json, target)?;
    let sockets = [Sockets::Profile, Sockets::LocalAndInet, Sockets::UnixOnly][usize::from(sockets % 3)];
    let rules = assemble(&mut profile, allow_ptrace, sockets, false, profile::Arch::NATIVE);
    let default = profile.default.ret();
    let program = bpf::compile(&native_filter(&rules, default));
    Ok((rules, default, program))
}

/// The [`bpf::Filter`] `compile` builds for these rules on this machine.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn native_filter_for_check(rules: &[Rule], default: u32) -> bpf::Filter<'_> {
    native_filter(rules, default)
}

fn socket_rules(sockets: Sockets, arch: profile::Arch) -> Vec<Rule> {
    let allowed: &[u64] = match sockets {
        Sockets::Profile => return Vec::new(),
        Sockets::LocalAndInet => {
            &[libc::AF_UNIX as u64, libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_NETLINK as u64]
        }
        Sockets::UnixOnly => &[libc::AF_UNIX as u64, libc::AF_NETLINK as u64],
    };
    let eafnosupport = Action::Errno(libc::EAFNOSUPPORT as u16).ret();
    let conds: Vec<Cond> = allowed.iter().map(|af| Cond { arg: 0, op: Op::Ne(*af) }).collect();
    let mut rules = Vec::new();
    for name in ["socket", "socketpair"] {
        if let Some(nr) = arch.syscall_nr(name) {
            rules.push(Rule { nr, conds: conds.clone(), ret: eafnosupport });
        }
    }
    if sockets == Sockets::UnixOnly {
        // io_uring can create sockets without socket(2).
        for name in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
            if let Some(nr) = arch.syscall_nr(name) {
                rules.push(Rule { nr, conds: Vec::new(), ret: Action::Errno(libc::ENOSYS as u16).ret() });
            }
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::profile::{Arch, parse};
    use super::*;

    fn nr(name: &str) -> u32 {
        Arch::NATIVE.syscall_nr(name).unwrap()
    }

    fn program(policy: &SeccompPolicy, ptrace: bool, sockets: Sockets) -> Vec<libc::sock_filter> {
        compile(policy, ptrace, sockets).unwrap().unwrap().filter
    }

    fn run(p: &[libc::sock_filter], name: &str, args: [u64; 6]) -> u32 {
        bpf::check::run(p, Arch::NATIVE.audit(), nr(name), args)
    }

    const EPERM: u32 = bpf::RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = bpf::RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn builtin_profiles_parse_for_every_supported_arch() {
        for (name, json) in BUILTIN {
            for arch in [Arch::X86_64, Arch::Aarch64] {
                let target = Target { arch, kernel: (6, 1) };
                if let Err(e) = parse(name, json, &target) {
                    panic!("{e}");
                }
            }
        }
    }

    #[test]
    fn precompiled_builtins_match_the_runtime_parser() {
        for (name, json) in BUILTIN {
            let parsed = parse(name, json, &Target::native()).unwrap();
            let built = builtin_profile(name).unwrap();
            assert_eq!(parsed.default, built.default, "{name}");
            assert_eq!(parsed.rules, built.rules, "{name}");
        }
    }

    #[test]
    fn default_profile_blocks_what_it_promises() {
        let p = program(&SeccompPolicy::default(), false, Sockets::LocalAndInet);
        let clone_newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(run(&p, "clone", [clone_newuser | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, "clone", [libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, "clone", [0x3d0f00, 0, 0, 0, 0, 0]), bpf::RET_ALLOW, "pthread_create's clone");
        assert_eq!(run(&p, "clone3", [0; 6]), ENOSYS);
        for name in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "kexec_load",
            "init_module",
            "finit_module",
            "delete_module",
            "open_by_handle_at",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
        ] {
            assert_eq!(run(&p, name, [0; 6]), EPERM, "{name}");
        }
        for name in ["fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr", "io_uring_setup"] {
            assert_eq!(run(&p, name, [0; 6]), ENOSYS, "{name}");
        }
        let tiocsti = libc::TIOCSTI;
        assert_eq!(run(&p, "ioctl", [0, tiocsti, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, "ioctl", [0, 0xffff_ffff_0000_0000 | tiocsti, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, "ioctl", [0, 0x541C, 0, 0, 0, 0]), EPERM, "TIOCLINUX");
        assert_eq!(run(&p, "ioctl", [0, libc::TIOCGWINSZ, 0, 0, 0, 0]), bpf::RET_ALLOW);
        for name in ["read", "write", "openat", "execve", "clone", "wait4", "socket"] {
            assert_eq!(run(&p, name, [libc::AF_INET as u64, 0, 0, 0, 0, 0]), bpf::RET_ALLOW, "{name}");
        }
        let eaf = bpf::RET_ERRNO | libc::EAFNOSUPPORT as u32;
        assert_eq!(run(&p, "socket", [libc::AF_VSOCK as u64, 1, 0, 0, 0, 0]), eaf);
        assert_eq!(run(&p, "socket", [libc::AF_PACKET as u64, 3, 0, 0, 0, 0]), eaf);
    }

    #[test]
    fn nested_commands_may_make_user_mount_and_pid_namespaces_only() {
        let (user, ns, pid) =
            (libc::CLONE_NEWUSER as u64, libc::CLONE_NEWNS as u64, libc::CLONE_NEWPID as u64);
        let (net, ipc, uts) =
            (libc::CLONE_NEWNET as u64, libc::CLONE_NEWIPC as u64, libc::CLONE_NEWUTS as u64);
        let sigchld = libc::SIGCHLD as u64;
        for name in ["default", "strict"] {
            let policy = SeccompPolicy::Builtin(name.into());
            for sockets in [Sockets::Profile, Sockets::UnixOnly] {
                let p = compile_nested(&policy, false, sockets).unwrap().unwrap().filter;
                for flags in [user, user | ns | pid, ns | pid, pid, libc::CLONE_FS as u64] {
                    assert_eq!(
                        run(&p, "unshare", [flags, 0, 0, 0, 0, 0]),
                        bpf::RET_ALLOW,
                        "{name} {flags:#x}"
                    );
                }
                for flags in [net, user | net, ipc, uts, libc::CLONE_NEWCGROUP as u64, 0x80, user | (1 << 40)]
                {
                    assert_eq!(run(&p, "unshare", [flags, 0, 0, 0, 0, 0]), EPERM, "{name} {flags:#x}");
                }
                for flags in [user | sigchld, user | ns | pid | sigchld, 0x3d0f00] {
                    assert_eq!(run(&p, "clone", [flags, 0, 0, 0, 0, 0]), bpf::RET_ALLOW, "{name} {flags:#x}");
                }
                for flags in [net, user | net | sigchld, user | ipc, uts | sigchld] {
                    assert_eq!(run(&p, "clone", [flags, 0, 0, 0, 0, 0]), EPERM, "{name} {flags:#x}");
                }
                for call in ["mount", "umount2", "pivot_root"] {
                    assert_eq!(run(&p, call, [0; 6]), bpf::RET_ALLOW, "{name} {call}");
                }
                // Everything else stays as the profile has it.
                for call in ["setns", "chroot", "keyctl", "bpf", "perf_event_open", "ptrace", "userfaultfd"] {
                    assert_eq!(run(&p, call, [0; 6]), EPERM, "{name} {call}");
                }
                for call in ["clone3", "io_uring_setup", "openat2"] {
                    assert_eq!(run(&p, call, [0; 6]), ENOSYS, "{name} {call}");
                }
                let at = libc::AT_FDCWD as u64;
                assert_eq!(run(&p, "fchmodat", [at, 0, 0o4755, 0, 0, 0]), EPERM, "{name}");
                if sockets == Sockets::UnixOnly {
                    let eaf = bpf::RET_ERRNO | libc::EAFNOSUPPORT as u32;
                    assert_eq!(run(&p, "socket", [libc::AF_INET as u64, 1, 0, 0, 0, 0]), eaf);
                }
            }
            // The agent's own filter is untouched.
            let p = program(&policy, false, Sockets::Profile);
            assert_eq!(run(&p, "unshare", [user, 0, 0, 0, 0, 0]), EPERM, "{name}");
            assert_eq!(run(&p, "clone", [user | sigchld, 0, 0, 0, 0, 0]), EPERM, "{name}");
            assert_eq!(run(&p, "mount", [0; 6]), EPERM, "{name}");
        }
    }

    #[test]
    fn ptrace_switch_and_unix_only_sockets() {
        let p = program(&SeccompPolicy::default(), true, Sockets::UnixOnly);
        assert_eq!(run(&p, "ptrace", [0; 6]), bpf::RET_ALLOW);
        assert_eq!(run(&p, "process_vm_readv", [0; 6]), bpf::RET_ALLOW);
        let eaf = bpf::RET_ERRNO | libc::EAFNOSUPPORT as u32;
        assert_eq!(run(&p, "socket", [libc::AF_INET as u64, 1, 0, 0, 0, 0]), eaf);
        assert_eq!(run(&p, "socket", [libc::AF_INET6 as u64, 1, 0, 0, 0, 0]), eaf);
        assert_eq!(run(&p, "socket", [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]), bpf::RET_ALLOW);
    }

    #[test]
    fn the_reaper_filter_allows_only_the_reaper_loop() {
        let p = reaper().filter;
        for name in REAPER_SYSCALLS.iter().filter(|n| Arch::NATIVE.syscall_nr(n).is_some()) {
            assert_eq!(run(&p, name, [0; 6]), bpf::RET_ALLOW, "{name}");
        }
        for name in ["read", "openat", "mmap", "mprotect", "ptrace", "unshare", "mount", "execve", "clone"] {
            assert_eq!(run(&p, name, [0; 6]), bpf::RET_KILL_PROCESS, "{name}");
        }
    }

    #[test]
    fn no_profile_lets_a_set_id_bit_through() {
        let custom = std::env::temp_dir().join(format!("allow-all-{}.json", std::process::id()));
        std::fs::write(
            &custom,
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[
            {"names":["chmod","fchmodat","openat","openat2","io_uring_setup"],"action":"SCMP_ACT_ALLOW"}]}"#,
        )
        .unwrap();
        let policies = [
            SeccompPolicy::default(),
            SeccompPolicy::Builtin("strict".into()),
            SeccompPolicy::File(custom.clone()),
        ];
        for policy in &policies {
            let p = program(policy, false, Sockets::Profile);
            let at = libc::AT_FDCWD as u64;
            let create = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
            let tmpfile = libc::O_TMPFILE as u64 | libc::O_WRONLY as u64;
            for (name, args) in [
                ("chmod", [0, 0o4755, 0, 0, 0, 0]),
                ("chmod", [0, 0o2755, 0, 0, 0, 0]),
                ("fchmod", [3, 0o6755, 0, 0, 0, 0]),
                ("fchmodat", [at, 0, 0o4700, 0, 0, 0]),
                ("fchmodat2", [at, 0, 0o2700, 0, 0, 0]),
                ("mkdir", [0, 0o2775, 0, 0, 0, 0]),
                ("mkdirat", [at, 0, 0o2775, 0, 0, 0]),
                ("mknod", [0, libc::S_IFREG as u64 | 0o4755, 0, 0, 0, 0]),
                ("mknodat", [at, 0, libc::S_IFREG as u64 | 0o4755, 0, 0, 0]),
                ("creat", [0, 0o4755, 0, 0, 0, 0]),
                ("open", [0, create, 0o4755, 0, 0, 0]),
                ("openat", [at, 0, create, 0o4755, 0, 0]),
                ("openat", [at, 0, tmpfile, 0o2755, 0, 0]),
                // Upper bits of the mode do not hide it.
                ("chmod", [0, 0xffff_0000_0000_0000 | 0o4000, 0, 0, 0, 0]),
            ] {
                assert_eq!(run(&p, name, args), EPERM, "{} {name} {args:?}", policy.describe());
            }
            for name in ["openat2", "io_uring_setup"] {
                assert_eq!(run(&p, name, [0; 6]), ENOSYS, "{} {name}", policy.describe());
            }
        }
        // Everything else about modes is untouched.
        let p = program(&SeccompPolicy::default(), false, Sockets::Profile);
        let at = libc::AT_FDCWD as u64;
        for (name, args) in [
            ("chmod", [0, 0o1777, 0, 0, 0, 0]),
            ("fchmodat", [at, 0, 0o755, 0, 0, 0]),
            ("mkdirat", [at, 0, 0o755, 0, 0, 0]),
            // Without O_CREAT the mode argument is garbage: ignored.
            ("openat", [at, 0, libc::O_RDONLY as u64, 0o4755, 0, 0]),
            ("openat", [at, 0, libc::O_CREAT as u64, 0o644, 0, 0]),
        ] {
            assert_eq!(run(&p, name, args), bpf::RET_ALLOW, "{name} {args:?}");
        }
        std::fs::remove_file(custom).unwrap();
    }

    #[test]
    fn the_engine_profile_is_default_with_the_set_id_rules() {
        // Read back as a profile file: the same program as `default`
        // (the set-uid rules twice, harmlessly, as the file has them too).
        let file = std::env::temp_dir().join(format!("engine-{}.json", std::process::id()));
        std::fs::write(&file, engine_profile()).unwrap();
        let engine = program(&SeccompPolicy::File(file.clone()), false, Sockets::Profile);
        let default = program(&SeccompPolicy::default(), false, Sockets::Profile);
        let at = libc::AT_FDCWD as u64;
        for (name, args) in [
            ("fchmodat", [at, 0, 0o4755, 0, 0, 0]),
            ("openat", [at, 0, libc::O_CREAT as u64, 0o2755, 0, 0]),
            ("openat", [at, 0, libc::O_CREAT as u64, 0o755, 0, 0]),
            ("openat2", [0; 6]),
            ("mount", [0; 6]),
            ("read", [0; 6]),
        ] {
            assert_eq!(run(&engine, name, args), run(&default, name, args), "{name}");
        }
        std::fs::remove_file(file).unwrap();
    }

    #[test]
    fn the_userns_holder_may_only_wait_and_toggle_dumpable() {
        let p = userns_holder().filter;
        for name in HOLDER_SYSCALLS {
            assert_eq!(run(&p, name, [0; 6]), bpf::RET_ALLOW, "{name}");
        }
        let dumpable = libc::PR_SET_DUMPABLE as u64;
        assert_eq!(run(&p, "prctl", [dumpable, 1, 0, 0, 0, 0]), bpf::RET_ALLOW);
        for other in [libc::PR_SET_SECCOMP, libc::PR_CAP_AMBIENT, libc::PR_SET_NO_NEW_PRIVS] {
            assert_eq!(run(&p, "prctl", [other as u64, 1, 0, 0, 0, 0]), bpf::RET_KILL_PROCESS);
        }
        for name in ["openat", "mmap", "mprotect", "unshare", "setns", "mount", "execve", "clone", "keyctl"] {
            assert_eq!(run(&p, name, [0; 6]), bpf::RET_KILL_PROCESS, "{name}");
        }
    }

    #[test]
    fn strict_is_an_allowlist() {
        let p = program(&SeccompPolicy::Builtin("strict".into()), false, Sockets::Profile);
        assert_eq!(run(&p, "read", [0; 6]), bpf::RET_ALLOW);
        assert_eq!(run(&p, "execve", [0; 6]), bpf::RET_ALLOW);
        assert_eq!(run(&p, "ptrace", [0; 6]), EPERM);
        assert_eq!(run(&p, "clone3", [0; 6]), ENOSYS);
        assert_eq!(run(&p, "clone", [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, "clone", [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]), bpf::RET_ALLOW);
    }

    #[test]
    fn bad_profiles_are_errors_naming_the_entry() {
        let target = Target::native();
        let cases = [
            ("{", "invalid JSON"),
            (r#"{"defaultAction":"SCMP_ACT_NOPE"}"#, "defaultAction: unknown action \"SCMP_ACT_NOPE\""),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO"},{"names":["no_such_call"],"action":"SCMP_ACT_ERRNO"}]}"#,
                "syscalls[1] (\"no_such_call\"): unknown syscall \"no_such_call\"",
            ),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_FOO"}]}"#,
                "syscalls[0] (\"read\"): unknown action \"SCMP_ACT_FOO\"",
            ),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO","args":[{"index":7,"value":1,"op":"SCMP_CMP_EQ"}]}]}"#,
                "args[0]: index 7 is out of range",
            ),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO","args":[{"index":0,"value":1,"op":"SCMP_CMP_SOMETIMES"}]}]}"#,
                "unknown operator \"SCMP_CMP_SOMETIMES\"",
            ),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO","bogus":1}]}"#,
                "unknown field `bogus`",
            ),
            (r#"{"defaultAction":"SCMP_ACT_NOTIFY"}"#, "needs a supervisor"),
            // Found by the `seccomp_profile` fuzz target: a name as written
            // must not split the line.
            (
                "{\"defaultAction\":\"SCMP_ACT_ALLOW\",\"syscalls\":[{\"names\":[\"read\"],\"action\":\"SCMP_ACT_ERRNO\",\"\\re\":1}]}",
                "unknown field `\\re`",
            ),
            (
                "{\"defaultAction\":\"SCMP_ACT_LOG\\n\",\"defaultErrnoRet\":1}",
                "errnoRet is only valid with SCMP_ACT_ERRNO, not SCMP_ACT_LOG\\n",
            ),
        ];
        for (json, want) in cases {
            let err = parse("/p.json", json, &target).unwrap_err();
            assert!(err.starts_with("seccomp profile /p.json: "), "{err}");
            assert!(!err.contains(['\n', '\r']), "{err:?} is not one line");
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[test]
    fn includes_and_excludes() {
        let json = r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[
            {"names":["read"],"action":"SCMP_ACT_ERRNO","includes":{"arches":["arm64"]}},
            {"names":["write"],"action":"SCMP_ACT_ERRNO","includes":{"caps":["CAP_SYS_ADMIN"]}},
            {"names":["close"],"action":"SCMP_ACT_ERRNO","excludes":{"caps":["CAP_SYS_ADMIN"]}},
            {"names":["dup"],"action":"SCMP_ACT_ERRNO","includes":{"minKernel":"99.0"}}]}"#;
        let x86 = parse("p", json, &Target { arch: Arch::X86_64, kernel: (6, 1) }).unwrap();
        let nrs: Vec<u32> = x86.rules.iter().map(|r| r.nr).collect();
        assert_eq!(nrs, vec![Arch::X86_64.syscall_nr("close").unwrap()]);
        let arm = parse("p", json, &Target { arch: Arch::Aarch64, kernel: (6, 1) }).unwrap();
        assert_eq!(arm.rules.len(), 2);
    }
}
