//! From a parsed manifest to a plan: every host path checked against the
//! allowlist, every download URI resolved against the inputs endpoint,
//! every git repository classified, and the workspace decided. Nothing is
//! downloaded or written yet.

use std::path::{Path, PathBuf};

use url::Url;

use super::error::{Cause, Code, InputError};
use super::hostpath::{HostAllowlist, HostPath};
use crate::manifest::Shown;
use crate::manifest::{Access, Apply, EnvPatch, Item, Manifest, Root, SCRATCH_DIR, Source};

/// What planning needs to know about the host.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Roots that hostPath sources (copy, bindMount, local git) may lie under.
    pub host_paths: HostAllowlist,
    /// Directory that relative hostPath sources are relative to (the
    /// manifest file's directory).
    pub base_dir: PathBuf,
    /// Base URL for relative `httpZip` URIs; its origin is the only one the
    /// bearer token is ever sent to.
    pub base_url: Option<Url>,
}

/// Where each logical root is, as the agent sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub workspace: String,
    pub home: String,
    pub scratch: String,
}

impl Layout {
    /// `/workspace`, the given home, `/scratch`.
    pub fn new(home: impl Into<String>) -> Layout {
        Layout { workspace: sandbox::WORKSPACE.into(), home: home.into(), scratch: SCRATCH_DIR.into() }
    }

    pub fn root(&self, root: Root) -> &str {
        match root {
            Root::Workspace => &self.workspace,
            Root::UserHome => &self.home,
            Root::Scratch => &self.scratch,
        }
    }

    /// The guest path of `rel` under `root`.
    pub fn guest(&self, root: Root, rel: &str) -> String {
        let base = self.root(root);
        if rel.is_empty() { base.to_string() } else { format!("{}/{rel}", base.trim_end_matches('/')) }
    }
}

/// A git repository to check out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GitRepo {
    /// `https://`, `http://`, `ssh://`, `git://` or `user@host:path`.
    Remote(String),
    /// A repository on this host (a path or `file://`), allowlisted.
    Local(HostPath),
}

/// How one item will be landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The `WORKSPACE` `"."` bind: it decides which host directory is the
    /// workspace; nothing happens at apply time.
    Workspace {
        host: HostPath,
        access: Access,
    },
    /// Any other bind: attached at its turn.
    Bind {
        host: HostPath,
        access: Access,
    },
    Copy {
        host: HostPath,
    },
    WriteFile {
        text: String,
    },
    Download {
        url: Url,
        content_hash: Option<String>,
    },
    Checkout {
        repo: GitRepo,
        git_ref: Option<String>,
    },
}

/// An item with its step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub item: Item,
    pub step: Step,
}

/// The checked manifest, ready to be fetched and applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    env_patch: EnvPatch,
    items: Vec<Planned>,
}

/// Most binds one manifest may hold besides the workspace (the sandbox
/// keeps their clones in a fixed table).
pub const MAX_BINDS: usize = 64;

/// A bindMount's step: the `WORKSPACE` `"."` one (at most one, a
/// directory) chooses the workspace; any other counts against
/// [`MAX_BINDS`].
fn bind_step(
    item: &Item,
    host: HostPath,
    workspace_item: &mut Option<String>,
    binds: &mut usize,
) -> Result<Step, InputError> {
    let id = item.id.as_str();
    if item.target.root == Root::Workspace && item.target.is_root() {
        if let Some(first) = &workspace_item {
            return Err(InputError::new(Code::Conflict, id, Cause::WorkspaceTaken { first: first.clone() }));
        }
        if !host.is_dir {
            return Err(InputError::new(
                Code::HostPath,
                id,
                Cause::WorkspaceNotDirectory { path: host.canonical.clone() },
            ));
        }
        *workspace_item = Some(item.id.clone());
        Ok(Step::Workspace { host, access: item.access })
    } else {
        *binds += 1;
        if *binds > MAX_BINDS {
            return Err(InputError::new(Code::Conflict, id, Cause::TooManyBinds { max: MAX_BINDS }));
        }
        if item.target.is_root() && !host.is_dir {
            return Err(InputError::new(
                Code::HostPath,
                id,
                Cause::BindRootNeedsDirectory { path: host.canonical.clone() },
            ));
        }
        Ok(Step::Bind { host, access: item.access })
    }
}

