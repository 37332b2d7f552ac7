//! Paths for the daemon's control actions: a host path (a string the
//! backend sent) resolved inside the workspace root, symlinks included,
//! checked at every existing component, and the missing directories made.
//! The result is a path, for the docker CLI and for instance configs; the
//! file operations themselves go through descriptors ([`super::root`]).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a host path was refused or could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum UnderRootError {
    #[error("{} must be under sandbox.workspaceHostRoot ({})", .path.display(), .root.display())]
    Outside { path: PathBuf, root: PathBuf },
    #[error("{} is not an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    #[error("{} contains '..'", .0.display())]
    DotDot(PathBuf),
    #[error("{} is the workspace root itself", .0.display())]
    IsRoot(PathBuf),
    /// Longer or deeper than any path the daemon accepts ([`super::bounds`]).
    #[error("{}...: {source}", shorten(.path))]
    Bound { path: PathBuf, source: super::bounds::PathBound },
    #[error("{} resolves to {}, outside the workspace root", .path.display(), .real.display())]
    LeadsOutside { path: PathBuf, real: PathBuf },
    #[error("create {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Create { path: PathBuf, source: std::io::Error },
    #[error("{}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Io { path: PathBuf, source: std::io::Error },
}

/// Resolves `path` inside `root` (canonical), symlinks included, and with
/// `create` makes the missing directories: the last one 0700 (a run's
/// workspace or home is its own), the ones above it 0711 (passable, not
/// listable). Refuses anything that is or leads outside the root, and the
/// root itself.
pub fn resolve_under_root(root: &Path, path: &Path, create: bool) -> Result<PathBuf, UnderRootError> {
    let outside = || UnderRootError::Outside { path: path.to_path_buf(), root: root.to_path_buf() };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UnderRootError::Io { path, source }
    };
    if !path.is_absolute() {
        return Err(UnderRootError::NotAbsolute(path.to_path_buf()));
    }
    use std::os::unix::ffi::OsStrExt;
    super::bounds::check(path.as_os_str().as_bytes())
        .map_err(|source| UnderRootError::Bound { path: path.to_path_buf(), source })?;
    // Lexical first: no `..`, and under the root as written.
    let mut lexical = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => lexical.push("/"),
            Component::Normal(n) => lexical.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(UnderRootError::DotDot(path.to_path_buf()));
            }
        }
    }
    let rel = lexical.strip_prefix(root).map_err(|_| outside())?.to_path_buf();
    if rel.as_os_str().is_empty() {
        return Err(UnderRootError::IsRoot(path.to_path_buf()));
    }
    // Then walk down from the root, resolving each existing component
    // (symlinks included) and checking it stays inside.
    let mut cur = root.to_path_buf();
    let last = rel.components().count();
    for (i, c) in rel.components().enumerate() {
        let next = cur.join(c);
        let mode = if i + 1 == last { 0o700 } else { 0o711 };
        match std::fs::symlink_metadata(&next) {
            Ok(_) => {
                let real = std::fs::canonicalize(&next).map_err(io(&next))?;
                if !real.starts_with(root) || real == root {
                    return Err(UnderRootError::LeadsOutside { path: next, real });
                }
                cur = real;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                match std::fs::DirBuilder::new().mode(mode).create(&next) {
                    // The mode exactly, whatever the umask.
                    Ok(()) => std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode))
                        .map_err(|source| UnderRootError::Create { path: next.clone(), source })?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => return Err(UnderRootError::Create { path: next, source }),
                }
                cur = std::fs::canonicalize(&next).map_err(io(&next))?;
                if !cur.starts_with(root) {
                    return Err(outside());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                cur = next;
            }
            Err(source) => return Err(UnderRootError::Io { path: next, source }),
        }
    }
    Ok(cur)
}

/// The first 64 bytes of an over-long path, for its error.
fn shorten(path: &Path) -> String {
    let text = path.display().to_string();
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_root() {
        let base = std::env::temp_dir().join(format!("tuixiu-runs-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("root")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        let root = std::fs::canonicalize(base.join("root")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), root.join("link")).unwrap();
        let ok = resolve_under_root(&root, &root.join("run-a/sub"), true).unwrap();
        assert!(ok.is_dir() && ok.starts_with(&root));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode(&root.join("run-a")), mode(&ok)), (0o711, 0o700));
        for bad in [
            root.join("link"),
            root.join("link/x"),
            root.join("../outside"),
            PathBuf::from("/etc"),
            root.clone(),
        ] {
            assert!(resolve_under_root(&root, &bad, true).is_err(), "{} accepted", bad.display());
        }
        assert!(!base.join("outside/x").exists(), "created through the symlink");
        let deep = root.join("d/".repeat(crate::hostfs::bounds::MAX_PATH_DEPTH));
        let e = resolve_under_root(&root, &deep, true).unwrap_err();
        assert!(e.to_string().contains("components, more than the 256"), "{e}");
        assert!(!root.join("d").exists(), "nothing made");
        let _ = std::fs::remove_dir_all(&base);
    }
}
