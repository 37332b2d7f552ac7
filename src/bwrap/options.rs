//! bubblewrap 0.11's options, as one table: the parser looks options up
//! here (name, arguments, what they do) and `--help` prints it, in
//! bubblewrap's order and layout.

/// One option of bwrap's command line.
pub struct Opt {
    pub name: &'static str,
    /// Placeholders of its arguments, as `--help` shows them; their count
    /// is the option's arity.
    pub args: &'static [&'static str],
    pub kind: Kind,
    /// `--help`'s description (a `\n` continues it on the next line).
    pub help: &'static str,
    /// bubblewrap's message when arguments are missing, where it is not
    /// the usual `takes an argument` / `takes two arguments` / ...
    pub missing: Option<&'static str>,
}

/// What an option does, for the parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Help,
    Version,
    Args,
    Argv0,
    LevelPrefix,
    UnshareAll,
    ShareNet,
    Unshare(Ns),
    /// `--userns`, `--userns2`, `--pidns`, `--sync-fd`, `--block-fd`,
    /// `--userns-block-fd`, `--info-fd`, `--json-status-fd`, `--seccomp`:
    /// one descriptor, the last one given wins.
    Fd(FdOpt),
    DisableUserns,
    AssertUsernsDisabled,
    Uid,
    Gid,
    Hostname,
    Chdir,
    Clearenv,
    Setenv,
    Unsetenv,
    LockFile,
    Bind {
        mode: BindMode,
        optional: bool,
    },
    BindFd {
        ro: bool,
    },
    RemountRo,
    OverlaySrc,
    Overlay,
    TmpOverlay,
    RoOverlay,
    Label,
    Proc,
    Dev,
    Tmpfs,
    Mqueue,
    Dir,
    File,
    BindData {
        ro: bool,
    },
    Symlink,
    AddSeccompFd,
    NewSession,
    DieWithParent,
    AsPid1,
    CapAdd,
    CapDrop,
    Perms,
    Size,
    Chmod,
    /// Ours: `--tx-seccomp PROFILE`.
    TxSeccomp,
    /// Ours: `--tx-landlock`.
    TxLandlock,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ns {
    User,
    UserTry,
    Ipc,
    Pid,
    Net,
    Uts,
    Cgroup,
    CgroupTry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdOpt {
    Userns,
    Userns2,
    Pidns,
    SyncFd,
    BlockFd,
    UsernsBlockFd,
    InfoFd,
    JsonStatusFd,
    Seccomp,
}

pub use sandbox::nested::BindMode;

const fn opt(name: &'static str, args: &'static [&'static str], kind: Kind, help: &'static str) -> Opt {
    Opt { name, args, kind, help, missing: None }
}

const fn opt_msg(
    name: &'static str,
    args: &'static [&'static str],
    kind: Kind,
    help: &'static str,
    missing: &'static str,
) -> Opt {
    Opt { name, args, kind, help, missing: Some(missing) }
}

const FD: &[&str] = &["FD"];
const DEST: &[&str] = &["DEST"];
const SRC_DEST: &[&str] = &["SRC", "DEST"];
const FD_DEST: &[&str] = &["FD", "DEST"];

/// Every option of bubblewrap 0.11.1, in its `--help` order.
pub const OPTIONS: &[Opt] = &[
    opt("--help", &[], Kind::Help, "Print this help"),
    opt("--version", &[], Kind::Version, "Print version"),
    opt("--args", FD, Kind::Args, "Parse NUL-separated args from FD"),
    opt_msg(
        "--argv0",
        &["VALUE"],
        Kind::Argv0,
        "Set argv[0] to the value VALUE before running the program",
        "--argv0 takes one argument",
    ),
    opt("--level-prefix", &[], Kind::LevelPrefix, "Prepend e.g. <3> to diagnostic messages"),
    opt("--unshare-all", &[], Kind::UnshareAll, "Unshare every namespace we support by default"),
    opt(
        "--share-net",
        &[],
        Kind::ShareNet,
        "Retain the network namespace (can only combine with --unshare-all)",
    ),
    opt(
        "--unshare-user",
        &[],
        Kind::Unshare(Ns::User),
        "Create new user namespace (may be automatically implied if not setuid)",
    ),
    opt(
        "--unshare-user-try",
        &[],
        Kind::Unshare(Ns::UserTry),
        "Create new user namespace if possible else continue by skipping it",
    ),
    opt("--unshare-ipc", &[], Kind::Unshare(Ns::Ipc), "Create new ipc namespace"),
    opt("--unshare-pid", &[], Kind::Unshare(Ns::Pid), "Create new pid namespace"),
    opt("--unshare-net", &[], Kind::Unshare(Ns::Net), "Create new network namespace"),
    opt("--unshare-uts", &[], Kind::Unshare(Ns::Uts), "Create new uts namespace"),
    opt("--unshare-cgroup", &[], Kind::Unshare(Ns::Cgroup), "Create new cgroup namespace"),
    opt(
        "--unshare-cgroup-try",
        &[],
        Kind::Unshare(Ns::CgroupTry),
        "Create new cgroup namespace if possible else continue by skipping it",
    ),
    opt(
        "--userns",
        FD,
        Kind::Fd(FdOpt::Userns),
        "Use this user namespace (cannot combine with --unshare-user)",
    ),
    opt(
        "--userns2",
        FD,
        Kind::Fd(FdOpt::Userns2),
        "After setup switch to this user namespace, only useful with --userns",
    ),
    opt(
        "--disable-userns",
        &[],
        Kind::DisableUserns,
        "Disable further use of user namespaces inside sandbox",
    ),
    opt(
        "--assert-userns-disabled",
        &[],
        Kind::AssertUsernsDisabled,
        "Fail unless further use of user namespace inside sandbox is disabled",
    ),
    opt(
        "--pidns",
        FD,
        Kind::Fd(FdOpt::Pidns),
        "Use this pid namespace (as parent namespace if using --unshare-pid)",
    ),
    opt("--uid", &["UID"], Kind::Uid, "Custom uid in the sandbox (requires --unshare-user or --userns)"),
    opt("--gid", &["GID"], Kind::Gid, "Custom gid in the sandbox (requires --unshare-user or --userns)"),
    opt("--hostname", &["NAME"], Kind::Hostname, "Custom hostname in the sandbox (requires --unshare-uts)"),
    opt_msg("--chdir", &["DIR"], Kind::Chdir, "Change directory to DIR", "--chdir takes one argument"),
    opt("--clearenv", &[], Kind::Clearenv, "Unset all environment variables"),
    opt("--setenv", &["VAR", "VALUE"], Kind::Setenv, "Set an environment variable"),
    opt("--unsetenv", &["VAR"], Kind::Unsetenv, "Unset an environment variable"),
    opt("--lock-file", DEST, Kind::LockFile, "Take a lock on DEST while sandbox is running"),
    opt("--sync-fd", FD, Kind::Fd(FdOpt::SyncFd), "Keep this fd open while sandbox is running"),
    opt(
        "--bind",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Rw, optional: false },
        "Bind mount the host path SRC on DEST",
    ),
    opt(
        "--bind-try",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Rw, optional: true },
        "Equal to --bind but ignores non-existent SRC",
    ),
    opt(
        "--dev-bind",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Dev, optional: false },
        "Bind mount the host path SRC on DEST, allowing device access",
    ),
    opt(
        "--dev-bind-try",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Dev, optional: true },
        "Equal to --dev-bind but ignores non-existent SRC",
    ),
    opt(
        "--ro-bind",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Ro, optional: false },
        "Bind mount the host path SRC readonly on DEST",
    ),
    opt(
        "--ro-bind-try",
        SRC_DEST,
        Kind::Bind { mode: BindMode::Ro, optional: true },
        "Equal to --ro-bind but ignores non-existent SRC",
    ),
    opt_msg(
        "--bind-fd",
        FD_DEST,
        Kind::BindFd { ro: false },
        "Bind open directory or path fd on DEST",
        "--bind-fd takes two arguments",
    ),
    opt_msg(
        "--ro-bind-fd",
        FD_DEST,
        Kind::BindFd { ro: true },
        "Bind open directory or path fd read-only on DEST",
        "--bind-fd takes two arguments",
    ),
    opt_msg(
        "--remount-ro",
        DEST,
        Kind::RemountRo,
        "Remount DEST as readonly; does not recursively remount",
        "--remount-ro takes one argument",
    ),
    opt("--overlay-src", &["SRC"], Kind::OverlaySrc, "Read files from SRC in the following overlay"),
    opt(
        "--overlay",
        &["RWSRC", "WORKDIR", "DEST"],
        Kind::Overlay,
        "Mount overlayfs on DEST, with RWSRC as the host path for writes and\n\
         WORKDIR an empty directory on the same filesystem as RWSRC",
    ),
    opt(
        "--tmp-overlay",
        DEST,
        Kind::TmpOverlay,
        "Mount overlayfs on DEST, with writes going to an invisible tmpfs",
    ),
    opt("--ro-overlay", DEST, Kind::RoOverlay, "Mount overlayfs read-only on DEST"),
    opt("--exec-label", &["LABEL"], Kind::Label, "Exec label for the sandbox"),
    opt("--file-label", &["LABEL"], Kind::Label, "File label for temporary sandbox content"),
    opt("--proc", DEST, Kind::Proc, "Mount new procfs on DEST"),
    opt("--dev", DEST, Kind::Dev, "Mount new dev on DEST"),
    opt("--tmpfs", DEST, Kind::Tmpfs, "Mount new tmpfs on DEST"),
    opt("--mqueue", DEST, Kind::Mqueue, "Mount new mqueue on DEST"),
    opt("--dir", DEST, Kind::Dir, "Create dir at DEST"),
    opt("--file", FD_DEST, Kind::File, "Copy from FD to destination DEST"),
    opt(
        "--bind-data",
        FD_DEST,
        Kind::BindData { ro: false },
        "Copy from FD to file which is bind-mounted on DEST",
    ),
    opt(
        "--ro-bind-data",
        FD_DEST,
        Kind::BindData { ro: true },
        "Copy from FD to file which is readonly bind-mounted on DEST",
    ),
    opt("--symlink", SRC_DEST, Kind::Symlink, "Create symlink at DEST with target SRC"),
    opt("--seccomp", FD, Kind::Fd(FdOpt::Seccomp), "Load and use seccomp rules from FD (not repeatable)"),
    opt("--add-seccomp-fd", FD, Kind::AddSeccompFd, "Load and use seccomp rules from FD (repeatable)"),
    opt("--block-fd", FD, Kind::Fd(FdOpt::BlockFd), "Block on FD until some data to read is available"),
    opt(
        "--userns-block-fd",
        FD,
        Kind::Fd(FdOpt::UsernsBlockFd),
        "Block on FD until the user namespace is ready",
    ),
    opt("--info-fd", FD, Kind::Fd(FdOpt::InfoFd), "Write information about the running container to FD"),
    opt(
        "--json-status-fd",
        FD,
        Kind::Fd(FdOpt::JsonStatusFd),
        "Write container status to FD as multiple JSON documents",
    ),
    opt("--new-session", &[], Kind::NewSession, "Create a new terminal session"),
    opt(
        "--die-with-parent",
        &[],
        Kind::DieWithParent,
        "Kills with SIGKILL child process (COMMAND) when bwrap or bwrap's parent dies.",
    ),
    opt("--as-pid-1", &[], Kind::AsPid1, "Do not install a reaper process with PID=1"),
    opt("--cap-add", &["CAP"], Kind::CapAdd, "Add cap CAP when running as privileged user"),
    opt("--cap-drop", &["CAP"], Kind::CapDrop, "Drop cap CAP when running as privileged user"),
    opt("--perms", &["OCTAL"], Kind::Perms, "Set permissions of next argument (--bind-data, --file, etc.)"),
    opt("--size", &["BYTES"], Kind::Size, "Set size of next argument (only for --tmpfs)"),
    opt("--chmod", &["OCTAL", "PATH"], Kind::Chmod, "Change permissions of PATH (must already exist)"),
];