impl Plan {
    pub fn new(manifest: Manifest, config: &Config) -> Result<Plan, InputError> {
        let mut items = Vec::with_capacity(manifest.items.len());
        let mut workspace_item: Option<String> = None;
        let mut binds = 0;
        for item in manifest.items {
            let id = item.id.as_str();
            let step = match (&item.apply, &item.source) {
                (Apply::BindMount, Source::HostPath { path }) => {
                    let host = config.host_paths.resolve(id, path, &config.base_dir)?;
                    bind_step(&item, host, &mut workspace_item, &mut binds)?
                }
                (Apply::Copy, Source::HostPath { path }) => {
                    let host = config.host_paths.resolve(id, path, &config.base_dir)?;
                    if item.target.is_root() && !host.is_dir {
                        return Err(InputError::new(
                            Code::HostPath,
                            id,
                            Cause::CopyFileOverRoot { path: host.canonical.clone() },
                        ));
                    }
                    Step::Copy { host }
                }
                (Apply::WriteFile, Source::InlineText { text }) => {
                    if item.target.is_root() {
                        return Err(InputError::new(Code::TargetFailed, id, Cause::WriteFileOverRoot));
                    }
                    Step::WriteFile { text: text.clone() }
                }
                (Apply::DownloadExtract, Source::HttpZip { uri, content_hash }) => Step::Download {
                    url: resolve_uri(id, uri, config.base_url.as_ref())?,
                    content_hash: content_hash.clone(),
                },
                (Apply::Checkout, Source::Git { repo, git_ref }) => {
                    Step::Checkout { repo: classify_repo(id, repo, config)?, git_ref: git_ref.clone() }
                }
                // `manifest::parse` refuses every other pairing.
                (apply, source) => {
                    return Err(InputError::new(
                        Code::Conflict,
                        id,
                        Cause::Unpaired { apply: apply.as_str(), source_type: source.type_name() },
                    ));
                }
            };
            if item.access == Access::Ro && !matches!(step, Step::Workspace { .. } | Step::Bind { .. }) {
                tracing::warn!(
                    "item {id}: access \"ro\" is only enforced for bindMount; {} writes into a root the agent owns",
                    item.apply.as_str()
                );
            }
            items.push(Planned { item, step });
        }
        Ok(Plan { env_patch: manifest.env_patch, items })
    }

    pub fn items(&self) -> &[Planned] {
        &self.items
    }

    /// The items of the plan as a manifest.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            version: 1,
            env_patch: self.env_patch.clone(),
            items: self.items.iter().map(|p| p.item.clone()).collect(),
        }
    }

    /// The same plan with only the items of `wanted` (by id), in order.
    pub fn only(&self, wanted: &Manifest) -> Plan {
        let ids: std::collections::HashSet<&str> = wanted.items.iter().map(|i| i.id.as_str()).collect();
        Plan {
            env_patch: self.env_patch.clone(),
            items: self.items.iter().filter(|p| ids.contains(p.item.id.as_str())).cloned().collect(),
        }
    }

    pub fn env_patch(&self) -> &EnvPatch {
        &self.env_patch
    }

    /// The host directory the manifest binds as the workspace, if any.
    pub fn workspace(&self) -> Option<(&Path, Access)> {
        self.items.iter().find_map(|p| match &p.step {
            Step::Workspace { host, access } => Some((host.canonical.as_path(), *access)),
            _ => None,
        })
    }

    /// The binds other than the workspace, with their item's position.
    pub fn binds(&self) -> impl Iterator<Item = (usize, &Planned, &HostPath, Access)> {
        self.items.iter().enumerate().filter_map(|(i, p)| match &p.step {
            Step::Bind { host, access } => Some((i, p, host, *access)),
            _ => None,
        })
    }

    /// Whether any item lands under `root`.
    #[allow(dead_code)] // for providers: whether to make a scratch volume
    pub fn uses(&self, root: Root) -> bool {
        self.items.iter().any(|p| p.item.target.root == root)
    }

    /// One line per item: position, id, action, source, where it lands.
    pub fn describe(&self, layout: &Layout) -> Vec<String> {
        self.described(layout)
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let action = match (d.workspace, d.access) {
                    (true, Some(access)) => format!("{} {access} (the workspace)", d.apply),
                    (false, Some(access)) => format!("{} {access}", d.apply),
                    _ => d.apply.to_string(),
                };
                format!(
                    "{:>3}. {}: {action} {} -> {} ({})",
                    i + 1,
                    Shown(&d.id),
                    Shown(&d.source),
                    Shown(&d.target),
                    Shown(&d.target_spec)
                )
            })
            .collect()
    }

    /// Each item as it will land, in order (`manifest check`: its lines,
    /// and its `--json`).
    pub fn described(&self, layout: &Layout) -> Vec<Described> {
        self.items
            .iter()
            .map(|p| {
                let (workspace, access) = match &p.step {
                    Step::Workspace { access, .. } => (true, Some(access.as_str())),
                    Step::Bind { access, .. } => (false, Some(access.as_str())),
                    _ => (false, None),
                };
                Described {
                    id: p.item.id.clone(),
                    apply: p.item.apply.as_str(),
                    access,
                    workspace,
                    source: describe_source(p),
                    target: layout.guest(p.item.target.root, &p.item.target.path),
                    target_spec: p.item.target.display(),
                }
            })
            .collect()
    }
}

