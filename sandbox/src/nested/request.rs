//! What a `bwrap` front end asks the launcher for: the parsed command line,
//! as plain data. The launcher's worker checks every field again before
//! using it ([`Request::check`]): the front end runs inside the sandbox,
//! so nothing it sends is trusted.

use serde::{Deserialize, Serialize};

/// Most arguments one request may carry, as bubblewrap's own cap.
pub const MAX_ARGS: usize = 9000;
/// Most environment variables.
pub const MAX_ENV: usize = 8192;
/// The kernel's cap on one BPF program (`BPF_MAXINSNS`).
pub const MAX_BPF_INSNS: usize = 4096;
/// `S_ISUID | S_ISGID`: never in a mode a nested request sets.
const SET_ID_BITS: u32 = 0o6000;
/// bubblewrap's options only a bwrap on the host serves: the caller's own
/// namespaces and status descriptors, SELinux labels. Inside a sandbox
/// the portal's worker refuses them ([`Request::check_served`]), the one
/// place that decides; the front end only names them in the request.
pub const HOST_ONLY: &[&str] = &["--userns", "--userns2", "--pidns", "--exec-label", "--file-label"];

/// One nested sandbox, as the front end parsed it from bwrap's options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Request {
    /// COMMAND and its arguments; COMMAND is looked up in `env`'s `PATH`.
    pub command: Vec<String>,
    /// `--argv0`: the `argv[0]` COMMAND sees.
    pub argv0: Option<String>,
    /// COMMAND's environment: the caller's, after `--setenv`, `--unsetenv`
    /// and `--clearenv` (`PWD` is set to the working directory).
    pub env: Vec<(String, String)>,
    /// The caller's working directory (relative sources resolve from it,
    /// and COMMAND starts there when it exists in the new root).
    pub cwd: String,
    /// `--chdir`.
    pub chdir: Option<String>,
    /// The caller's umask, restored for COMMAND.
    pub umask: u32,
    /// The filesystem operations, in command-line order.
    pub ops: Vec<Op>,
    pub unshare: Unshare,
    /// `--uid` / `--gid` inside the new user namespace.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// `--hostname` (needs `unshare.uts`).
    pub hostname: Option<String>,
    /// The capability set COMMAND keeps, from `--cap-add`/`--cap-drop`
    /// (bit N = capability N); `None` when neither was given.
    pub caps: Option<u64>,
    /// The caller's descriptor numbers passed along (SCM_RIGHTS, same
    /// order): COMMAND gets each at the same number.
    pub fds: Vec<i32>,
    /// `--new-session` (a nested sandbox always gets one).
    #[serde(default)]
    pub new_session: bool,
    /// `--as-pid-1`: COMMAND is the new pid namespace's PID 1, no reaper.
    #[serde(default)]
    pub as_pid_1: bool,
    /// `--seccomp`/`--add-seccomp-fd`: classic BPF programs (8-byte
    /// `sock_filter`s), installed in order after the runtime's own.
    #[serde(default)]
    pub seccomp: Vec<Vec<u8>>,
    /// `--lock-file`: paths in the new root that PID 1 holds a read lock
    /// on for the sandbox's life.
    #[serde(default)]
    pub lock_files: Vec<String>,
    /// `--block-fd`: one of `fds`; COMMAND starts once a byte (or
    /// end-of-file) can be read from it.
    #[serde(default)]
    pub block_fd: Option<i32>,
    /// `--userns2`: one of `fds`, the user namespace to switch to once
    /// the sandbox is set up (on the host only).
    #[serde(default)]
    pub userns2_fd: Option<i32>,
    /// `--info-fd`, `--json-status-fd`, `--userns-block-fd`: each one of
    /// `fds`; the worker writes bubblewrap's reports on the nested
    /// sandbox there (and waits on the last), as bubblewrap's monitor.
    #[serde(default)]
    pub info_fd: Option<i32>,
    #[serde(default)]
    pub json_status_fd: Option<i32>,
    #[serde(default)]
    pub userns_block_fd: Option<i32>,
    /// `--disable-userns`: COMMAND cannot make user namespaces.
    #[serde(default)]
    pub disable_userns: bool,
    /// `--assert-userns-disabled`: fail unless user namespaces are off.
    #[serde(default)]
    pub assert_userns_disabled: bool,
    /// The options of [`HOST_ONLY`] given, by name (the host serves them
    /// from its own parse; inside a sandbox they are refused).
    #[serde(default)]
    pub host_only: Vec<String>,
}

