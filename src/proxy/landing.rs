//! A run's agentInputs as its lane lands them (docs/manifest.md, "Landing
//! again"): planned against `workspaceHostRoot`, fetched (downloads from the
//! backend carry the download token, which no other part of a lane sees)
//! and landed into the host directories behind the instance, never over the
//! agent's work.

use std::path::PathBuf;

use serde_json::Value;

use super::config::{Config, ProviderChoice, Secret};
use super::run_state::RunState;
use crate::env::Redactor;
use crate::inputs::landed::{self, Landed};
use crate::inputs::{self, InputError};

/// Why a landing of agentInputs failed. The texts go to the backend
/// (`acp_opened`) as the agent's errors.
#[derive(Debug, thiserror::Error)]
pub enum LandingError {
    #[error(transparent)]
    Inputs(#[from] InputError),
    /// `workspaceHostRoot` as the agentInputs' host path allowlist.
    #[error("{0}")]
    Config(#[source] inputs::AllowlistError),
    #[error(transparent)]
    OpenRoot(landed::OpenRootError),
    #[error("run {run}: agentInputs: {source}")]
    Task { run: String, source: crate::blocking::Panicked },
}

/// How agentInputs are planned here, without anything to fetch them
/// with: what the instance part needs to know a run's binds.
#[derive(Clone)]
pub struct Planning {
    /// `workspaceHostRoot`: the only root host paths may lie under.
    root: PathBuf,
    /// The backend's origin as `http(s)://host:port/`, for relative URIs
    /// (and the one origin the token is sent to).
    base_url: Option<url::Url>,
}

impl Planning {
    pub fn new(cfg: &Config) -> Planning {
        Planning {
            root: cfg.sandbox.workspace_host_root.clone(),
            base_url: super::config::url_parts(&cfg.orchestrator_url).ok().and_then(|p| {
                let scheme = if p.scheme == "wss" { "https" } else { "http" };
                url::Url::parse(&format!("{scheme}://{}:{}/", p.host, p.port)).ok()
            }),
        }
    }

    /// Host paths only under `workspaceHostRoot`, relative URIs against
    /// the backend's origin.
    pub fn config(&self) -> Result<inputs::Config, inputs::AllowlistError> {
        Ok(inputs::Config {
            host_paths: inputs::HostAllowlist::new(std::slice::from_ref(&self.root))?,
            base_dir: self.root.clone(),
            base_url: self.base_url.clone(),
        })
    }
}

/// What landing agentInputs needs of the daemon: its slice of the config
/// and the token its downloads from the backend authenticate with.
pub struct Landing {
    planning: Planning,
    /// `<state>/inputs-cache`.
    cache_dir: PathBuf,
    max_bytes: u64,
    /// Docker instances: what lands is owned by the sandbox user.
    docker: bool,
    /// `auth_token`.
    token: Option<Secret>,
}

/// One run's side of a landing: where it lands and what it reports with.
pub struct Target {
    run_id: String,
    /// `/scratch`'s host directory, when the instance has one.
    scratch: Option<PathBuf>,
    /// Where new content of items left alone lands aside.
    incoming: PathBuf,
    redactor: Redactor,
    blocking: crate::blocking::Share,
}

impl Target {
    pub fn new(
        run_id: &str,
        scratch: Option<PathBuf>,
        incoming: PathBuf,
        redactor: Redactor,
        blocking: crate::blocking::Share,
    ) -> Target {
        Target { run_id: run_id.to_string(), scratch, incoming, redactor, blocking }
    }
}

impl Landing {
    pub fn new(cfg: &Config, token: Option<Secret>) -> Landing {
        Landing {
            planning: Planning::new(cfg),
            cache_dir: cfg.state_dir.join("inputs-cache"),
            max_bytes: cfg.skills_download_max_bytes,
            docker: cfg.sandbox.provider == ProviderChoice::Docker,
            token,
        }
    }

    /// How agentInputs are planned here: host paths only under
    /// `workspaceHostRoot`, relative URIs against the backend's origin.
    pub fn config(&self) -> Result<inputs::Config, inputs::AllowlistError> {
        self.planning.config()
    }

    /// How agentInputs are planned, without the token: what the instance
    /// part gets.
    pub fn planning(&self) -> Planning {
        self.planning.clone()
    }

    /// Lands `manifest`'s items for the run of `state`, as `inputs::landed`
    /// decides: never over the agent's work, whether or not the backend sent
    /// `init` again. Items left alone are in the outcome; new content of
    /// theirs lands aside. The outcome's records say what is landed now
    /// (also when a landing failed: what landed before the failure).
    pub async fn land(&self, state: &RunState, manifest: crate::manifest::Manifest, to: Target) -> Outcome {
        let failed = |e: LandingError| Outcome { result: Err(e), ..Outcome::default() };
        let config = match self.config() {
            Ok(c) => c,
            Err(e) => return failed(LandingError::Config(e)),
        };
        // The whole manifest is checked every time, whatever lands.
        let plan = match inputs::Plan::new(manifest.clone(), &config) {
            Ok(p) => p,
            Err(e) => return failed(e.into()),
        };
        if !manifest.items.iter().any(landed::lands) {
            return Outcome { records: Some(Landed::new()), ..Outcome::default() };
        }
        let options = match self.options(&plan, &config, state, to.redactor.clone()) {
            Ok(o) => o,
            Err(e) => return failed(e.into()),
        };
        let job = Job {
            plan,
            manifest,
            options,
            layout: inputs::Layout::new(state.home_guest.clone()),
            workspace: state.workspace.clone(),
            home: state.home.clone(),
            scratch: to.scratch,
            incoming: to.incoming,
            recorded: state.landed.clone(),
            docker_user: self.docker.then_some((state.uid, state.gid)),
        };
        // Downloads, checkouts and tree walks block: off the daemon's thread.
        match to.blocking.run(move || job.run()).await {
            Ok(out) => out,
            Err(source) => failed(LandingError::Task { run: to.run_id, source }),
        }
    }

    /// What fetching `plan` needs: the cache, the token (for the backend's
    /// origin only), the git credentials of the run's `init.env`.
    fn options(
        &self,
        plan: &inputs::Plan,
        config: &inputs::Config,
        state: &RunState,
        redactor: Redactor,
    ) -> Result<inputs::FetchOptions, InputError> {
        let cache = inputs::cache_for(plan, Some(&self.cache_dir))?;
        let git_env: Vec<(String, String)> = state
            .init
            .as_ref()
            .and_then(|i| i.get("env"))
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        Ok(inputs::FetchOptions {
            cache,
            download: inputs::DownloadOptions {
                token_origin: config.base_url.as_ref().map(|u| u.origin()),
                token: self.token.as_ref().map(|t| inputs::Secret::new(t.expose().to_string())),
                max_bytes: self.max_bytes,
                progress: false,
                ..inputs::DownloadOptions::default()
            },
            git: inputs::GitOptions {
                credentials: inputs::GitCredentials::from_env(&git_env),
                ..inputs::GitOptions::default()
            },
            redactor,
            owner: None,
        })
    }
}

/// A landing handed to the blocking pool in one piece.
struct Job {
    plan: inputs::Plan,
    manifest: crate::manifest::Manifest,
    options: inputs::FetchOptions,
    layout: inputs::Layout,
    workspace: PathBuf,
    home: PathBuf,
    scratch: Option<PathBuf>,
    incoming: PathBuf,
    recorded: Landed,
    docker_user: Option<(u32, u32)>,
}

impl Job {
    fn run(self) -> Outcome {
        // The roots by descriptors opened now, as the daemon's user: the
        // docker user writing below cannot search the (private) state
        // directory that holds the scratch.
        let roots = match landed::Roots::open(&self.workspace, &self.home, self.scratch.as_deref()) {
            Ok(r) => r,
            Err(e) => return Outcome { result: Err(LandingError::OpenRoot(e)), ..Outcome::default() },
        };
        let selection = landed::select(&self.manifest, &self.recorded, &roots);
        let mut out = Outcome { left_alone: selection.left_alone, ..Outcome::default() };
        let mut records = selection.keep;
        if selection.land.items.iter().any(landed::lands) {
            let dest = roots.host_dirs(self.layout.clone());
            out.result = land(self.plan.only(&selection.land), &self.options, dest, self.docker_user);
            let (now, failed) = landed::record(&selection.land, &self.recorded, &roots);
            records.extend(now);
            out.unrecorded = failed.into_iter().map(|(id, e)| (id, e.to_string())).collect();
        }
        out.records = Some(records);
        if !selection.aside.items.is_empty() {
            let plan = self.plan.only(&selection.aside);
            let aside = landed::land_aside(plan, &self.options, self.layout, &self.incoming);
            out.aside = Some(aside.map(|()| self.incoming));
        }
        out
    }
}

/// Fetches `plan` and lands it in `dest`, as the docker user when there
/// is one (so the agent owns what lands).
fn land(
    plan: inputs::Plan,
    options: &inputs::FetchOptions,
    mut dest: inputs::HostDirs,
    docker_user: Option<(u32, u32)>,
) -> Result<(), LandingError> {
    let fetched = plan.fetch(options)?;
    let mut audit = inputs::Audit::log_only();
    let mut apply = || inputs::apply(&fetched, &mut dest, &inputs::ApplyOptions::default(), &mut audit);
    match docker_user {
        Some((uid, gid)) => crate::provider::docker::as_user(uid, gid, apply),
        None => apply(),
    }?;
    Ok(())
}

/// What a landing of agentInputs did.
pub struct Outcome {
    result: Result<(), LandingError>,
    /// `None`: nothing is known of what landed.
    records: Option<Landed>,
    left_alone: Vec<landed::LeftAlone>,
    /// Items landed whose target could not be fingerprinted, with why.
    unrecorded: Vec<(String, String)>,
    /// Where the new content of items left alone was landed aside, if
    /// any was (or why it could not be).
    aside: Option<Result<PathBuf, landed::AsideError>>,
}

impl Default for Outcome {
    fn default() -> Outcome {
        Outcome { result: Ok(()), records: None, left_alone: Vec::new(), unrecorded: Vec::new(), aside: None }
    }
}

impl Outcome {
    /// Logs what could not be recorded and returns, for the lane to report,
    /// a line per item left alone; then the records and the result.
    pub fn finish(
        self,
        run_id: &str,
        home_guest: &str,
    ) -> (Vec<String>, Option<Landed>, Result<(), LandingError>) {
        for (id, e) in &self.unrecorded {
            tracing::warn!("run {run_id}: item {id}: fingerprint: {e}");
        }
        let layout = inputs::Layout::new(home_guest.to_string());
        let left_alone =
            self.left_alone.iter().map(|item| item.report(&layout, self.aside.as_ref())).collect();
        (left_alone, self.records, self.result)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The download token goes with the landing's fetches, and only to
    /// the backend's origin (relative URIs resolve against it).
    #[test]
    fn downloads_carry_the_token_to_the_backend_origin_only() {
        let root = std::env::temp_dir().join(format!("tuixiu-landing-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let doc: toml::Table = toml::from_str(&format!(
            "orchestrator_url = \"wss://backend.example:8443/ws/agent\"\n[sandbox]\nworkspaceHostRoot = {:?}\n",
            root.display().to_string()
        ))
        .unwrap();
        let (cfg, _) = Config::from_table("proxy.toml", doc, &Default::default()).unwrap();
        let landing = Landing::new(&cfg, Some(Secret::new("download-token-123")));
        let config = landing.config().unwrap();
        assert_eq!(config.base_url.as_ref().map(url::Url::as_str), Some("https://backend.example:8443/"));
        let manifest = crate::manifest::parse_value(&json!({"version": 1, "items": []})).unwrap();
        let plan = inputs::Plan::new(manifest, &config).unwrap();
        let state: RunState = serde_json::from_value(json!({
            "version": 1, "run_id": "r1", "instance_name": "i", "keepalive_ttl_seconds": 60,
            "expires_at_ms": null, "workspace": "/w", "home": "/h", "home_guest": "/root",
            "init": null, "created_at": "", "updated_at": ""
        }))
        .unwrap();
        let options = landing.options(&plan, &config, &state, Redactor::default()).unwrap();
        let token = options.download.token.as_ref().map(|t| t.expose().to_string());
        assert_eq!(token.as_deref(), Some("download-token-123"));
        let origin = options.download.token_origin.unwrap();
        assert_eq!(origin.ascii_serialization(), "https://backend.example:8443");
        let _ = std::fs::remove_dir_all(&root);
    }
}
