//! The argument vectors given to the container CLI. Pure functions of
//! validated input, so they can be tested without an engine.
//!
//! Every value is passed in the `--flag=value` form and every positional
//! argument comes after `--`, so no value (a name, a path, a label) can
//! ever be read as a flag, even one that starts with `-`.

use std::path::Path;

use sandbox::{Access, Network};

use super::super::{InstanceConfig, Limits, Mount};

pub const LABEL_MANAGED: &str = "acp-proxy.managed";
pub const LABEL_RUN_ID: &str = "acp-proxy.run_id";
pub const LABEL_AGENT_MODE: &str = "acp-proxy.agent_mode";
/// Our containers run a keeper as their main process and the agent through
/// `exec`. The Node proxy's `entrypoint` containers run the agent as the
/// main process instead; they are listed and can be stopped and removed,
/// but not reused.
pub const AGENT_MODE_EXEC: &str = "exec";
/// The variable that marks every process of one exec, so a kill can find
/// them inside the container.
pub const EXEC_MARKER: &str = "TUIXIU_EXEC_ID";

/// The main process of an instance container: waits forever, exits at
/// once on SIGTERM (so `docker stop` is quick) and reaps orphans.
pub const KEEPER_SCRIPT: &str = "trap 'exit 0' TERM INT HUP; while :; do sleep 86400 & wait $!; done";
/// Runs the command as `exec "$@"`, so `sh` reports 127 for a command that
/// is not found and 126 for one that cannot be executed, as the native
/// provider does (the engine itself says 126 for both).
pub const EXEC_WRAPPER: &str = "exec \"$@\"";
/// Signals every process whose initial environment has the exec marker.
/// `$1` = marker value, `$2` = signal number. Fails when none was found.
/// The pids are collected first and signalled by one `kill`, so a child
/// that dies first cannot let its parent run on before the parent is hit.
/// (`environ` is NUL-separated; busybox grep would stop at the first NUL.)
pub const KILL_SCRIPT: &str = "pids=; for d in /proc/[0-9]*; do p=${d#/proc/}; \
     [ \"$p\" = \"$$\" ] && continue; \
     if tr '\\0' '\\n' < \"$d/environ\" 2>/dev/null | grep -qxF \"TUIXIU_EXEC_ID=$1\"; then pids=\"$pids $p\"; fi; \
     done; [ -n \"$pids\" ] || exit 1; kill -\"$2\" $pids 2>/dev/null; exit 0";

/// Host paths an instance container is built from.
pub struct InstancePaths<'a> {
    pub workspace: &'a Path,
    /// Host home, bound at the user's home; `None`: a private tmpfs.
    pub home: Option<&'a Path>,
    pub passwd: &'a Path,
    pub group: &'a Path,
    /// The seccomp profile (`sandbox::seccomp::engine_profile`, in a file
    /// the CLI reads: `/dev/fd/N`).
    pub seccomp: &'a str,
}

/// The options shared by `run -d` (instances) and `run --rm` (one-off).
fn run_options(config: &InstanceConfig, paths: &InstancePaths<'_>, env_file: &str, cwd: &str) -> Vec<String> {
    let user = &config.user;
    let mut args = vec![
        "--init".to_string(),
        format!("--name={}", config.name),
        format!("--label={LABEL_MANAGED}=1"),
        format!("--label={LABEL_RUN_ID}={}", config.run_id),
        format!("--label={LABEL_AGENT_MODE}={AGENT_MODE_EXEC}"),
        format!("--hostname={}", config.hostname),
        format!("--user={}:{}", user.uid, user.gid),
        format!("--workdir={cwd}"),
        bind(
            paths.workspace,
            sandbox::WORKSPACE,
            if config.workspace_read_only { Access::Ro } else { Access::Rw },
        ),
    ];
    match paths.home {
        Some(home) => args.push(bind(home, &user.home, Access::Rw)),
        None => args.push(format!("--tmpfs={}:uid={},gid={},mode=0700", user.home, user.uid, user.gid)),
    }
    args.push(bind(paths.passwd, "/etc/passwd", Access::Ro));
    args.push(bind(paths.group, "/etc/group", Access::Ro));
    for mount in &config.mounts {
        args.push(match mount {
            Mount::Bind { src, dst, access } => bind(src, dst, *access),
            Mount::Tmpfs { dst } => format!("--tmpfs={dst}:uid={},gid={},mode=0755", user.uid, user.gid),
        });
    }
    // What must not show: covered where a bind would show it (a
    // container sees no host directory but its binds).
    let binds: Vec<(&std::path::Path, &str)> = config
        .mounts
        .iter()
        .filter_map(|m| match m {
            Mount::Bind { src, dst, .. } => Some((src.as_path(), dst.as_str())),
            Mount::Tmpfs { .. } => None,
        })
        .collect();
    let covers = sandbox::guest_path::covers(&config.hidden, &binds);
    for dst in covers {
        args.push(format!("--tmpfs={dst}:ro,mode=0555"));
    }
    if config.network == Network::Off {
        args.push("--network=none".into());
    }
    args.extend(limit_options(&config.limits));
    // The user is not root; these keep it that way (no setuid gains, no
    // capabilities even for a uid-0 user).
    args.push("--cap-drop=ALL".into());
    args.push("--security-opt=no-new-privileges".into());
    // The runtime's default profile, whose rules also keep set-uid and
    // set-gid bits off every file the container writes (the engine's own
    // profile lets them be set, and a host directory keeps them).
    args.push(format!("--security-opt=seccomp={}", paths.seccomp));
    args.push(format!("--env-file={env_file}"));
    args
}

