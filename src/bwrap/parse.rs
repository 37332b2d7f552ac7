//! bubblewrap's command-line parser, over the option table: exact names,
//! arguments taken verbatim from the following elements, scanning stops at
//! the first element not starting with `-` (COMMAND) or after `--`;
//! `--args FD` splices NUL-separated arguments in place; `--perms`,
//! `--size` and `--overlay-src` attach to the next option. Every option of
//! bubblewrap 0.11 is parsed here, with its messages; which ones the
//! runtime serves is decided afterwards ([`Parsed::unsupported`]).

use std::collections::BTreeMap;

use super::options::{self, BindMode, FdOpt, Kind, Ns, Opt};

/// bubblewrap's cap on arguments (its own plus COMMAND's and `--args`').
pub const MAX_ARGS: usize = 9000;

/// A filesystem operation, in command-line order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Bind { src: String, dst: String, mode: BindMode, optional: bool },
    BindFd { fd: i32, dst: String, ro: bool },
    RemountRo { dst: String },
    Overlay { sources: Vec<String>, kind: OverlayKind, dst: String },
    Proc { dst: String },
    Dev { dst: String },
    Tmpfs { dst: String, perms: Option<u32>, size: Option<u64> },
    Mqueue { dst: String },
    Dir { dst: String, perms: Option<u32> },
    File { fd: i32, dst: String, perms: Option<u32> },
    BindData { fd: i32, dst: String, perms: Option<u32>, ro: bool },
    Symlink { target: String, dst: String },
    Chmod { mode: u32, path: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverlayKind {
    Rw { upper: String, work: String },
    Tmp,
    Ro,
}

/// The namespaces asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unshare {
    pub user: bool,
    pub user_try: bool,
    pub ipc: bool,
    pub pid: bool,
    pub net: bool,
    pub uts: bool,
    pub cgroup: bool,
    pub cgroup_try: bool,
}

/// Everything a bwrap command line says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub argv0: Option<String>,
    pub level_prefix: bool,
    pub unshare: Unshare,
    pub fds: BTreeMap<&'static str, i32>,
    pub disable_userns: bool,
    pub assert_userns_disabled: bool,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub hostname: Option<String>,
    pub chdir: Option<String>,
    /// The environment after `--setenv`, `--unsetenv` and `--clearenv`.
    pub env: Vec<(String, String)>,
    pub lock_files: Vec<String>,
    pub ops: Vec<Op>,
    /// Programs of `--add-seccomp-fd`, read at parse time.
    pub seccomp_programs: Vec<Vec<u8>>,
    /// `--exec-label`: the SELinux context COMMAND is executed in.
    pub exec_label: Option<String>,
    /// `--file-label`: the context of the tmpfs mounts made for the sandbox
    /// (files created during setup get it through `Io::file_label`).
    pub file_label: Option<String>,
    pub new_session: bool,
    pub die_with_parent: bool,
    pub as_pid_1: bool,
    /// `--cap-add`/`--cap-drop` in order: (add?, capability mask).
    pub caps: Vec<(bool, u64)>,
    /// Options given, in order (each name once), for [`Parsed::host_only`].
    pub given: Vec<&'static str>,
    pub command: Vec<String>,
    /// `--tx-seccomp PROFILE` (ours).
    pub tx_seccomp: Option<String>,
    /// `--tx-landlock` (ours).
    pub tx_landlock: bool,
}

/// How parsing ended, besides a command line to run.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Run(Box<Parsed>),
    /// `--help`: the usage on stdout, exit 0.
    Help,
    /// `--version`.
    Version,
    /// No COMMAND (or no arguments): the usage on stderr, exit 1.
    Usage,
}

/// A parse error: bubblewrap's message (without `bwrap: `), and whether
/// `--level-prefix` was in force when it happened.
#[derive(Debug, PartialEq, Eq)]
pub struct Error {
    pub message: String,
    pub prefixed: bool,
}

/// Side effects the parser needs: reading descriptors (`--args`,
/// `--add-seccomp-fd`) and printing warnings.
pub trait Io {
    /// Reads `fd` to end-of-file and closes it.
    fn read_fd(&mut self, fd: i32) -> std::io::Result<Vec<u8>>;
    fn warn(&mut self, message: &str, prefixed: bool);
    /// Whether SELinux is enabled (libselinux's `is_selinux_enabled`).
    fn selinux(&self) -> bool;
    /// Whether the kernel takes `label` as a context (libselinux's
    /// `security_check_context`).
    fn check_label(&mut self, label: &str) -> std::io::Result<()>;
    /// `--file-label`: files this process creates from now on get `label`
    /// (libselinux's `setfscreatecon`; the sandbox's PID 1 inherits it).
    fn file_label(&mut self, label: &str) -> std::io::Result<()>;
}

/// Parses bwrap's arguments (after `argv[0]`), starting from `env`.
pub fn parse(args: &[String], env: Vec<(String, String)>, io: &mut dyn Io) -> Result<Outcome, Error> {
    if args.is_empty() {
        return Ok(Outcome::Usage);
    }
    let mut p =
        Parser { parsed: Parsed { env, ..Parsed::default() }, pending: Pending::default(), count: 0, io };
    match p.options(args, false)? {
        Stop::Help => return Ok(Outcome::Help),
        Stop::Version => return Ok(Outcome::Version),
        Stop::Command(at) => p.parsed.command = args[at..].to_vec(),
        Stop::End => {}
    }
    if !p.pending.overlay.is_empty() {
        return Err(p.error(OVERLAY_SRC_MISUSE));
    }
    p.validate()?;
    if p.parsed.command.is_empty() {
        return Ok(Outcome::Usage);
    }
    Ok(Outcome::Run(Box::new(p.parsed)))
}

