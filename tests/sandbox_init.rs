//! The sandbox's PID 1 (the reaper) is out of the command's reach, whatever
//! Landlock does: it is a fork of the launcher, so its memory held the
//! caller's whole environment, and it runs without the command's seccomp
//! filter. From inside, with Landlock off and ptrace let through seccomp,
//! every way into it must fail, while the same calls against a process of
//! the command's own succeed (so the denials are PID 1's, not the
//! sandbox's in general). From outside, its memory must no longer hold the
//! caller's secrets.

mod common;

use common::{Caller, Fixture, stderr};

/// A variable of the caller's that the command is not given.
const SECRET: (&str, &str) = ("TUIXIU_TEST_CALLER_SECRET", "sk-caller-secret-5b2e91d07c");

/// Tries every way into process `argv[1]`; prints `name result` lines.
const PROBE: &str = r#"
import ctypes, errno, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": (101, 310, 311), "aarch64": (117, 270, 271)}[platform.machine()]
target, secret = int(sys.argv[1]), sys.argv[2].encode()

def code(f):
    try:
        f()
        return "ok"
    except OSError as e:
        # Which of the two a denial is depends on who owns /proc/1 (file
        # permissions: EACCES) or on the ptrace check answering first (EPERM).
        if e.errno in (errno.EACCES, errno.EPERM):
            return "denied"
        return errno.errorcode.get(e.errno, str(e.errno))

