//! The host-side filesystem layer: the input applier, skill jobs and the
//! daemon's control actions resolve paths inside a root, write atomically
//! and create directories through here. The ACP host's `fs/*`
//! (`acp/fs.rs`) still walks on its own (component by component, for the
//! guest mounts and the allowed prefixes it checks on the way): moving it
//! here is left for issue 16.
//!
//! | module | job |
//! |---|---|
//! | [`root`] | writes under a root's descriptor (`openat2(RESOLVE_IN_ROOT\|RESOLVE_NO_MAGICLINKS)`), safe directory creation (`mkdir_p`), staging + `renameat2` replacement, tree removal, staging entries locked by their writer and swept when stale |
//! | [`beneath`] | `openat2(RESOLVE_BENEATH)` opens (optionally no symlink at all), regular files opened only after an `O_PATH` check, atomic writes (`tempfile`, synced), plain-name checks |
//!
//! Resolution is `openat2` alone, no component-walk fallback and no
//! `pathrs`: the tool needs Linux 5.12 (`open_tree`, `mount_setattr`), and
//! `openat2` exists since 5.6, so a fallback would never run; `pathrs`'s
//! fast path is the same `openat2` behind a handle type and a C library.
//! Measured (docs/benchmarks.md, "Path resolution"): a 6-component path
//! resolves in about 3 µs with `openat2`, against about 20 µs walked one
//! `O_PATH|O_NOFOLLOW` component at a time.

pub mod beneath;
pub mod root;
pub mod under_root;
