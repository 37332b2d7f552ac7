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

/// How tuixiu-sandbox serves each option, for docs/bwrap.md's option
/// table (generated from this and [`OPTIONS`]: `UPDATE_DOCS=1 cargo test
/// -p tuixiu-sandbox --lib bwrap::options`). "Host" is a run outside any
/// sandbox of ours, "nested" one inside (served by the outer launcher).
pub const NOTES: &[(&str, &str)] = &[
    ("--help", "bubblewrap's text, then our extras"),
    ("--version", "`bubblewrap 0.11.1`, as bubblewrap (`tuixiu-sandbox --version` names the build)"),
    (
        "--args",
        "read at parse time, NUL-separated, spliced in place; never supplies COMMAND; not inside itself",
    ),
    ("--argv0", "as bubblewrap"),
    ("--level-prefix", "`<3>`/`<4>` before later messages"),
    ("--unshare-all", "as bubblewrap (user and cgroup as `-try`)"),
    ("--share-net", "as bubblewrap"),
    (
        "--unshare-user",
        "host: a new user namespace mapping `--uid`/`--gid` (default: the caller's ids) onto the caller's (one line); implied for a caller that is not uid 0; nested: made after the mounts",
    ),
    ("--unshare-user-try", "a user namespace is always possible without setuid: as `--unshare-user`"),
    ("--unshare-ipc", "as bubblewrap"),
    (
        "--unshare-pid",
        "host: as bubblewrap (also made for the PID 1 that holds `--lock-file`s and `--sync-fd`); nested: made always",
    ),
    ("--unshare-net", "as bubblewrap: loopback only, up"),
    ("--unshare-uts", "as bubblewrap"),
    ("--unshare-cgroup", "as bubblewrap"),
    ("--unshare-cgroup-try", "as bubblewrap"),
    ("--userns", "host: joined before the sandbox is made; nested: refused"),
    ("--userns2", "host: switched to after setup; nested: refused"),
    (
        "--disable-userns",
        "`user.max_user_namespaces` = 1 in the sandbox's user namespace, then one more nested user namespace, as bubblewrap",
    ),
    (
        "--assert-userns-disabled",
        "fails with bubblewrap's message where `unshare(CLONE_NEWUSER)` still works",
    ),
    (
        "--pidns",
        "host: joined; COMMAND runs as its PID 1's sibling, no reaper, unless `--unshare-pid`; nested: refused",
    ),
    ("--uid", "needs a new user namespace, bubblewrap's message otherwise"),
    ("--gid", "as `--uid`"),
    ("--hostname", "needs `--unshare-uts`, bubblewrap's message otherwise"),
    (
        "--chdir",
        "as bubblewrap (from the new root's `/`); without it the caller's directory, else `$HOME`, else `/`",
    ),
    ("--clearenv", "as bubblewrap (`PWD` is set)"),
    ("--setenv", "applied in order with `--unsetenv`/`--clearenv`; values must be UTF-8"),
    ("--unsetenv", "as `--setenv`"),
    (
        "--lock-file",
        "read-locked (`F_SETLK`) by our PID 1 for the sandbox's life, from COMMAND's directory; one it cannot take stops the sandbox before COMMAND",
    ),
    ("--sync-fd", "held by our PID 1 for the sandbox's life; COMMAND gets it only with `--as-pid-1`"),
    (
        "--bind",
        "recursive, `nosuid`, `nodev`; sources resolved in the caller's view, destinations inside the new root",
    ),
    ("--bind-try", "as `--bind`, a missing source skipped"),
    ("--dev-bind", "as `--bind`, devices usable"),
    ("--dev-bind-try", "as `--dev-bind`, a missing source skipped"),
    ("--ro-bind", "as `--bind`, read-only on every submount"),
    ("--ro-bind-try", "as `--ro-bind`, a missing source skipped"),
    ("--bind-fd", "the path the descriptor is open on (`/proc/self/fd/FD`), bound as `--bind`"),
    ("--ro-bind-fd", "as `--bind-fd`, read-only"),
    ("--remount-ro", "the single mount at DEST, as bubblewrap"),
    ("--overlay-src", "bubblewrap's rules and messages"),
    (
        "--overlay",
        "overlayfs (`userxattr` in a user namespace) made while the caller's tree is visible; layers from the caller's view; Linux 6.8 (`lowerdir+`)",
    ),
    ("--tmp-overlay", "as `--overlay`, the upper layer on a private tmpfs"),
    ("--ro-overlay", "as `--overlay`, read-only, at least two sources"),
    (
        "--exec-label",
        "without SELinux `labeling not supported on this system`, as Debian's and Fedora's bubblewrap; with it, checked, and COMMAND executed in it (`/proc/thread-self/attr/exec`); host only",
    ),
    (
        "--file-label",
        "without SELinux as `--exec-label`; with it, checked, files made during setup get it (`attr/fscreate`), `--tmpfs` and `--dev` mounted with `context=`; host only",
    ),
    (
        "--proc",
        "a fresh procfs of the sandbox's pid namespace, without one the caller's bound, as bubblewrap (`sys`, `sysrq-trigger`, `irq`, `bus` read-only where writable); nested: per the outer sandbox's `--proc`",
    ),
    (
        "--dev",
        "host: bubblewrap's (a writable tmpfs: nodes, private `pts`, `shm` directory, fd links); nested: the runtime's, read-only",
    ),
    ("--tmpfs", "as bubblewrap; with `--perms`, `--size`"),
    ("--mqueue", "as bubblewrap (needs `--unshare-ipc` without root)"),
    ("--dir", "as bubblewrap, missing parents with bubblewrap's modes"),
    ("--file", "the bytes read from FD, written to a new file at DEST (mode 0666 or `--perms`)"),
    ("--bind-data", "the bytes on a private tmpfs, bound read-write at DEST (0600 or `--perms`)"),
    ("--ro-bind-data", "as `--bind-data`, read-only"),
    ("--symlink", "idempotent; a different link or another file there is bubblewrap's error"),
    (
        "--seccomp",
        "the program installed last before exec with `prctl(PR_SET_SECCOMP)`, as bubblewrap; nested: after the outer sandbox's filter",
    ),
    ("--add-seccomp-fd", "as `--seccomp`, in order"),
    (
        "--block-fd",
        "our PID 1 reads one byte (or end of file, or an error) before COMMAND starts, then closes it",
    ),
    (
        "--userns-block-fd",
        "host: read before the sandbox goes on, after the info descriptor; nested: read by the portal's worker before COMMAND starts (the maps are the portal's)",
    ),
    (
        "--info-fd",
        "host: bubblewrap's JSON (`child-pid`, namespace ids) once the namespaces exist; nested: the same, the ids sent by the nested PID 1 ([below](#differences-from-bubblewrap-nested))",
    ),
    (
        "--json-status-fd",
        "host: bubblewrap's JSON lines (`child-pid` and ids, then `exit-code` if COMMAND was executed); nested: the same",
    ),
    ("--new-session", "host: as bubblewrap; nested: always"),
    ("--die-with-parent", "as bubblewrap; COMMAND also dies with the launcher without it"),
    ("--as-pid-1", "COMMAND is the pid namespace's PID 1, no reaper"),
    (
        "--cap-add",
        "host: bubblewrap's rules (libcap's names; root starts from its own set, in a user namespace too; the bounding set reduced only in one); nested: only inside a new user namespace",
    ),
    ("--cap-drop", "as `--cap-add`"),
    ("--perms", "bubblewrap's rules (for `--dir`, `--tmpfs`, `--file`, `--bind-data`)"),
    ("--size", "bubblewrap's rules (for `--tmpfs`); nested: at most the outer sandbox's tmpfs size"),
    ("--chmod", "`fchmodat2` on what PATH names inside the new root (Linux 6.6)"),
    ("--tx-seccomp", "ours: the runtime's built-in profile (`default`, `strict`) or an OCI/Docker JSON file"),
    (
        "--tx-landlock",
        "ours: Landlock on the sandbox's view, required (fails where the kernel cannot enforce it)",
    ),
];

