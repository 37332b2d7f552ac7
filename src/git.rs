//! The one hardened git runner of the host side: the input applier's
//! `checkout` sources (`inputs/git.rs`, blocking) and the daemon's git
//! (`proxy/gitenv.rs`: `TUIXIU_REPO_URL` preparation and `git_push`,
//! async) build their `git` command here, so both get the same hardening:
//!
//! * a cleared environment: `PATH`, `HOME` (a private directory of the
//!   caller's), `LANG`/`LC_ALL` `C`, and nothing else of ours;
//! * no system configuration (`GIT_CONFIG_NOSYSTEM`) and no user one
//!   (`GIT_CONFIG_GLOBAL` is the caller's own file, else `/dev/null`);
//! * no prompts (`GIT_TERMINAL_PROMPT=0`, `GCM_INTERACTIVE=Never`, ssh in
//!   batch mode), no repository `core.sshCommand` (`GIT_SSH_COMMAND` set);
//! * only the usual transports (`GIT_ALLOW_PROTOCOL`, narrowed by callers
//!   that know the URL), never `ext::`;
//! * `-c` overrides of what a repository's config could make git run:
//!   hooks, fsmonitor, askpass and credential helpers;
//! * stdin closed, its own process group (so a deadline kills git's
//!   helpers too).
//!
//! Callers add their credentials (askpass, ssh key) and, for a repository
//! they did not make, its `safe.directory`.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};

/// `-c` overrides on every git command line: repository configuration
/// that would run a program on the host (or hand credentials to one).
pub const CONFIG_OVERRIDES: [&str; 5] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.askPass=",
    "credential.helper=",
    "protocol.ext.allow=never",
];

/// `PATH` when the caller keeps none of its own.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The transports allowed unless the caller narrows them.
pub const DEFAULT_PROTOCOLS: &str = "https:http:ssh:git:file";

/// `GIT_SSH_COMMAND` unless the caller gives its own: never a prompt.
pub const DEFAULT_SSH: &str = "ssh -o BatchMode=yes";

/// Where one git command runs from.
pub struct Hardened<'a> {
    /// `HOME`: a private directory of the caller's (no user config there).
    pub home: &'a Path,
    /// `GIT_CONFIG_GLOBAL`: a file of the caller's; `None`: `/dev/null`.
    pub global_config: Option<&'a Path>,
    /// `PATH` for git and its helpers; `None`: [`DEFAULT_PATH`].
    pub path: Option<OsString>,
    /// A repository the caller did not make but trusts (`safe.directory`).
    pub safe_directory: Option<&'a Path>,
}

impl Hardened<'_> {
    /// `git -c <overrides>...` with the hardened environment only, stdin
    /// closed, in its own process group. Callers add their variables
    /// (credentials, `GIT_ALLOW_PROTOCOL`), then the subcommand.
    pub fn command(&self) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("git");
        for c in CONFIG_OVERRIDES {
            cmd.arg("-c").arg(c);
        }
        if let Some(dir) = self.safe_directory {
            let mut arg = OsString::from("safe.directory=");
            arg.push(dir.as_os_str());
            cmd.arg("-c").arg(arg);
        }
        cmd.env_clear()
            .env("PATH", self.path.clone().unwrap_or_else(|| OsString::from(DEFAULT_PATH)))
            .env("HOME", self.home)
            .env("LANG", "C")
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", self.global_config.unwrap_or(Path::new("/dev/null")))
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GCM_INTERACTIVE", "Never")
            .env("GIT_ALLOW_PROTOCOL", DEFAULT_PROTOCOLS)
            .env("GIT_SSH_COMMAND", DEFAULT_SSH)
            .stdin(Stdio::null())
            .process_group(0);
        cmd
    }

    /// [`Hardened::command`] for async callers; killed if dropped.
    pub fn async_command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::from(self.command());
        cmd.kill_on_drop(true);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hardening_is_on_every_command() {
        let home = Path::new("/tmp/h");
        let cmd = Hardened { home, global_config: None, path: None, safe_directory: Some(Path::new("/r")) }
            .command();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        for c in CONFIG_OVERRIDES {
            assert!(args.iter().any(|a| a == c), "{c} missing from {args:?}");
        }
        assert!(args.iter().any(|a| a == "safe.directory=/r"));
        let env: Vec<_> = cmd.get_envs().collect();
        let get = |k: &str| env.iter().find(|(key, _)| *key == k).and_then(|(_, v)| *v);
        assert_eq!(get("GIT_CONFIG_GLOBAL"), Some(std::ffi::OsStr::new("/dev/null")));
        assert_eq!(get("GIT_TERMINAL_PROMPT"), Some(std::ffi::OsStr::new("0")));
        assert_eq!(get("HOME"), Some(home.as_os_str()));
    }
}
