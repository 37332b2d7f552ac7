//! The environment pipeline of a run, and secret redaction.
//!
//! Order (docs/manifest.md, "Environment"), each step overriding the previous
//! one:
//!
//! 1. `init.env`: `--env-file FILE` lines, then `--env KEY=VALUE` flags;
//! 2. the user view: `HOME`, `USER`, `LOGNAME` of the sandbox user;
//! 3. the manifest's `envPatch` (only `HOME`, `USER`, `LOGNAME`);
//! 4. the allowlist: only keys in [`DEFAULT_ALLOWLIST`] (unless disabled)
//!    and those added with `--env-allow` survive (`run` adds the keys typed
//!    with `--env`: the caller's explicit choice). Dropped keys are reported
//!    by name, never with their values.
//!
//! [`Redactor`] replaces secret values (tokens, API keys) with
//! `[REDACTED]` in any text about to be logged or shown; the daemon can
//! reuse it for agent stderr.

use std::borrow::Cow;
use std::collections::BTreeSet;

/// The Node proxy's default `agent_env_allowlist` (docs/protocol.md,
/// "Environment of a run").
pub const DEFAULT_ALLOWLIST: &[&str] = &[
    "USER_HOME",
    "HOME",
    "USER",
    "LOGNAME",
    "TUIXIU_BWRAP_USERNAME",
    "TUIXIU_BWRAP_UID",
    "TUIXIU_BWRAP_GID",
    "TUIXIU_BWRAP_HOME_PATH",
    "TUIXIU_PROJECT_ID",
    "TUIXIU_PROJECT_NAME",
    "TUIXIU_REPO_URL",
    "TUIXIU_SCM_TYPE",
    "TUIXIU_DEFAULT_BRANCH",
    "TUIXIU_BASE_BRANCH",
    "TUIXIU_RUN_ID",
    "TUIXIU_RUN_BRANCH",
    "TUIXIU_WORKSPACE",
    "TUIXIU_WORKSPACE_GUEST",
    "TUIXIU_WORKSPACE_PROVIDER",
    "TUIXIU_PROJECT_HOME_DIR",
    "TUIXIU_WORKSPACE_MODE",
    "TUIXIU_ROLE_KEY",
    "TUIXIU_GIT_AUTH_MODE",
    "TUIXIU_GIT_HTTP_USERNAME",
    "TUIXIU_GIT_HTTP_PASSWORD",
    "GH_TOKEN",
    "GITHUB_TOKEN",
    "GITLAB_TOKEN",
    "GITLAB_ACCESS_TOKEN",
];

/// Variables whose values are secrets (the Node proxy's list: docs/protocol.md,
/// "Environment of a run").
pub const SECRET_KEYS: &[&str] = &[
    "GH_TOKEN",
    "GITHUB_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "ANTHROPIC_API_KEY",
    "GITLAB_TOKEN",
    "GITLAB_ACCESS_TOKEN",
    "TUIXIU_GIT_HTTP_PASSWORD",
    "TUIXIU_GIT_SSH_KEY",
    "TUIXIU_GIT_SSH_KEY_B64",
    "TUIXIU_INPUTS_TOKEN",
];

/// Errors of the environment inputs. Messages name files, lines and keys,
/// never values.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("--env-file {file}: {}", sandbox::error::io_error_text(.source))]
    File {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--env-file {file} line {line}: expected KEY=VALUE (a name of letters, digits and '_')")]
    Line { file: String, line: usize },
    #[error("--env-allow {0:?}: not a variable name")]
    AllowName(String),
}

