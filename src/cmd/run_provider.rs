//! `run` through a provider: `--provider docker|host`, or a named instance
//! (`--instance-name`) of any provider.
//!
//! The plain native `run` never comes here: it launches in-process
//! (`cmd/run.rs`). A named native instance still launches in-process; only
//! the instance's directories and template come from the provider.
//!
//! Stdio passes straight through and the exit status follows the native
//! conventions: the command's code, 128+N for a signal, 125 for our own
//! errors (and docker's), 126 when the command cannot run, 127 when it is
//! not found.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use clap::ArgMatches;
use clap::parser::ValueSource;
use sandbox::{Access, MountOp, Network, UserView};
use tuixiu_sandbox::provider::docker::{self, DockerProvider, Volumes, as_container_user};
use tuixiu_sandbox::provider::host::{self, HostProvider};
use tuixiu_sandbox::provider::names::{self, NameError};
use tuixiu_sandbox::provider::native::NativeProvider;
use tuixiu_sandbox::provider::{
    InstanceConfig, Limits, Mount, ProcessSpec, Provider, ProviderError, Stdio, default_state_dir,
};

use super::engine_check::EngineError;
use super::error::CmdError;
use super::relay;
use crate::cli::{NetworkArg, ProviderArg, RunArgs};
use crate::inputs::{self, Layout, Plan, landed};
use crate::manifest::Root;
use crate::{EXIT_TOOL_ERROR, report_error};
use tuixiu_sandbox::launcher::args::RunGiven;
use tuixiu_sandbox::launcher::error::RunError;
use tuixiu_sandbox::launcher::run::{check_dir, environment, extra_mounts, launch_and_report};
use tuixiu_sandbox::launcher::run_inputs;
use tuixiu_sandbox::launcher::units::parse_size;

/// Whether `run` must go through a provider rather than the plain native path.
pub fn handles(args: &RunArgs) -> bool {
    let p = &args.provider;
    p.provider != ProviderArg::Native || p.instance_name.is_some() || p.image.is_some() || p.run_id.is_some()
}

pub fn main(args: RunArgs, matches: &ArgMatches) -> u8 {
    match run(&args, matches) {
        Ok(code) => code,
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}

fn run(args: &RunArgs, matches: &ArgMatches) -> Result<u8, CmdError> {
    let p = &args.provider;
    let state_dir = p.options.state_dir.clone().unwrap_or_else(default_state_dir);
    let prefix = p.options.instance_prefix.as_str();
    // The same order as the native `run`: the manifest is read and planned
    // first, then the user view (moved by envPatch), then the env pipeline.
    let given = RunGiven::from_matches(matches);
    let init_env = run_inputs::init_env(args)?;
    let plan = run_inputs::load_plan(args)?;
    let user =
        run_inputs::user_view(&run_inputs::UserFlags::of(args, &given), plan.as_ref().map(Plan::env_patch))?;
    let mut env = environment(args)?;
    env.extend(run_inputs::environment(args, &user, plan.as_ref().map(Plan::env_patch), &init_env)?);
    let process = ProcessSpec {
        argv: args.command.clone(),
        env,
        cwd: args.chdir.clone(),
        cwd_dir: None,
        stdio: Stdio::Inherit,
    };
    let cmdline = CommandLine { args, matches, given, user, plan, init_env };
    if cmdline.plan.is_some() && p.provider != ProviderArg::Docker {
        return Err(CmdError::ManifestUnsupported(match p.provider {
            ProviderArg::Native => "native",
            ProviderArg::Docker => "docker",
            ProviderArg::Host => "host",
        }));
    }
    if p.run_id.is_some() && p.instance_name.is_none() && p.provider != ProviderArg::Docker {
        return Err(CmdError::RunIdWithoutInstance);
    }
    // Seccomp, Landlock, --nofile, --timeout and --tmpfs-size are the plain
    // native sandbox's; ignoring them here would be a weaker sandbox than
    // asked for.
    for id in ["seccomp", "allow_ptrace", "landlock", "nofile", "timeout", "kill_after", "tmpfs_size"] {
        if matches.value_source(id) == Some(ValueSource::CommandLine) {
            return Err(CmdError::NativeOnly(id));
        }
    }
    match p.provider {
        ProviderArg::Native => run_native(&cmdline, &state_dir, prefix, &process),
        ProviderArg::Docker => {
            refuse_flags(matches, "docker", &["json_status_fd", "keep_session", "map_uid", "map_gid"])?;
            run_docker(cmdline, &state_dir, prefix, &process)
        }
        ProviderArg::Host => {
            refuse_flags(
                matches,
                "host",
                &["json_status_fd", "keep_session", "map_uid", "map_gid", "uid", "gid", "hostname"],
            )?;
            run_host(&cmdline, &state_dir, prefix, &process)
        }
    }
}

/// Refuses native-only flags given explicitly to another provider: an
/// option that would be silently ignored is a weaker sandbox than asked for.
fn refuse_flags(matches: &ArgMatches, provider: &'static str, ids: &[&'static str]) -> Result<(), CmdError> {
    for &id in ids {
        if matches.value_source(id) == Some(ValueSource::CommandLine) {
            return Err(CmdError::NotSupportedBy { id, provider });
        }
    }
    Ok(())
}

