//! The host-side filesystem layer: the input applier, skill jobs, the ACP
//! host's `fs/*` and the daemon's control actions resolve paths inside a
//! root, write atomically and create directories through here.
//!
//! | module | job |
//! |---|---|
//! | [`open`] | the one `openat2`: a path under a directory descriptor, in its root or beneath it, symlinks followed or never, magic links never |
//! | [`root`] | writes under a root's descriptor (`openat2(RESOLVE_IN_ROOT\|RESOLVE_NO_MAGICLINKS)`), safe directory creation (`mkdir_p`), files through [`atomic`], trees through a staging directory + `renameat2`, tree removal, staging directories locked by their writer and swept when stale |
//! | [`guest`] | guest paths of a sandbox seen from the host (the ACP host's `fs/*`): mounts at guest paths, allowed prefixes, `openat2(RESOLVE_IN_ROOT\|RESOLVE_NO_MAGICLINKS\|RESOLVE_NO_SYMLINKS)` for paths without a symlink, symlinks resolved by us otherwise, the canonical guest path; missing directories made and a resolved file replaced atomically |
//! | [`atomic`] | the one atomic file writer, by path or by directory descriptor (an anonymous `O_TMPFILE` file linked over the target, a named `O_EXCL` fallback; a mode, three durability levels): skill records and bundles, the input cache's downloads, inputs landed as files, the ACP host's writes, the daemon's identity and run state |
//! | [`under_root`] | a host path resolved inside the workspace root for the daemon's control actions |
//! | [`bounds`] | the length and depth every path from an agent or the backend must stay within |
//! | [`beneath`] | `openat2(RESOLVE_BENEATH)` opens (optionally no symlink at all), regular files opened only after an `O_PATH` check, plain-name checks |
//!
//! Resolution is `openat2` alone (the guest view walks components only
//! where symlinks must be resolved as the guest sees them), no fallback
//! and no `pathrs`: the tool needs Linux 5.12 (`open_tree`, `mount_setattr`), and
//! `openat2` exists since 5.6, so a fallback would never run; `pathrs`'s
//! fast path is the same `openat2` behind a handle type and a C library.
//! Measured (docs/benchmarks.md, "Path resolution"): a 6-component path
//! resolves in about 3 µs with `openat2`, against about 20 µs walked one
//! `O_PATH|O_NOFOLLOW` component at a time.

pub mod atomic;
pub mod beneath;
pub mod bounds;
pub mod guest;
pub mod open;
pub mod root;
pub mod under_root;

/// The errno behind an I/O error (`EIO` for one that has none), for the
/// `call("path") => ERRNO` errors of this layer.
pub fn errno_of(e: &std::io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}
