//! The manifest and environment parts of `run`: reading and planning
//! `--manifest`, the env pipeline, fetching before launch, and the apply
//! callback that lands the items inside the sandbox.

use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox::{Access, DeferredBind, MountOp, SandboxBuilder, UserView};

use super::args::{RunArgs, RunGiven};
use super::error::RunError;
use super::launch::{Built, report_launch};
use super::{EXIT_TOOL_ERROR, report_error};
use crate::env::{self, Allowlist, Redactor, UserVars};
use crate::inputs::{
    self, ApplyOptions, Audit, Config, DownloadOptions, FetchOptions, GitCredentials, GitOptions,
    HostAllowlist, Layout, Plan, SandboxDest, Secret, ZipLimits,
};
use crate::manifest::{self, EnvPatch, SCRATCH_DIR};

/// Largest manifest read (inline texts included).
const MAX_MANIFEST_BYTES: u64 = 16 << 20;
/// Environment variable holding the inputs token.
pub const TOKEN_ENV: &str = "TUIXIU_INPUTS_TOKEN";

/// init.env: `--env-file` lines in order, then `--env` flags.
pub fn init_env(args: &RunArgs) -> Result<Vec<(String, String)>, RunError> {
    let mut vars = Vec::new();
    for file in &args.env_pipeline.env_file {
        let shown = file.display().to_string();
        let text = std::fs::read_to_string(file)
            .map_err(|source| env::EnvError::File { file: shown.clone(), source })?;
        vars.extend(env::parse_env_file(&shown, &text)?);
    }
    for (i, pair) in args.env.iter().enumerate() {
        match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => vars.push((key.to_string(), value.to_string())),
            // Never echo the value: it may be a secret.
            _ => return Err(RunError::EnvPair(i + 1)),
        }
    }
    Ok(vars)
}

/// Steps 1-4 of the env pipeline; reports dropped keys on stderr by name.
pub fn environment(
    args: &RunArgs,
    user: &UserView,
    patch: Option<&EnvPatch>,
    init: &[(String, String)],
) -> Result<Vec<(String, String)>, RunError> {
    // A variable the caller typed with --env is theirs to give, as with
    // --pass-env: it passes. The allowlist is for what arrives in bulk:
    // --env-file, manifests, the backend's init.env.
    let typed = args.env.iter().filter_map(|pair| pair.split_once('=')).map(|(key, _)| key);
    let allow = Allowlist::new(
        !args.env_pipeline.no_default_env_allow,
        args.env_pipeline.env_allow.iter().map(String::as_str).chain(typed.filter(|k| env::is_name(k))),
    )?;
    let patch_pairs = patch.map(EnvPatch::pairs).unwrap_or_default();
    let composed = env::compose(init, &UserVars { home: &user.home, user: &user.name }, &patch_pairs, &allow);
    let dropped: Vec<&String> = composed
        .dropped
        .iter()
        // HOME/USER/LOGNAME come from the user view anyway; only the
        // caller's own keys are worth a word.
        .filter(|k| init.iter().any(|(key, _)| key == *k))
        .collect();
    if !dropped.is_empty() {
        let names: Vec<&str> = dropped.iter().map(|k| k.as_str()).collect();
        eprintln!(
            "tuixiu-sandbox: env: not in the allowlist, dropped: {} (allow with --env-allow KEY)",
            names.join(", ")
        );
    }
    Ok(composed.vars)
}

/// Reads and plans `--manifest`, if given.
pub fn load_plan(args: &RunArgs) -> Result<Option<Plan>, RunError> {
    let Some(path) = &args.manifest else {
        return Ok(None);
    };
    let manifest = read_manifest(path)?;
    let mut allowed = args.plan.allow_host_path.clone();
    if let Some(ws) = args.workspace.as_ref().filter(|ws| ws.is_dir()) {
        // A missing --workspace is reported by its own check, as `--workspace`.
        allowed.push(ws.clone());
    }
    let config = plan_config(path, &allowed, args.plan.inputs_base_url.as_deref())?;
    Ok(Some(Plan::new(manifest, &config)?))
}

