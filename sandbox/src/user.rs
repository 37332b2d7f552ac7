//! The user view: validation of the name and home, the bytes of the
//! synthetic `/etc/passwd` and `/etc/group`, and the id map lines.

use crate::error::SpecError;
use crate::guest_path;
use crate::spec::UserView;

/// The overflow ("nobody") ids, present in every generated database so that
/// files owned by unmapped host ids have a name.
pub const NOBODY_ID: u32 = 65534;

/// Guest directories a home may be neither nor lie in: the system view and
/// the kernel's and the sandbox's own mounts. A home mounted there would
/// hide or replace what they hold (`/etc`, the binaries in `/usr/bin`,
/// `/dev/null`), with a directory the home's owner can write.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/dev", "/sys",
    "/run", "/boot",
];

impl UserView {
    /// A user named `name` with the given ids, home `/home/<name>` and `/bin/sh`.
    pub fn new(name: impl Into<String>, uid: u32, gid: u32) -> Self {
        let name = name.into();
        let home = format!("/home/{name}");
        UserView { name, uid, gid, home, shell: "/bin/sh".into() }
    }

    /// Checks that every field can be written into `/etc/passwd` unharmed and
    /// that the home is a clean absolute path outside `/workspace`.
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_user_name(&self.name)?;
        let home = guest_path::normalize(&self.home)
            .map_err(|why| SpecError::new(format!("home path {:?}: {why}", self.home)))?;
        if home != self.home {
            return Err(SpecError::new(format!(
                "home path {:?} is not normalized (use {home:?})",
                self.home
            )));
        }
        if home == "/" {
            return Err(SpecError::new("home path must not be \"/\""));
        }
        if let Some(system) = SYSTEM_DIRS.iter().find(|dir| guest_path::is_within(&home, dir)) {
            return Err(SpecError::new(format!(
                "home path {:?} must not be {system} or inside it: the home is mounted over it \
                 (system directories: {})",
                self.home,
                SYSTEM_DIRS.join(" ")
            )));
        }
        if guest_path::is_within(&home, crate::WORKSPACE) {
            return Err(SpecError::new(format!(
                "home path {:?} must not be {} or inside it",
                self.home,
                crate::WORKSPACE
            )));
        }
        if self.home.contains(':') {
            return Err(SpecError::new(format!("home path {:?} must not contain ':'", self.home)));
        }
        if self.shell.contains([':', '\n']) || !self.shell.starts_with('/') {
            return Err(SpecError::new(format!("shell {:?} must be an absolute path", self.shell)));
        }
        Ok(())
    }

    /// The contents of the sandbox's `/etc/passwd`: root, the user and nobody.
    pub fn passwd_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        if self.uid != 0 {
            out.push_str("root:x:0:0:root:/root:/bin/sh\n");
        }
        out.push_str(&format!(
            "{name}:x:{uid}:{gid}:{name}:{home}:{shell}\n",
            name = self.name,
            uid = self.uid,
            gid = self.gid,
            home = self.home,
            shell = self.shell
        ));
        if self.uid != NOBODY_ID {
            out.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        }
        out.into_bytes()
    }

    /// The contents of the sandbox's `/etc/group`: root, the user's group and nogroup.
    pub fn group_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        if self.gid != 0 {
            out.push_str("root:x:0:\n");
        }
        out.push_str(&format!("{}:x:{}:\n", self.name, self.gid));
        if self.gid != NOBODY_ID {
            out.push_str("nogroup:x:65534:\n");
        }
        out.into_bytes()
    }
}

/// POSIX-portable user names, as `useradd` accepts them by default:
/// `[a-z_][a-z0-9_-]*[$]?`, at most 32 bytes.
pub fn validate_user_name(name: &str) -> Result<(), SpecError> {
    let bad = |why: &str| Err(SpecError::new(format!("user name {name:?} {why}")));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > 32 {
        return bad("is longer than 32 bytes");
    }
    let bytes = name.as_bytes();
    if !(bytes[0].is_ascii_lowercase() || bytes[0] == b'_') {
        return bad("must start with a lowercase letter or '_'");
    }
    let body = bytes.strip_suffix(b"$").unwrap_or(bytes);
    if !body.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-') {
        return bad("may only contain a-z, 0-9, '_' and '-' (and a final '$')");
    }
    Ok(())
}

/// One line of `/proc/PID/uid_map` or `gid_map` mapping a single id.
pub fn id_map_line(inside: u32, outside: u32) -> String {
    format!("{inside} {outside} 1\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_has_root_user_and_nobody() {
        let u = UserView::new("agent", 1000, 1000);
        let passwd = String::from_utf8(u.passwd_bytes()).unwrap();
        assert_eq!(
            passwd,
            "root:x:0:0:root:/root:/bin/sh\n\
             agent:x:1000:1000:agent:/home/agent:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        let group = String::from_utf8(u.group_bytes()).unwrap();
        assert_eq!(group, "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n");
    }

    #[test]
    fn user_with_root_ids_replaces_root_entry() {
        let u = UserView::new("builder", 0, 0);
        let passwd = String::from_utf8(u.passwd_bytes()).unwrap();
        assert!(passwd.starts_with("builder:x:0:0:"));
        assert!(!passwd.contains("root:x:0:0:root"));
    }

    #[test]
    fn names_that_would_corrupt_passwd_are_refused() {
        for bad in ["", "Agent", "a:b", "a\nb", "1abc", "a b", "x".repeat(33).as_str()] {
            assert!(validate_user_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["agent", "_svc", "ci-runner", "machine$", "a1"] {
            validate_user_name(good).unwrap();
        }
    }

    #[test]
    fn home_must_be_absolute_clean_and_outside_workspace() {
        let mut u = UserView::new("agent", 1000, 1000);
        for bad in ["home/agent", "/home/../etc", "/workspace", "/workspace/h", "/", "/home//agent", "/a:b"] {
            u.home = bad.into();
            assert!(u.validate().is_err(), "{bad:?} accepted");
        }
        u.home = "/home/agent".into();
        u.validate().unwrap();
        u.home = "/workspace2".into();
        u.validate().unwrap();
    }

    #[test]
    fn home_must_not_cover_a_system_directory() {
        let mut u = UserView::new("agent", 1000, 1000);
        for bad in ["/etc", "/usr/bin", "/usr", "/dev", "/proc/self", "/lib64", "/run/secrets", "/sys/fs"] {
            u.home = bad.into();
            let err = u.validate().unwrap_err().to_string();
            assert!(err.contains("must not be /"), "{bad:?}: {err}");
        }
        for good in ["/root", "/srv/builder", "/home/agent", "/var/lib/agent", "/usrlocal", "/etcetera"] {
            u.home = good.into();
            u.validate().unwrap();
        }
    }
}