/// A variable name as shells accept it.
pub fn is_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Parses an env file: `KEY=VALUE` per line; blank lines and lines starting
/// with `#` are skipped; an `export ` prefix is allowed; spaces around `=`
/// are dropped; a value wrapped in
/// matching single or double quotes loses them (no escapes, no expansion).
pub fn parse_env_file(file: &str, text: &str) -> Result<Vec<(String, String)>, EnvError> {
    let mut vars = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map(str::trim_start).unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(EnvError::Line { file: file.to_string(), line: n + 1 });
        };
        let key = key.trim_end();
        if !is_name(key) {
            return Err(EnvError::Line { file: file.to_string(), line: n + 1 });
        }
        let value = value.trim_start().trim_end_matches(['\r']);
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        vars.push((key.to_string(), unquoted.to_string()));
    }
    Ok(vars)
}

/// Which keys survive step 4.
#[derive(Clone, Debug)]
pub struct Allowlist {
    keys: BTreeSet<String>,
}

impl Allowlist {
    /// The default list (unless `defaults` is false) plus `extra`.
    pub fn new<'a>(defaults: bool, extra: impl IntoIterator<Item = &'a str>) -> Result<Allowlist, EnvError> {
        let mut keys: BTreeSet<String> = if defaults {
            DEFAULT_ALLOWLIST.iter().map(|k| k.to_string()).collect()
        } else {
            BTreeSet::new()
        };
        for key in extra {
            if !is_name(key) {
                return Err(EnvError::AllowName(key.to_string()));
            }
            keys.insert(key.to_string());
        }
        Ok(Allowlist { keys })
    }

    pub fn allows(&self, key: &str) -> bool {
        self.keys.contains(key)
    }
}

/// The user view's variables (step 2).
#[derive(Clone, Debug)]
pub struct UserVars<'a> {
    pub home: &'a str,
    pub user: &'a str,
}

/// What the pipeline produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Composed {
    /// The variables to set, in first-seen order.
    pub vars: Vec<(String, String)>,
    /// Keys the allowlist removed, sorted, without duplicates.
    pub dropped: Vec<String>,
}

/// Runs steps 1-4. `init` is `init.env` in order (later entries win),
/// `patch` the manifest's envPatch pairs.
pub fn compose(
    init: &[(String, String)],
    user: &UserVars<'_>,
    patch: &[(&str, &str)],
    allow: &Allowlist,
) -> Composed {
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match vars.iter_mut().find(|(key, _)| key == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => vars.push((k.to_string(), v.to_string())),
    };
    for (k, v) in init {
        set(k, v);
    }
    set("HOME", user.home);
    set("USER", user.user);
    set("LOGNAME", user.user);
    for (k, v) in patch {
        set(k, v);
    }
    let mut dropped = BTreeSet::new();
    vars.retain(|(k, _)| {
        let keep = allow.allows(k);
        if !keep {
            dropped.insert(k.clone());
        }
        keep
    });
    Composed { vars, dropped: dropped.into_iter().collect() }
}

/// A value that must never be printed: `Debug` shows `[REDACTED]`, there
/// is no `Display`, and the memory is zeroed when it is dropped (a forked
/// sandbox PID 1 keeps a copy of this process's memory: no token is left
/// in freed memory). Config tokens, download tokens.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Replaces known secret values with `[REDACTED]`.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

/// How many secrets, never which: a `{:?}` of anything holding a redactor
/// (`inputs::FetchOptions`, ...) must not print them.
impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("secrets", &self.secrets.len()).finish()
    }
}

const REDACTED: &str = "[REDACTED]";
/// Shorter values would redact ordinary words.
const MIN_SECRET_LEN: usize = 6;

impl Redactor {
    /// Collects the values of [`SECRET_KEYS`] found in `env`.
    pub fn from_env<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Redactor {
        let mut r = Redactor::default();
        for (k, v) in env {
            if SECRET_KEYS.contains(&k) {
                r.add(v);
            }
        }
        r
    }