/// One planned item, as `manifest check` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Described {
    pub id: String,
    /// `bindMount`, `copy`, `downloadExtract`, `writeFile`, `checkout`.
    pub apply: &'static str,
    /// `ro` or `rw` for a bind (the mount enforces it); `None` otherwise.
    pub access: Option<&'static str>,
    /// The item is the workspace (bound at `/workspace` itself).
    pub workspace: bool,
    /// The source as logs show it: no credentials, no query string.
    pub source: String,
    /// The guest path it lands at.
    pub target: String,
    /// `ROOT/path` as the manifest names it.
    pub target_spec: String,
}

/// The source as it may appear in logs: no credentials, no query string.
pub fn describe_source(p: &Planned) -> String {
    match &p.step {
        Step::Workspace { host, .. } | Step::Bind { host, .. } | Step::Copy { host } => {
            host.canonical.display().to_string()
        }
        Step::WriteFile { text } => format!("inline text ({} bytes)", text.len()),
        Step::Download { url, content_hash } => match content_hash {
            Some(h) => format!("{} (sha256 {h})", display_url(url)),
            None => display_url(url),
        },
        Step::Checkout { repo, git_ref } => {
            let repo = match repo {
                GitRepo::Remote(r) => display_repo(r),
                GitRepo::Local(h) => h.canonical.display().to_string(),
            };
            match git_ref {
                Some(r) => format!("{repo} @ {r}"),
                None => repo,
            }
        }
    }
}

/// A URL without user info, query or fragment.
pub fn display_url(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

fn display_repo(repo: &str) -> String {
    match Url::parse(repo) {
        Ok(url) if url.has_host() => display_url(&url),
        _ => repo.to_string(),
    }
}

fn resolve_uri(id: &str, uri: &str, base: Option<&Url>) -> Result<Url, InputError> {
    let url = match Url::parse(uri) {
        Ok(url) => url,
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            let Some(base) = base else {
                return Err(InputError::new(Code::Uri, id, Cause::RelativeUri { uri: uri.to_string() }));
            };
            base.join(uri).map_err(|source| bad_uri(id, uri, source))?
        }
        Err(source) => return Err(bad_uri(id, uri, source)),
    };
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(InputError::new(Code::Uri, id, Cause::UriScheme { scheme: url.scheme().to_string() }));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(InputError::new(Code::Uri, id, Cause::UriCredentials));
    }
    Ok(url)
}

fn bad_uri(id: &str, uri: &str, source: url::ParseError) -> InputError {
    InputError::new(Code::Uri, id, Cause::BadUri { uri: uri.to_string(), source })
}