/// Namespaces beyond the mount and pid ones every nested sandbox has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Unshare {
    pub user: bool,
    /// `--unshare-pid`: a nested sandbox always gets a new pid namespace;
    /// on the host, only `--pidns` makes this matter.
    #[serde(default)]
    pub pid: bool,
    pub ipc: bool,
    pub net: bool,
    pub uts: bool,
    pub cgroup: bool,
}

/// How a bind treats what it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BindMode {
    /// `--bind`: read-write, `nosuid`, `nodev`.
    Rw,
    /// `--ro-bind`: read-only, `nosuid`, `nodev`.
    Ro,
    /// `--dev-bind`: read-write, `nosuid`, devices usable.
    Dev,
}

/// One filesystem operation. Sources are paths of the sandbox the request
/// comes from; destinations are paths in the new root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum Op {
    /// `--bind`, `--ro-bind`, `--dev-bind` and their `-try` forms
    /// (`optional`: a missing source is skipped).
    Bind { src: String, dst: String, mode: BindMode, optional: bool },
    /// `--remount-ro`.
    RemountRo { dst: String },
    /// `--tmpfs` (with `--perms`, `--size`).
    Tmpfs { dst: String, mode: u32, size: Option<u64> },
    /// `--dir` (with `--perms`).
    Dir { dst: String, mode: u32 },
    /// `--symlink TARGET DEST`.
    Symlink { target: String, dst: String },
    /// `--proc`.
    Proc { dst: String },
    /// `--dev`.
    Dev { dst: String },
    /// `--mqueue`.
    Mqueue { dst: String },
    /// `--file`, `--bind-data`, `--ro-bind-data` (with `--perms`): the
    /// bytes read from the descriptor.
    Data { dst: String, contents: Vec<u8>, mode: u32, how: DataKind },
    /// `--chmod MODE PATH`.
    Chmod { dst: String, mode: u32 },
    /// `--overlay`, `--tmp-overlay`, `--ro-overlay` with their
    /// `--overlay-src`s (lowest last, as overlayfs lists them: bwrap's
    /// order reversed).
    Overlay { sources: Vec<String>, dst: String, kind: OverlayKind },
}

/// How `Op::Data` lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DataKind {
    /// `--file`: a new file at the destination.
    File,
    /// `--bind-data`: a private file bound read-write.
    Bind,
    /// `--ro-bind-data`: a private file bound read-only.
    RoBind,
}

/// Which overlay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OverlayKind {
    /// `--overlay RWSRC WORKDIR`.
    Rw { upper: String, work: String },
    /// `--tmp-overlay`: writes go to an invisible tmpfs.
    Tmp,
    /// `--ro-overlay`.
    Ro,
}