const OVERLAY_SRC_MISUSE: &str = "--overlay-src must be followed by another --overlay-src or one of --overlay, --tmp-overlay, or --ro-overlay";

enum Stop {
    Help,
    Version,
    /// COMMAND starts at this index.
    Command(usize),
    End,
}

#[derive(Default)]
struct Pending {
    perms: Option<u32>,
    size: Option<u64>,
    overlay: Vec<String>,
}

struct Parser<'a> {
    parsed: Parsed,
    pending: Pending,
    /// Arguments seen, for [`MAX_ARGS`].
    count: usize,
    io: &'a mut dyn Io,
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> Error {
        Error { message: one_line(&message.into()), prefixed: self.parsed.level_prefix }
    }

    /// Parses options from `args`; `in_file` for the contents of `--args`.
    fn options(&mut self, args: &[String], in_file: bool) -> Result<Stop, Error> {
        self.count += args.len();
        if self.count > MAX_ARGS {
            return Err(self.error(format!("Exceeded maximum number of arguments {MAX_ARGS}")));
        }
        let mut i = 0;
        while i < args.len() {
            let arg = args[i].as_str();
            if arg == "--" {
                return Ok(if in_file || i + 1 >= args.len() { Stop::End } else { Stop::Command(i + 1) });
            }
            if !arg.starts_with('-') {
                return Ok(if in_file { Stop::End } else { Stop::Command(i) });
            }
            let Some(opt) = options::find(arg) else {
                return Err(self.error(format!("Unknown option {arg}")));
            };
            let n = opt.args.len();
            if args.len() - i - 1 < n {
                // bubblewrap counts `--overlay-src` without checking that
                // its argument is there: the queue is then left unused.
                if opt.kind == Kind::OverlaySrc {
                    return Err(self.error(OVERLAY_SRC_MISUSE));
                }
                return Err(self.error(opt.missing_text()));
            }
            let values = &args[i + 1..i + 1 + n];
            i += 1 + n;
            if !self.parsed.given.contains(&opt.name) {
                self.parsed.given.push(opt.name);
            }
            if let Some(stop) = self.apply(opt, values, in_file)? {
                return Ok(stop);
            }
            self.check_pending(opt)?;
        }
        Ok(Stop::End)
    }

    /// `--perms`, `--size` and `--overlay-src` must be followed by an
    /// option that uses them: checked, as bubblewrap does, once the next
    /// option has been handled (so its own errors, a `--level-prefix` and
    /// `--help` come first).
    fn check_pending(&mut self, opt: &Opt) -> Result<(), Error> {
        let kind = opt.kind;
        if !matches!(kind, Kind::Perms | Kind::Size) {
            if self.pending.perms.is_some() {
                return Err(self.error("--perms must be followed by an option that creates a file"));
            }
            if self.pending.size.is_some() {
                return Err(self.error("--size must be followed by --tmpfs"));
            }
        }
        if kind != Kind::OverlaySrc && !self.pending.overlay.is_empty() {
            return Err(self.error(OVERLAY_SRC_MISUSE));
        }
        Ok(())
    }

    /// One option, by group: help and version stop, `--args` splices,
    /// then filesystem operations, security settings, the rest.
    fn apply(&mut self, opt: &'static Opt, v: &[String], in_file: bool) -> Result<Option<Stop>, Error> {
        match opt.kind {
            Kind::Help => return Ok(Some(Stop::Help)),
            Kind::Version => return Ok(Some(Stop::Version)),
            Kind::Args => return self.splice_args(&v[0], in_file),
            Kind::Bind { .. }
            | Kind::BindFd { .. }
            | Kind::RemountRo
            | Kind::OverlaySrc
            | Kind::Overlay
            | Kind::TmpOverlay
            | Kind::RoOverlay
            | Kind::Proc
            | Kind::Dev
            | Kind::Tmpfs
            | Kind::Mqueue
            | Kind::Dir
            | Kind::File
            | Kind::BindData { .. }
            | Kind::Symlink
            | Kind::Perms
            | Kind::Size
            | Kind::Chmod => self.filesystem(opt, v)?,
            Kind::Fd(_)
            | Kind::Label
            | Kind::AddSeccompFd
            | Kind::CapAdd
            | Kind::CapDrop
            | Kind::DisableUserns
            | Kind::AssertUsernsDisabled
            | Kind::TxSeccomp
            | Kind::TxLandlock => self.security(opt, v)?,
            Kind::Argv0
            | Kind::LevelPrefix
            | Kind::UnshareAll
            | Kind::ShareNet
            | Kind::Unshare(_)
            | Kind::Uid
            | Kind::Gid
            | Kind::Hostname
            | Kind::Chdir
            | Kind::Clearenv
            | Kind::Setenv
            | Kind::Unsetenv
            | Kind::LockFile
            | Kind::NewSession
            | Kind::DieWithParent
            | Kind::AsPid1 => self.process(opt, v)?,
        }
        Ok(None)
    }

    /// `--args FD`: the descriptor's NUL-separated arguments, parsed in
    /// place (not from within another `--args`).
    fn splice_args(&mut self, fd_text: &str, in_file: bool) -> Result<Option<Stop>, Error> {
        let fd = self.fd(fd_text)?;
        if in_file {
            return Err(self.error("--args not supported in arguments file"));
        }
        let data = self
            .io
            .read_fd(fd)
            .map_err(|e| self.error(format!("Can't read --args data: {}", strerror(&e))))?;
        let mut pieces: Vec<&[u8]> = data.split(|&b| b == 0).collect();
        if data.last() == Some(&0) || data.is_empty() {
            pieces.pop();
        }
        let pieces = pieces
            .into_iter()
            .map(|b| String::from_utf8(b.to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| self.error("--args data is not valid UTF-8 (tuixiu-sandbox's bwrap needs UTF-8)"))?;
        Ok(match self.options(&pieces, true)? {
            Stop::Help => Some(Stop::Help),
            Stop::Version => Some(Stop::Version),
            _ => None,
        })
    }

    /// The process's settings: argv0, namespaces, ids, names, the
    /// environment, lock files, session flags.
    fn process(&mut self, opt: &'static Opt, v: &[String]) -> Result<(), Error> {
        let p = &mut self.parsed;
        match opt.kind {
            Kind::Argv0 => {
                if p.argv0.is_some() {
                    return Err(self.error("--argv0 used multiple times"));
                }
                p.argv0 = Some(v[0].clone());
            }
            Kind::LevelPrefix => p.level_prefix = true,
            Kind::UnshareAll => {
                let u = &mut p.unshare;
                (u.user_try, u.ipc, u.pid, u.net, u.uts, u.cgroup_try) = (true, true, true, true, true, true);
            }
            Kind::ShareNet => p.unshare.net = false,
            Kind::Unshare(ns) => {
                let u = &mut p.unshare;
                *match ns {
                    Ns::User => &mut u.user,
                    Ns::UserTry => &mut u.user_try,
                    Ns::Ipc => &mut u.ipc,
                    Ns::Pid => &mut u.pid,
                    Ns::Net => &mut u.net,
                    Ns::Uts => &mut u.uts,
                    Ns::Cgroup => &mut u.cgroup,
                    Ns::CgroupTry => &mut u.cgroup_try,
                } = true;
            }
            Kind::Uid | Kind::Gid => {
                let uid = opt.kind == Kind::Uid;
                if if uid { p.uid.is_some() } else { p.gid.is_some() } {
                    self.warn_last(opt.name);
                }
                let what = if uid { "uid" } else { "gid" };
                let id = c_int(&v[0]).ok_or_else(|| self.error(format!("Invalid {what}: {}", v[0])))?;
                let slot = if uid { &mut self.parsed.uid } else { &mut self.parsed.gid };
                *slot = Some(id as u32);
            }
            Kind::Hostname => {
                if p.hostname.replace(v[0].clone()).is_some() {
                    self.warn_last(opt.name);
                }
            }
            Kind::Chdir => {
                if p.chdir.replace(v[0].clone()).is_some() {
                    self.warn_last(opt.name);
                }
            }
            Kind::Clearenv => p.env.clear(),
            // The C library's setenv(3) and unsetenv(3) refuse a name that
            // is empty or holds `=`; bubblewrap then stops.
            Kind::Setenv if v[0].is_empty() || v[0].contains('=') => return Err(self.error("setenv failed")),
            Kind::Unsetenv if v[0].is_empty() || v[0].contains('=') => {
                return Err(self.error("unsetenv failed"));
            }
            Kind::Setenv => {
                p.env.retain(|(k, _)| *k != v[0]);
                p.env.push((v[0].clone(), v[1].clone()));
            }
            Kind::Unsetenv => p.env.retain(|(k, _)| *k != v[0]),
            Kind::LockFile => p.lock_files.push(v[0].clone()),
            Kind::NewSession => p.new_session = true,
            Kind::DieWithParent => p.die_with_parent = true,
            Kind::AsPid1 => p.as_pid_1 = true,
            _ => unreachable!("apply sends only process options here"),
        }
        Ok(())
    }

    /// Descriptors, labels, seccomp, capabilities, user namespace
    /// nesting, and our own Landlock/seccomp additions.
    fn security(&mut self, opt: &'static Opt, v: &[String]) -> Result<(), Error> {
        let p = &mut self.parsed;
        match opt.kind {
            Kind::Fd(which) => {
                if which == FdOpt::Seccomp && !p.seccomp_programs.is_empty() {
                    return Err(self.error("--seccomp cannot be combined with --add-seccomp-fd"));
                }
                if p.fds.contains_key(opt.name) {
                    self.warn_last(opt.name);
                }
                let fd = self.fd(&v[0])?;
                self.parsed.fds.insert(opt.name, fd);
            }
            Kind::DisableUserns => p.disable_userns = true,
            Kind::AssertUsernsDisabled => p.assert_userns_disabled = true,
            // bubblewrap's order: the last one wins (with a warning), then
            // the label is checked, and a file label applied at once.
            Kind::Label => {
                let exec = opt.name == "--exec-label";
                let slot = if exec { &mut p.exec_label } else { &mut p.file_label };
                if slot.replace(v[0].clone()).is_some() {
                    self.warn_last(opt.name);
                }
                if !self.io.selinux() {
                    return Err(self.error("labeling not supported on this system"));
                }
                if let Err(e) = self.io.check_label(&v[0]) {
                    return Err(self.error(format!("invalid label {}: {}", v[0], strerror(&e))));
                }
                if !exec && let Err(e) = self.io.file_label(&v[0]) {
                    return Err(self.error(format!("--file-label setup failed: {}", strerror(&e))));
                }
            }
            Kind::AddSeccompFd => {
                if p.fds.contains_key("--seccomp") {
                    return Err(self.error("--add-seccomp-fd cannot be combined with --seccomp"));
                }
                let fd = self.fd(&v[0])?;
                let data = self
                    .io
                    .read_fd(fd)
                    .map_err(|e| self.error(format!("Can't read seccomp data: {}", strerror(&e))))?;
                if data.len() % 8 != 0 {
                    return Err(self.error("Invalid seccomp data, must be multiple of 8"));
                }
                self.parsed.seccomp_programs.push(data);
            }
            Kind::CapAdd | Kind::CapDrop => {
                let mask = cap_mask(&v[0]).ok_or_else(|| self.error(format!("unknown cap: {}", v[0])))?;
                self.parsed.caps.push((opt.kind == Kind::CapAdd, mask));
            }
            Kind::TxSeccomp => p.tx_seccomp = Some(v[0].clone()),
            Kind::TxLandlock => p.tx_landlock = true,
            _ => unreachable!("apply sends only security options here"),
        }
        Ok(())
    }

    /// Filesystem operations, in command-line order, with the `--perms`,
    /// `--size` and `--overlay-src` that attach to the next one.
    fn filesystem(&mut self, opt: &'static Opt, v: &[String]) -> Result<(), Error> {
        let p = &mut self.parsed;
        match opt.kind {
            Kind::Bind { mode, optional } => {
                p.ops.push(Op::Bind { src: v[0].clone(), dst: v[1].clone(), mode, optional })
            }
            Kind::BindFd { ro } => {
                let fd = self.fd(&v[0])?;
                self.parsed.ops.push(Op::BindFd { fd, dst: v[1].clone(), ro });
            }
            Kind::RemountRo => p.ops.push(Op::RemountRo { dst: v[0].clone() }),
            Kind::OverlaySrc => self.pending.overlay.push(v[0].clone()),
            Kind::Overlay | Kind::TmpOverlay | Kind::RoOverlay => {
                let sources = std::mem::take(&mut self.pending.overlay);
                let (need, words) = if opt.kind == Kind::RoOverlay { (2, "two") } else { (1, "one") };
                if sources.len() < need {
                    return Err(self.error(format!("{} requires at least {words} --overlay-src", opt.name)));
                }
                let (kind, dst) = match opt.kind {
                    Kind::Overlay => {
                        (OverlayKind::Rw { upper: v[0].clone(), work: v[1].clone() }, v[2].clone())
                    }
                    Kind::TmpOverlay => (OverlayKind::Tmp, v[0].clone()),
                    _ => (OverlayKind::Ro, v[0].clone()),
                };
                self.parsed.ops.push(Op::Overlay { sources, kind, dst });
            }
            Kind::Proc => p.ops.push(Op::Proc { dst: v[0].clone() }),
            Kind::Dev => p.ops.push(Op::Dev { dst: v[0].clone() }),
            Kind::Tmpfs => {
                let (perms, size) = (self.pending.perms.take(), self.pending.size.take());
                self.parsed.ops.push(Op::Tmpfs { dst: v[0].clone(), perms, size });
            }
            Kind::Mqueue => p.ops.push(Op::Mqueue { dst: v[0].clone() }),
            Kind::Dir => {
                let perms = self.pending.perms.take();
                self.parsed.ops.push(Op::Dir { dst: v[0].clone(), perms });
            }
            Kind::File => {
                let fd = self.fd(&v[0])?;
                let perms = self.pending.perms.take();
                self.parsed.ops.push(Op::File { fd, dst: v[1].clone(), perms });
            }
            Kind::BindData { ro } => {
                let fd = self.fd(&v[0])?;
                let perms = self.pending.perms.take();
                self.parsed.ops.push(Op::BindData { fd, dst: v[1].clone(), perms, ro });
            }
            Kind::Symlink => p.ops.push(Op::Symlink { target: v[0].clone(), dst: v[1].clone() }),
            Kind::Perms => {
                let mode = parse_octal(&v[0])
                    .ok_or_else(|| self.error("--perms takes an octal argument <= 07777"))?;
                if self.pending.perms.replace(mode).is_some() {
                    return Err(self.error("--perms given twice for the same action"));
                }
            }
            Kind::Size => {
                let size = parse_size(&v[0]).map_err(|e| self.error(e.to_string()))?;
                if self.pending.size.replace(size).is_some() {
                    return Err(self.error("--size given twice for the same action"));
                }
            }
            Kind::Chmod => {
                let mode = parse_octal(&v[0])
                    .ok_or_else(|| self.error("--chmod takes an octal argument <= 07777"))?;
                self.parsed.ops.push(Op::Chmod { mode, path: v[1].clone() });
            }
            _ => unreachable!("apply sends only filesystem options here"),
        }
        Ok(())
    }

    fn fd(&self, text: &str) -> Result<i32, Error> {
        c_int(text).ok_or_else(|| self.error(format!("Invalid fd: {text}")))
    }

    fn warn_last(&mut self, name: &str) {
        let prefixed = self.parsed.level_prefix;
        self.io.warn(&format!("Only the last {name} option will take effect"), prefixed);
    }

    /// The checks bubblewrap makes once all options are read, in its order.
    fn validate(&mut self) -> Result<(), Error> {
        let p = &self.parsed;
        let explicit_user = p.unshare.user;
        if p.fds.contains_key("--userns-block-fd") && !explicit_user {
            return Err(self.error("--userns-block-fd requires --unshare-user"));
        }
        if p.fds.contains_key("--userns-block-fd") && !p.fds.contains_key("--info-fd") {
            return Err(self.error("--userns-block-fd requires --info-fd"));
        }
        if p.fds.contains_key("--userns") && p.unshare.user {
            return Err(self.error("--userns not compatible --unshare-user"));
        }
        if p.fds.contains_key("--userns") && p.unshare.user_try {
            return Err(self.error("--userns not compatible --unshare-user-try"));
        }
        if p.disable_userns && !explicit_user {
            return Err(self.error("--disable-userns requires --unshare-user"));
        }
        if p.disable_userns && p.fds.contains_key("--userns-block-fd") {
            return Err(self.error("--disable-userns is not compatible with  --userns-block-fd"));
        }
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let p = &mut self.parsed;
        // Not root: a user namespace is implied, as for a non-setuid bwrap;
        // --unshare-user-try: one can always be made for a nested sandbox.
        if (uid != 0 && !p.fds.contains_key("--userns")) || p.unshare.user_try {
            p.unshare.user = true;
        }
        if p.unshare.cgroup_try {
            p.unshare.cgroup = true;
        }
        if p.command.is_empty() {
            return Ok(());
        }
        let userns = p.unshare.user || p.fds.contains_key("--userns");
        if p.uid.is_some_and(|u| u != uid) && !userns {
            return Err(self.error("Specifying --uid requires --unshare-user or --userns"));
        }
        if p.gid.is_some_and(|g| g != gid) && !userns {
            return Err(self.error("Specifying --gid requires --unshare-user or --userns"));
        }
        let p = &self.parsed;
        if p.hostname.is_some() && !p.unshare.uts {
            return Err(self.error("Specifying --hostname requires --unshare-uts"));
        }
        if p.as_pid_1 && !p.unshare.pid {
            return Err(self.error("Specifying --as-pid-1 requires --unshare-pid"));
        }
        if p.as_pid_1 && !p.lock_files.is_empty() {
            return Err(self.error("Specifying --as-pid-1 and --lock-file is not permitted"));
        }
        Ok(())
    }
}