/// tuixiu-sandbox's own options, beyond bubblewrap's (none of them
/// changes what bubblewrap's options do; each adds confinement).
pub const EXTRAS: &[Opt] = &[
    opt(
        "--tx-seccomp",
        &["PROFILE"],
        Kind::TxSeccomp,
        "Also apply the runtime's seccomp profile: a built-in name (default)\n\
         or an OCI/Docker JSON file (tuixiu-sandbox)",
    ),
    opt(
        "--tx-landlock",
        &[],
        Kind::TxLandlock,
        "Also confine COMMAND with Landlock to the sandbox's view: write only\n\
         where it is mounted writable (tuixiu-sandbox)",
    ),
];

/// The option named exactly `name`.
pub fn find(name: &str) -> Option<&'static Opt> {
    OPTIONS.iter().chain(EXTRAS).find(|o| o.name == name)
}

impl Opt {
    /// bubblewrap's message when the option's arguments run out.
    pub fn missing_text(&self) -> String {
        if let Some(text) = self.missing {
            return text.to_string();
        }
        let count = match self.args.len() {
            1 => "an argument",
            2 => "two arguments",
            _ => "three arguments",
        };
        format!("{} takes {count}", self.name)
    }
}

/// The usage text, as bubblewrap prints it: `usage: ARGV0 ...`, an empty
/// line, then one line per option with descriptions from column 34.
pub fn usage(argv0: &str) -> String {
    let out = format!("usage: {argv0} [OPTIONS...] [--] COMMAND [ARGS...]\n\n");
    table(out, OPTIONS)
}