/// Why a request is refused; the text follows `bwrap: `.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("Can't find source path {src}: {reason}")]
    Source { src: String, reason: String },
    #[error("Can't use destination {dst}: it is outside the new root")]
    Outside { dst: String },
    #[error("Specifying --{0} requires --unshare-user or --userns")]
    IdWithoutUserns(&'static str),
    #[error("Specifying --hostname requires --unshare-uts")]
    HostnameWithoutUts,
    #[error(
        "capset failed: Operation not permitted (capabilities are kept only inside a new user namespace)"
    )]
    CapsWithoutUserns,
    #[error(
        "{option} {mode:o}: set-uid and set-gid bits cannot be set inside a sandbox (see docs/security.md)"
    )]
    SetId { option: &'static str, mode: u32 },
    #[error(
        "--overlay with a writable host directory is refused inside a sandbox whose user is host root: \
         copying a file up would keep its set-uid bit (see docs/security.md)"
    )]
    RootCopyUp,
    #[error("Can't use overlay source {src}: the sandbox masks files below it (see docs/security.md)")]
    Masked { src: String },
    #[error("{0} is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)")]
    HostOnly(&'static str),
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl Request {
    /// Every check the portal's worker makes before it touches anything
    /// (`user_is_host_root`: the outer sandbox's user is host root): the
    /// one place that decides what a nested request may ask for.
    pub fn check_served(&self, received: usize, user_is_host_root: bool) -> Result<(), RequestError> {
        self.check_nested(received)?;
        // overlayfs copies a file up with its owner and mode, set-uid bit
        // included, as the nested PID 1, which may: where the sandbox user
        // is host root, the system view's set-uid-root programs would land
        // in a host directory as set-uid-root files (the upper layer of a
        // tmp overlay stays in memory, and is not refused).
        if user_is_host_root
            && self.ops.iter().any(|op| matches!(op, Op::Overlay { kind: OverlayKind::Rw { .. }, .. }))
        {
            return Err(RequestError::RootCopyUp);
        }
        Ok(())
    }

    /// Checks a nested request: as [`Request::check`], and capabilities
    /// only inside a new user namespace (the outer sandbox has none to give).
    fn check_nested(&self, received: usize) -> Result<(), RequestError> {
        self.check(received)?;
        // What only the host serves: named by the front end, or present as
        // a field (a raw request need not name what it sends).
        if let Some(name) = self.host_only.first() {
            let known = HOST_ONLY.iter().find(|o| **o == name.as_str());
            return Err(known.map_or_else(
                || RequestError::Invalid(format!("host option {name:?}")),
                |o| RequestError::HostOnly(o),
            ));
        }
        if self.userns2_fd.is_some() {
            return Err(RequestError::HostOnly("--userns2"));
        }
        if !self.unshare.user && self.caps.is_some_and(|c| c != 0) {
            return Err(RequestError::CapsWithoutUserns);
        }
        // Nothing inside a sandbox makes a set-uid or set-gid file, the
        // nested PID 1's own steps included.
        for op in &self.ops {
            let (option, mode) = match op {
                Op::Chmod { mode, .. } => ("--chmod", *mode),
                Op::Tmpfs { mode, .. } => ("--perms (--tmpfs)", *mode),
                Op::Dir { mode, .. } => ("--perms (--dir)", *mode),
                Op::Data { mode, .. } => ("--perms", *mode),
                _ => continue,
            };
            if mode & SET_ID_BITS != 0 {
                return Err(RequestError::SetId { option, mode });
            }
        }
        Ok(())
    }

    /// No string the command's `execve` and setup take holds a NUL byte,
    /// and every environment variable has a name.
    fn check_strings(&self) -> Result<(), RequestError> {
        let bad = |what: String| Err(RequestError::Invalid(what));
        let strings = self
            .command
            .iter()
            .chain(&self.argv0)
            .chain(self.env.iter().flat_map(|(k, v)| [k, v]))
            .chain(std::iter::once(&self.cwd))
            .chain(&self.chdir)
            .chain(&self.hostname);
        for s in strings {
            if s.contains('\0') {
                return bad(format!("{s:?} contains a NUL byte"));
            }
        }
        for (key, _) in &self.env {
            if key.is_empty() || key.contains('=') {
                return bad(format!("environment variable name {key:?}"));
            }
        }
        Ok(())
    }

    /// Checks everything that does not need the filesystem; `received` is
    /// how many descriptors came with the request.
    pub fn check(&self, received: usize) -> Result<(), RequestError> {
        let bad = |what: String| Err(RequestError::Invalid(what));
        // An empty COMMAND is execvp's to refuse, as in bubblewrap.
        if self.command.is_empty() {
            return bad("no command".into());
        }
        if self.command.len() + 3 * self.ops.len() > MAX_ARGS {
            return bad(format!("more than {MAX_ARGS} arguments"));
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("more than {MAX_ENV} environment variables"));
        }
        self.check_strings()?;
        if !self.cwd.starts_with('/') {
            return bad(format!("working directory {:?} is not absolute", self.cwd));
        }
        if self.umask > 0o777 {
            return bad(format!("umask {:o}", self.umask));
        }
        if self.fds.len() != received {
            return bad(format!("{} descriptors named, {received} received", self.fds.len()));
        }
        let mut seen = self.fds.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.fds.len() || seen.iter().any(|&fd| !(0..1 << 20).contains(&fd)) {
            return bad("descriptor numbers must be distinct, between 0 and 2^20".into());
        }
        for op in &self.ops {
            op.check()?;
        }
        // An empty program is the kernel's to refuse, as in bubblewrap.
        for program in &self.seccomp {
            if program.len() % 8 != 0 || program.len() / 8 > MAX_BPF_INSNS {
                return bad(format!("seccomp program of {} bytes", program.len()));
            }
        }
        if self.host_only.len() > HOST_ONLY.len() || self.host_only.iter().any(|n| n.contains('\0')) {
            return bad("host options".into());
        }
        if self.lock_files.iter().any(|p| p.contains('\0')) {
            return bad("lock file path".into());
        }
        let named = [self.block_fd, self.userns2_fd, self.info_fd, self.json_status_fd, self.userns_block_fd];
        if named.iter().flatten().any(|fd| !self.fds.contains(fd)) {
            return bad("a descriptor named by an option is not passed".into());
        }
        if !self.unshare.user {
            for (name, id) in [("uid", self.uid), ("gid", self.gid)] {
                if id.is_some() {
                    return Err(RequestError::IdWithoutUserns(name));
                }
            }
        }
        if let Some(name) = &self.hostname {
            if !self.unshare.uts {
                return Err(RequestError::HostnameWithoutUts);
            }
            // Its length is the kernel's to check (`sethostname`), as in bubblewrap.
            if name.len() > 4096 {
                return bad(format!("hostname of {} bytes", name.len()));
            }
        }
        if self.caps.is_some_and(|c| c >> last_cap().saturating_add(1) != 0) {
            return bad("unknown capability".into());
        }
        Ok(())
    }
}

