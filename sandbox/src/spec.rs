//! Plain data describing one sandboxed process.
//!
//! A [`SandboxSpec`] says *what* the sandbox looks like; it holds no file
//! descriptors and no C strings, so it can be built anywhere (including a
//! multi-threaded daemon), serialized, and handed to a fresh single-threaded
//! launcher process. [`crate::launch`] turns it into a prepared plan and runs
//! it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::landlock::LandlockMode;
pub use crate::limits::Limits;
pub use crate::seccomp::SeccompPolicy;

/// Everything the launcher needs to start one command in a sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The command and its arguments. `argv[0]` is looked up in the
    /// sandbox's `PATH` when it contains no `/`.
    pub argv: Vec<String>,
    /// The complete environment of the command, in order. Nothing else is
    /// inherited from the caller.
    pub env: Vec<(String, String)>,
    /// Working directory of the command, as the sandbox sees it.
    pub cwd: String,
    /// The identity the command runs under.
    pub user: UserView,
    /// Host ids the sandbox user maps onto. `None` maps onto the launcher's
    /// own effective ids, which is the only choice for unprivileged callers.
    pub host_ids: Option<HostIds>,
    /// Whether the sandbox shares the host's network or gets its own.
    pub network: Network,
    /// Hostname inside the sandbox's UTS namespace.
    pub hostname: String,
    /// The root filesystem, built in this order on an empty tmpfs.
    pub mounts: Vec<MountOp>,
    /// Run the command in a new session (`setsid`), detached from the
    /// caller's terminal. This closes the TIOCSTI terminal-injection hole.
    pub new_session: bool,
    /// Binds prepared during setup but attached only when the launcher's
    /// apply phase asks for them, by index (see [`crate::launch_with`]), so
    /// they can be interleaved with writes in a caller-defined order.
    #[serde(default)]
    pub deferred_binds: Vec<DeferredBind>,
    /// Seccomp, Landlock, network sockets and resource limits. Missing in
    /// a serialized spec means the secure defaults.
    #[serde(default)]
    pub security: Security,
    /// Serve `bwrap` inside the sandbox: nested sandboxes built by the
    /// launcher, outside the confinement (see [`crate::nested`]). Missing in
    /// a serialized spec means on.
    #[serde(default = "yes")]
    pub nested: bool,
}

fn yes() -> bool {
    true
}

impl SandboxSpec {
    /// The socket families its command may create, beyond what the
    /// seccomp profile says (`no_ip`: `--network none`).
    pub(crate) fn sockets(&self) -> crate::seccomp::Sockets {
        use crate::seccomp::Sockets;
        match (self.network, self.security.no_ip) {
            (_, true) => Sockets::UnixOnly,
            (Network::Off | Network::Proxied, false) => Sockets::LocalAndInet,
            (Network::On, false) => Sockets::Profile,
        }
    }
}

/// How the command is confined beyond namespaces. Capabilities are always
/// dropped and `no_new_privs` always set; these are the choices.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Security {
    /// The seccomp filter (default: the built-in `default` profile).
    pub seccomp: SeccompPolicy,
    /// Let `ptrace` and `process_vm_*` through the profile (debuggers,
    /// strace, sanitizers). Within the sandbox's pid namespace only.
    pub allow_ptrace: bool,
    /// Landlock (default: best effort).
    pub landlock: LandlockMode,
    /// No IP at all (`--network none`): AF_INET/AF_INET6 sockets are
    /// denied by seccomp and, with Landlock ABI 4 or newer, TCP bind and
    /// connect too. Requires [`Network::Off`].
    pub no_ip: bool,
    /// Resource limits.
    pub limits: Limits,
    /// Whether a nested sandbox's command may make its own user, mount
    /// and pid namespaces, as under bubblewrap (docs/security.md).
    pub nested_userns: NestedUserns,
}

/// `--nested-userns`: what a nested sandbox's command may build itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NestedUserns {
    /// Its own user, mount and pid namespaces and the mounts they allow
    /// (bubblewrap's semantics): the seccomp relaxation and Landlock
    /// without filesystem rules of docs/security.md.
    #[default]
    On,
    /// Nothing: the sandbox's own profile and Landlock rules, unchanged.
    Off,
}

/// A bind whose source is cloned during setup and attached on request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeferredBind {
    pub src: PathBuf,
    pub dst: String,
    pub access: Access,
}

/// The user as seen from inside: `id -un`, `getpwuid()`, `$HOME`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Guest path of the home directory.
    pub home: String,
    /// Login shell recorded in `/etc/passwd` and `$SHELL`.
    pub shell: String,
}

/// Host uid/gid that the sandbox user's ids are mapped onto.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
}

/// Network policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Share the host's network namespace.
    #[default]
    On,
    /// A private network namespace with only loopback, which is brought up.
    Off,
    /// [`Network::Off`] plus an egress listener on `127.0.0.1:3128`
    /// inside, handed out to the launcher's caller, who serves a proxy
    /// there from outside ([`crate::egress`]); the proxy variables point
    /// at it.
    Proxied,
}

impl Network {
    /// The sandbox gets a network namespace of its own.
    pub fn is_private(self) -> bool {
        self != Network::On
    }
}

/// How the sandbox gets its `/proc` (procfs.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcMode {
    /// A fresh procfs, or the sandbox does not start (exit 125).
    Fresh,
    /// The caller's `/proc`, bound recursively and read-only.
    Bind,
    /// Fresh where the kernel allows it, else the bind (with a warning).
    #[default]
    Auto,
    /// The caller's `/proc`, bound recursively and read-write with the
    /// entries a fresh one gets covered read-only: bubblewrap's `--proc`
    /// without a new pid namespace (a bwrap run on the host; not a
    /// `--proc` choice of `run`).
    Caller,
}

