//! The launcher's own parser for the common `run` command line.
//!
//! clap builds its whole command (some fifty options with their help texts)
//! before it looks at the first argument: about 0.15 ms and two dozen page
//! faults of a 3 ms sandbox start. This parser takes only the usual forms —
//! long options with their value after `=` or as the next argument, `-v`,
//! `--`, then the command — and yields exactly what clap yields for them
//! (the tests compare both on many command lines). For anything else
//! (help, other short options, an unknown or repeated option, a value clap
//! might read differently) it returns `None` and clap parses the command
//! line, with its own messages. An option added to [`RunArgs`] later is
//! unknown here until it is added, so it goes to clap meanwhile.

use std::ffi::OsString;
use std::path::PathBuf;

use super::args::{
    EgressArgs, EnvArgs, InputArgs, LandlockArg, LimitArgs, MountFlag, NestedArg, NetworkArg, PlanArgs,
    ProcArg, ProviderArg, ProviderOptions, RunArgs, RunGiven, RunProviderArgs,
};
use super::units::parse_size;

/// Parses the arguments after `run`: the parsed options, what the command
/// line said beyond them, and the count of `-v` flags; `None` when clap must.
pub fn parse_run(args: &[OsString]) -> Option<(RunArgs, RunGiven, u8)> {
    let mut p = Parsed::default();
    let mut given = RunGiven::default();
    let mut verbose = 0u8;
    let mut command: Vec<String> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.to_str()?;
        if arg == "--" {
            command = strings(rest)?;
            break;
        }
        if !arg.starts_with('-') {
            command = std::iter::once(arg.to_string()).chain(strings(rest)?).collect();
            break;
        }
        if let Some(n) = super::verbose_flag(arg) {
            verbose = verbose.saturating_add(n);
            continue;
        }
        let body = arg.strip_prefix("--")?;
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        // The option's value: after `=`, or the next argument. Empty values
        // and values that look like options are left to clap.
        let mut value = || -> Option<String> {
            let v = match inline {
                Some(v) => v,
                None => rest.next()?.to_str()?,
            };
            (!v.is_empty() && !v.starts_with('-')).then(|| v.to_string())
        };
        option(&mut p, &mut given, name, inline.is_some(), &mut value)?;
    }
    // clap's checks: a command is required; --kill-after requires --timeout.
    if command.is_empty() || (p.kill_after.is_some() && p.timeout.is_none()) {
        return None;
    }
    let args = p.into_run_args(command)?;
    Some((args, given, verbose))
}

/// One `--name[=value]` option of `run` into `p`; `inline`: its value came
/// after `=`. `None` when clap must parse the line.
///
/// One arm per option, kept whole: it reads as the table of `run`'s options.
fn option(
    p: &mut Parsed,
    given: &mut RunGiven,
    name: &str,
    inline: bool,
    value: &mut impl FnMut() -> Option<String>,
) -> Option<()> {
    match name {
        "workspace" => once(&mut p.workspace, value().map(PathBuf::from)?)?,
        "home" => once(&mut p.home, value().map(PathBuf::from)?)?,
        "user" => {
            once(&mut p.user, value()?)?;
            given.user = true;
        }
        "uid" => once(&mut p.uid, number(&value()?)?)?,
        "gid" => once(&mut p.gid, number(&value()?)?)?,
        "home-path" => once(&mut p.home_path, value()?)?,
        "chdir" => once(&mut p.chdir, value()?)?,
        "ro-bind" | "bind" if !inline => {
            let (src, dst) = (value()?, value()?);
            let (list, flag) = if name == "bind" {
                (&mut p.bind, MountFlag::Bind)
            } else {
                (&mut p.ro_bind, MountFlag::RoBind)
            };
            list.extend([src, dst]);
            given.mount_order.push(flag);
        }
        "tmpfs" => {
            p.tmpfs.push(value()?);
            given.mount_order.push(MountFlag::Tmpfs);
        }
        "tmpfs-size" => once(&mut p.tmpfs_size, value()?)?,
        "env" => p.env.push(value()?),
        "pass-env" => p.pass_env.push(value()?),
        "network" => once(
            &mut p.network,
            choice(
                &value()?,
                &[("on", NetworkArg::On), ("off", NetworkArg::Off), ("none", NetworkArg::None)],
            )?,
        )?,
        "seccomp" => once(&mut p.seccomp, value()?)?,
        "allow-ptrace" if !inline => flag(&mut p.allow_ptrace)?,
        "landlock" => once(
            &mut p.landlock,
            choice(
                &value()?,
                &[
                    ("off", LandlockArg::Off),
                    ("best-effort", LandlockArg::BestEffort),
                    ("require", LandlockArg::Require),
                ],
            )?,
        )?,
        "nofile" => once(&mut p.nofile, number(&value()?)?)?,
        "timeout" => once(&mut p.timeout, value()?)?,
        "kill-after" => once(&mut p.kill_after, value()?)?,
        "hostname" => once(&mut p.hostname, value()?)?,
        "proc" => once(
            &mut p.proc,
            choice(
                &value()?,
                &[("fresh", ProcArg::Fresh), ("bind", ProcArg::Bind), ("auto", ProcArg::Auto)],
            )?,
        )?,
        "map-uid" => {
            once(&mut p.map_uid, number(&value()?)?)?;
            given.map_ids = true;
        }
        "map-gid" => {
            once(&mut p.map_gid, number(&value()?)?)?;
            given.map_ids = true;
        }
        "json-status-fd" => once(&mut p.json_status_fd, number(&value()?)?)?,
        "keep-session" if !inline => flag(&mut p.keep_session)?,
        "nested" => {
            once(&mut p.nested, choice(&value()?, &[("on", NestedArg::On), ("off", NestedArg::Off)])?)?
        }
        "nested-userns" => {
            once(&mut p.nested_userns, choice(&value()?, &[("on", NestedArg::On), ("off", NestedArg::Off)])?)?
        }
        "env-file" => p.env_file.push(value().map(PathBuf::from)?),
        "env-allow" => p.env_allow.push(value()?),
        "no-default-env-allow" if !inline => flag(&mut p.no_default_env_allow)?,
        "memory" => once(&mut p.memory, value()?)?,
        "pids" => once(&mut p.pids, number(&value()?)?)?,
        "cpus" => once(&mut p.cpus, cpus(&value()?)?)?,
        _ => return None,
    }
    Some(())
}