impl Op {
    /// The destination in the new root.
    pub fn dst(&self) -> &str {
        match self {
            Op::Bind { dst, .. }
            | Op::RemountRo { dst }
            | Op::Tmpfs { dst, .. }
            | Op::Dir { dst, .. }
            | Op::Symlink { dst, .. }
            | Op::Proc { dst }
            | Op::Dev { dst }
            | Op::Mqueue { dst }
            | Op::Data { dst, .. }
            | Op::Chmod { dst, .. }
            | Op::Overlay { dst, .. } => dst,
        }
    }

    fn check(&self) -> Result<(), RequestError> {
        let bad = |what: String| Err(RequestError::Invalid(what));
        dest(self.dst())?;
        match self {
            Op::Bind { src, .. } if src.contains('\0') => bad(format!("source {src:?}")),
            Op::Symlink { target, .. } if target.contains('\0') => bad(format!("symlink target {target:?}")),
            Op::Tmpfs { mode, .. }
            | Op::Dir { mode, .. }
            | Op::Data { mode, .. }
            | Op::Chmod { mode, .. }
                if *mode > 0o7777 =>
            {
                bad(format!("mode {mode:o}"))
            }
            Op::Overlay { sources, kind, .. } => {
                let extra = match kind {
                    OverlayKind::Rw { upper, work } => vec![upper, work],
                    _ => vec![],
                };
                if sources.is_empty() || sources.iter().chain(extra).any(|s| s.contains('\0')) {
                    return bad("overlay sources".into());
                }
                Ok(())
            }
            Op::Tmpfs { size: Some(0), .. } => bad("tmpfs size 0".into()),
            _ => Ok(()),
        }
    }
}

