//! Validation of everything a caller names: instance names, run ids, image
//! references and environment variables.
//!
//! These checks run before any container CLI is called. Together with
//! passing every value in the `--flag=value` form, they make sure that
//! nothing a caller (or the backend) sends can become a CLI flag, a second
//! argument, or a line of an env file.

use std::fmt;

/// The prefix instance names must carry unless configured otherwise. The
/// backend names per-run instances `tuixiu-run-<run_id>`.
pub const DEFAULT_INSTANCE_PREFIX: &str = "tuixiu-run-";
/// The longest accepted instance name (docker's limit is higher; the Node
/// proxy and the backend use 200).
pub const MAX_INSTANCE_NAME: usize = 200;
/// The longest accepted run id.
pub const MAX_RUN_ID: usize = 200;

/// Why a name was refused: `what` is the kind of value ("instance name",
/// "image", ...), `value` the offending value (never a secret).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: {reason}")]
pub struct NameError {
    pub what: &'static str,
    pub value: String,
    pub reason: String,
}

fn refuse(what: &'static str, value: &str, reason: impl fmt::Display) -> NameError {
    // Long or binary garbage is cut so the message stays one readable line.
    let mut shown: String = value.chars().take(80).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    NameError { what, value: shown, reason: reason.to_string() }
}

/// Checks an instance name: `^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`, at most 200
/// characters, starting with `prefix` (empty: no prefix required).
pub fn validate_instance_name(name: &str, prefix: &str) -> Result<(), NameError> {
    const WHAT: &str = "instance name";
    if name.is_empty() {
        return Err(refuse(WHAT, name, "must not be empty"));
    }
    if name.len() > MAX_INSTANCE_NAME {
        return Err(refuse(WHAT, name, format!("longer than {MAX_INSTANCE_NAME} characters")));
    }
    let first = name.as_bytes()[0];
    if !first.is_ascii_alphanumeric() {
        return Err(refuse(WHAT, name, "must start with a letter or a digit"));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(refuse(
            WHAT,
            name,
            format!("{bad:?} is not allowed (only letters, digits, '_', '.' and '-')"),
        ));
    }
    if !name.starts_with(prefix) {
        return Err(refuse(WHAT, name, format!("must start with the configured prefix {prefix:?}")));
    }
    Ok(())
}

/// Checks a configured instance-name prefix: empty, or a valid start of a name.
pub fn validate_prefix(prefix: &str) -> Result<(), NameError> {
    if prefix.is_empty() {
        return Ok(());
    }
    validate_instance_name(prefix, "").map_err(|e| NameError { what: "instance name prefix", ..e })
}

/// Checks a run id: non-empty, at most 200 characters, no `/`, `\`, `:`,
/// whitespace or control characters (it becomes a label value and a path
/// component).
pub fn validate_run_id(run_id: &str) -> Result<(), NameError> {
    const WHAT: &str = "run id";
    if run_id.is_empty() {
        return Err(refuse(WHAT, run_id, "must not be empty"));
    }
    if run_id.len() > MAX_RUN_ID {
        return Err(refuse(WHAT, run_id, format!("longer than {MAX_RUN_ID} characters")));
    }
    if run_id == "." || run_id == ".." {
        return Err(refuse(WHAT, run_id, "must not be \".\" or \"..\""));
    }
    if let Some(bad) =
        run_id.chars().find(|c| matches!(c, '/' | '\\' | ':') || c.is_whitespace() || c.is_control())
    {
        return Err(refuse(WHAT, run_id, format!("{bad:?} is not allowed")));
    }
    Ok(())
}

/// The run id encoded in a backend-style instance name (`tuixiu-run-<id>`),
/// as the Node proxy derives it for inventories.
pub fn run_id_from_name(name: &str) -> Option<&str> {
    name.strip_prefix(DEFAULT_INSTANCE_PREFIX).filter(|id| validate_run_id(id).is_ok())
}

/// Checks an image reference against the grammar of
/// `distribution/reference`: `[host[:port]/]path[:tag][@digest]`, or a bare
/// image id `sha256:<hex>`. Lower-case path components, at most 255
/// characters of name.
pub fn validate_image(image: &str) -> Result<(), NameError> {
    const WHAT: &str = "image";
    let fail = |reason: &str| Err(refuse(WHAT, image, reason));
    if image.is_empty() {
        return fail("must not be empty");
    }
    if image.starts_with('-') {
        return fail("must not start with '-'");
    }
    if image.len() > 512 {
        return fail("longer than 512 characters");
    }
    if let Some(hex) = image.strip_prefix("sha256:") {
        return if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(())
        } else {
            fail("an image id must be sha256: followed by 64 hex digits")
        };
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest
        && let Err(reason) = check_digest(digest)
    {
        return fail(reason);
    }
    // A tag is whatever follows the last ':' that comes after the last '/'
    // (a ':' before it belongs to a registry port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag
        && let Err(reason) = check_tag(tag)
    {
        return fail(reason);
    }
    if name.is_empty() {
        return fail("the repository name is empty");
    }
    if name.len() > 255 {
        return fail("the repository name is longer than 255 characters");
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1
        && is_registry_host(components[0])
        && let Err(reason) = check_registry(components.remove(0))
    {
        return fail(reason);
    }
    for component in components {
        if !is_path_component(component) {
            return fail(
                "each path component must be lower-case letters and digits, separated by '.', '_', '__' or dashes",
            );
        }
    }
    Ok(())
}

/// `ALGORITHM:HEX` after an image's `@`.
fn check_digest(digest: &str) -> Result<(), &'static str> {
    let Some((algo, hex)) = digest.split_once(':') else {
        return Err("the digest must be ALGORITHM:HEX");
    };
    let algo_ok = !algo.is_empty()
        && algo.as_bytes()[0].is_ascii_alphabetic()
        && algo.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'_' | b'-'));
    if !algo_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the digest must be ALGORITHM:HEX with at least 32 hex digits");
    }
    Ok(())
}

