//! `run`: one command in a fresh sandbox, stdio passed straight through.

use std::collections::HashMap;
use std::path::PathBuf;

use sandbox::{
    Access, Home, LandlockMode, Limits, MountOp, NestedUserns, Network, SandboxBuilder, SeccompPolicy,
    Security,
};

use super::args::{EgressArgs, LandlockArg, MountFlag, NestedArg, NetworkArg, RunArgs, RunGiven};
use super::error::RunError;
pub use super::launch::{Built, EXIT_TIMED_OUT, check_fd, launch_and_report, report_launch};
use super::run_inputs;
use super::units::{UnitError, parse_cpus, parse_duration, parse_size};
use super::{EXIT_TOOL_ERROR, report_error};
use crate::inputs::{Layout, Plan};

/// Variables copied from the caller when set: harmless and needed by
/// interactive programs. Everything else must be asked for.
const PASSED_BY_DEFAULT: &[&str] = &["TERM"];

/// `run` with the native provider in this (single-threaded) process: the
/// manifest, if any, is read, checked and planned first, so a bad one stops
/// the run before anything is mounted or downloaded.
pub fn main(args: RunArgs, given: &RunGiven) -> u8 {
    let prepared = run_inputs::init_env(&args)
        .and_then(|init_env| Ok((run_inputs::load_plan(&args)?, init_env)))
        .and_then(|(plan, init_env)| {
            Ok((build_spec(&args, given, plan.as_ref(), &init_env)?, plan, init_env))
        });
    let (built, plan, init_env) = match prepared {
        Ok(prepared) => prepared,
        Err(message) => {
            report_error(message);
            return EXIT_TOOL_ERROR;
        }
    };
    // The proxy's process is forked now, while this process has one thread.
    let egress = match start_egress(&args, &built.spec) {
        Ok(egress) => egress,
        Err(message) => {
            report_error(message);
            return EXIT_TOOL_ERROR;
        }
    };
    let egress_fd = egress.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let json_status_fd = args.json_status_fd;
    match plan {
        None => launch_and_report(&built.spec, json_status_fd, egress_fd),
        Some(plan) => {
            run_inputs::fetch_and_launch(plan, &args, given, built, &init_env, json_status_fd, egress_fd)
        }
    }
}

/// `--network allow`'s policy: `--allow-host`, the files of
/// `--allow-hosts-file`, `--allow-range`.
pub fn egress_policy(args: &EgressArgs) -> Result<crate::egress::Policy, RunError> {
    let mut hosts = args.allow_host.clone();
    for file in &args.allow_hosts_file {
        hosts.extend(crate::egress::policy::read_rules_file(file).map_err(RunError::AllowHostsFile)?);
    }
    crate::egress::Policy::parse(&hosts, &args.allow_range).map_err(RunError::Allowlist)
}

/// The egress proxy of a proxied network, in a child process: the socket
/// its listener goes out on (the launcher's end).
fn start_egress(
    args: &RunArgs,
    spec: &sandbox::SandboxSpec,
) -> Result<Option<std::os::fd::OwnedFd>, RunError> {
    if spec.network != Network::Proxied {
        return Ok(None);
    }
    let policy = egress_policy(&args.egress)?;
    if policy.hosts.is_empty() {
        tracing::warn!("--network allow without --allow-host: every destination is refused");
    }
    for rule in &policy.hosts {
        tracing::info!("egress proxy: allowing {rule}");
    }
    crate::egress::spawn_for_run(policy, None).map(Some).map_err(RunError::EgressProxy)
}

/// `run` without a manifest, provider or instance: what the small launcher
/// runs itself. Links none of the download or checkout code.
pub fn plain(args: RunArgs, given: &RunGiven) -> u8 {
    debug_assert!(!super::needs_full(&args));
    let built = run_inputs::init_env(&args).and_then(|init_env| build_spec(&args, given, None, &init_env));
    match built {
        Ok(built) => launch_and_report(&built.spec, args.json_status_fd, None),
        Err(message) => {
            report_error(message);
            EXIT_TOOL_ERROR
        }
    }
}

pub fn build_spec(
    args: &RunArgs,
    given: &RunGiven,
    plan: Option<&Plan>,
    init_env: &[(String, String)],
) -> Result<Built, RunError> {
    let user = run_inputs::user_view(&run_inputs::UserFlags::of(args, given), plan.map(Plan::env_patch))?;
    let layout = Layout::new(user.home.clone());

    // The manifest's WORKSPACE "." bind, when there is one, decides the workspace.
    let (workspace, workspace_access) = match plan.and_then(Plan::workspace) {
        Some((dir, access)) => (dir.to_path_buf(), run_inputs::access(access)),
        None => (
            match &args.workspace {
                Some(dir) => dir.clone(),
                None => std::env::current_dir().map_err(RunError::CurrentDir)?,
            },
            Access::Rw,
        ),
    };
    check_dir("--workspace", &workspace)?;
    let home = match &args.home {
        Some(dir) => {
            check_dir("--home", dir)?;
            Home::Bind(dir.clone())
        }
        None => Home::Tmpfs,
    };

    let mut builder = SandboxBuilder::new(args.command[0].clone())
        .args(args.command[1..].iter().cloned())
        .user(user.clone())
        .home(home)
        .network(network(args)?)
        .security(security(args)?)
        .hostname(args.hostname.clone())
        .proc(args.proc.into())
        .new_session(!args.keep_session)
        .nested(args.nested == NestedArg::On);
    builder = match workspace_access {
        Access::Rw => builder.workspace(workspace),
        // A read-only workspace is a plain bind; the command still starts there.
        Access::Ro => builder
            .mount(MountOp::Bind { src: workspace, dst: sandbox::WORKSPACE.into(), access: Access::Ro })
            .cwd(sandbox::WORKSPACE),
    };
    if let Some(dir) = &args.chdir {
        builder = builder.cwd(dir.clone());
    }
    if let Some(ids) = args.host_ids()? {
        builder = builder.map_to_host(ids);
    }
    for op in extra_mounts(args, given) {
        builder = builder.mount(op);
    }
    let mut binds = HashMap::new();
    if let Some(plan) = plan {
        builder = run_inputs::add_mounts(builder, plan, &layout, &mut binds);
    }
    for (key, value) in environment(args)? {
        builder = builder.env(key, value);
    }
    for (key, value) in run_inputs::environment(args, &user, plan.map(Plan::env_patch), init_env)? {
        builder = builder.env(key, value);
    }
    let spec = builder.build()?;
    Ok(Built { spec, layout, binds })
}

