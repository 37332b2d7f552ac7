//! A `Command`-shaped builder for the standard sandbox layout.
//!
//! ```no_run
//! use sandbox::{Home, Network, SandboxBuilder, UserView};
//! let spec = SandboxBuilder::new("sh")
//!     .args(["-c", "id; pwd"])
//!     .user(UserView::new("agent", 1000, 1000))
//!     .workspace("/srv/runs/42")
//!     .home(Home::Tmpfs)
//!     .network(Network::Off)
//!     .build()?;
//! let status = sandbox::launch(&spec, &Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The root view, in this order: the host's system directories read-only
//! (top-level symlinks such as `/bin -> usr/bin` reproduced as symlinks), a
//! fresh `/proc` (or the caller's, read-only, where that is refused), a
//! minimal `/dev`, a private `/tmp`, the workspace at `/workspace`, the
//! home (host directory or private tmpfs), generated `/etc/passwd` and
//! `/etc/group`, then the caller's extra mounts.

use std::path::{Path, PathBuf};

use crate::WORKSPACE;
use crate::error::{SpecError, io_error_text};
use crate::guest_path;
use crate::spec::{
    Access, DeferredBind, HostIds, MountOp, Network, ProcMode, SandboxSpec, Security, UserView,
};

/// Host directories shown read-only, besides every top-level `/lib*`.
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/etc", "/opt"];
/// `PATH` inside the sandbox unless the caller sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the sandbox user's home comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Home {
    /// A private tmpfs owned by the user, gone when the sandbox ends.
    Tmpfs,
    /// A host directory bound read-write.
    Bind(PathBuf),
}

#[derive(Clone, Debug)]
pub struct SandboxBuilder {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    user: UserView,
    workspace: Option<PathBuf>,
    home: Home,
    network: Network,
    hostname: String,
    cwd: Option<String>,
    host_ids: Option<HostIds>,
    new_session: bool,
    extra: Vec<MountOp>,
    deferred: Vec<DeferredBind>,
    security: Security,
    proc: ProcMode,
    nested: bool,
    hidden: Vec<PathBuf>,
}

impl SandboxBuilder {
    /// A sandbox that will run `program` as user `agent` (1000:1000) with a
    /// private home, the host's network, and a new session.
    pub fn new(program: impl Into<String>) -> Self {
        SandboxBuilder {
            argv: vec![program.into()],
            env: Vec::new(),
            user: UserView::new("agent", 1000, 1000),
            workspace: None,
            home: Home::Tmpfs,
            network: Network::On,
            hostname: "sandbox".into(),
            cwd: None,
            host_ids: None,
            new_session: true,
            extra: Vec::new(),
            deferred: Vec::new(),
            security: Security::default(),
            proc: ProcMode::Auto,
            nested: true,
            hidden: Vec::new(),
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.argv.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable; later calls for the same name win. The sandbox
    /// starts from `PATH`, `HOME`, `USER`, `LOGNAME` and `SHELL` only.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn user(mut self, user: UserView) -> Self {
        self.user = user;
        self
    }

    /// Host directory bound read-write at `/workspace`; the default working directory.
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    pub fn home(mut self, home: Home) -> Self {
        self.home = home;
        self
    }

    pub fn network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    pub fn hostname(mut self, name: impl Into<String>) -> Self {
        self.hostname = name.into();
        self
    }

    /// Working directory; must be under `/workspace` or the home.
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Host ids the sandbox user maps onto (root callers only).
    pub fn map_to_host(mut self, ids: HostIds) -> Self {
        self.host_ids = Some(ids);
        self
    }

    /// `false` keeps the caller's session (for an interactive shell); the
    /// default detaches the command from the terminal.
    pub fn new_session(mut self, yes: bool) -> Self {
        self.new_session = yes;
        self
    }

    /// Seccomp, Landlock, sockets and limits (default: the `default`
    /// seccomp profile, Landlock best effort, no limits).
    pub fn security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }

    /// How `/proc` is made (default: fresh, else the caller's bound
    /// read-only; see [`ProcMode`]).
    pub fn proc(mut self, mode: ProcMode) -> Self {
        self.proc = mode;
        self
    }

    /// Whether the command may run `bwrap` (nested sandboxes served by the
    /// launcher; default: yes).
    pub fn nested(mut self, yes: bool) -> Self {
        self.nested = yes;
        self
    }

    /// Whether a nested sandbox's command may make its own user, mount and
    /// pid namespaces (default: yes; see [`crate::NestedUserns`]).
    pub fn nested_userns(mut self, mode: crate::NestedUserns) -> Self {
        self.security.nested_userns = mode;
        self
    }