/// The parsed command line, with the manifest's plan and the user view.
struct CommandLine<'a> {
    args: &'a RunArgs,
    matches: &'a ArgMatches,
    given: RunGiven,
    /// The user view, moved by the manifest's envPatch.
    user: UserView,
    plan: Option<Plan>,
    init_env: Vec<(String, String)>,
}

/// The instance config from the command line: the same options as the
/// plain native `run`, plus the provider's. A manifest's WORKSPACE "."
/// bind decides the workspace.
fn instance_config(cl: &CommandLine<'_>, name: &str, run_id: &str) -> Result<InstanceConfig, CmdError> {
    let args = cl.args;
    let (workspace, read_only) = match cl.plan.as_ref().and_then(Plan::workspace) {
        Some((dir, access)) => (dir.to_path_buf(), run_inputs::access(access) == Access::Ro),
        None => match &args.workspace {
            Some(dir) => (dir.clone(), false),
            None => (std::env::current_dir().map_err(RunError::CurrentDir)?, false),
        },
    };
    check_dir("--workspace", &workspace)?;
    if let Some(home) = &args.home {
        check_dir("--home", home)?;
    }
    let mut config = InstanceConfig::new(name, run_id, workspace);
    config.workspace_read_only = read_only;
    config.home = args.home.clone();
    config.user = cl.user.clone();
    config.image = args.provider.image.clone();
    config.network = match args.network {
        NetworkArg::None => return Err(CmdError::NetworkNone),
        _ => tuixiu_sandbox::launcher::run::network(args)?,
    };
    if config.network == Network::Proxied {
        config.egress = Some(tuixiu_sandbox::launcher::run::egress_policy(&args.egress)?);
    }
    config.hostname = args.hostname.clone();
    config.limits = limits(args)?;
    for op in extra_mounts(args, &cl.given) {
        config.mounts.push(match op {
            MountOp::Bind { src, dst, access } => Mount::Bind { src, dst, access },
            MountOp::Tmpfs { dst, .. } => Mount::Tmpfs { dst },
            other => return Err(CmdError::MountUnsupported(other.dst().to_string())),
        });
    }
    Ok(config)
}