/// The value of a closed choice (`--network on`), `None` for any other.
fn choice<T: Copy>(value: &str, table: &[(&str, T)]) -> Option<T> {
    table.iter().find(|(name, _)| *name == value).map(|(_, v)| *v)
}

/// Options as given; `None`/empty for those that were not.
#[derive(Default)]
struct Parsed {
    workspace: Option<PathBuf>,
    home: Option<PathBuf>,
    user: Option<String>,
    uid: Option<u32>,
    gid: Option<u32>,
    home_path: Option<String>,
    chdir: Option<String>,
    ro_bind: Vec<String>,
    bind: Vec<String>,
    tmpfs: Vec<String>,
    tmpfs_size: Option<String>,
    env: Vec<String>,
    pass_env: Vec<String>,
    network: Option<NetworkArg>,
    seccomp: Option<String>,
    allow_ptrace: bool,
    landlock: Option<LandlockArg>,
    nofile: Option<u64>,
    timeout: Option<String>,
    kill_after: Option<String>,
    hostname: Option<String>,
    proc: Option<ProcArg>,
    map_uid: Option<u32>,
    map_gid: Option<u32>,
    json_status_fd: Option<i32>,
    keep_session: bool,
    nested: Option<NestedArg>,
    nested_userns: Option<NestedArg>,
    env_file: Vec<PathBuf>,
    env_allow: Vec<String>,
    no_default_env_allow: bool,
    memory: Option<String>,
    pids: Option<u64>,
    cpus: Option<f64>,
}

