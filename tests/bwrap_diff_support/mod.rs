//! The differential harness behind tests/bwrap_diff.rs: runs one shell
//! line through a reference bubblewrap and through ours, as one caller, in
//! the same scratch directory, and compares what a caller can see: exit
//! status, stdout, stderr and the files the line leaves behind (`*.out`,
//! where the corpus points `--info-fd` and `--json-status-fd`).
//!
//! Each line is `sh -c LINE` with `$BWRAP` naming the bwrap under test and
//! `$D` its scratch directory (also the working directory and `$HOME`).
//! What legitimately differs between two runs is normalised before the
//! comparison: the paths of the binaries and of the scratch directory, the
//! `child-pid` the status descriptors report, and namespace ids (renamed in
//! order of first appearance, so that "the same namespace as" survives).

#![allow(dead_code)]

pub mod generate;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{PermissionsExt, lchown};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::Caller;

/// One command line of the corpus.
#[derive(Clone, Debug)]
pub struct Case {
    pub id: String,
    pub script: String,
}

/// How long a line may run before it counts as hanging.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What a caller sees of one run, normalised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    pub files: String,
}

pub const FIELDS: [&str; 4] = ["status", "stdout", "stderr", "files"];

impl Outcome {
    pub fn field(&self, name: &str) -> &str {
        match name {
            "status" => &self.status,
            "stdout" => &self.stdout,
            "stderr" => &self.stderr,
            _ => &self.files,
        }
    }

    /// The fields in which `self` and `other` differ.
    pub fn differs(&self, other: &Outcome) -> BTreeSet<&'static str> {
        FIELDS.iter().copied().filter(|f| self.field(f) != other.field(f)).collect()
    }
}

/// The short name a caller has in the corpus and the differences list.
pub fn caller_name(caller: Caller) -> &'static str {
    match caller {
        Caller::Root => "root",
        Caller::Unprivileged => "nobody",
        Caller::Nested => "nested",
    }
}

/// A seccomp program (classic BPF, x86-64) that answers `mkdir` and
/// `mkdirat` with EPERM and allows everything else: what libseccomp's
/// `seccomp_export_bpf` would write for that rule, assembled here so the
/// harness needs no libseccomp.
fn deny_mkdir_bpf() -> Vec<u8> {
    const LD_ABS_W: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO_EPERM: u32 = 0x0005_0000 | 1;
    let program: [(u16, u8, u8, u32); 7] = [
        (LD_ABS_W, 0, 0, 4),              // arch
        (JEQ_K, 0, 3, AUDIT_ARCH_X86_64), // another arch: allow
        (LD_ABS_W, 0, 0, 0),              // syscall number
        (JEQ_K, 2, 0, libc::SYS_mkdir as u32),
        (JEQ_K, 1, 0, libc::SYS_mkdirat as u32),
        (RET_K, 0, 0, ALLOW),
        (RET_K, 0, 0, ERRNO_EPERM),
    ];
    program
        .iter()
        .flat_map(|&(code, jt, jf, k)| {
            let mut ins = code.to_le_bytes().to_vec();
            ins.extend([jt, jf]);
            ins.extend(k.to_le_bytes());
            ins
        })
        .collect()
}