/// A tag: at most 128 of `[A-Za-z0-9_.-]`, not starting with `.` or `-`.
fn check_tag(tag: &str) -> Result<(), &'static str> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && (tag.as_bytes()[0].is_ascii_alphanumeric() || tag.as_bytes()[0] == b'_')
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err("the tag must be letters, digits, '_', '.' or '-' (at most 128, not starting with '.' or '-')")
    }
}

/// A registry `host[:port]` (the first component, when it names one).
fn check_registry(host: &str) -> Result<(), &'static str> {
    let (domain, port) = match host.split_once(':') {
        Some((d, p)) => (d, Some(p)),
        None => (host, None),
    };
    let domain_ok = domain.split('.').all(|label| {
        !label.is_empty()
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !domain_ok {
        return Err("the registry host is not a valid host name");
    }
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the registry port must be digits");
    }
    Ok(())
}

/// The first component of a reference names a registry when it has a `.` or
/// a `:`, is `localhost`, or has upper-case letters (docker's rule).
fn is_registry_host(component: &str) -> bool {
    component.contains(['.', ':'])
        || component == "localhost"
        || component.bytes().any(|b| b.is_ascii_uppercase())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: one '.', one or two '_', or any run of '-'.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return false;
        }
    }
    true
}

/// Checks an environment variable for the env file: the key must be a
/// non-empty name without `=`, whitespace, NUL or a leading `#`; the value
/// must have no NUL, newline or carriage return (the env-file format is
/// line-based and would split or trim it). The value is never echoed.
pub fn validate_env(key: &str, value: &str) -> Result<(), NameError> {
    const WHAT: &str = "environment variable";
    if key.is_empty() {
        return Err(refuse(WHAT, key, "the name is empty"));
    }
    if key.starts_with('#') {
        return Err(refuse(WHAT, key, "the name must not start with '#'"));
    }
    if let Some(bad) = key.chars().find(|c| *c == '=' || c.is_whitespace() || c.is_control()) {
        return Err(refuse(WHAT, key, format!("{bad:?} is not allowed in a name")));
    }
    if value.contains(['\0', '\n', '\r']) {
        return Err(refuse(
            WHAT,
            key,
            "the value contains a NUL, newline or carriage return, which an env file cannot carry",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        let ok = |n: &str| validate_instance_name(n, DEFAULT_INSTANCE_PREFIX);
        ok("tuixiu-run-01a200e0-a3f2-7cdc-ab85-30b44c5494a6").unwrap();
        ok("tuixiu-run-x.y_z").unwrap();
        for bad in
            ["--privileged", "-x", "", "tuixiu-run-a b", "tuixiu-run-a/b", "tuixiu-run-é", "tuixiu-run-\n"]
        {
            assert!(ok(bad).is_err(), "{bad:?} accepted");
        }
        let err = ok("--privileged").unwrap_err().to_string();
        assert_eq!(err, "instance name \"--privileged\": must start with a letter or a digit");
        let err = ok("other-name").unwrap_err().to_string();
        assert!(err.contains("prefix \"tuixiu-run-\""), "{err}");
        validate_instance_name("other-name", "").unwrap();
        let long = format!("tuixiu-run-{}", "a".repeat(190));
        assert!(ok(&long).is_err());
        ok(&long[..200]).unwrap();
    }

    #[test]
    fn prefixes() {
        validate_prefix("").unwrap();
        validate_prefix("tuixiu-run-").unwrap();
        assert!(validate_prefix("-x").is_err());
        assert!(validate_prefix("a b").is_err());
    }

    #[test]
    fn run_ids() {
        validate_run_id("01a200e0-a3f2-7cdc-ab85-30b44c5494a6").unwrap();
        for bad in ["", "..", "../x", "a/b", "a\\b", "a:b", "a b", "a\0b"] {
            assert!(validate_run_id(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(run_id_from_name("tuixiu-run-r1"), Some("r1"));
        assert_eq!(run_id_from_name("other-r1"), None);
    }

    #[test]
    fn images() {
        for ok in [
            "busybox",
            "tuixiu-test/busybox:latest",
            "library/ubuntu:24.04",
            "localhost:5000/a/b:v1",
            "registry.example.com/team/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ghcr.io/a/b:1.0-rc_1",
            "a__b/c--d",
            "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "Registry.Example:443/x",
        ] {
            validate_image(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "",
            "--privileged",
            "-v",
            "UPPER",
            "a b",
            "a:",
            "a:-tag",
            "a/../b",
            "a//b",
            "a@sha256:xyz",
            "a_",
            "a___b",
            "host:99999999/x",
            "img\n",
        ] {
            assert!(validate_image(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn env() {
        validate_env("OPENAI_API_KEY", "sk-123 with spaces").unwrap();
        validate_env("X", "").unwrap();
        for (k, v) in
            [("", "v"), ("A=B", "v"), ("#A", "v"), ("A B", "v"), ("A", "x\ny"), ("A", "x\r"), ("A", "\0")]
        {
            assert!(validate_env(k, v).is_err(), "{k:?}={v:?} accepted");
        }
        let err = validate_env("TOKEN", "secret\nvalue").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
    }
}