/// docs/bwrap.md's option table: every option, its arguments, bubblewrap's
/// description and how it is served.
pub fn doc_table() -> String {
    let mut out = String::from("| option | bubblewrap's description | tuixiu-sandbox |\n|---|---|---|\n");
    for o in OPTIONS.iter().chain(EXTRAS) {
        let mut name = format!("`{}", o.name);
        for a in o.args {
            name.push(' ');
            name.push_str(a);
        }
        name.push('`');
        let note = NOTES.iter().find(|(n, _)| *n == o.name).map_or("", |(_, t)| *t);
        out.push_str(&format!("| {name} | {} | {note} |\n", o.help.replace('\n', " ")));
    }
    out
}

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
    fn every_option_has_a_note_and_the_docs_table_is_generated() {
        for o in OPTIONS.iter().chain(EXTRAS) {
            assert!(NOTES.iter().any(|(n, _)| *n == o.name), "no note for {}", o.name);
        }
        assert_eq!(NOTES.len(), OPTIONS.len() + EXTRAS.len());
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bwrap.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let (begin, end) = ("<!-- options: generated -->\n", "<!-- options: end -->");
        let at = doc.find(begin).expect("docs/bwrap.md has the generated block") + begin.len();
        let to = doc[at..].find(end).expect("the block ends") + at;
        if doc[at..to] != doc_table() && std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, format!("{}{}{}", &doc[..at], doc_table(), &doc[to..])).unwrap();
            return;
        }
        assert_eq!(&doc[at..to], doc_table(), "regenerate: UPDATE_DOCS=1 cargo test --lib bwrap::options");
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