fn limit_options(limits: &Limits) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(cpus) = limits.cpus {
        args.push(format!("--cpus={cpus}"));
    }
    if let Some(memory) = limits.memory {
        args.push(format!("--memory={memory}"));
    }
    if let Some(pids) = limits.pids {
        args.push(format!("--pids-limit={pids}"));
    }
    args
}

/// `--mount=type=bind,...`. Paths were checked to hold no `,` or `"` (the
/// value is parsed as CSV).
fn bind(src: &Path, dst: &str, access: Access) -> String {
    let mut arg = format!("--mount=type=bind,source={},target={dst}", src.display());
    if access == Access::Ro {
        arg.push_str(",readonly");
    }
    arg
}

/// `run -d ...`: creates and starts an instance container with the keeper.
pub fn create(
    config: &InstanceConfig,
    paths: &InstancePaths<'_>,
    image: &str,
    env_file: &str,
) -> Vec<String> {
    let mut args = vec!["run".to_string(), "-d".to_string()];
    args.extend(run_options(config, paths, env_file, sandbox::WORKSPACE));
    args.extend(["--".to_string(), image.to_string(), "sh".into(), "-c".into(), KEEPER_SCRIPT.into()]);
    args
}

/// `run --rm -i ...`: one command in a throw-away container (the CLI's
/// `run` without `--instance-name`).
pub fn run_once(
    config: &InstanceConfig,
    paths: &InstancePaths<'_>,
    image: &str,
    env_file: &str,
    cwd: &str,
    argv: &[String],
) -> Vec<String> {
    let mut args = vec!["run".to_string(), "--rm".to_string(), "-i".to_string()];
    args.extend(run_options(config, paths, env_file, cwd));
    args.push("--".into());
    args.push(image.into());
    args.extend(argv.iter().cloned());
    args
}

/// `exec -i ...`: a process in a running instance container.
pub fn exec(name: &str, env_file: &str, cwd: &str, argv: &[String]) -> Vec<String> {
    let mut args = vec![
        "exec".to_string(),
        "-i".to_string(),
        format!("--workdir={cwd}"),
        format!("--env-file={env_file}"),
        "--".to_string(),
        name.to_string(),
        "sh".to_string(),
        "-c".to_string(),
        EXEC_WRAPPER.to_string(),
        "sh".to_string(),
    ];
    args.extend(argv.iter().cloned());
    args
}

/// `exec ... sh -c KILL_SCRIPT`: signals the processes of one exec.
pub fn kill(name: &str, user: Option<&str>, exec_id: &str, signal: i32) -> Vec<String> {
    let mut args = vec!["exec".to_string()];
    if let Some(user) = user {
        args.push(format!("--user={user}"));
    }
    args.extend([
        "--".to_string(),
        name.to_string(),
        "sh".into(),
        "-c".into(),
        KILL_SCRIPT.into(),
        "sh".into(),
        exec_id.to_string(),
        signal.to_string(),
    ]);
    args
}

/// `KEY=VALUE` lines for `--env-file`. The pairs were validated (no
/// newline, no `=` in a key); a later key wins over an earlier one.
pub fn env_file(env: &[(String, String)]) -> Vec<u8> {
    let mut merged: Vec<(&str, &str)> = Vec::new();
    for (k, v) in env {
        match merged.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v,
            None => merged.push((k, v)),
        }
    }
    let mut out = Vec::new();
    for (k, v) in merged {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(b'\n');
    }
    out
}