/// The fixtures every line finds in `$D`.
fn make_fixtures(d: &Path, uid: u32) {
    std::fs::create_dir(d).unwrap();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let write = |name: &str, data: &[u8]| std::fs::write(d.join(name), data).unwrap();
    write("data", b"some data\n");
    write("empty", b"");
    write("lock", b"");
    write("deny-mkdir.bpf", &deny_mkdir_bpf());
    // seccomp "allow everything": one instruction.
    let mut allow = 0x06u16.to_le_bytes().to_vec();
    allow.extend([0, 0]);
    allow.extend(0x7fff_0000u32.to_le_bytes());
    write("allow.bpf", &allow);
    write("short.bpf", b"1234567");
    for dir in ["dir", "dir/sub", "dir2", "up", "work"] {
        std::fs::create_dir(d.join(dir)).unwrap();
    }
    write("dir/file", b"inside\n");
    write("dir2/file2", b"second\n");
    write("exe.sh", b"#!/bin/sh\necho script \"$@\"\n");
    std::fs::set_permissions(d.join("exe.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("dir", d.join("link")).unwrap();
    std::os::unix::fs::symlink("nonexistent", d.join("dangling")).unwrap();
    chown_tree(d, uid);
}

fn chown_tree(path: &Path, uid: u32) {
    lchown(path, Some(uid), Some(uid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

/// Every process descended from `pid` (from /proc's parent links).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.insert(p, ppid);
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
}

/// Runs `case` with `bwrap` as `caller` in `dir` (made afresh), raw.
fn run_raw(caller: Caller, bwrap: &Path, case: &Case, dir: &Path) -> (String, Vec<u8>, Vec<u8>, String) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let d = dir.join("d");
    make_fixtures(&d, caller.host_uid());
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut cmd = caller.command(Path::new("/bin/sh"), &["-c", &case.script]);
    cmd.current_dir(&d)
        .env("BWRAP", bwrap)
        .env("D", &d)
        .env("HOME", &d)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break if let Some(code) = status.code() {
                format!("exit {code}")
            } else {
                format!("signal {}", status.signal().unwrap_or(0))
            };
        }
        if start.elapsed() > TIMEOUT {
            for pid in descendants(child.id()).into_iter().rev() {
                // SAFETY: kill with a pid we found as a descendant and a signal number.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = child.wait();
            break "hang".to_string();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // What the line left behind in its process group (bubblewrap's own
    // monitor outlives the shell for some lines, e.g. `--info-fd` on a
    // descriptor that is not open): never let it outlive the case, where it
    // would count against the next tests' process limits.
    // SAFETY: kill with the negated process group id of our child, which
    // `process_group(0)` made its own group's leader, and a signal number.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let mut files = String::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "out"))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read(&name).unwrap_or_default();
        files.push_str(&format!(
            "{}:\n{}\n",
            name.file_name().unwrap().to_string_lossy(),
            String::from_utf8_lossy(&text)
        ));
    }
    let stdout = std::fs::read(dir.join("stdout")).unwrap();
    let stderr = std::fs::read(dir.join("stderr")).unwrap();
    (status, stdout, stderr, files)
}

/// Runs `case` and normalises what it printed: `$D`, `$BWRAP`, pids in the
/// status JSON and namespace ids.
pub fn run(caller: Caller, bwrap: &Path, case: &Case, dir: &Path) -> Outcome {
    let (status, stdout, stderr, files) = run_raw(caller, bwrap, case, dir);
    let d = dir.join("d");
    let mut names = NsNames::default();
    let mut norm = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes)
            .replace(d.to_str().unwrap(), "$D")
            .replace(bwrap.to_str().unwrap(), "$BWRAP");
        names.rename(&child_pids(&text))
    };
    let stdout = norm(&stdout);
    let stderr = norm(&stderr);
    let files = norm(files.as_bytes());
    let _ = std::fs::remove_dir_all(dir);
    Outcome { status, stdout, stderr, files }
}

/// `"child-pid": N` → `"child-pid": PID`.
fn child_pids(text: &str) -> String {
    const KEY: &str = "\"child-pid\": ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        out.push_str(&rest[..at + KEY.len()]);
        rest = &rest[at + KEY.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(if digits > 0 { "PID" } else { "" });
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// Namespace ids (`net:[4026532...]`, `"net-namespace": 4026532...`) as
/// `NS1`, `NS2`, ... in order of first appearance, across one run's output.
#[derive(Default)]
struct NsNames(BTreeMap<String, usize>);

impl NsNames {
    fn rename(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
                let len = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                let number = &text[i..i + len];
                let is_ns = len == 10
                    && number.parse::<u64>().is_ok_and(|n| (4_026_531_840..4_027_580_416).contains(&n));
                if is_ns {
                    let next = self.0.len() + 1;
                    let n = *self.0.entry(number.to_string()).or_insert(next);
                    out.push_str(&format!("NS{n}"));
                } else {
                    out.push_str(number);
                }
                i += len;
            } else {
                let c = text[i..].chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
        out
    }
}

/// One entry of the list of known differences
/// (tests/fixtures/bwrap-diff/differences.txt).
#[derive(Debug)]
pub struct Known {
    pub line: usize,
    /// A case id; `*` stands for any text.
    pub pattern: String,
    pub callers: BTreeSet<String>,
    /// The fields that may differ (`*`: any).
    pub fields: BTreeSet<String>,
    /// The anchor in docs/bwrap.md that says why (`diff-REASON`).
    pub reason: String,
    /// Only for a reference of this version (`ref=0.11.0`), else any.
    pub only_ref: Option<String>,
}

impl Known {
    pub fn matches_case(&self, id: &str) -> bool {
        wildcard(&self.pattern, id)
    }

    pub fn applies(&self, caller: &str, reference: &str) -> bool {
        (self.callers.contains("*") || self.callers.contains(caller))
            && self.only_ref.as_deref().is_none_or(|v| v == reference)
    }

    /// Whether it accounts for a difference in `fields` (`*`: in any).
    pub fn covers(&self, fields: &BTreeSet<&str>) -> bool {
        self.fields.contains("*") || fields.iter().all(|f| self.fields.contains(*f))
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any text.
fn wildcard(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else { return false };
            (0..=tail.len()).filter(|&i| tail.is_char_boundary(i)).any(|i| wildcard(rest, &tail[i..]))
        }
    }
}

/// Parses the differences list: `PATTERN CALLERS FIELDS REASON [ref=V]`,
/// `#` comments.
pub fn known_differences(text: &str) -> Vec<Known> {
    let mut list = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split(" #").next().unwrap().trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            (4..=5).contains(&words.len()),
            "differences.txt:{}: PATTERN CALLERS FIELDS REASON [ref=V]: {raw}",
            n + 1
        );
        let set = |w: &str| w.split(',').map(str::to_string).collect::<BTreeSet<_>>();
        let fields = set(words[2]);
        for f in &fields {
            assert!(f == "*" || FIELDS.contains(&f.as_str()), "differences.txt:{}: unknown field {f}", n + 1);
        }
        let callers = set(words[1]);
        for c in &callers {
            assert!(
                ["*", "root", "nobody", "nested"].contains(&c.as_str()),
                "differences.txt:{}: {c}",
                n + 1
            );
        }
        let only_ref = words.get(4).map(|w| {
            w.strip_prefix("ref=").unwrap_or_else(|| panic!("differences.txt:{}: {w}", n + 1)).to_string()
        });
        list.push(Known {
            line: n + 1,
            pattern: words[0].to_string(),
            callers,
            fields,
            reason: words[3].to_string(),
            only_ref,
        });
    }
    list
}

/// Parses the hand-written corpus: `ID: LINE`, a trailing `\` continues a
/// line, `#` starts a comment line.
pub fn handwritten(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut pending = String::new();
    for raw in text.lines() {
        if pending.is_empty() && (raw.trim().is_empty() || raw.trim_start().starts_with('#')) {
            continue;
        }
        match raw.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                continue;
            }
            None => pending.push_str(raw),
        }
        let (id, script) = pending.split_once(": ").unwrap_or_else(|| panic!("corpus: ID: LINE: {pending}"));
        cases.push(Case { id: id.trim().to_string(), script: script.trim().to_string() });
        pending.clear();
    }
    assert!(pending.is_empty(), "corpus ends inside a continued line");
    cases
}

/// A text shortened for a report: at most `lines` lines.
pub fn excerpt(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all.iter().take(lines).map(|l| format!("      | {l}\n")).collect::<String>();
    if all.len() > lines {
        out.push_str(&format!("      | ... ({} more lines)\n", all.len() - lines));
    }
    out
}