/// Reads and parses a manifest file; errors are one line.
pub fn read_manifest(path: &Path) -> Result<manifest::Manifest, RunError> {
    let read_error = |source| RunError::ManifestRead { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(RunError::ManifestTooLarge { path: path.to_path_buf(), max: MAX_MANIFEST_BYTES });
    }
    Ok(manifest::parse(&bytes)?)
}

/// The planning configuration: allowlist, the manifest's directory for
/// relative host paths, and the inputs base URL.
pub fn plan_config(manifest: &Path, allowed: &[PathBuf], base_url: Option<&str>) -> Result<Config, RunError> {
    let host_paths = HostAllowlist::new(allowed).map_err(RunError::AllowHostPath)?;
    let base_dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let base_dir = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
    let base_url = match base_url {
        None => None,
        Some(raw) => {
            let url =
                url::Url::parse(raw).map_err(|source| RunError::BaseUrl { raw: raw.to_string(), source })?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(RunError::BaseUrlScheme(raw.to_string()));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(RunError::BaseUrlCredentials);
            }
            Some(url)
        }
    };
    Ok(Config { host_paths, base_dir, base_url })
}

/// The user flags of `run` and `manifest check`.
pub struct UserFlags<'a> {
    pub name: &'a str,
    /// `--user` was given (not defaulted).
    pub name_given: bool,
    pub uid: u32,
    pub gid: u32,
    pub home_path: Option<&'a str>,
}