/// The command that signals the processes of one exec inside a container.
pub fn kill_command(
    cli: &str,
    container: &str,
    user: Option<&str>,
    exec_id: &str,
    signal: i32,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(cli);
    cmd.args(kill(container, user, exec_id, signal));
    cmd.stdin(std::process::Stdio::null());
    cmd
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::provider::InstanceConfig;

    fn config() -> InstanceConfig {
        let mut c = InstanceConfig::new("tuixiu-run-r1", "r1", "/srv/ws");
        c.network = Network::Off;
        c.limits = Limits { cpus: Some(1.5), memory: Some(64 << 20), pids: Some(100) };
        c.mounts.push(Mount::Bind {
            src: PathBuf::from("/srv/data"),
            dst: "/data".into(),
            access: Access::Ro,
        });
        c.mounts.push(Mount::Tmpfs { dst: "/scratch".into() });
        c
    }

    #[test]
    fn create_argv() {
        let paths = InstancePaths {
            workspace: Path::new("/srv/ws"),
            home: Some(Path::new("/state/home")),
            passwd: Path::new("/state/etc/passwd"),
            group: Path::new("/state/etc/group"),
            seccomp: "/dev/fd/8",
        };
        let args = create(&config(), &paths, "img:1", "/dev/fd/9");
        let expect = [
            "run",
            "-d",
            "--init",
            "--name=tuixiu-run-r1",
            "--label=acp-proxy.managed=1",
            "--label=acp-proxy.run_id=r1",
            "--label=acp-proxy.agent_mode=exec",
            "--hostname=sandbox",
            "--user=1000:1000",
            "--workdir=/workspace",
            "--mount=type=bind,source=/srv/ws,target=/workspace",
            "--mount=type=bind,source=/state/home,target=/home/agent",
            "--mount=type=bind,source=/state/etc/passwd,target=/etc/passwd,readonly",
            "--mount=type=bind,source=/state/etc/group,target=/etc/group,readonly",
            "--mount=type=bind,source=/srv/data,target=/data,readonly",
            "--tmpfs=/scratch:uid=1000,gid=1000,mode=0755",
            "--network=none",
            "--cpus=1.5",
            "--memory=67108864",
            "--pids-limit=100",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--security-opt=seccomp=/dev/fd/8",
            "--env-file=/dev/fd/9",
            "--",
            "img:1",
            "sh",
            "-c",
            KEEPER_SCRIPT,
        ];
        assert_eq!(args, expect);
    }

    #[test]
    fn hidden_paths_are_covered_where_a_bind_shows_them() {
        let paths = InstancePaths {
            workspace: Path::new("/srv/data/runs/r1"),
            home: None,
            passwd: Path::new("/state/etc/passwd"),
            group: Path::new("/state/etc/group"),
            seccomp: "/dev/fd/8",
        };
        let mut c = config();
        // The bind of /srv/data shows the workspace root at /data/runs.
        c.hidden = vec![PathBuf::from("/srv/data/runs"), PathBuf::from("/elsewhere")];
        let args = create(&c, &paths, "img:1", "/dev/fd/9");
        let covers: Vec<&String> = args.iter().filter(|a| a.starts_with("--tmpfs=/data")).collect();
        assert_eq!(covers, ["--tmpfs=/data/runs:ro,mode=0555"]);
    }

    #[test]
    fn every_value_is_attached_to_its_flag() {
        let paths = InstancePaths {
            workspace: Path::new("/srv/ws"),
            home: None,
            passwd: Path::new("/p"),
            group: Path::new("/g"),
            seccomp: "/dev/fd/4",
        };
        let argv = ["--privileged".to_string()];
        let args = run_once(&config(), &paths, "img", "/dev/fd/3", "/workspace", &argv);
        let dashdash = args.iter().position(|a| a == "--").unwrap();
        // Between the subcommand and `--`: only flags, each carrying its value.
        assert_eq!(args[0], "run");
        for a in &args[1..dashdash] {
            assert!(a.starts_with('-'), "{a}");
            assert!(a == "--rm" || a == "-i" || a == "--init" || a.contains('='), "{a}");
        }
        assert_eq!(&args[dashdash + 1..], ["img", "--privileged"]);
        assert!(args.contains(&"--tmpfs=/home/agent:uid=1000,gid=1000,mode=0700".to_string()));
    }

    #[test]
    fn exec_and_kill_argv() {
        let args = exec("tuixiu-run-r1", "/dev/fd/5", "/workspace/sub", &["ls".into(), "-l".into()]);
        assert_eq!(
            args,
            [
                "exec",
                "-i",
                "--workdir=/workspace/sub",
                "--env-file=/dev/fd/5",
                "--",
                "tuixiu-run-r1",
                "sh",
                "-c",
                EXEC_WRAPPER,
                "sh",
                "ls",
                "-l"
            ]
        );
        let args = kill("tuixiu-run-r1", None, "abc", 15);
        assert_eq!(args[..3], ["exec", "--", "tuixiu-run-r1"]);
        assert_eq!(args[args.len() - 2..], ["abc", "15"]);
    }

    #[test]
    fn env_file_lines() {
        let env = vec![("A".into(), "1".into()), ("B".into(), "x y=z".into()), ("A".into(), "2".into())];
        assert_eq!(env_file(&env), b"A=2\nB=x y=z\n");
    }
}
