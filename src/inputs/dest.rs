//! Where items land: the seam between the applier and a provider.
//!
//! * [`SandboxDest`]: the native sandbox during its apply phase. Roots are
//!   opened under [`sandbox::ApplyContext::root`], binds are the spec's
//!   deferred binds, attached at their turn.
//! * [`HostDirs`]: plain host directories that back the roots (the docker
//!   and host providers: `/workspace` and the home are volumes there).
//!   Writes land in the directories directly; binds are the provider's
//!   business (volumes declared when the container is created).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, fstat};

use super::plan::Layout;
use crate::hostfs::root::{self as fsx, FsError, fs_err};
use crate::manifest::Root;

/// What happened to a bind item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindOutcome {
    /// Mounted now.
    Attached,
    /// Left to the provider (e.g. a docker volume), with a note for the log.
    #[allow(dead_code)] // made by `HostDirs`, for providers
    Delegated(String),
}

pub use super::error::BindError;

/// A place that items can land in.
pub trait Destination {
    /// An `O_PATH` directory descriptor for a logical root. Called once per
    /// item, so a bind over a whole root is seen by the items after it.
    fn open_root(&mut self, root: Root) -> Result<OwnedFd, FsError>;

    /// The guest-side layout (for messages and the audit trail).
    fn layout(&self) -> &Layout;

    /// Mounts bind item `item` (its position in the plan) at `rel` under
    /// `root_fd`, whose target exists already.
    fn bind(
        &mut self,
        item: usize,
        root: Root,
        root_fd: BorrowedFd<'_>,
        rel: &str,
    ) -> Result<BindOutcome, BindError>;
}

/// The native sandbox during its apply phase.
pub struct SandboxDest<'c, 'p> {
    ctx: &'c mut sandbox::ApplyContext<'p>,
    layout: Layout,
    /// Plan position of a bind item → index of its deferred bind.
    binds: HashMap<usize, usize>,
}

impl<'c, 'p> SandboxDest<'c, 'p> {
    pub fn new(ctx: &'c mut sandbox::ApplyContext<'p>, layout: Layout, binds: HashMap<usize, usize>) -> Self {
        SandboxDest { ctx, layout, binds }
    }
}

fn guest_rel(path: &str) -> &str {
    path.trim_start_matches('/')
}

impl Destination for SandboxDest<'_, '_> {
    fn open_root(&mut self, root: Root) -> Result<OwnedFd, FsError> {
        let rel = guest_rel(self.layout.root(root)).to_string();
        fsx::open_in_root(self.ctx.root(), &rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| FsError { path: format!("/{rel}"), ..e })
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn bind(
        &mut self,
        item: usize,
        root: Root,
        root_fd: BorrowedFd<'_>,
        rel: &str,
    ) -> Result<BindOutcome, BindError> {
        let Some(&index) = self.binds.get(&item) else {
            return Err(BindError::NotPrepared);
        };
        // The sandbox attaches at the guest path resolved from its own `/`;
        // make sure that is the same place as `rel` resolved inside the
        // logical root, i.e. no symlink leads the bind out of the root.
        let guest = self.layout.guest(root, rel);
        let inside = fsx::open_in_root(root_fd, rel, OFlag::O_PATH)?;
        let leads_out =
            || BindError::LeadsOut { guest: guest.clone(), root: self.layout.root(root).to_string() };
        // The target exists inside the root; if the sandbox's own view of
        // the same path does not reach it, a symlink leads elsewhere.
        let seen =
            fsx::open_in_root(self.ctx.root(), guest_rel(&guest), OFlag::O_PATH).map_err(|_| leads_out())?;
        let (a, b) = (
            fstat(inside.as_fd()).map_err(|e| fs_err("fstat", &guest, e))?,
            fstat(seen.as_fd()).map_err(|e| fs_err("fstat", &guest, e))?,
        );
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
            return Err(leads_out());
        }
        self.ctx.attach(index)?;
        Ok(BindOutcome::Attached)
    }
}

/// Host directories backing the roots (docker volumes, a host provider).
#[allow(dead_code)] // for providers
#[derive(Clone, Debug)]
pub struct HostDirs {
    pub layout: Layout,
    pub workspace: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub scratch: Option<PathBuf>,
    /// Binds are mounted by the provider (volumes); the applier only
    /// records them. When `false`, a bind item fails.
    pub binds_are_volumes: bool,
}

impl Destination for HostDirs {
    fn open_root(&mut self, root: Root) -> Result<OwnedFd, FsError> {
        let dir = match root {
            Root::Workspace => &self.workspace,
            Root::UserHome => &self.home,
            Root::Scratch => &self.scratch,
        };
        let Some(dir) = dir else {
            return Err(fs_err("open", root.as_str(), nix::errno::Errno::ENOENT));
        };
        nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| fs_err("open", dir.to_string_lossy().as_bytes(), e))
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn bind(
        &mut self,
        _item: usize,
        _root: Root,
        _root_fd: BorrowedFd<'_>,
        _rel: &str,
    ) -> Result<BindOutcome, BindError> {
        if self.binds_are_volumes {
            Ok(BindOutcome::Delegated("mounted by the provider as a volume".into()))
        } else {
            Err(BindError::Unsupported)
        }
    }
}
