//! How long and how deep a path from outside may be: every path an agent
//! or the backend gives the daemon is checked here before anything is
//! opened, made or walked (docs/acp.md, "Paths").
//!
//! The bounds are Linux's own where it has them: a path of at most
//! `PATH_MAX` bytes with its NUL ([`MAX_PATH_BYTES`]), components of at most
//! `NAME_MAX` ([`MAX_NAME_BYTES`]). Linux has no depth limit but the one
//! `PATH_MAX` implies (2 048 one-letter components); [`MAX_PATH_DEPTH`] is
//! ours, far above any real tree (a deep `node_modules` has some 40), and
//! bounds the directories a walk holds open and creates.

/// Longest path, in bytes (`PATH_MAX` less the NUL).
pub const MAX_PATH_BYTES: usize = libc::PATH_MAX as usize - 1;
/// Longest component, in bytes (`NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Most components in a path, and in what it resolves to.
pub const MAX_PATH_DEPTH: usize = 256;

/// A path over one of the bounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathBound {
    #[error("the path is {len} bytes long, more than the {MAX_PATH_BYTES} the daemon accepts (PATH_MAX)")]
    TooLong { len: usize },
    #[error("the path has {depth} components, more than the {MAX_PATH_DEPTH} the daemon accepts")]
    TooDeep { depth: usize },
    #[error(
        "a component of the path is {len} bytes long, more than the {MAX_NAME_BYTES} the daemon accepts (NAME_MAX)"
    )]
    NameTooLong { len: usize },
    /// Resolving it (symlinks) led deeper than the bound.
    #[error("it resolves to a path deeper than the {MAX_PATH_DEPTH} components the daemon accepts")]
    ResolvesTooDeep,
}

/// Checks `path` against the bounds: its length first (nothing longer is
/// even split), then each component and their number.
pub fn check(path: &[u8]) -> Result<(), PathBound> {
    if path.len() > MAX_PATH_BYTES {
        return Err(PathBound::TooLong { len: path.len() });
    }
    let mut depth = 0;
    for c in path.split(|b| *b == b'/').filter(|c| !c.is_empty() && *c != b".") {
        if c.len() > MAX_NAME_BYTES {
            return Err(PathBound::NameTooLong { len: c.len() });
        }
        depth += 1;
    }
    if depth > MAX_PATH_DEPTH {
        return Err(PathBound::TooDeep { depth });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert_eq!(check(b"/workspace/a/b"), Ok(()));
        let deep = "/a".repeat(MAX_PATH_DEPTH);
        assert_eq!(check(deep.as_bytes()), Ok(()));
        assert_eq!(check(format!("{deep}/a").as_bytes()), Err(PathBound::TooDeep { depth: 257 }));
        // `.` and empty components do not count.
        assert_eq!(check(format!("{deep}/./").as_bytes()), Ok(()));
        let long = format!("/{}", "x".repeat(MAX_PATH_BYTES));
        assert_eq!(check(long.as_bytes()), Err(PathBound::TooLong { len: MAX_PATH_BYTES + 1 }));
        let name = format!("/w/{}", "n".repeat(256));
        assert_eq!(check(name.as_bytes()), Err(PathBound::NameTooLong { len: 256 }));
        assert_eq!(
            PathBound::TooLong { len: 60_000 }.to_string(),
            "the path is 60000 bytes long, more than the 4095 the daemon accepts (PATH_MAX)"
        );
    }
}