/// Lands a manifest in the host directories behind a docker instance's
/// volumes, before its container starts (or before the process runs in a
/// reused one):
///
/// * bindMount items become binds of the container (`config.mounts`), at
///   the item's guest path; the WORKSPACE "." bind already chose the
///   workspace (`instance_config`);
/// * the home and, when an item targets SCRATCH, a scratch directory at
///   `/scratch` are made by the provider and bound (`prepare_volumes`);
/// * copy, writeFile, downloadExtract and checkout items are written by the
///   applier straight into those host directories, in manifest order, as
///   the container's user (`as_container_user`), so the agent owns them.
///
/// Unlike the native sandbox, where binds are attached at their turn, the
/// container's binds exist from its start: an item written into a path
/// that a later bind covers is hidden, as it would be natively, but an item
/// written *into* a bound directory lands in the volume below the bind.
/// For a reused instance, binds are those of its creation.
fn land_manifest_in_volumes(
    cl: &CommandLine<'_>,
    provider: &DockerProvider,
    plan: Plan,
    config: &mut InstanceConfig,
) -> Result<Volumes, CmdError> {
    let layout = Layout::new(config.user.home.clone());
    for (_, planned, host, access) in plan.binds() {
        config.mounts.push(Mount::Bind {
            src: host.canonical.clone(),
            dst: layout.guest(planned.item.target.root, &planned.item.target.path),
            access: run_inputs::access(access),
        });
    }
    let volumes = provider.prepare_volumes(config, plan.uses(Root::Scratch))?;
    let options = run_inputs::fetch_options(&plan, cl.args, &cl.given, &cl.init_env)?;
    let mut audit = run_inputs::open_audit(cl.args)?;
    let roots = landed::Roots::open(&volumes.workspace, &volumes.home, volumes.scratch.as_deref())
        .map_err(|e| ProviderError::File { op: "open", path: e.dir, source: e.source })?;
    // A named instance is landed into again at every run: never over what
    // its commands did (docs/manifest.md, "Landing again"). Its first
    // landing (no records yet) lands everything, as a plain `run` does.
    let named = cl.args.provider.instance_name.is_some();
    let records_file = provider.landed_file(&config.name);
    let recorded = if named { landed::read_records(&records_file)? } else { None };
    let selection = recorded.as_ref().map(|r| landed::select(&plan.manifest(), r, &roots));
    let to_land = match &selection {
        Some(s) => plan.only(&s.land),
        None => plan.clone(),
    };
    let landing_now = to_land.manifest();
    let fetched = to_land.fetch(&options)?;
    let mut dest = roots.host_dirs(layout.clone());
    let apply_options = run_inputs::apply_options(cl.args);
    let landing =
        as_container_user(config, || inputs::apply(&fetched, &mut dest, &apply_options, &mut audit));
    drop(fetched);
    if named {
        let before = recorded.unwrap_or_default();
        let (now, failed) = landed::record(&landing_now, &before, &roots);
        for (id, e) in failed {
            tracing::warn!("item {id}: fingerprint: {e}");
        }
        let mut records = selection.as_ref().map(|s| s.keep.clone()).unwrap_or_default();
        records.extend(now);
        landed::write_records(&records_file, &records)?;
    }
    if let Some(s) = selection {
        let aside = (!s.aside.items.is_empty()).then(|| {
            let dir = provider.incoming_dir(&config.name);
            landed::land_aside(plan.only(&s.aside), &options, layout.clone(), &dir).map(|()| dir)
        });
        for item in &s.left_alone {
            eprintln!("tuixiu-sandbox: {}", item.report(&layout, aside.as_ref()));
        }
    }
    landing?;
    Ok(volumes)
}

fn limits(args: &RunArgs) -> Result<Limits, RunError> {
    let l = &args.provider.limits;
    let memory = match &l.memory {
        Some(text) => Some(parse_size(text).map_err(|source| RunError::Limit { flag: "--memory", source })?),
        None => None,
    };
    Ok(Limits { cpus: l.cpus, memory, pids: l.pids })
}

/// The run id of a new instance: `--run-id`, else the name without the
/// prefix when that is a valid id, else the whole name.
fn run_id_for(args: &RunArgs, name: &str, prefix: &str) -> Result<String, NameError> {
    let id = match &args.provider.run_id {
        Some(id) => id.clone(),
        None => match name.strip_prefix(prefix) {
            Some(rest) if names::validate_run_id(rest).is_ok() => rest.to_string(),
            _ => name.to_string(),
        },
    };
    names::validate_run_id(&id)?;
    Ok(id)
}

fn current_thread_runtime() -> Result<tokio::runtime::Runtime, CmdError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CmdError::Runtime)
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => EXIT_TOOL_ERROR,
    }
}

fn run_native(
    cl: &CommandLine<'_>,
    state_dir: &std::path::Path,
    prefix: &str,
    process: &ProcessSpec,
) -> Result<u8, CmdError> {
    let (args, matches) = (cl.args, cl.matches);
    let Some(name) = &args.provider.instance_name else {
        if args.provider.image.is_some() {
            return Err(CmdError::NativeImage);
        }
        return Err(CmdError::NativeRunId);
    };
    let provider = NativeProvider::with_current_exe(state_dir, prefix)?;
    provider.check_name(name)?;
    let mut config = instance_config(cl, name, &run_id_for(args, name, prefix)?)?;
    config.host_ids = args.host_ids()?;
    provider.ensure_blocking(&config)?;
    let mut spec = provider.spec_for(name, process)?;
    spec.new_session = !args.keep_session;
    let forget = provider.track_self(name)?;
    let egress = match provider.egress_policy(name)? {
        Some(policy) => Some(
            tuixiu_sandbox::egress::spawn_for_run(policy, Some(provider.egress_counts_file(name)))
                .map_err(RunError::EgressProxy)?,
        ),
        None => None,
    };
    let egress_fd = egress.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let code = launch_and_report(&spec, matches.get_one::<i32>("json_status_fd").copied(), egress_fd);
    forget();
    Ok(code)
}