fn classify_repo(id: &str, repo: &str, config: &Config) -> Result<GitRepo, InputError> {
    if let Ok(url) = Url::parse(repo)
        && url.scheme().len() > 1
    {
        return match url.scheme() {
            "file" => {
                let path = url.to_file_path().map_err(|()| {
                    InputError::new(Code::HostPath, id, Cause::RepoNotLocal { repo: repo.to_string() })
                })?;
                let host = config.host_paths.resolve(id, &path.to_string_lossy(), &config.base_dir)?;
                Ok(GitRepo::Local(host))
            }
            "https" | "http" | "ssh" | "git" => {
                if url.password().is_some() {
                    return Err(InputError::new(Code::Uri, id, Cause::RepoPassword));
                }
                Ok(GitRepo::Remote(repo.to_string()))
            }
            other => Err(InputError::new(Code::Uri, id, Cause::RepoScheme { scheme: other.to_string() })),
        };
    }
    // scp-like `user@host:path` (a ':' before any '/').
    if let Some(colon) = repo.find(':')
        && !repo[..colon].contains('/')
    {
        return Ok(GitRepo::Remote(repo.to_string()));
    }
    let host = config.host_paths.resolve(id, repo, &config.base_dir)?;
    Ok(GitRepo::Local(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_value;
    use serde_json::json;

    fn config(allow: &[PathBuf]) -> Config {
        Config {
            host_paths: HostAllowlist::new(allow).unwrap(),
            base_dir: PathBuf::from("/"),
            base_url: Some(Url::parse("https://backend.example/api/").unwrap()),
        }
    }

    fn plan(items: serde_json::Value, cfg: &Config) -> Result<Plan, InputError> {
        Plan::new(parse_value(&json!({"version": 1, "items": items})).unwrap(), cfg)
    }

    #[test]
    fn host_paths_need_the_allowlist() {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = tmp.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::fs::create_dir(tmp.path().join("other")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("other"), allowed.join("escape")).unwrap();
        let cfg = config(std::slice::from_ref(&allowed));
        let item = |p: &Path| {
            json!([{"id": "x", "apply": "copy", "source": {"type": "hostPath", "path": p},
                                       "target": {"root": "WORKSPACE", "path": "x"}}])
        };
        assert!(plan(item(&allowed), &cfg).is_ok());
        let e = plan(item(&tmp.path().join("other")), &cfg).unwrap_err();
        assert_eq!(e.code, Code::HostPathNotAllowed, "{e}");
        assert!(e.to_string().starts_with("AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:x: host path "), "{e}");
        // A symlink inside the allowed root that points out of it is refused.
        let e = plan(item(&allowed.join("escape")), &cfg).unwrap_err();
        assert_eq!(e.code, Code::HostPathNotAllowed, "{e}");
        let e = plan(item(&allowed.join("missing")), &Config::default()).unwrap_err();
        assert_eq!(e.code, Code::HostPath, "{e}");
        let e = plan(item(&allowed), &Config::default()).unwrap_err();
        assert!(e.cause.to_string().contains("no host paths are allowed"), "{e}");
    }

    #[test]
    fn workspace_bind_is_decided_once() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(&[tmp.path().to_path_buf()]);
        let ws = json!({"id": "ws", "apply": "bindMount", "source": {"type": "hostPath", "path": tmp.path()},
                        "target": {"root": "WORKSPACE", "path": "."}});
        let p = plan(json!([ws.clone()]), &cfg).unwrap();
        assert_eq!(p.workspace().unwrap().0, std::fs::canonicalize(tmp.path()).unwrap());
        assert_eq!(p.binds().count(), 0);
        let mut again = ws.clone();
        again["id"] = json!("ws2");
        let e = plan(json!([ws, again]), &cfg).unwrap_err();
        assert_eq!(e.to_string(), "AGENT_INPUTS_CONFLICT:ws2: the workspace is already bound by item ws");
    }

    #[test]
    fn uris_resolve_against_the_base() {
        let cfg = config(&[]);
        let dl = |uri: &str| {
            json!([{"id": "z", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": uri},
                                     "target": {"root": "USER_HOME", "path": "z"}}])
        };
        let p = plan(dl("/api/acp-proxy/skills/packages/a.zip"), &cfg).unwrap();
        match &p.items()[0].step {
            Step::Download { url, .. } => {
                assert_eq!(url.as_str(), "https://backend.example/api/acp-proxy/skills/packages/a.zip")
            }
            other => panic!("{other:?}"),
        }
        let e = plan(dl("/a.zip"), &Config::default()).unwrap_err();
        assert!(e.to_string().contains("is relative; pass --inputs-base-url"), "{e}");
        for bad in ["ftp://h/a.zip", "file:///etc/passwd", "https://u:p@h/a.zip"] {
            let e = plan(dl(bad), &cfg).unwrap_err();
            assert_eq!(e.code, Code::Uri, "{bad}: {e}");
        }
    }

    #[test]
    fn git_repos_are_classified() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(&[tmp.path().to_path_buf()]);
        let co = |repo: &str| {
            json!([{"id": "g", "apply": "checkout", "source": {"type": "git", "repo": repo},
                                      "target": {"root": "WORKSPACE", "path": "."}}])
        };
        for remote in ["https://h/r.git", "ssh://git@h/r.git", "git@h:org/r.git"] {
            let p = plan(co(remote), &cfg).unwrap();
            assert_eq!(
                p.items()[0].step,
                Step::Checkout { repo: GitRepo::Remote(remote.into()), git_ref: None }
            );
        }
        let p = plan(co(tmp.path().to_str().unwrap()), &cfg).unwrap();
        assert!(matches!(&p.items()[0].step, Step::Checkout { repo: GitRepo::Local(_), .. }));
        let file_url = format!("file://{}", tmp.path().display());
        assert!(matches!(
            &plan(co(&file_url), &cfg).unwrap().items()[0].step,
            Step::Checkout { repo: GitRepo::Local(_), .. }
        ));
        assert_eq!(plan(co("/etc"), &cfg).unwrap_err().code, Code::HostPathNotAllowed);
        assert_eq!(plan(co("https://u:secret@h/r.git"), &cfg).unwrap_err().code, Code::Uri);
        assert_eq!(plan(co("ext::sh"), &cfg).unwrap_err().code, Code::Uri);
    }

    #[test]
    fn layout_and_descriptions() {
        let layout = Layout::new("/home/agent");
        assert_eq!(layout.guest(Root::UserHome, ".codex/skills/a"), "/home/agent/.codex/skills/a");
        assert_eq!(layout.guest(Root::Workspace, ""), "/workspace");
        assert_eq!(layout.guest(Root::Scratch, "t"), "/scratch/t");
        let url = Url::parse("https://u:p@h/a.zip?token=secret#x").unwrap();
        assert_eq!(display_url(&url), "https://h/a.zip");
    }
}