impl Parsed {
    /// The options given that only a bwrap on the host serves (the
    /// caller's own namespaces and status descriptors, SELinux labels),
    /// once each, in the order given. A nested request names them and the
    /// launcher's worker refuses them: the one check, made where a raw
    /// request meets it too.
    pub fn host_only(&self) -> Vec<String> {
        self.given.iter().filter(|n| sandbox::nested::HOST_ONLY.contains(n)).map(|n| n.to_string()).collect()
    }

    /// The capability set COMMAND keeps (bwrap starts from nothing inside
    /// a user namespace, and from the caller's effective set, which in a
    /// sandbox is empty, outside one); `None` without `--cap-*`.
    pub fn caps(&self, from: u64) -> Option<u64> {
        if self.caps.is_empty() {
            return None;
        }
        Some(self.caps.iter().fold(from, |set, &(add, mask)| if add { set | mask } else { set & !mask }))
    }
}

/// A message as one line: control characters an argument brought along
/// (`Unknown option -\n...`) escaped; bubblewrap prints them raw.
pub fn one_line(message: &str) -> String {
    if !message.chars().any(char::is_control) {
        return message.to_string();
    }
    message
        .chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// bubblewrap's reading of a descriptor, uid or gid: C's `strtol(s, &end,
/// 10)` over the whole string (leading blanks and a sign allowed, clamped
/// to the range of `long`), stored in an `int`, and refused if negative.
fn c_int(s: &str) -> Option<i32> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude = digits.bytes().fold(0i128, |n, b| (n * 10 + i128::from(b - b'0')).min(1 << 64));
    let long = if negative { -magnitude } else { magnitude }.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
    // The conversion to `int` keeps the low 32 bits, as C does here.
    Some(long as i32).filter(|n| *n >= 0)
}