    /// A host path the command must not see by any path: wherever it
    /// would show (under a system directory of the view, or under any
    /// bind's source), an empty read-only tmpfs covers it, after every
    /// other mount. Binds of what lies *below* it stay (a workspace inside
    /// a hidden root is still the workspace). Give it canonical.
    pub fn hide(mut self, host: impl Into<PathBuf>) -> Self {
        self.hidden.push(host.into());
        self
    }

    /// An extra mount, applied after the standard layout in call order.
    pub fn mount(mut self, op: MountOp) -> Self {
        self.extra.push(op);
        self
    }

    /// A bind attached during the apply phase; returns its index for
    /// [`crate::ApplyContext::attach`].
    pub fn deferred_bind(&mut self, bind: DeferredBind) -> usize {
        self.deferred.push(bind);
        self.deferred.len() - 1
    }

    pub fn build(self) -> Result<SandboxSpec, SpecError> {
        self.user.validate()?;
        let home = self.user.home.clone();

        let mut mounts = system_view(self.network)?;
        mounts.push(MountOp::Proc { dst: "/proc".into(), mode: self.proc });
        mounts.push(MountOp::Dev { dst: "/dev".into(), bwrap: false });
        mounts.push(MountOp::Tmpfs { dst: "/tmp".into(), mode: 0o1777, owned_by_user: false, size: None });
        if let Some(ws) = &self.workspace {
            require_dir("workspace", ws)?;
            mounts.push(MountOp::Bind { src: ws.clone(), dst: WORKSPACE.into(), access: Access::Rw });
        }
        match &self.home {
            Home::Tmpfs => {
                mounts.push(MountOp::Tmpfs {
                    dst: home.clone(),
                    mode: 0o755,
                    owned_by_user: true,
                    size: None,
                });
            }
            Home::Bind(dir) => {
                require_dir("home", dir)?;
                mounts.push(MountOp::Bind { src: dir.clone(), dst: home.clone(), access: Access::Rw });
            }
        }
        mounts.push(MountOp::File {
            dst: "/etc/passwd".into(),
            contents: self.user.passwd_bytes(),
            mode: 0o644,
        });
        mounts.push(MountOp::File {
            dst: "/etc/group".into(),
            contents: self.user.group_bytes(),
            mode: 0o644,
        });
        mounts.extend(self.extra);
        let covers = hidden_covers(&mounts, &self.hidden);
        mounts.extend(covers);

        let default_cwd = if self.workspace.is_some() { WORKSPACE.to_string() } else { home.clone() };
        let cwd = match &self.cwd {
            None => default_cwd,
            Some(dir) => working_dir(dir, &home)?,
        };
        let env = environment(&self.user, self.network, self.env);

        Ok(SandboxSpec {
            argv: self.argv,
            env,
            cwd,
            user: self.user,
            host_ids: self.host_ids,
            network: self.network,
            hostname: self.hostname,
            mounts,
            new_session: self.new_session,
            deferred_binds: self.deferred,
            security: self.security,
            nested: self.nested,
        })
    }
}

/// Covers for the `hidden` host paths that the binds among `mounts` would
/// show: an empty read-only tmpfs over each.
fn hidden_covers(mounts: &[MountOp], hidden: &[PathBuf]) -> Vec<MountOp> {
    let binds: Vec<(&Path, &str)> = mounts
        .iter()
        .filter_map(|op| match op {
            MountOp::SystemBind { src, dst }
            | MountOp::Bind { src, dst, .. }
            | MountOp::DevBind { src, dst } => Some((src.as_path(), dst.as_str())),
            _ => None,
        })
        .collect();
    let mut covers = Vec::new();
    for dst in guest_path::covers(hidden, &binds) {
        covers.push(MountOp::Tmpfs { dst: dst.clone(), mode: 0o555, owned_by_user: false, size: None });
        covers.push(MountOp::RemountRo { dst });
    }
    covers
}

/// The working directory `dir` asked for, normalized; it must be under
/// the workspace or the `home`.
fn working_dir(dir: &str, home: &str) -> Result<String, SpecError> {
    let norm = guest_path::normalize(dir)
        .map_err(|why| SpecError::new(format!("working directory {dir:?} {why}")))?;
    if !(guest_path::is_within(&norm, WORKSPACE) || guest_path::is_within(&norm, home)) {
        return Err(SpecError::new(format!(
            "working directory {dir:?} must be under {WORKSPACE} or the home {home}"
        )));
    }
    Ok(norm)
}

/// The command's environment: the user's basics, the egress proxy's
/// variables when the network is proxied, then the caller's `extra` in
/// order (a later value replaces an earlier one in place).
fn environment(user: &UserView, network: Network, extra: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("HOME".to_string(), user.home.clone()),
        ("USER".to_string(), user.name.clone()),
        ("LOGNAME".to_string(), user.name.clone()),
        ("SHELL".to_string(), user.shell.clone()),
    ];
    if network == Network::Proxied {
        env.extend(crate::egress::proxy_env());
    }
    for (k, v) in extra {
        set_var(&mut env, k, v);
    }
    env
}

