//! Landing fetched items, strictly in manifest order; the first failure
//! stops the walk.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::sys::stat::{SFlag, fstat};

use super::audit::{Audit, Record};
use super::dest::{BindOutcome, Destination};
use super::error::{Cause, InputError, LandError};
use super::fsx::{self, FsError};
use super::hostpath::{self, CopyError};
use super::plan::{Planned, Step, describe_source};
use super::zip::{self, ZipError, ZipLimits};
use super::{Fetched, Resource};
use crate::manifest::Root;

/// Options of the apply phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyOptions {
    pub zip: ZipLimits,
}

/// What one item produced, for the audit record.
#[derive(Default)]
struct Landed {
    bytes: u64,
    files: Option<u64>,
    note: Option<String>,
}

/// A failure while landing, before the item id is attached: a file
/// operation at the target (its guest path is added), or any other.
enum Fail {
    Fs(FsError),
    Land(LandError),
}

impl From<LandError> for Fail {
    fn from(e: LandError) -> Self {
        Fail::Land(e)
    }
}

impl From<FsError> for Fail {
    fn from(e: FsError) -> Self {
        Fail::Fs(e)
    }
}

/// Lands every item of `fetched` in `dest`, in order.
pub fn apply(
    fetched: &Fetched,
    dest: &mut dyn Destination,
    options: &ApplyOptions,
    audit: &mut Audit,
) -> Result<(), InputError> {
    // Modes of created files and directories must not depend on the
    // caller's umask. The launcher is single-threaded, so this is safe.
    let old_umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let result = fetched
        .plan
        .items()
        .iter()
        .zip(&fetched.resources)
        .enumerate()
        .try_for_each(|(i, (planned, resource))| apply_one(i, planned, resource, dest, options, audit));
    nix::sys::stat::umask(old_umask);
    result
}

fn apply_one(
    index: usize,
    planned: &Planned,
    resource: &Resource,
    dest: &mut dyn Destination,
    options: &ApplyOptions,
    audit: &mut Audit,
) -> Result<(), InputError> {
    let started = Instant::now();
    let item = &planned.item;
    let target = dest.layout().guest(item.target.root, &item.target.path);
    let mut record = Record {
        time_ms: Record::now_ms(),
        id: item.id.clone(),
        apply: item.apply.as_str(),
        access: item.access.as_str(),
        source: describe_source(planned),
        target: target.clone(),
        bytes: 0,
        files: None,
        sha256: None,
        archive_bytes: None,
        cached: None,
        duration_ms: 0.0,
        outcome: "applied",
        note: None,
        error: None,
    };
    if let Resource::Zip(z) = resource {
        record.sha256 = Some(z.sha256.clone());
        record.archive_bytes = Some(z.bytes);
        record.cached = Some(z.cached);
    }
    let outcome = land(index, planned, resource, dest, options);
    record.duration_ms = Record::millis(started.elapsed());
    match outcome {
        Ok(landed) => {
            record.bytes = landed.bytes;
            record.files = landed.files;
            record.note = landed.note;
            audit.record(&record);
            Ok(())
        }
        Err(fail) => {
            let failure = match fail {
                Fail::Fs(source) => LandError::Target { target: target.clone(), source },
                Fail::Land(e) => e,
            };
            let error = InputError::new(
                failure.code(),
                &item.id,
                Cause::Apply { apply: item.apply.as_str(), failure },
            );
            record.outcome = "failed";
            record.error = Some(error.to_string());
            audit.record(&record);
            Err(error)
        }
    }
}