/// C's `strtoul(s, &end, 8)`, at most 07777.
fn parse_octal(s: &str) -> Option<u32> {
    let t = s.trim_start();
    if t.is_empty() || !t.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(t, 8).ok().filter(|&m| m <= 0o7777)
}

/// A `--size` bubblewrap refuses, in its words.
#[derive(Debug, thiserror::Error)]
enum SizeError {
    #[error("--size takes a non-zero number of bytes")]
    NotNonZero,
    #[error("--size (for tmpfs) is limited to {}", u64::MAX >> 1)]
    TooLarge,
}

/// `--size`: `strtoull` base 0 (decimal, `0x` hex, leading-0 octal), a
/// digit first, non-zero, at most `SIZE_MAX >> 1`.
fn parse_size(s: &str) -> Result<u64, SizeError> {
    if !s.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(SizeError::NotNonZero);
    }
    let (digits, radix) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (hex, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    let n = u64::from_str_radix(digits, radix).map_err(|_| SizeError::NotNonZero)?;
    if n == 0 {
        return Err(SizeError::NotNonZero);
    }
    if n > (u64::MAX >> 1) {
        return Err(SizeError::TooLarge);
    }
    Ok(n)
}

/// libcap's capability names (without the `cap_` prefix), by number.
const CAPS: &[&str] = &[
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// bubblewrap's reading of a capability: `ALL` (any case), else libcap's
/// `cap_from_name`: a number (C's `strtoul` base 0 over the leading
/// digits) below 64, or the longest run of letters and `_` at the start,
/// a libcap name in any case (`cap_chown`; `cap_chown,cap_kill` reads as
/// `cap_chown`). Bits the kernel does not know are dropped by `capset`.
fn cap_mask(name: &str) -> Option<u64> {
    if name.eq_ignore_ascii_case("all") {
        return Some(u64::MAX);
    }
    let n = if name.starts_with(|c: char| c.is_ascii_digit()) {
        let (digits, radix) = match name.strip_prefix("0x").or_else(|| name.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if name.len() > 1 && name.starts_with('0') => (&name[1..], 8),
            None => (name, 10),
        };
        let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
        // `strtoul` reads "0x" alone as 0, and clamps what overflows.
        u64::from_str_radix(&digits[..end], radix).unwrap_or(if end == 0 { 0 } else { u64::MAX })
    } else {
        let end = name.find(|c: char| !(c.is_ascii_alphabetic() || c == '_')).unwrap_or(name.len());
        let lower = name[..end].to_ascii_lowercase();
        CAPS.iter().position(|c| lower.strip_prefix("cap_") == Some(*c))? as u64
    };
    (n < 64).then(|| 1u64 << n)
}

fn strerror(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => sandbox::error::strerror(raw),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct FakeIo {
        files: BTreeMap<i32, Vec<u8>>,
        warnings: Vec<String>,
        /// SELinux enabled, with these labels valid.
        selinux: Option<Vec<String>>,
        /// `--file-label`s applied, in order.
        file_labels: Vec<String>,
    }

    impl Io for FakeIo {
        fn read_fd(&mut self, fd: i32) -> std::io::Result<Vec<u8>> {
            self.files.remove(&fd).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))
        }
        fn warn(&mut self, message: &str, _: bool) {
            self.warnings.push(message.to_string());
        }
        fn selinux(&self) -> bool {
            self.selinux.is_some()
        }
        fn check_label(&mut self, label: &str) -> std::io::Result<()> {
            match &self.selinux {
                Some(valid) if valid.iter().any(|v| v == label) => Ok(()),
                _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        fn file_label(&mut self, label: &str) -> std::io::Result<()> {
            self.file_labels.push(label.to_string());
            Ok(())
        }
    }

    fn run(args: &[&str]) -> Result<Outcome, Error> {
        parse_with(args, &mut FakeIo::default())
    }

    fn parse_with(args: &[&str], io: &mut FakeIo) -> Result<Outcome, Error> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&args, vec![("PATH".into(), "/bin".into())], io)
    }

    fn parsed(args: &[&str]) -> Parsed {
        match run(args) {
            Ok(Outcome::Run(p)) => *p,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn message(args: &[&str]) -> String {
        match run(args) {
            Err(e) => e.message,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn labels_where_selinux_is_enabled() {
        const EXEC: &str = "system_u:system_r:container_t:s0:c1,c2";
        const FILE: &str = "system_u:object_r:container_file_t:s0:c1,c2";
        let with_selinux = || FakeIo { selinux: Some(vec![EXEC.into(), FILE.into()]), ..FakeIo::default() };
        let mut io = with_selinux();
        let args = ["--exec-label", "x", "--exec-label", EXEC, "--file-label", FILE, "true"];
        // The first label is refused before the second replaces it:
        // bubblewrap checks each one as it comes.
        let err = parse_with(&args, &mut io).unwrap_err();
        assert_eq!(err.message, "invalid label x: Invalid argument");
        let mut io = with_selinux();
        let args = ["--exec-label", EXEC, "--exec-label", EXEC, "--file-label", FILE, "true"];
        let Ok(Outcome::Run(p)) = parse_with(&args, &mut io) else { panic!("{args:?}") };
        assert_eq!((p.exec_label.as_deref(), p.file_label.as_deref()), (Some(EXEC), Some(FILE)));
        assert_eq!(io.warnings, ["Only the last --exec-label option will take effect"]);
        assert_eq!(io.file_labels, [FILE], "the file label is applied while parsing, as setfscreatecon");
        assert_eq!(p.host_only(), ["--exec-label", "--file-label"], "labels are the host's business");
    }

    #[test]
    fn codex_command_lines() {
        let p = parsed(&[
            "--new-session",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--bind",
            "/ws",
            "/ws",
            "--ro-bind",
            "/ws/.git",
            "/ws/.git",
            "--perms",
            "555",
            "--tmpfs",
            "/ws/.codex",
            "--remount-ro",
            "/ws/.codex",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--proc",
            "/proc",
            "--",
            "/h/codex-linux-sandbox",
            "--apply-seccomp-then-exec",
            "--",
            "/bin/bash",
            "-lc",
            "echo hi",
        ]);
        assert!(p.new_session && p.die_with_parent);
        assert!(p.unshare.user && p.unshare.pid && p.unshare.net);
        assert_eq!(p.ops[4], Op::Tmpfs { dst: "/ws/.codex".into(), perms: Some(0o555), size: None });
        assert_eq!(p.ops[5], Op::RemountRo { dst: "/ws/.codex".into() });
        assert_eq!(p.command[0], "/h/codex-linux-sandbox");
        assert_eq!(p.command.len(), 6);
        assert!(p.host_only().is_empty());
    }

    #[test]
    fn scanning_stops_at_command_and_after_dashes() {
        let p = parsed(&["--ro-bind", "/", "/", "echo", "--bind", "a", "b"]);
        assert_eq!(p.command, ["echo", "--bind", "a", "b"]);
        let p = parsed(&["--", "--dev-bind", "x"]);
        assert_eq!(p.command, ["--dev-bind", "x"]);
        let p = parsed(&["--setenv", "X", "--bind", "true"]);
        assert_eq!(p.env.last().unwrap(), &("X".to_string(), "--bind".to_string()));
        assert_eq!(run(&["--ro-bind", "/", "/"]), Ok(Outcome::Usage));
        assert_eq!(run(&[]), Ok(Outcome::Usage));
        assert_eq!(run(&["--ro-bind", "/", "/", "--help", "true"]), Ok(Outcome::Help));
        assert_eq!(run(&["--version"]), Ok(Outcome::Version));
    }

    #[test]
    fn bubblewraps_parse_errors() {
        assert_eq!(message(&["--foo", "true"]), "Unknown option --foo");
        assert_eq!(message(&["-", "true"]), "Unknown option -");
        assert_eq!(message(&["--bind", "/usr"]), "--bind takes two arguments");
        assert_eq!(message(&["--proc"]), "--proc takes an argument");
        assert_eq!(message(&["--overlay", "a", "b"]), "--overlay takes three arguments");
        assert_eq!(message(&["--argv0"]), "--argv0 takes one argument");
        assert_eq!(message(&["--file", "abc", "/x", "true"]), "Invalid fd: abc");
        assert_eq!(message(&["--file", "-1", "/x", "true"]), "Invalid fd: -1");
        assert_eq!(message(&["--args", "99", "true"]), "Can't read --args data: Bad file descriptor");
        assert_eq!(message(&["--uid", "-5", "true"]), "Invalid uid: -5");
        assert_eq!(message(&["--argv0", "a", "--argv0", "b", "true"]), "--argv0 used multiple times");
        assert_eq!(
            message(&["--perms", "0644", "--bind", "/", "/", "true"]),
            "--perms must be followed by an option that creates a file"
        );
        assert_eq!(
            message(&["--perms", "0644", "--perms", "0600", "--dir", "/x", "true"]),
            "--perms given twice for the same action"
        );
        assert_eq!(
            message(&["--perms", "9", "--dir", "/x", "true"]),
            "--perms takes an octal argument <= 07777"
        );
        for bad in ["0", "abc", "", "-1", "18446744073709551616", "123bogus"] {
            assert_eq!(
                message(&["--size", bad, "--tmpfs", "/x", "true"]),
                "--size takes a non-zero number of bytes",
                "{bad:?}"
            );
        }
        assert_eq!(
            message(&["--size", "9223372036854775808", "--tmpfs", "/tmp", "true"]),
            "--size (for tmpfs) is limited to 9223372036854775807"
        );
        assert_eq!(message(&["--size", "1000", "--dir", "/x", "true"]), "--size must be followed by --tmpfs");
        assert_eq!(message(&["--chmod", "999", "/x", "true"]), "--chmod takes an octal argument <= 07777");
        assert_eq!(message(&["--cap-add", "CAP_FOO", "true"]), "unknown cap: CAP_FOO");
        assert_eq!(message(&["--overlay-src", "/usr", "true"]), OVERLAY_SRC_MISUSE);
        assert_eq!(
            message(&["--overlay", "/a", "/b", "/c", "true"]),
            "--overlay requires at least one --overlay-src"
        );
        assert_eq!(
            message(&["--overlay-src", "/usr", "--ro-overlay", "/usr", "true"]),
            "--ro-overlay requires at least two --overlay-src"
        );
        assert_eq!(message(&["--exec-label", "foo", "true"]), "labeling not supported on this system");
        assert_eq!(message(&["--file-label", "foo", "true"]), "labeling not supported on this system");
        assert_eq!(message(&["--exec-label"]), "--exec-label takes an argument");
        // Found by fuzzing (bwrap_args): a CR in an unknown option split the line.
        assert_eq!(message(&["-\runshare-user", "true"]), "Unknown option -\\runshare-user");
        assert_eq!(message(&["--hostname", "foo", "true"]), "Specifying --hostname requires --unshare-uts");
        assert_eq!(message(&["--as-pid-1", "true"]), "Specifying --as-pid-1 requires --unshare-pid");
        assert_eq!(message(&["--disable-userns", "true"]), "--disable-userns requires --unshare-user");
        let many: Vec<String> = (0..8997).map(|n| n.to_string()).collect();
        let mut args = vec!["--ro-bind", "/", "/", "true"];
        args.extend(many.iter().map(String::as_str));
        assert_eq!(message(&args), "Exceeded maximum number of arguments 9000");
        args.pop();
        assert!(matches!(run(&args), Ok(Outcome::Run(_))));
    }

    #[test]
    fn pending_modifiers_before_the_command_are_ignored() {
        let p = parsed(&["--perms", "0700", "true"]);
        assert!(p.ops.is_empty());
        let p = parsed(&["--size", "1048576", "--perms", "01777", "--tmpfs", "/x", "true"]);
        assert_eq!(p.ops, [Op::Tmpfs { dst: "/x".into(), perms: Some(0o1777), size: Some(1 << 20) }]);
        let p = parsed(&["--size", "0x100000", "--tmpfs", "/x", "true"]);
        assert_eq!(p.ops, [Op::Tmpfs { dst: "/x".into(), perms: None, size: Some(1 << 20) }]);
    }

    #[test]
    fn args_fd_splices_options_but_never_the_command() {
        let mut io = FakeIo::default();
        io.files.insert(3, b"--ro-bind\0/\0/\0echo\0fromfile\0".to_vec());
        io.files.insert(4, b"--setenv\0A\0\0".to_vec());
        let args = ["--args", "3", "--args", "4", "echo", "outer"];
        let Ok(Outcome::Run(p)) = parse_with(&args, &mut io) else { panic!() };
        assert_eq!(p.ops.len(), 1);
        assert_eq!(p.command, ["echo", "outer"]);
        assert!(p.env.contains(&("A".to_string(), String::new())));
        let mut io = FakeIo::default();
        io.files.insert(3, b"--args\x005\0".to_vec());
        assert_eq!(
            parse_with(&["--args", "3", "true"], &mut io).unwrap_err().message,
            "--args not supported in arguments file"
        );
        let mut io = FakeIo::default();
        io.files.insert(3, b"--perms\x000700".to_vec());
        assert_eq!(
            parse_with(&["--args", "3", "true"], &mut io).unwrap_err().message,
            "--perms must be followed by an option that creates a file"
        );
    }

    #[test]
    fn env_options_apply_in_order_and_repeats_warn() {
        let mut io = FakeIo::default();
        let args = [
            "--clearenv",
            "--setenv",
            "A",
            "1",
            "--unsetenv",
            "A",
            "--setenv",
            "B",
            "2",
            "--chdir",
            "/a",
            "--chdir",
            "/b",
            "true",
        ];
        let Ok(Outcome::Run(p)) = parse_with(&args, &mut io) else { panic!() };
        assert_eq!(p.env, [("B".to_string(), "2".to_string())]);
        assert_eq!(p.chdir.as_deref(), Some("/b"));
        assert_eq!(io.warnings, ["Only the last --chdir option will take effect"]);
    }

    #[test]
    fn capabilities_in_order() {
        let p = parsed(&["--cap-drop", "ALL", "--cap-add", "cap_net_admin", "true"]);
        assert_eq!(p.caps(0), Some(1 << 12));
        let p = parsed(&["--cap-add", "CAP_SYS_ADMIN", "--cap-drop", "cap_sys_admin", "true"]);
        assert_eq!(p.caps(0), Some(0));
        assert_eq!(parsed(&["true"]).caps(0), None);
        // Root starts from its own set.
        let p = parsed(&["--cap-drop", "CAP_KILL", "true"]);
        assert_eq!(p.caps(u64::MAX), Some(!(1 << 5)));
    }

    #[test]
    fn capability_names_as_libcap_reads_them() {
        let cap = |name: &str| match run(&["--cap-drop", "ALL", "--cap-add", name, "true"]) {
            Ok(Outcome::Run(p)) => Ok(p.caps(0).unwrap()),
            Err(e) => Err(e.message),
            other => panic!("{other:?}"),
        };
        assert_eq!(cap("ALL"), Ok(u64::MAX));
        assert_eq!(cap("all"), Ok(u64::MAX));
        assert_eq!(cap("Cap_Chown"), Ok(1));
        // The longest run of letters and `_`: the rest is not looked at.
        assert_eq!(cap("cap_chown,cap_kill"), Ok(1));
        assert_eq!(cap("CAP_CHOWN+ep"), Ok(1));
        // A number, `strtoul` base 0, below 64 (the kernel drops unknown bits).
        assert_eq!(cap("5"), Ok(1 << 5));
        assert_eq!(cap("0x5"), Ok(1 << 5));
        assert_eq!(cap("012"), Ok(1 << 10));
        assert_eq!(cap("63"), Ok(1 << 63));
        for bad in ["SYS_ADMIN", "cap_foo", "64", " cap_chown", ""] {
            assert_eq!(cap(bad), Err(format!("unknown cap: {bad}")), "{bad:?}");
        }
    }

    #[test]
    fn numbers_as_strtol_into_an_int() {
        let fd = |text: &str| match run(&["--sync-fd", text, "true"]) {
            Ok(Outcome::Run(p)) => Ok(p.fds["--sync-fd"]),
            Err(e) => Err(e.message),
            other => panic!("{other:?}"),
        };
        assert_eq!(fd(" 3"), Ok(3));
        assert_eq!(fd("+3"), Ok(3));
        assert_eq!(fd("-0"), Ok(0));
        // `long` to `int` keeps the low 32 bits.
        assert_eq!(fd("4294967299"), Ok(3));
        for bad in ["", "3x", "-1", "2147483648", "99999999999999999999", " "] {
            assert_eq!(fd(bad), Err(format!("Invalid fd: {bad}")), "{bad:?}");
        }
        let uid = |text: &str| match run(&["--unshare-user", "--uid", text, "true"]) {
            Ok(Outcome::Run(p)) => Ok(p.uid.unwrap()),
            Err(e) => Err(e.message),
            other => panic!("{other:?}"),
        };
        assert_eq!(uid("4294967296"), Ok(0));
        assert_eq!(uid("4294967295"), Err("Invalid uid: 4294967295".into()));
    }

    #[test]
    fn modifiers_are_checked_after_the_next_option() {
        // The next option's own error, `--help`, and `--level-prefix` come first.
        assert_eq!(
            message(&["--perms", "0700", "--exec-label", "x", "true"]),
            "labeling not supported on this system"
        );
        assert_eq!(run(&["--perms", "0700", "--help"]), Ok(Outcome::Help));
        let err = run(&["--size", "4096", "--level-prefix", "true"]).unwrap_err();
        assert_eq!((err.message.as_str(), err.prefixed), ("--size must be followed by --tmpfs", true));
        // `--overlay-src` without its argument leaves the queue unused.
        assert_eq!(message(&["--ro-bind", "/", "/", "--overlay-src"]), OVERLAY_SRC_MISUSE);
        // The C library refuses these names.
        assert_eq!(message(&["--setenv", "", "x", "true"]), "setenv failed");
        assert_eq!(message(&["--setenv", "A=B", "x", "true"]), "setenv failed");
        assert_eq!(message(&["--unsetenv", "", "true"]), "unsetenv failed");
        // A repeated option warns before its value is checked.
        let mut io = FakeIo::default();
        let err = parse_with(&["--sync-fd", "3", "--sync-fd", "x", "true"], &mut io).unwrap_err();
        assert_eq!(err.message, "Invalid fd: x");
        assert_eq!(io.warnings, ["Only the last --sync-fd option will take effect"]);
    }

    #[test]
    fn the_callers_own_namespaces_are_named_once_each() {
        for opt in [&["--userns", "3"][..], &["--pidns", "3"]] {
            let mut args = opt.to_vec();
            args.push("true");
            assert_eq!(parsed(&args).host_only(), [opt[0]]);
        }
        let p = parsed(&["--pidns", "3", "--info-fd", "4", "--userns", "6", "--pidns", "5", "true"]);
        assert_eq!(p.host_only(), ["--pidns", "--userns"]);
        // The status descriptors are served inside a sandbox too.
        let p = parsed(&["--info-fd", "3", "--json-status-fd", "4", "true"]);
        assert!(p.host_only().is_empty());
        let p = parsed(&["--mqueue", "/mq", "--chmod", "0755", "/x", "--as-pid-1", "--unshare-pid", "true"]);
        assert!(p.host_only().is_empty());
    }
}