/// `--network`; the allowlist's options only go with `allow`.
pub fn network(args: &RunArgs) -> Result<Network, RunError> {
    match args.network {
        NetworkArg::Allow => Ok(Network::Proxied),
        _ if !args.egress.is_empty() => Err(RunError::AllowlistWithoutAllow),
        NetworkArg::On => Ok(Network::On),
        NetworkArg::Off | NetworkArg::None => Ok(Network::Off),
    }
}

/// `--seccomp`, `--landlock`, `--network none` and the limits.
fn security(args: &RunArgs) -> Result<Security, RunError> {
    let seccomp = SeccompPolicy::parse(&args.seccomp).map_err(RunError::Seccomp)?;
    let flag =
        |flag: &'static str, r: Result<u64, UnitError>| r.map_err(|source| RunError::Limit { flag, source });
    let l = &args.provider.limits;
    let limits = Limits {
        memory: l.memory.as_deref().map(|m| flag("--memory", parse_size(m))).transpose()?,
        cpu_millis: l.cpus.map(|c| flag("--cpus", parse_cpus(&c.to_string()))).transpose()?,
        pids: l.pids,
        nofile: args.nofile,
        timeout_ms: args
            .timeout
            .as_deref()
            .map(|t| flag("--timeout", parse_duration(t).map(|d| d.as_millis().max(1) as u64)))
            .transpose()?,
        kill_after_ms: match &args.timeout {
            Some(_) => {
                Some(flag("--kill-after", parse_duration(&args.kill_after).map(|d| d.as_millis() as u64))?)
            }
            None => None,
        },
        tmpfs_size: args.tmpfs_size.as_deref().map(|s| flag("--tmpfs-size", parse_size(s))).transpose()?,
    };
    if l.pids == Some(0) || args.nofile == Some(0) {
        return Err(RunError::ZeroLimit);
    }
    Ok(Security {
        seccomp,
        allow_ptrace: args.allow_ptrace,
        landlock: match args.landlock {
            LandlockArg::Off => LandlockMode::Off,
            LandlockArg::BestEffort => LandlockMode::BestEffort,
            LandlockArg::Require => LandlockMode::Require,
        },
        no_ip: args.network == NetworkArg::None,
        limits,
        nested_userns: match args.nested_userns {
            NestedArg::On => NestedUserns::On,
            NestedArg::Off => NestedUserns::Off,
        },
    })
}

pub fn check_dir(flag: &'static str, dir: &PathBuf) -> Result<(), RunError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(RunError::NotADirectory { flag, dir: dir.clone() }),
        Err(source) => Err(RunError::Dir { flag, dir: dir.clone(), source }),
    }
}

/// `--ro-bind`, `--bind` and `--tmpfs` in command-line order, as bubblewrap
/// applies them: a later mount may cover an earlier one.
pub fn extra_mounts(args: &RunArgs, given: &RunGiven) -> Vec<MountOp> {
    let mut ro_binds = args.ro_bind.chunks_exact(2);
    let mut binds = args.bind.chunks_exact(2);
    let mut tmpfs = args.tmpfs.iter();
    let bind =
        |pair: &[String], access| MountOp::Bind { src: pair[0].clone().into(), dst: pair[1].clone(), access };
    given
        .mount_order
        .iter()
        .filter_map(|flag| match flag {
            MountFlag::RoBind => ro_binds.next().map(|pair| bind(pair, Access::Ro)),
            MountFlag::Bind => binds.next().map(|pair| bind(pair, Access::Rw)),
            MountFlag::Tmpfs => tmpfs.next().map(|dst| MountOp::Tmpfs {
                dst: dst.clone(),
                mode: 0o755,
                owned_by_user: true,
                size: None,
            }),
        })
        .collect()
}

/// The variables the CLI adds to the builder's base (user view and PATH)
/// outside the allowlist: TERM and `--pass-env` (naming a key there is
/// allowing it). `--env` and `--env-file` go through `run_inputs::environment`.
pub fn environment(args: &RunArgs) -> Result<Vec<(String, String)>, RunError> {
    let mut env = Vec::new();
    for key in PASSED_BY_DEFAULT.iter().copied().chain(args.pass_env.iter().map(String::as_str)) {
        if key.is_empty() || key.contains('=') {
            return Err(RunError::PassEnvName(key.to_string()));
        }
        if let Ok(value) = std::env::var(key) {
            env.push((key.to_string(), value));
        }
    }
    Ok(env)
}
