//! The manifest and environment parts of `run`: reading and planning
//! `--manifest`, the env pipeline, fetching before launch, and the apply
//! callback that lands the items inside the sandbox.

use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox::{Access, DeferredBind, MountOp, SandboxBuilder, UserView};

use super::args::{RunArgs, RunGiven};
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
pub fn init_env(args: &RunArgs) -> Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for file in &args.env_pipeline.env_file {
        let shown = file.display().to_string();
        let text = std::fs::read_to_string(file).map_err(|e| {
            env::EnvError::File { file: shown.clone(), reason: sandbox::error::io_error_text(&e) }.to_string()
        })?;
        vars.extend(env::parse_env_file(&shown, &text).map_err(|e| e.to_string())?);
    }
    for (i, pair) in args.env.iter().enumerate() {
        match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => vars.push((key.to_string(), value.to_string())),
            // Never echo the value: it may be a secret.
            _ => {
                return Err(format!(
                    "--env: expected KEY=VALUE, got a value without '=' or with an empty key (argument {})",
                    i + 1
                ));
            }
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
) -> Result<Vec<(String, String)>, String> {
    // A variable the caller typed with --env is theirs to give, as with
    // --pass-env: it passes. The allowlist is for what arrives in bulk:
    // --env-file, manifests, the backend's init.env.
    let typed = args.env.iter().filter_map(|pair| pair.split_once('=')).map(|(key, _)| key);
    let allow = Allowlist::new(
        !args.env_pipeline.no_default_env_allow,
        args.env_pipeline.env_allow.iter().map(String::as_str).chain(typed.filter(|k| env::is_name(k))),
    )
    .map_err(|e| e.to_string())?;
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
pub fn load_plan(args: &RunArgs) -> Result<Option<Plan>, String> {
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
    Plan::new(manifest, &config).map(Some).map_err(|e| e.to_string())
}

/// Reads and parses a manifest file; errors are one line.
pub fn read_manifest(path: &Path) -> Result<manifest::Manifest, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("--manifest {}: {}", path.display(), sandbox::error::io_error_text(&e)))?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("--manifest {}: {}", path.display(), sandbox::error::io_error_text(&e)))?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(format!("--manifest {}: larger than {} MiB", path.display(), MAX_MANIFEST_BYTES >> 20));
    }
    manifest::parse(&bytes).map_err(|e| e.to_string())
}

/// The planning configuration: allowlist, the manifest's directory for
/// relative host paths, and the inputs base URL.
pub fn plan_config(manifest: &Path, allowed: &[PathBuf], base_url: Option<&str>) -> Result<Config, String> {
    let host_paths = HostAllowlist::new(allowed)?;
    let base_dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let base_dir = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
    let base_url = match base_url {
        None => None,
        Some(raw) => {
            let url = url::Url::parse(raw).map_err(|e| format!("--inputs-base-url {raw:?}: {e}"))?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(format!("--inputs-base-url {raw:?}: must be an http or https URL"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err("--inputs-base-url must not carry credentials; use --inputs-token-file".into());
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
pub fn user_view(flags: &UserFlags<'_>, patch: Option<&EnvPatch>) -> Result<UserView, String> {
    let mut user = UserView::new(flags.name, flags.uid, flags.gid);
    if let Some(home) = flags.home_path {
        if !home.starts_with('/') {
            return Err(format!("--home-path {home:?}: must be an absolute path"));
        }
        user.home = home.to_string();
    }
    let flag = if flags.home_path.is_some() { "--home-path" } else { "--user" };
    user.validate().map_err(|e| format!("{flag}: {e}"))?;
    if let Some(patch) = patch {
        patch_user_view(&mut user, patch, flags)?;
        user.validate().map_err(|e| format!("envPatch: {e}"))?;
    }
    Ok(user)
}

/// envPatch's HOME and USER move the user view too, so that `~` and
/// USER_HOME stay one directory; a conflict with an explicit flag is an error.
fn patch_user_view(user: &mut UserView, patch: &EnvPatch, flags: &UserFlags<'_>) -> Result<(), String> {
    if let Some(name) = &patch.user
        && *name != user.name
    {
        if flags.name_given {
            return Err(format!("envPatch.USER {name:?} conflicts with --user {:?}", user.name));
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
            return Err(format!("envPatch.HOME {home:?} conflicts with --home-path {:?}", user.home));
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
) -> u8 {
    let fail = |message: String| {
        report_error(message);
        EXIT_TOOL_ERROR
    };
    let options = match fetch_options(&plan, args, given, init_env) {
        Ok(options) => options,
        Err(message) => return fail(message),
    };
    let mut audit = match open_audit(args) {
        Ok(audit) => audit,
        Err(message) => return fail(message),
    };
    let fetched = match plan.fetch(&options) {
        Ok(fetched) => fetched,
        Err(e) => return fail(e.to_string()),
    };
    drop(options);
    if let Err(e) = inputs::wait_single_threaded() {
        return fail(e.into());
    }
    let apply_options = apply_options(args);
    let Built { spec, layout, binds } = built;
    report_launch(json_status_fd, move |launch_options| {
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
pub fn open_audit(args: &RunArgs) -> Result<Audit, String> {
    match &args.inputs.audit_log {
        Some(path) => Audit::open(path)
            .map_err(|e| format!("--audit-log {}: {}", path.display(), sandbox::error::io_error_text(&e))),
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
) -> Result<FetchOptions, String> {
    let token = match &args.inputs.inputs_token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                format!("--inputs-token-file {}: {}", path.display(), sandbox::error::io_error_text(&e))
            })?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        }
        None => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
    };
    let cache = inputs::cache_for(plan, args.inputs.inputs_cache.as_deref()).map_err(|e| e.to_string())?;

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
