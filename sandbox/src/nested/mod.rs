//! Nested sandboxes: `bwrap` inside a sandbox, built by the launcher
//! outside it (the model of Flatpak's portal, `flatpak-spawn --sandbox`).
//!
//! Agents such as codex-acp sandbox every tool call with bubblewrap. Inside
//! our sandbox they cannot: the default seccomp profile denies namespaces
//! and mounts, Landlock denies mounts, and a mount namespace copied into a
//! new user namespace locks our masked `/proc`, so a fresh procfs is
//! refused. We keep all of that for the agent and serve the request from
//! outside instead:
//!
//! ```text
//! agent ─ bwrap ARGS (our front end, /run/tuixiu/bin/bwrap, first on PATH)
//!    │ parse, then connect /run/tuixiu/nested.sock: the request as JSON,
//!    │ its stdio and open descriptors by SCM_RIGHTS
//!    ▼
//! launcher (monitor, host side): at the first connection, fork ──▶ server
//!    server: own session; into the sandbox's cgroup; setns into the sandbox's
//!      user, mount, ipc, uts (net) namespaces, pid for its children; the
//!      sandbox user's ids; every descriptor but the socket closed; not
//!      dumpable; fork ──▶ acceptor (in the sandbox's pid namespace, for the
//!      sandbox's whole life): accept, fork ──▶ worker per connection
//!    worker: read and check the request ([`request`]), resolve its sources
//!      in the sandbox's view ([`plan`]), start it with the runtime's launch:
//!    clone(NEWNS|NEWPID[|NEWNET|NEWIPC|NEWUTS|NEWCGROUP]) ─▶ nested PID 1
//!      the usual checklist (child.rs): mounts on a fresh tmpfs root, a fresh
//!      /proc (allowed: nothing in this mount namespace is locked, it was
//!      copied within the sandbox's own user namespace), pivot_root, lo;
//!      then, for --unshare-user, a new user namespace; no_new_privs, no
//!      capabilities, the sandbox's seccomp filter and rlimits, Landlock
//!      on the nested view, and COMMAND as PID 2
//!    worker ◀─ COMMAND's status ─ relayed to the front end, which exits with
//!      it; the front end's connection closing kills the nested sandbox
//! ```
//!
//! The trust argument is in docs/security.md.

mod host;
mod plan;
mod pool;
pub mod request;
mod server;
mod tally;
pub mod wire;
mod worker;

pub use crate::launch::BwrapStatus;
pub use crate::portal::{PORTAL_BIN, PORTAL_DIR, SOCKET, SOCKET_NAME};
pub use host::{HostError, run_on_host};
pub use plan::HostOptions;
pub use request::{BindMode, DataKind, HOST_ONLY, Op, OverlayKind, Request, RequestError, Unshare};
pub(crate) use server::Server;
pub use tally::{NestedCounts, Outcome, Tally};
pub(crate) use worker::Context;

/// Most nested sandboxes one sandbox may run at once.
pub const MAX_WORKERS: usize = 16;