def syscall(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def read(name):
    with open(f"/proc/{target}/{name}", "rb") as f:
        return f.read()

buf = ctypes.create_string_buffer(8)
local = (ctypes.c_ulong * 2)(ctypes.addressof(buf), 8)
# Remote address 0: an allowed call fails with EFAULT, a denied one with EPERM.
remote = (ctypes.c_ulong * 2)(0, 8)
results = {
    "environ": code(lambda: read("environ")),
    "mem": code(lambda: os.close(os.open(f"/proc/{target}/mem", os.O_RDWR))),
    "maps": code(lambda: read("maps")),
    "syscall": code(lambda: read("syscall")),
    # PTRACE_SEIZE does not stop the tracee.
    "ptrace": code(lambda: syscall(NR[0], 0x4206, target, 0, 0)),
    "vm_readv": code(lambda: syscall(NR[1], target, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)),
    "vm_writev": code(lambda: syscall(NR[2], target, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)),
}
readable = b""
for name in ["cmdline", "stat", "status", "comm", "environ"]:
    try:
        readable += read(name)
    except OSError:
        pass
results["secret"] = "found" if secret in readable else "absent"
for name, result in results.items():
    print(name, result)
"#;

fn probe(f: &Fixture, extra: &[&str], target: &str) -> Vec<(String, String)> {
    std::fs::write(f.workspace.join("probe.py"), PROBE).unwrap();
    let script = format!("sleep 30 & sibling=$!; python3 probe.py {target} {}; kill $sibling", SECRET.1);
    let mut args = vec!["run", "--workspace", f.workspace.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend(["--", "sh", "-c", &script]);
    let out = f.command(&args).env(SECRET.0, SECRET.1).output().unwrap();
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    common::pairs(&out.stdout)
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

const DENIED: &[(&str, &str)] = &[
    ("environ", "denied"),
    ("mem", "denied"),
    ("maps", "denied"),
    ("syscall", "denied"),
    ("ptrace", "denied"),
    ("vm_readv", "denied"),
    ("vm_writev", "denied"),
    ("secret", "absent"),
];

for_each_caller!(pid1_is_out_of_reach_without_landlock, |caller: Caller| {
    let f = Fixture::new(caller);
    for extra in [
        &["--landlock", "off", "--allow-ptrace"][..],
        &["--landlock", "off", "--seccomp", "unconfined"][..],
        &["--allow-ptrace"][..],
        &[][..],
    ] {
        let ptrace_allowed = extra.contains(&"--allow-ptrace") || extra.contains(&"unconfined");
        assert_eq!(probe(&f, extra, "1"), expect(DENIED), "PID 1 with {extra:?}");
        // The same calls against the command's own process: the kernel
        // lets them through, so PID 1's answers above are its own.
        let (ptrace, vm) = if ptrace_allowed { ("ok", "EFAULT") } else { ("denied", "denied") };
        let sibling = [
            ("environ", "ok"),
            ("mem", "ok"),
            ("maps", "ok"),
            ("syscall", "ok"),
            ("ptrace", ptrace),
            ("vm_readv", vm),
            ("vm_writev", vm),
            ("secret", "absent"),
        ];
        assert_eq!(probe(&f, extra, "$sibling"), expect(&sibling), "a process of the command with {extra:?}");
    }
});

// Landlock unavailable on the host (the default `best-effort` then only
// warns): the same.
for_each_caller!(pid1_is_out_of_reach_when_landlock_is_unavailable, |caller: Caller| {
    let f = Fixture::new(caller);
    std::fs::write(f.workspace.join("probe.py"), PROBE).unwrap();
    let script = format!("python3 probe.py 1 {}", SECRET.1);
    let out = f
        .command(&["run", "--allow-ptrace", "--", "sh", "-c", &script])
        .current_dir(&f.workspace)
        .env(SECRET.0, SECRET.1)
        .env(sandbox::landlock::TEST_ABI_ENV, "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("Landlock"), "no Landlock warning: {}", stderr(&out));
    assert_eq!(common::pairs(&out.stdout), expect(DENIED));
});

// PID 1 runs under a seccomp filter of its own and keeps no privilege.
for_each_caller!(pid1_runs_under_seccomp, |caller: Caller| {
    let f = Fixture::new(caller);
    for extra in [&["--seccomp", "unconfined", "--landlock", "off"][..], &[][..]] {
        // PID 1 installs its filter right after the command's execve,
        // concurrently with the command.
        let status = f.sh(
            extra,
            "for i in $(seq 100); do grep -q '^Seccomp:.2' /proc/1/status && break; sleep 0.02; done; cat /proc/1/status",
        );
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {name} in {status}"))
                .to_string()
        };
        assert_eq!(field("Seccomp"), "2", "{extra:?}");
        assert_eq!(field("NoNewPrivs"), "1", "{extra:?}");
        assert_eq!(field("CapEff"), "0000000000000000", "{extra:?}");
    }
});

// Seen from outside (as root, who may read any process's memory): once the
// command runs, nothing of the caller's environment is left in PID 1's
// memory.
for_each_caller!(pid1_memory_holds_no_caller_secret, |caller: Caller| {
    let f = Fixture::new(caller);
    let started = f.start(&["--landlock", "off"], &["sleep", "30"], &[SECRET]);
    let pid1 = started.pid1;
    // PID 1 wipes right after the command's execve, concurrently with the
    // command: give it a moment.
    let wiped = || {
        let environ = std::fs::read(format!("/proc/{pid1}/environ")).unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid1}/cmdline")).unwrap();
        environ.iter().all(|&b| b == 0) && !contains(&cmdline, b"--landlock")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !wiped() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let environ = std::fs::read(format!("/proc/{pid1}/environ")).unwrap();
    assert!(
        environ.iter().all(|&b| b == 0),
        "PID 1's environment is not wiped: {}",
        String::from_utf8_lossy(&environ)
    );
    let cmdline = std::fs::read(format!("/proc/{pid1}/cmdline")).unwrap();
    assert!(
        !contains(&cmdline, b"--landlock"),
        "PID 1's arguments are not wiped: {}",
        String::from_utf8_lossy(&cmdline)
    );
    let found = scan_memory(pid1, SECRET.1.as_bytes());
    assert!(found.is_empty(), "the caller's secret is in PID 1's memory at {found:?}");
    drop(started);
});

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Mappings of `pid` (their `maps` lines) whose memory contains `needle`.
fn scan_memory(pid: u32, needle: &[u8]) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (range, perms) = (fields.next().unwrap(), fields.next().unwrap());
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        let mut bytes = vec![0u8; (end - start) as usize];
        if mem.seek(SeekFrom::Start(start)).is_ok()
            && mem.read_exact(&mut bytes).is_ok()
            && contains(&bytes, needle)
        {
            found.push(line.to_string());
        }
    }
    found
}