/// Sets `key` in an ordered environment, replacing an earlier value in place.
pub fn set_var(env: &mut Vec<(String, String)>, key: String, value: String) {
    match env.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => env.push((key, value)),
    }
}

fn require_dir(what: &str, dir: &Path) -> Result<(), SpecError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SpecError::new(format!("{what} {}: not a directory", dir.display()))),
        Err(e) => Err(SpecError::new(format!("{what} {}: {}", dir.display(), io_error_text(&e)))),
    }
}

/// The host directories every sandbox's system view shows read-only: the
/// system directories and every top-level `/lib*` (symlinks included:
/// they are reproduced as symlinks).
pub fn system_dirs() -> Result<Vec<String>, SpecError> {
    let mut dirs: Vec<String> = SYSTEM_DIRS.iter().map(|s| s.to_string()).collect();
    let mut libs: Vec<String> = std::fs::read_dir("/")
        .map_err(|e| SpecError::new(format!("read /: {e}")))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.starts_with("lib"))
        .map(|name| format!("/{name}"))
        .collect();
    libs.sort();
    dirs.extend(libs);
    Ok(dirs)
}

/// The host's system directories as read-only binds, or as symlinks where
/// the host has a top-level symlink (merged-/usr systems).
fn system_view(network: Network) -> Result<Vec<MountOp>, SpecError> {
    let dirs = system_dirs()?;

    let mut ops = Vec::new();
    for dir in &dirs {
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target =
                std::fs::read_link(dir).map_err(|e| SpecError::new(format!("readlink {dir}: {e}")))?;
            let Some(target) = target.to_str() else {
                continue;
            };
            ops.push(MountOp::Symlink { target: target.to_string(), dst: dir.clone() });
        } else if meta.is_dir() {
            ops.push(MountOp::SystemBind { src: dir.into(), dst: dir.clone() });
        }
    }

    // With the host's network, name resolution must work: on systemd-resolved
    // hosts /etc/resolv.conf points into /run, which is not part of the view.
    if network == Network::On
        && let Ok(real) = std::fs::canonicalize("/etc/resolv.conf")
        && let Some(real_str) = real.to_str()
        && !dirs.iter().any(|d| guest_path::is_within(real_str, d))
    {
        ops.push(MountOp::SystemBind { src: real.clone(), dst: real_str.to_string() });
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_layout_order() {
        let spec = SandboxBuilder::new("true").workspace("/").build().unwrap();
        let dsts: Vec<&str> = spec.mounts.iter().map(|m| m.dst()).collect();
        let pos = |d: &str| dsts.iter().position(|x| *x == d).unwrap();
        assert!(pos("/usr") < pos("/proc"));
        assert!(pos("/proc") < pos("/dev"));
        assert!(pos("/tmp") < pos("/workspace"));
        assert!(pos("/workspace") < pos("/home/agent"));
        assert!(pos("/home/agent") < pos("/etc/passwd"));
        assert_eq!(spec.cwd, "/workspace");
    }

    #[test]
    fn env_is_explicit_and_overridable() {
        let spec = SandboxBuilder::new("true").env("PATH", "/bin").env("X", "1").build().unwrap();
        assert_eq!(spec.env[0], ("PATH".into(), "/bin".into()));
        assert!(spec.env.contains(&("HOME".into(), "/home/agent".into())));
        assert!(spec.env.contains(&("X".into(), "1".into())));
        assert_eq!(spec.env.len(), 6);
    }

    #[test]
    fn cwd_must_stay_in_workspace_or_home() {
        let err = SandboxBuilder::new("true").workspace("/").cwd("/etc").build().unwrap_err();
        assert!(err.to_string().contains("must be under /workspace or the home"), "{err}");
        SandboxBuilder::new("true").workspace("/").cwd("/workspace/sub").build().unwrap();
        SandboxBuilder::new("true").cwd("/home/agent/x").build().unwrap();
    }

    #[test]
    fn missing_workspace_is_reported() {
        let err = SandboxBuilder::new("true").workspace("/nonexistent/ws").build().unwrap_err();
        assert!(err.to_string().starts_with("workspace /nonexistent/ws: "), "{err}");
    }

    #[test]
    fn spec_round_trips_through_json() {
        let spec = SandboxBuilder::new("sh").args(["-c", "id"]).build().unwrap();
        assert_eq!(SandboxSpec::from_json(&spec.to_json()).unwrap(), spec);
    }
}