fn run_docker(
    cl: CommandLine<'_>,
    state_dir: &std::path::Path,
    prefix: &str,
    process: &ProcessSpec,
) -> Result<u8, CmdError> {
    let args = cl.args;
    let provider = DockerProvider::new(&args.provider.options.container_cli, state_dir, prefix)?;
    let cli = provider.cli().to_string();
    match &args.provider.instance_name {
        Some(name) => {
            provider.check_name(name)?;
            let mut config = instance_config(&cl, name, &run_id_for(args, name, prefix)?)?;
            let volumes = match cl.plan.clone() {
                Some(plan) => Some(land_manifest_in_volumes(&cl, &provider, plan, &mut config)?),
                None => None,
            };
            current_thread_runtime()?.block_on(provider.ensure(&config))?;
            drop(volumes);
            let (cmd, env_fd, exec_id) = provider.exec_command(name, process, &config.user.home)?;
            // `docker exec` does not forward signals: deliver them inside
            // the container, to every process of this exec.
            let status = relay::run(cmd, |child, received| {
                let killed = docker::kill_command(&cli, name, None, &exec_id, received.signal)
                    .stderr(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !killed {
                    relay::signal_child(child, received.signal);
                }
            })
            .map_err(|source| CmdError::CliSpawn { cli: cli.clone(), source })?;
            drop(env_fd);
            check_engine_after(&cli, Some(name), status)?;
            Ok(exit_code(status))
        }
        None => {
            let name = provider.one_off_name();
            let run_id = match &args.provider.run_id {
                Some(id) => id.clone(),
                None => name.strip_prefix(prefix).unwrap_or(&name).to_string(),
            };
            let mut config = instance_config(&cl, &name, &run_id)?;
            let volumes = match cl.plan.clone() {
                Some(plan) => match land_manifest_in_volumes(&cl, &provider, plan, &mut config) {
                    Ok(volumes) => Some(volumes),
                    Err(e) => {
                        // Nothing started: take back the host files made so far.
                        let _ = std::fs::remove_dir_all(state_dir.join("docker").join(&name));
                        return Err(e);
                    }
                },
                None => None,
            };
            let (cmd, memfds, files) = provider.run_once_command(&config, process)?;
            drop(volumes);
            // `docker run` forwards the signals it receives to the
            // container (sig-proxy); a terminal's ^C reached it already.
            let status = relay::run(cmd, |child, received| {
                if !received.from_terminal {
                    relay::signal_child(child, received.signal);
                }
            });
            drop(memfds);
            files.remove();
            let status = status.map_err(|source| CmdError::CliSpawn { cli: cli.clone(), source })?;
            check_engine_after(&cli, None, status)?;
            Ok(exit_code(status))
        }
    }
}

/// After the container CLI returned, the engine must still be there (and,
/// for an instance, its container run): otherwise the CLI's status and the
/// output so far are what a broken stream left, and the run fails (125)
/// saying so (`engine_check.rs`).
fn check_engine_after(
    cli: &str,
    instance: Option<&str>,
    status: std::process::ExitStatus,
) -> Result<(), CmdError> {
    super::engine_check::engine_still_there(cli, instance).map_err(|source: EngineError| {
        CmdError::EngineLost { cli: cli.to_string(), source, status: exit_code(status) }
    })
}

fn run_host(
    cl: &CommandLine<'_>,
    state_dir: &std::path::Path,
    prefix: &str,
    process: &ProcessSpec,
) -> Result<u8, CmdError> {
    let args = cl.args;
    let provider = HostProvider::new(state_dir, prefix, args.provider.i_know_there_is_no_isolation)?;
    provider.check_acknowledged()?;
    let mut cmd: Command = match &args.provider.instance_name {
        Some(name) => {
            provider.check_name(name)?;
            let config = instance_config(cl, name, &run_id_for(args, name, prefix)?)?;
            provider.ensure_blocking(&config)?;
            provider.track_self(name)?;
            provider.command_for(name, process)?
        }
        None => {
            let config = instance_config(cl, "", "-")?;
            host::check_supported(&config)?;
            let home: PathBuf = match &config.home {
                Some(home) => home.clone(),
                None => provider.default_home()?,
            };
            host::command(&config.workspace, &home, &config.user, &[], process)?
        }
    };
    tracing::warn!("{}", host::WARNING);
    // The command replaces this process: its exit status is ours, and
    // signals reach it directly.
    let e = cmd.exec();
    report_error(format!("{}: {}", process.argv[0], sandbox::error::io_error_text(&e)));
    Ok(if e.kind() == std::io::ErrorKind::NotFound {
        sandbox::EXIT_NOT_FOUND
    } else {
        sandbox::EXIT_CANNOT_EXECUTE
    })
}
