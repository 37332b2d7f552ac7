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
}