impl ProcMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcMode::Fresh => "fresh",
            ProcMode::Bind => "bind",
            ProcMode::Auto => "auto",
            ProcMode::Caller => "caller",
        }
    }

    pub fn is_auto(&self) -> bool {
        *self == ProcMode::Auto
    }
}

impl std::str::FromStr for ProcMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fresh" => Ok(ProcMode::Fresh),
            "bind" => Ok(ProcMode::Bind),
            "auto" => Ok(ProcMode::Auto),
            _ => Err(format!("{s:?}: expected fresh, bind or auto")),
        }
    }
}

/// Read-only or read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Ro,
    Rw,
}

/// One step of building the sandbox's root filesystem.
///
/// Guest paths (`dst`) are absolute paths inside the sandbox. They are
/// resolved inside the new root, so a symlink met on the way is followed
/// *within* the sandbox and can never lead the mount onto a host path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum MountOp {
    /// Recursive bind of a host path. `nosuid` and `nodev` are applied to
    /// the bind and every submount; `ro` adds `MS_RDONLY` to each of them.
    Bind { src: PathBuf, dst: String, access: Access },
    /// A fresh tmpfs. `owner` makes the tmpfs root belong to the sandbox
    /// user (used for a private home).
    Tmpfs {
        dst: String,
        mode: u32,
        #[serde(default)]
        owned_by_user: bool,
        #[serde(default)]
        size: Option<u64>,
    },
    /// A fresh procfs for the sandbox's pid namespace, with `sys`,
    /// `sysrq-trigger`, `irq` and `bus` covered read-only; or, as `mode`
    /// says, the caller's `/proc` bound read-only where the kernel refuses
    /// a fresh one (inside containers; see [`ProcMode`]).
    Proc {
        dst: String,
        #[serde(default, skip_serializing_if = "ProcMode::is_auto")]
        mode: ProcMode,
    },
    /// A minimal `/dev`: null, zero, full, random, urandom, tty, a private
    /// devpts with ptmx, shm, and the fd symlinks. The runtime's is a
    /// read-only, `noexec` tmpfs with `shm` a tmpfs of its own; `bwrap`'s
    /// is bubblewrap's: a writable tmpfs, `shm` a directory in it.
    Dev {
        dst: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bwrap: bool,
    },
    /// A read-only file with the given bytes, created on the sandbox's
    /// private tmpfs and bound over `dst` (never written into a host path).
    File { dst: String, contents: Vec<u8>, mode: u32 },
    /// A symbolic link `dst -> target`.
    Symlink { target: String, dst: String },
    /// An empty directory on the root tmpfs.
    Dir { dst: String, mode: u32 },
    /// A recursive read-write bind that keeps device nodes usable (no
    /// `nodev`; `nosuid` still applies), as bubblewrap's `--dev-bind`.
    DevBind { src: PathBuf, dst: String },
    /// Make the single mount at `dst` read-only (with `nosuid` and `nodev`),
    /// not its submounts, as bubblewrap's `--remount-ro`.
    RemountRo { dst: String },
    /// A read-only bind of a host system directory (the system view). The
    /// command sees it as an unprivileged host user would: what is not
    /// world-readable stays unreadable even when the sandbox user maps onto
    /// host root (an idmapped mount, or masks where that is impossible).
    SystemBind { src: PathBuf, dst: String },
    /// A POSIX message queue filesystem (bubblewrap's `--mqueue`).
    Mqueue { dst: String },
    /// A file with these bytes created at `dst` itself, writable by its
    /// mode (bubblewrap's `--file`).
    CreateFile { dst: String, contents: Vec<u8>, mode: u32 },
    /// A private file with these bytes, bound over `dst` (bubblewrap's
    /// `--bind-data` and `--ro-bind-data`).
    BindData { dst: String, contents: Vec<u8>, mode: u32, access: Access },
    /// Change the mode of what `dst` names (bubblewrap's `--chmod`).
    Chmod { dst: String, mode: u32 },
    /// An overlay filesystem of host directories (bubblewrap's `--overlay`,
    /// `--tmp-overlay`, `--ro-overlay`): `lower` from the top down;
    /// `upper` the writable layer and its work directory, none for a
    /// read-only overlay, or a private tmpfs's (`tmp`).
    Overlay { lower: Vec<PathBuf>, upper: Option<(PathBuf, PathBuf)>, tmp: bool, dst: String },
}

impl MountOp {
    /// The guest path this operation writes to.
    pub fn dst(&self) -> &str {
        match self {
            MountOp::Bind { dst, .. }
            | MountOp::Tmpfs { dst, .. }
            | MountOp::Proc { dst, .. }
            | MountOp::Dev { dst, .. }
            | MountOp::File { dst, .. }
            | MountOp::Symlink { dst, .. }
            | MountOp::Dir { dst, .. }
            | MountOp::DevBind { dst, .. }
            | MountOp::RemountRo { dst }
            | MountOp::SystemBind { dst, .. }
            | MountOp::Mqueue { dst }
            | MountOp::CreateFile { dst, .. }
            | MountOp::BindData { dst, .. }
            | MountOp::Chmod { dst, .. }
            | MountOp::Overlay { dst, .. } => dst,
        }
    }
}

impl SandboxSpec {
    /// Serialize for the re-exec boundary.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_vec(self).expect("SandboxSpec is always serializable")
    }

    /// Deserialize what [`SandboxSpec::to_json`] produced.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}
