//! `sandbox`: run one process in fresh Linux namespaces, without `bwrap`.
//!
//! The crate is the low-level runtime of `tuixiu-sandbox`. It knows nothing
//! about ACP, manifests or backends: it takes a [`SandboxSpec`] (plain,
//! serializable data, usually made by [`SandboxBuilder`]) and runs it with
//! [`launch`]:
//!
//! 1. [`launch`] prepares every C string and buffer (the plan), then
//!    `clone`s a child into new user, mount, pid, ipc and uts namespaces
//!    (and net, when the network is off), writes its id maps, and monitors it.
//! 2. The child (PID 1 inside) runs the setup checklist in `child.rs`:
//!    mounts on a fresh tmpfs, `pivot_root`, hostname, loopback, working
//!    directory, then forks the command and stays as the reaper.
//! 3. The command's exit status comes back as the launcher's result;
//!    a setup failure comes back as one line naming the step, the syscall
//!    and the errno.
//!
//! [`launch`] must run in a single-threaded process. A threaded caller
//! (the daemon) spawns the `tuixiu-sandbox __exec` helper with the spec as
//! JSON instead.

mod apply;
mod builder;
mod bwrap_words;
mod child;
mod confine;
pub mod egress;
pub mod error;
pub mod guest_path;
pub mod idmap;
mod init;
mod join;
pub mod landlock;
mod launch;
pub mod limits;
mod mounts;
pub mod nested;
mod ns_ids;
mod portal;
mod prepare;
mod procfs;
pub mod reach;
mod report;
pub mod seccomp;
mod secrets;
pub mod selinux;
pub mod spec;
mod splice;
mod start;
mod sys;
#[doc(hidden)]
pub mod test_only;
pub mod user;

pub use apply::ApplyContext;
pub use builder::{DEFAULT_PATH, Home, SandboxBuilder, set_var, system_dirs};
pub use error::{
    EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED, LaunchError, SpecError, SyscallError,
};
pub use init::FORWARDED_SIGNALS;
pub use join::join;
pub use launch::{ApplyError, ExitStatus, LaunchOptions};
pub use spec::{
    Access, DeferredBind, HostIds, LandlockMode, Limits, MountOp, NestedUserns, Network, ProcMode,
    SandboxSpec, SeccompPolicy, Security, UserView,
};
pub use start::{launch, launch_with};

/// Guest path of the workspace.
pub const WORKSPACE: &str = "/workspace";