impl<'a> UserFlags<'a> {
    pub fn of(args: &'a RunArgs, given: &RunGiven) -> UserFlags<'a> {
        UserFlags {
            name: &args.user,
            name_given: given.user,
            uid: args.uid,
            gid: args.gid.unwrap_or(args.uid),
            home_path: args.home_path.as_deref(),
        }
    }
}

/// The user view of a run: the flags, then the manifest's envPatch, each
/// checked as the sandbox will check it. Every provider's `run` and
/// `manifest check` go through here, so check refuses what run refuses.
pub fn user_view(flags: &UserFlags<'_>, patch: Option<&EnvPatch>) -> Result<UserView, RunError> {
    let mut user = UserView::new(flags.name, flags.uid, flags.gid);
    if let Some(home) = flags.home_path {
        if !home.starts_with('/') {
            return Err(RunError::HomePathRelative(home.to_string()));
        }
        user.home = home.to_string();
    }
    let flag = if flags.home_path.is_some() { "--home-path" } else { "--user" };
    user.validate().map_err(|source| RunError::User { flag, source })?;
    if let Some(patch) = patch {
        patch_user_view(&mut user, patch, flags)?;
        user.validate().map_err(RunError::EnvPatchUser)?;
    }
    Ok(user)
}

/// envPatch's HOME and USER move the user view too, so that `~` and
/// USER_HOME stay one directory; a conflict with an explicit flag is an error.
fn patch_user_view(user: &mut UserView, patch: &EnvPatch, flags: &UserFlags<'_>) -> Result<(), RunError> {
    if let Some(name) = &patch.user
        && *name != user.name
    {
        if flags.name_given {
            return Err(RunError::UserConflict { patch: name.clone(), flag: user.name.clone() });
        }
        user.name = name.clone();
        if flags.home_path.is_none() {
            user.home = format!("/home/{name}");
        }
    }
    if let Some(home) = &patch.home
        && *home != user.home
    {
        if flags.home_path.is_some() {
            return Err(RunError::HomeConflict { patch: home.clone(), flag: user.home.clone() });
        }
        user.home = home.clone();
    }
    Ok(())
}

pub fn access(a: manifest::Access) -> Access {
    match a {
        manifest::Access::Ro => Access::Ro,
        manifest::Access::Rw => Access::Rw,
    }
}

/// `/scratch` and the manifest's deferred binds.
pub fn add_mounts(
    mut builder: SandboxBuilder,
    plan: &Plan,
    layout: &Layout,
    binds: &mut HashMap<usize, usize>,
) -> SandboxBuilder {
    builder = builder.mount(MountOp::Tmpfs {
        dst: SCRATCH_DIR.into(),
        mode: 0o755,
        owned_by_user: true,
        size: None,
    });
    for (i, planned, host, a) in plan.binds() {
        let dst = layout.guest(planned.item.target.root, &planned.item.target.path);
        let index =
            builder.deferred_bind(DeferredBind { src: host.canonical.clone(), dst, access: access(a) });
        binds.insert(i, index);
    }
    builder
}

/// Fetches the plan's inputs, then launches with an apply phase that lands
/// them. Everything before the command starts fails with exit status 125.
pub fn fetch_and_launch(
    plan: Plan,
    args: &RunArgs,
    given: &RunGiven,
    built: Built,
    init_env: &[(String, String)],
    json_status_fd: Option<i32>,
    egress_fd: Option<i32>,
) -> u8 {
    let fail = |e: RunError| {
        report_error(e);
        EXIT_TOOL_ERROR
    };
    let options = match fetch_options(&plan, args, given, init_env) {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    let mut audit = match open_audit(args) {
        Ok(audit) => audit,
        Err(e) => return fail(e),
    };
    let fetched = match plan.fetch(&options) {
        Ok(fetched) => fetched,
        Err(e) => return fail(e.into()),
    };
    drop(options);
    if let Err(e) = inputs::wait_single_threaded() {
        return fail(RunError::Threads(e));
    }
    let apply_options = apply_options(args);
    let Built { spec, layout, binds } = built;
    report_launch(json_status_fd, egress_fd, move |launch_options| {
        sandbox::launch_with(&spec, launch_options, move |ctx| {
            let mut dest = SandboxDest::new(ctx, layout, binds);
            let result = inputs::apply(&fetched, &mut dest, &apply_options, &mut audit);
            // Archives closed and checkouts removed before the command runs.
            drop(fetched);
            drop(audit);
            result.map_err(Into::into)
        })
    })
}

/// `--audit-log`, or the log only.
pub fn open_audit(args: &RunArgs) -> Result<Audit, RunError> {
    match &args.inputs.audit_log {
        Some(path) => Audit::open(path).map_err(|source| RunError::AuditLog { path: path.clone(), source }),
        None => Ok(Audit::log_only()),
    }
}

/// The zip limits of the apply phase.
pub fn apply_options(args: &RunArgs) -> ApplyOptions {
    ApplyOptions {
        zip: ZipLimits {
            max_entries: args.inputs.zip_max_entries,
            max_file_bytes: args.inputs.zip_max_file_bytes,
            max_total_bytes: args.inputs.zip_max_total_bytes,
        },
    }
}

pub fn fetch_options(
    plan: &Plan,
    args: &RunArgs,
    given: &RunGiven,
    init_env: &[(String, String)],
) -> Result<FetchOptions, RunError> {
    let token = match &args.inputs.inputs_token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| RunError::TokenFile { path: path.clone(), source })?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        }
        None => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
    };
    let cache = inputs::cache_for(plan, args.inputs.inputs_cache.as_deref())?;

    // Git credentials: init.env first, then this process's own variables.
    let mut git_env: Vec<(String, String)> = init_env.to_vec();
    for key in ["TUIXIU_GIT_HTTP_USERNAME", "TUIXIU_GIT_HTTP_PASSWORD"] {
        if !git_env.iter().any(|(k, _)| k == key)
            && let Ok(v) = std::env::var(key)
        {
            git_env.push((key.to_string(), v));
        }
    }
    let credentials = GitCredentials::from_env(&git_env);

    let mut redactor = Redactor::from_env(init_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(t) = &token {
        redactor.add(t);
    }
    if let Some(c) = &credentials {
        redactor.add(c.password.expose());
    }
    let (euid, egid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let owner =
        (euid == 0 && given.map_ids).then(|| (args.map_uid.unwrap_or(euid), args.map_gid.unwrap_or(egid)));

    let base_origin = match &args.plan.inputs_base_url {
        Some(raw) => url::Url::parse(raw).ok().map(|u| u.origin()),
        None => None,
    };
    Ok(FetchOptions {
        cache,
        download: DownloadOptions {
            token_origin: base_origin,
            token: token.map(Secret::new),
            timeout: Duration::from_secs_f64(args.inputs.download_timeout),
            max_bytes: args.inputs.download_max_bytes,
            progress: std::io::stderr().is_terminal(),
        },
        git: GitOptions {
            timeout: Duration::from_secs_f64(args.inputs.checkout_timeout),
            credentials,
            ..GitOptions::default()
        },
        redactor,
        owner,
    })
}