/// A destination as an absolute path in the new root, as bubblewrap reads
/// it (relative to the new root whether or not it starts with `/`).
/// `..` is refused: nothing may land outside the new root.
pub fn dest(path: &str) -> Result<String, RequestError> {
    if path.contains('\0') {
        return Err(RequestError::Invalid(format!("destination {path:?} contains a NUL byte")));
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return Err(RequestError::Outside { dst: path.to_string() });
        }
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request { command: vec!["true".into()], cwd: "/".into(), umask: 0o22, ..Request::default() }
    }

    #[test]
    fn destinations_stay_in_the_new_root() {
        assert_eq!(dest("/a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(dest("a/b").unwrap(), "/a/b");
        assert_eq!(dest("/").unwrap(), "/");
        assert_eq!(dest("/../../x"), Err(RequestError::Outside { dst: "/../../x".into() }));
        assert!(dest("/a/../b").is_err());
    }

    #[test]
    fn ids_hostname_and_caps_need_their_namespaces() {
        let mut r = request();
        r.uid = Some(0);
        assert_eq!(r.check(0), Err(RequestError::IdWithoutUserns("uid")));
        r.unshare.user = true;
        assert_eq!(r.check(0), Ok(()));
        r.hostname = Some("x".into());
        assert_eq!(r.check(0), Err(RequestError::HostnameWithoutUts));
        let mut r = request();
        r.caps = Some(1 << 12);
        assert_eq!(r.check_nested(0), Err(RequestError::CapsWithoutUserns));
        assert_eq!(r.check(0), Ok(()), "on the host, root keeps capabilities");
        r.caps = Some(0);
        assert_eq!(r.check_nested(0), Ok(()));
    }

    #[test]
    fn descriptors_must_match_what_came() {
        let mut r = request();
        r.fds = vec![0, 1, 2];
        assert!(r.check(2).is_err());
        assert!(r.check(3).is_ok());
        r.fds = vec![0, 0, 2];
        assert!(r.check(3).is_err());
        r.fds = vec![0, 1, -1];
        assert!(r.check(3).is_err());
    }

    #[test]
    fn what_only_the_host_serves_is_refused_nested() {
        let mut r = request();
        r.fds = vec![3];
        r.userns2_fd = Some(3);
        assert_eq!(r.check(1), Ok(()), "on the host");
        assert_eq!(r.check_nested(1), Err(RequestError::HostOnly("--userns2")));
        let mut r = request();
        r.host_only = vec!["--pidns".into()];
        assert_eq!(r.check(0), Ok(()));
        assert_eq!(
            r.check_nested(0).unwrap_err().to_string(),
            "--pidns is not supported by tuixiu-sandbox's bwrap inside a sandbox (see docs/bwrap.md)"
        );
        r.host_only = vec!["--frob".into()];
        assert!(matches!(r.check_nested(0), Err(RequestError::Invalid(_))));
    }

    #[test]
    fn set_id_modes_are_refused_nested() {
        let mut r = request();
        r.ops = vec![Op::Chmod { dst: "/x".into(), mode: 0o4755 }];
        assert_eq!(r.check(0), Ok(()), "bwrap on the host is the caller's");
        assert_eq!(r.check_nested(0), Err(RequestError::SetId { option: "--chmod", mode: 0o4755 }));
        r.ops = vec![Op::Tmpfs { dst: "/x".into(), mode: 0o1777, size: None }];
        assert_eq!(r.check_nested(0), Ok(()), "the sticky bit is fine");
    }

    #[test]
    fn a_root_users_request_writes_no_overlay_to_the_host() {
        let mut r = request();
        let kind = OverlayKind::Rw { upper: "/u".into(), work: "/w".into() };
        r.ops = vec![Op::Overlay { sources: vec!["/usr".into()], dst: "/o".into(), kind }];
        assert_eq!(r.check_served(0, false), Ok(()));
        assert_eq!(r.check_served(0, true), Err(RequestError::RootCopyUp));
        r.ops = vec![Op::Overlay { sources: vec!["/usr".into()], dst: "/o".into(), kind: OverlayKind::Tmp }];
        assert_eq!(r.check_served(0, true), Ok(()), "a tmp overlay's upper layer is memory");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let json = r#"{"command":["true"],"argv0":null,"env":[],"cwd":"/","chdir":null,"umask":18,"ops":[],
            "unshare":{"user":false,"ipc":false,"net":false,"uts":false,"cgroup":false},"uid":null,"gid":null,
            "hostname":null,"caps":null,"fds":[],"extra":1}"#;
        assert!(serde_json::from_str::<Request>(json).is_err());
    }
}