    /// Adds one secret value (ignored when shorter than 6 characters).
    pub fn add(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.len() >= MIN_SECRET_LEN && !self.secrets.iter().any(|s| s == secret) {
            self.secrets.push(secret.to_string());
            // Longest first, so a secret containing another is fully hidden.
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.secrets.iter().any(|s| text.contains(s.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_string();
        for s in &self.secrets {
            out = out.replace(s.as_str(), REDACTED);
        }
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn debug_never_shows_the_secrets() {
        let mut r = Redactor::default();
        r.add("sk-very-secret-value");
        let options = crate::inputs::FetchOptions {
            cache: None,
            download: Default::default(),
            git: Default::default(),
            redactor: r.clone(),
            owner: None,
        };
        let shown = format!("{r:?} {options:?}");
        assert!(!shown.contains("sk-very-secret-value"), "{shown}");
        assert!(shown.contains("Redactor { secrets: 1 }"), "{shown}");
    }

    #[test]
    fn order_init_then_user_view_then_patch_then_allowlist() {
        let init = pairs(&[
            ("HOME", "/from/init"),
            ("TUIXIU_RUN_ID", "r1"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("TUIXIU_RUN_ID", "r2"),
        ]);
        let allow = Allowlist::new(true, []).unwrap();
        let out =
            compose(&init, &UserVars { home: "/home/agent", user: "agent" }, &[("USER", "bob")], &allow);
        assert_eq!(
            out.vars,
            pairs(&[("HOME", "/home/agent"), ("TUIXIU_RUN_ID", "r2"), ("USER", "bob"), ("LOGNAME", "agent")])
        );
        assert_eq!(out.dropped, vec!["OPENAI_API_KEY".to_string()]);
    }

    #[test]
    fn extra_allowed_keys_and_no_defaults() {
        let init = pairs(&[("OPENAI_API_KEY", "k"), ("TUIXIU_RUN_ID", "r")]);
        let allow = Allowlist::new(false, ["OPENAI_API_KEY", "HOME"]).unwrap();
        let out = compose(&init, &UserVars { home: "/h", user: "u" }, &[], &allow);
        assert_eq!(out.vars, pairs(&[("OPENAI_API_KEY", "k"), ("HOME", "/h")]));
        assert_eq!(out.dropped, vec!["LOGNAME".to_string(), "TUIXIU_RUN_ID".into(), "USER".into()]);
        assert!(matches!(Allowlist::new(true, ["A=B"]), Err(EnvError::AllowName(_))));
    }

    #[test]
    fn default_allowlist_is_the_node_proxy_list() {
        assert_eq!(DEFAULT_ALLOWLIST.len(), 29);
        assert!(!DEFAULT_ALLOWLIST.contains(&"OPENAI_API_KEY"));
        assert!(!DEFAULT_ALLOWLIST.contains(&"TUIXIU_GIT_SSH_KEY"));
    }

    #[test]
    fn env_file_format() {
        let text = "# comment\n\nA=1\nexport B = 'two words'\nC=\"x=y\"\r\nD=\nE='unbalanced\n";
        let vars = parse_env_file("f", text).unwrap();
        assert_eq!(
            vars,
            pairs(&[("A", "1"), ("B", "two words"), ("C", "x=y"), ("D", ""), ("E", "'unbalanced")])
        );
        let err = parse_env_file("f", "A=1\nnot a pair\n").unwrap_err().to_string();
        assert_eq!(err, "--env-file f line 2: expected KEY=VALUE (a name of letters, digits and '_')");
        let err = parse_env_file("f", "1A=secret-value\n").unwrap_err().to_string();
        assert!(!err.contains("secret-value"), "{err}");
    }

    #[test]
    fn redaction_hides_secrets_only() {
        let env =
            [("GH_TOKEN", "ghp_abcdef123"), ("TUIXIU_RUN_ID", "run-123456"), ("OPENAI_API_KEY", "short")];
        let mut r = Redactor::from_env(env);
        r.add("tok-abcdef123-longer");
        let text = "fatal: https://x:ghp_abcdef123@h/ run-123456 tok-abcdef123-longer short";
        assert_eq!(r.redact(text), "fatal: https://x:[REDACTED]@h/ run-123456 [REDACTED] short");
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
    }
}