/// `--help`: bubblewrap's usage, then our extras.
pub fn help(argv0: &str) -> String {
    table(usage(argv0) + "\ntuixiu-sandbox's own options (docs/bwrap.md):\n", EXTRAS)
}

fn table(mut out: String, options: &[Opt]) -> String {
    for o in options {
        let mut left = o.name.to_string();
        for a in o.args {
            left.push(' ');
            left.push_str(a);
        }
        let mut lines = o.help.split('\n');
        out.push_str(&format!("    {left:<28} {}\n", lines.next().unwrap_or("")));
        for more in lines {
            out.push_str(&format!("{:33}{}\n", "", more.trim_start()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_has_bubblewraps_layout() {
        let text = usage("bwrap");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 70, "67 options, one wrapped, usage and an empty line");
        assert_eq!(lines[0], "usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]");
        assert_eq!(lines[1], "");
        assert_eq!(lines[2], "    --help                       Print this help");
        assert_eq!(OPTIONS.len(), 67);
        for line in &lines[2..] {
            assert_eq!(&line[..4], "    ");
            assert_eq!(line.as_bytes()[32], b' ', "{line}");
            assert_ne!(line.as_bytes()[33], b' ', "description at column 34: {line}");
        }
        assert!(text.contains(
            "    --overlay RWSRC WORKDIR DEST Mount overlayfs on DEST, with RWSRC as the host path for writes and\n\
             \x20                                WORKDIR an empty directory on the same filesystem as RWSRC\n"
        ));
        assert!(
            text.ends_with(
                "    --chmod OCTAL PATH           Change permissions of PATH (must already exist)\n"
            )
        );
    }

    #[test]
    fn missing_argument_texts() {
        assert_eq!(find("--bind").unwrap().missing_text(), "--bind takes two arguments");
        assert_eq!(find("--proc").unwrap().missing_text(), "--proc takes an argument");
        assert_eq!(find("--overlay").unwrap().missing_text(), "--overlay takes three arguments");
        assert_eq!(find("--argv0").unwrap().missing_text(), "--argv0 takes one argument");
        assert_eq!(find("--ro-bind-fd").unwrap().missing_text(), "--bind-fd takes two arguments");
    }
}