impl Parsed {
    /// The [`RunArgs`] clap makes of the same command line: its defaults for
    /// everything not given (the `default_value`s of args.rs, and the
    /// environment variables some options read).
    fn into_run_args(self, command: Vec<String>) -> Option<RunArgs> {
        Some(RunArgs {
            workspace: self.workspace,
            home: self.home,
            user: self.user.unwrap_or_else(|| "agent".into()),
            uid: self.uid.unwrap_or(1000),
            gid: self.gid,
            home_path: self.home_path,
            chdir: self.chdir,
            ro_bind: self.ro_bind,
            bind: self.bind,
            tmpfs: self.tmpfs,
            tmpfs_size: self.tmpfs_size,
            env: self.env,
            pass_env: self.pass_env,
            network: self.network.unwrap_or(NetworkArg::On),
            egress: EgressArgs::default(),
            seccomp: self.seccomp.unwrap_or_else(|| "default".into()),
            allow_ptrace: self.allow_ptrace,
            landlock: self.landlock.unwrap_or(LandlockArg::BestEffort),
            nofile: self.nofile,
            timeout: self.timeout,
            kill_after: self.kill_after.unwrap_or_else(|| "5s".into()),
            hostname: self.hostname.unwrap_or_else(|| "sandbox".into()),
            proc: self.proc.unwrap_or(ProcArg::Auto),
            map_uid: self.map_uid,
            map_gid: self.map_gid,
            json_status_fd: self.json_status_fd,
            keep_session: self.keep_session,
            nested: self.nested.unwrap_or(NestedArg::On),
            nested_userns: self.nested_userns.unwrap_or(NestedArg::On),
            manifest: None,
            plan: PlanArgs { allow_host_path: Vec::new(), inputs_base_url: None },
            inputs: InputArgs {
                inputs_token_file: None,
                inputs_cache: None,
                download_timeout: 60.0,
                download_max_bytes: parse_size("200M").ok()?,
                zip_max_entries: 5000,
                zip_max_file_bytes: parse_size("20M").ok()?,
                zip_max_total_bytes: parse_size("100M").ok()?,
                checkout_timeout: 300.0,
                audit_log: None,
            },
            env_pipeline: EnvArgs {
                env_file: self.env_file,
                env_allow: self.env_allow,
                no_default_env_allow: self.no_default_env_allow,
            },
            command,
            provider: RunProviderArgs {
                provider: ProviderArg::Native,
                image: None,
                instance_name: None,
                run_id: None,
                i_know_there_is_no_isolation: false,
                limits: LimitArgs { cpus: self.cpus, memory: self.memory, pids: self.pids },
                options: ProviderOptions {
                    container_cli: match env("TUIXIU_CONTAINER_CLI")? {
                        None => "docker".into(),
                        Some(cli) if ["docker", "podman", "nerdctl"].contains(&cli.as_str()) => cli,
                        Some(_) => return None,
                    },
                    state_dir: env("TUIXIU_STATE_DIR")?.map(PathBuf::from),
                    instance_prefix: env("TUIXIU_INSTANCE_PREFIX")?
                        .unwrap_or_else(|| crate::provider::DEFAULT_INSTANCE_PREFIX.into()),
                },
            },
        })
    }
}

/// An option clap reads from the environment too: `Some(None)` when unset;
/// `None` (leave it to clap) when set but empty or not UTF-8.
fn env(key: &str) -> Option<Option<String>> {
    match std::env::var_os(key) {
        None => Some(None),
        Some(v) => v.into_string().ok().filter(|v| !v.is_empty()).map(Some),
    }
}

/// Sets a single-valued option; a second occurrence is clap's error to report.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.is_none().then(|| *slot = Some(value))
}

fn flag(slot: &mut bool) -> Option<()> {
    (!*slot).then(|| *slot = true)
}

/// Plain decimal digits only: clap's integer parsers accept a few more
/// spellings (a sign), which it may as well read itself.
fn number<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.bytes().all(|b| b.is_ascii_digit()) { s.parse().ok() } else { None }
}

fn cpus(s: &str) -> Option<f64> {
    let plain =
        s.bytes().all(|b| b.is_ascii_digit() || b == b'.') && s.bytes().filter(|&b| b == b'.').count() <= 1;
    if plain { s.parse().ok() } else { None }
}

fn strings<'a>(args: impl Iterator<Item = &'a OsString>) -> Option<Vec<String>> {
    args.map(|a| a.to_str().map(String::from)).collect()
}

#[cfg(test)]
mod tests {
    use clap::{Arg, ArgAction, Args, Command, FromArgMatches};

    use super::*;

    /// What the launcher's clap path makes of `run ARGS...` (as main.rs).
    fn clap_parse(args: &[&str]) -> Option<(String, RunGiven, u8)> {
        let command = RunArgs::augment_args(
            Command::new("run").arg(Arg::new("verbose").short('v').long("verbose").action(ArgAction::Count)),
        );
        let matches =
            command.try_get_matches_from(std::iter::once("run").chain(args.iter().copied())).ok()?;
        let parsed = RunArgs::from_arg_matches(&matches).ok()?;
        Some((format!("{parsed:?}"), RunGiven::from_matches(&matches), matches.get_count("verbose")))
    }