fn land(
    index: usize,
    planned: &Planned,
    resource: &Resource,
    dest: &mut dyn Destination,
    options: &ApplyOptions,
) -> Result<Landed, Fail> {
    let item = &planned.item;
    let rel = item.target.path.as_str();
    let root = dest.open_root(item.target.root)?;
    match (&planned.step, resource) {
        (Step::Workspace { .. }, _) => {
            Ok(Landed { note: Some("the workspace, bound at setup".into()), ..Landed::default() })
        }
        (Step::Bind { host, .. }, _) => {
            if !rel.is_empty() {
                prepare_mount_point(root.as_fd(), rel, host.is_dir)?;
            }
            match dest.bind(index, item.target.root, root.as_fd(), rel) {
                Ok(BindOutcome::Attached) => Ok(Landed::default()),
                Ok(BindOutcome::Delegated(note)) => Ok(Landed { note: Some(note), ..Landed::default() }),
                Err(e) => Err(LandError::Bind(e).into()),
            }
        }
        (Step::WriteFile { text }, _) => {
            let bytes = fsx::replace_file(root.as_fd(), rel, 0o644, |f| {
                f.write_all(text.as_bytes()).map(|()| text.len() as u64)
            })
            .map_err(|e| target_error(dest, item.target.root, rel, e))?;
            Ok(Landed { bytes, files: Some(1), note: None })
        }
        (Step::Copy { host }, _) => {
            let src = host
                .open()
                .map_err(|source| LandError::OpenSource { path: host.canonical.clone(), source })?;
            if host.is_dir {
                let copied = fsx::replace_tree(
                    root.as_fd(),
                    rel,
                    |stage| {
                        hostpath::copy_tree(src.as_fd(), stage)
                            .map_err(|e| copy_fail(&host.canonical.display().to_string(), e))
                    },
                    |_| Ok(()),
                )?;
                Ok(Landed { bytes: copied.bytes, files: Some(copied.files), note: None })
            } else {
                let mode = fstat(src.as_fd()).map(|st| (st.st_mode & 0o777) | 0o600).unwrap_or(0o644);
                let mut from = File::from(src.try_clone().map_err(LandError::CloneSource)?);
                let bytes = fsx::replace_file(root.as_fd(), rel, mode, |f| std::io::copy(&mut from, f))
                    .map_err(|e| target_error(dest, item.target.root, rel, e))?;
                Ok(Landed { bytes, files: Some(1), note: None })
            }
        }
        (Step::Download { .. }, Resource::Zip(archive)) => {
            let skill = item.target.root == Root::UserHome && rel.starts_with(".codex/skills/");
            let extracted = fsx::replace_tree(
                root.as_fd(),
                rel,
                |stage| zip::extract(&archive.file, stage, &options.zip).map_err(zip_fail),
                |stage| if skill { require_skill_md(stage) } else { Ok(()) },
            )?;
            Ok(Landed { bytes: extracted.bytes, files: Some(extracted.files), note: None })
        }
        (Step::Checkout { .. }, Resource::Tree(dir)) => {
            require_empty_target(root.as_fd(), rel)?;
            let tree = nix::fcntl::open(dir, fsx::dir_read_flags(), nix::sys::stat::Mode::empty())
                .map_err(LandError::OpenCheckout)?;
            let copied = fsx::replace_tree(
                root.as_fd(),
                rel,
                |stage| hostpath::copy_tree(tree.as_fd(), stage).map_err(|e| copy_fail("the checkout", e)),
                |_| Ok(()),
            )?;
            Ok(Landed { bytes: copied.bytes, files: Some(copied.files), note: None })
        }
        _ => Err(LandError::NotFetched.into()),
    }
}

fn target_error(dest: &dyn Destination, root: Root, rel: &str, e: FsError) -> Fail {
    LandError::TargetWrite { guest: dest.layout().guest(root, rel), source: e }.into()
}

fn copy_fail(what: &str, e: CopyError) -> Fail {
    LandError::Copy { what: what.to_string(), source: e }.into()
}

fn zip_fail(e: ZipError) -> Fail {
    match e {
        ZipError::Fs(e) => Fail::Fs(e),
        refused => LandError::Zip(refused).into(),
    }
}

/// A skill package needs `SKILL.md` at its top (as the Node proxy checks).
fn require_skill_md(stage: BorrowedFd<'_>) -> Result<(), Fail> {
    match fsx::kind_at(stage, c"SKILL.md")? {
        Some(SFlag::S_IFREG) => Ok(()),
        _ => Err(LandError::SkillMdMissing.into()),
    }
}

/// Creates the directory or empty file a bind will cover, in-root.
fn prepare_mount_point(root: BorrowedFd<'_>, rel: &str, dir: bool) -> Result<(), Fail> {
    if dir {
        fsx::mkdir_p(root, rel)?;
        return Ok(());
    }
    let (parent, name) = fsx::parent_of(root, rel)?;
    match fsx::kind_at(parent.as_fd(), &name)? {
        Some(_) => Ok(()),
        None => fsx::create_file(parent.as_fd(), &name, 0o644).map(drop).map_err(Fail::Fs),
    }
}

/// git's rule: a checkout goes into a missing or empty directory.
fn require_empty_target(root: BorrowedFd<'_>, rel: &str) -> Result<(), Fail> {
    let fd: OwnedFd = match fsx::open_in_root(root, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(e) if e.errno == nix::errno::Errno::ENOENT => return Ok(()),
        Err(e) if e.errno == nix::errno::Errno::ENOTDIR => {
            return Err(LandError::CheckoutTargetNotDirectory.into());
        }
        Err(e) => return Err(e.into()),
    };
    if fsx::is_empty_dir(fd.as_fd())? { Ok(()) } else { Err(LandError::CheckoutTargetNotEmpty.into()) }
}
