//! Paths inside the sandbox: absolute, `/`-separated, without `.` or `..`.

/// Returns the normalized form of an absolute guest path (duplicate and
/// trailing slashes removed), or why it is not acceptable.
pub fn normalize(path: &str) -> Result<String, &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if !path.starts_with('/') {
        return Err("must be absolute");
    }
    if path.contains('\0') {
        return Err("must not contain NUL");
    }
    let mut out = String::with_capacity(path.len());
    for component in path.split('/').filter(|c| !c.is_empty()) {
        match component {
            "." => return Err("must not contain '.' components"),
            ".." => return Err("must not contain '..'"),
            _ => {
                out.push('/');
                out.push_str(component);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// True when normalized `path` is `base` or lies below it.
pub fn is_within(path: &str, base: &str) -> bool {
    if base == "/" {
        return true;
    }
    path == base || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

/// Where host path `host` shows through a bind of host `src` at guest
/// `dst`: `dst` plus what `host` adds below `src`; `None` when `host` is
/// neither `src` nor below it. Paths compare by components, as given
/// (canonical paths compare right).
pub fn shown_at(host: &std::path::Path, src: &std::path::Path, dst: &str) -> Option<String> {
    let rest = host.strip_prefix(src).ok()?;
    let mut out = dst.trim_end_matches('/').to_string();
    for c in rest.components() {
        out.push('/');
        out.push_str(c.as_os_str().to_str()?);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// The guest paths where one of the host paths `hidden` would show
/// through one of `binds` (host source, guest destination; sources
/// compared canonical), each once, none inside another.
pub fn covers(hidden: &[std::path::PathBuf], binds: &[(&std::path::Path, &str)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (src, dst) in binds {
        let src = std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf());
        out.extend(hidden.iter().filter_map(|host| shown_at(host, &src, dst)));
    }
    out.sort();
    out.dedup();
    let mut kept: Vec<String> = Vec::new();
    for at in out {
        if !kept.iter().any(|k| is_within(&at, k)) {
            kept.push(at);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_slashes() {
        assert_eq!(normalize("/a//b/").unwrap(), "/a/b");
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("//").unwrap(), "/");
    }

    #[test]
    fn rejects_relative_dots_and_nul() {
        assert!(normalize("a/b").is_err());
        assert!(normalize("").is_err());
        assert!(normalize("/a/../b").is_err());
        assert!(normalize("/a/./b").is_err());
        assert!(normalize("/a\0b").is_err());
    }

    #[test]
    fn within_is_component_wise() {
        assert!(is_within("/workspace", "/workspace"));
        assert!(is_within("/workspace/x", "/workspace"));
        assert!(!is_within("/workspace2", "/workspace"));
        assert!(is_within("/anything", "/"));
    }

    #[test]
    fn where_a_host_path_shows() {
        use std::path::Path;
        let at = |h: &str, s: &str, d: &str| shown_at(Path::new(h), Path::new(s), d);
        assert_eq!(at("/opt/ws", "/opt", "/opt").as_deref(), Some("/opt/ws"));
        assert_eq!(at("/srv/a/ws", "/srv/a", "/mnt/x/").as_deref(), Some("/mnt/x/ws"));
        assert_eq!(at("/srv/ws", "/srv/ws", "/data").as_deref(), Some("/data"));
        assert_eq!(at("/srv/ws", "/", "/").as_deref(), Some("/srv/ws"));
        assert_eq!(at("/srv/ws", "/srv/ws/run-1", "/workspace"), None);
        assert_eq!(at("/srv/wsx", "/srv/ws", "/x"), None);
        assert_eq!(at("/optx/ws", "/opt", "/opt"), None);
    }
}