    fn fast_parse(args: &[&str]) -> Option<(String, RunGiven, u8)> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse_run(&args).map(|(parsed, given, verbose)| (format!("{parsed:?}"), given, verbose))
    }

    /// Command lines the fast path must take, each yielding clap's result.
    const TAKEN: &[&[&str]] = &[
        &["--", "true"],
        &["true"],
        &["sh", "-c", "id; pwd", "--workspace", "x"],
        &["--workspace", "/tmp/ws", "--", "/bin/true"],
        &["--workspace=/tmp/ws", "--home", "/tmp/h", "--", "codex-acp", "--flag"],
        &["-v", "--user", "agent", "--uid", "1000", "--gid", "100", "--", "id"],
        &[
            "-vv",
            "--verbose",
            "--user=bob",
            "--home-path",
            "/home/b",
            "--chdir",
            "/workspace/sub",
            "--",
            "ls",
        ],
        &["--ro-bind", "/a", "/b", "--tmpfs", "/t", "--bind", "/c", "/d", "--ro-bind", "/e", "/f", "--", "x"],
        &["--tmpfs=/t1", "--tmpfs", "/t2", "cmd"],
        &["--tmpfs-size", "64M", "--tmpfs", "/t", "--", "x"],
        &["--tmpfs-size=2G", "x"],
        &["--env", "A=1", "--env=B=2", "--pass-env", "TERM", "--pass-env=HOME", "--", "env"],
        &["--network", "off", "--seccomp", "strict", "--allow-ptrace", "--landlock", "require", "--", "x"],
        &["--network=none", "--landlock=off", "--seccomp=unconfined", "x"],
        &["--nofile", "1024", "--timeout", "30s", "--kill-after", "2s", "--hostname", "box", "--", "x"],
        &["--timeout=1m", "--", "x"],
        &["--proc", "bind", "--", "x"],
        &["--proc=fresh", "x"],
        &["--map-uid", "1234", "--", "x"],
        &["--map-gid=99", "--json-status-fd", "3", "--keep-session", "--", "x"],
        &["--nested", "off", "--", "x"],
        &["--nested=on", "x"],
        &["--env-file", "/e1", "--env-file=/e2", "--env-allow", "K", "--no-default-env-allow", "--", "x"],
        &["--memory", "512m", "--pids", "100", "--cpus", "1.5", "--", "x"],
        &["--cpus=2", "--memory=1G", "x", "--memory", "2G"],
        &["--user", "agent", "--", "x"],
        &["--", "--not-an-option"],
    ];

    /// Command lines left to clap (errors, help, options this parser does not take).
    const LEFT: &[&[&str]] = &[
        &[],
        &["--"],
        &["--help"],
        &["-h"],
        &["--version"],
        &["--workspace"],
        &["--workspace", "--", "x"],
        &["--workspace=", "x"],
        &["--uid", "-1", "x"],
        &["--uid", "+5", "x"],
        &["--uid", "x1", "x"],
        &["--uid", "1", "--uid", "2", "x"],
        &["--keep-session", "--keep-session", "x"],
        &["--keep-session=true", "x"],
        &["--tmpfs-size", "1G", "--tmpfs-size", "2G", "x"],
        &["--network", "OFF", "x"],
        &["--landlock", "maybe", "x"],
        &["--proc", "host", "x"],
        &["--nested", "maybe", "x"],
        &["--kill-after", "3s", "x"],
        &["--ro-bind", "/a", "x"],
        &["--ro-bind=/a", "/b", "x"],
        &["--manifest", "m.json", "x"],
        &["--provider", "docker", "x"],
        &["--instance-name", "n", "x"],
        &["--state-dir", "/s", "x"],
        &["--cpus", "1e3", "x"],
        &["-x", "x"],
        &["-vx", "x"],
        &["-", "x"],
        &["--unknown", "x"],
    ];

    #[test]
    fn the_fast_path_takes_common_command_lines_and_agrees_with_clap() {
        for args in TAKEN {
            let fast = fast_parse(args).unwrap_or_else(|| panic!("fast path declined {args:?}"));
            let clap = clap_parse(args).unwrap_or_else(|| panic!("clap rejected {args:?}"));
            assert_eq!(fast, clap, "for {args:?}");
        }
    }

    #[test]
    fn other_command_lines_go_to_clap() {
        for args in LEFT {
            assert_eq!(fast_parse(args), None, "fast path took {args:?}");
        }
    }

    #[test]
    fn mount_options_keep_their_order() {
        let args = ["--tmpfs", "/t", "--bind", "/a", "/b", "--ro-bind", "/c", "/d", "--tmpfs", "/u", "x"];
        let (_, given, _) = fast_parse(&args).unwrap();
        use MountFlag::*;
        assert_eq!(given.mount_order, [Tmpfs, Bind, RoBind, Tmpfs]);
        assert_eq!(Some(given), clap_parse(&args).map(|(_, g, _)| g));
    }
}
