//! The generated part of the corpus: every option of bubblewrap 0.11.1
//! with valid arguments, missing arguments, empty strings, invalid values
//! of its argument's kind, given twice, without COMMAND, from an `--args`
//! file, after `--level-prefix`, and after each modifier (`--perms`,
//! `--size`, `--overlay-src`) that must be followed by particular options.
//!
//! The option list is bubblewrap's (its `--help`, in its order);
//! tests/bwrap_diff.rs checks it against the reference's own `--help`.

use super::Case;

/// One option: its arguments' placeholders (as `--help` prints them), the
/// options it needs around it, valid arguments, descriptor redirections,
/// and a COMMAND that shows its effect.
pub struct Opt {
    pub name: &'static str,
    pub args: &'static [&'static str],
    /// Options before it that make the valid form meaningful.
    context: &'static str,
    /// Valid arguments (shell words).
    valid: &'static [&'static str],
    /// Redirections the valid form needs (`3<data`).
    redirect: &'static str,
    /// The COMMAND (its words), run after `--`.
    probe: &'static str,
}

const fn o(
    name: &'static str,
    args: &'static [&'static str],
    context: &'static str,
    valid: &'static [&'static str],
    redirect: &'static str,
    probe: &'static str,
) -> Opt {
    Opt { name, args, context, valid, redirect, probe }
}

/// Which namespaces COMMAND shares with the shell that started bwrap
/// (`ns.*` written by [`NS_SAVE`] before bwrap runs).
const NS_PROBE: &str = "sh -c 'for n in cgroup ipc mnt net pid user uts; do \
                        if [ \"$(readlink /proc/self/ns/$n)\" = \"$(cat $D/ns.$n)\" ]; then echo $n shared; \
                        else echo $n new; fi; done; id -u'";
const NS_SAVE: &str =
    "for n in cgroup ipc mnt net pid user uts; do readlink /proc/self/ns/$n > ns.$n; done; ";
const ENV_PROBE: &str = "sh -c 'env | grep -v ^_= | sort'";
const CAP_PROBE: &str = "grep ^Cap /proc/self/status";

/// bubblewrap 0.11.1's options, in its `--help` order.
pub const OPTIONS: &[Opt] = &[
    o("--help", &[], "", &[], "", ""),
    o("--version", &[], "", &[], "", ""),
    o("--args", &["FD"], "", &["3"], "3<a.args", "sh -c 'echo A=$A'"),
    o("--argv0", &["VALUE"], "", &["renamed"], "", "sh -c 'echo $0'"),
    o("--level-prefix", &[], "", &[], "", "sh -c 'echo ok'"),
    o("--unshare-all", &[], "", &[], "", NS_PROBE),
    o("--share-net", &[], "", &[], "", NS_PROBE),
    o("--unshare-user", &[], "", &[], "", NS_PROBE),
    o("--unshare-user-try", &[], "", &[], "", NS_PROBE),
    o("--unshare-ipc", &[], "", &[], "", NS_PROBE),
    o("--unshare-pid", &[], "", &[], "", NS_PROBE),
    o("--unshare-net", &[], "", &[], "", NS_PROBE),
    o("--unshare-uts", &[], "", &[], "", NS_PROBE),
    o("--unshare-cgroup", &[], "", &[], "", NS_PROBE),
    o("--unshare-cgroup-try", &[], "", &[], "", NS_PROBE),
    o("--userns", &["FD"], "", &["3"], "3</proc/self/ns/user", NS_PROBE),
    o("--userns2", &["FD"], "", &["3"], "3</proc/self/ns/user", NS_PROBE),
    o("--disable-userns", &[], "--unshare-user", &[], "", "sh -c 'unshare -U true 2>/dev/null; echo rc=$?'"),
    o("--assert-userns-disabled", &[], "", &[], "", "sh -c 'echo ok'"),
    o("--pidns", &["FD"], "", &["3"], "3</proc/self/ns/pid", NS_PROBE),
    o("--uid", &["UID"], "--unshare-user", &["1234"], "", "sh -c 'id -u; cat /proc/self/uid_map'"),
    o("--gid", &["GID"], "--unshare-user", &["1234"], "", "sh -c 'id -g; cat /proc/self/gid_map'"),
    o("--hostname", &["NAME"], "--unshare-uts", &["sandboxed"], "", "hostname"),
    o("--chdir", &["DIR"], "", &["/usr"], "", "pwd"),
    o("--clearenv", &[], "", &[], "", ENV_PROBE),
    o("--setenv", &["VAR", "VALUE"], "", &["NEWVAR", "'a value'"], "", ENV_PROBE),
    o("--unsetenv", &["VAR"], "", &["HOME"], "", ENV_PROBE),
    // COMMAND may still print after bubblewrap's reaper failed: the wait
    // after it gives it the time.
    o("--lock-file", &["DEST"], "--bind $D $D", &["$D/lock"], "; sleep 0.3", "sh -c 'echo ok'"),
    o("--sync-fd", &["FD"], "", &["3"], "3<data", "sh -c 'readlink /proc/self/fd/3 || echo closed'"),
    o(
        "--bind",
        &["SRC", "DEST"],
        "",
        &["$D/dir", "/tmp/b"],
        "",
        "sh -c 'ls /tmp/b; touch /tmp/b/new && echo written'",
    ),
    o("--bind-try", &["SRC", "DEST"], "", &["$D/dir", "/tmp/b"], "", "ls /tmp/b"),
    o(
        "--dev-bind",
        &["SRC", "DEST"],
        "",
        &["/dev/null", "/tmp/null"],
        "",
        "sh -c 'echo x > /tmp/null && echo written'",
    ),
    o(
        "--dev-bind-try",
        &["SRC", "DEST"],
        "",
        &["/dev/null", "/tmp/null"],
        "",
        "sh -c 'echo x > /tmp/null && echo written'",
    ),
    o(
        "--ro-bind",
        &["SRC", "DEST"],
        "",
        &["$D/dir", "/tmp/b"],
        "",
        "sh -c 'ls /tmp/b; touch /tmp/b/new 2>&1'",
    ),
    o("--ro-bind-try", &["SRC", "DEST"], "", &["$D/dir", "/tmp/b"], "", "ls /tmp/b"),
    o(
        "--bind-fd",
        &["FD", "DEST"],
        "",
        &["3", "/tmp/b"],
        "3<$D/dir",
        "sh -c 'ls /tmp/b; touch /tmp/b/new && echo written'",
    ),
    o(
        "--ro-bind-fd",
        &["FD", "DEST"],
        "",
        &["3", "/tmp/b"],
        "3<$D/dir",
        "sh -c 'ls /tmp/b; touch /tmp/b/new 2>&1'",
    ),
    o("--remount-ro", &["DEST"], "", &["/tmp"], "", "sh -c 'touch /tmp/x 2>&1'"),
    o("--overlay-src", &["SRC"], "", &["$D/dir", "--tmp-overlay", "/tmp/o"], "", "ls /tmp/o"),
    o(
        "--overlay",
        &["RWSRC", "WORKDIR", "DEST"],
        "--overlay-src $D/dir",
        &["$D/up", "$D/work", "/tmp/o"],
        "",
        "sh -c 'ls /tmp/o; echo new > /tmp/o/new; ls $D/up'",
    ),
    o(
        "--tmp-overlay",
        &["DEST"],
        "--overlay-src $D/dir",
        &["/tmp/o"],
        "",
        "sh -c 'echo new > /tmp/o/new; ls /tmp/o'",
    ),
    o("--ro-overlay", &["DEST"], "--overlay-src $D/dir --overlay-src $D/dir2", &["/tmp/o"], "", "ls /tmp/o"),
    o("--exec-label", &["LABEL"], "", &["system_u:system_r:container_t:s0"], "", "sh -c 'echo ok'"),
    o("--file-label", &["LABEL"], "", &["system_u:object_r:container_file_t:s0"], "", "sh -c 'echo ok'"),
    o("--proc", &["DEST"], "", &["/tmp/p"], "", "sh -c 'test -e /tmp/p/self/status && echo proc'"),
    o("--dev", &["DEST"], "", &["/tmp/dev"], "", "ls /tmp/dev"),
    o("--tmpfs", &["DEST"], "", &["/tmp/t"], "", "stat -c '%a %F' /tmp/t"),
    o("--mqueue", &["DEST"], "--unshare-ipc", &["/tmp/mq"], "", "stat -c %a /tmp/mq"),
    o("--dir", &["DEST"], "", &["/tmp/d"], "", "stat -c '%a %F' /tmp/d"),
    o("--file", &["FD", "DEST"], "", &["3", "/tmp/f"], "3<data", "sh -c 'stat -c %a /tmp/f; cat /tmp/f'"),
    o(
        "--bind-data",
        &["FD", "DEST"],
        "",
        &["3", "/tmp/f"],
        "3<data",
        "sh -c 'stat -c %a /tmp/f; cat /tmp/f'",
    ),
    o(
        "--ro-bind-data",
        &["FD", "DEST"],
        "",
        &["3", "/tmp/f"],
        "3<data",
        "sh -c 'stat -c %a /tmp/f; cat /tmp/f'",
    ),
    o("--symlink", &["SRC", "DEST"], "", &["target", "/tmp/l"], "", "readlink /tmp/l"),
    o("--seccomp", &["FD"], "", &["3"], "3<deny-mkdir.bpf", "sh -c 'mkdir /tmp/x 2>&1; echo rc=$?'"),
    o("--add-seccomp-fd", &["FD"], "", &["3"], "3<deny-mkdir.bpf", "sh -c 'mkdir /tmp/x 2>&1; echo rc=$?'"),
    o("--block-fd", &["FD"], "", &["3"], "3<data", "sh -c 'echo ran'"),
    o(
        "--userns-block-fd",
        &["FD"],
        "--unshare-user --info-fd 4",
        &["3"],
        "3<data 4>info.out",
        "sh -c 'id -u; cat /proc/self/uid_map'",
    ),
    o("--info-fd", &["FD"], "", &["3"], "3>info.out", "sh -c 'echo ran'"),
    o("--json-status-fd", &["FD"], "", &["3"], "3>status.out", "sh -c 'exit 3'"),
    o(
        "--new-session",
        &[],
        "",
        &[],
        "",
        "sh -c 'test \"$(cut -d\" \" -f6 /proc/$$/stat)\" = $$ && echo leader'",
    ),
    o("--die-with-parent", &[], "", &[], "", "sh -c 'echo ok'"),
    o("--as-pid-1", &[], "--unshare-pid", &[], "", "sh -c 'echo $$'"),
    o("--cap-add", &["CAP"], "", &["CAP_NET_ADMIN"], "", CAP_PROBE),
    o("--cap-drop", &["CAP"], "", &["CAP_NET_ADMIN"], "", CAP_PROBE),
    o("--perms", &["OCTAL"], "", &["0700", "--dir", "/tmp/d"], "", "stat -c %a /tmp/d"),
    o("--size", &["BYTES"], "", &["1048576", "--tmpfs", "/tmp/t"], "", "df -k --output=size /tmp/t"),
    o("--chmod", &["OCTAL", "PATH"], "", &["0700", "/tmp"], "", "stat -c %a /tmp"),
];

/// Values that are wrong (or odd) for an argument of this kind, each
/// with the name its case id carries.
fn invalid(kind: &str) -> &'static [(&'static str, &'static str)] {
    match kind {
        "FD" => &[
            ("letters", "abc"),
            ("negative", "-1"),
            ("closed", "99"),
            ("trailing", "3x"),
            ("blank", "' 3'"),
            ("plus", "+3"),
            ("int-overflow", "2147483648"),
        ],
        "OCTAL" => &[
            ("not-octal", "9"),
            ("hex", "0x1ff"),
            ("too-big", "010000"),
            ("negative", "-1"),
            ("blank", "' 0700'"),
            ("largest", "07777"),
        ],
        "BYTES" => &[
            ("zero", "0"),
            ("letters", "abc"),
            ("hex", "0x1000"),
            ("octal", "010000"),
            ("suffix", "1k"),
            ("negative", "-1"),
            ("too-big", "9223372036854775808"),
            ("overflow", "18446744073709551616"),
        ],
        "CAP" => &[
            ("ALL", "ALL"),
            ("all", "all"),
            ("lower", "cap_chown"),
            ("no-prefix", "SYS_ADMIN"),
            ("unknown", "cap_foo"),
            ("list", "cap_chown,cap_kill"),
            ("number", "5"),
            ("hex", "0x5"),
            ("number-64", "64"),
            ("blank", "' cap_chown'"),
            ("flags", "CAP_CHOWN+ep"),
        ],
        "UID" | "GID" => &[
            ("letters", "abc"),
            ("negative", "-5"),
            ("zero", "0"),
            ("u32-max", "4294967295"),
            ("u32-wrap", "4294967296"),
            ("blank", "' 7'"),
            ("plus", "+7"),
        ],
        "DEST" | "PATH" => &[
            ("relative", "relative/x"),
            ("dotdot", "/tmp/a/../b"),
            ("root", "/"),
            ("missing-parent", "/nonexistent/x"),
            ("slashes", "/tmp//x/"),
        ],
        "SRC" => &[
            ("missing", "/nonexistent"),
            ("relative", "dir"),
            ("symlink", "$D/link"),
            ("dangling", "$D/dangling"),
            ("file", "$D/data"),
        ],
        "RWSRC" | "WORKDIR" => &[("missing", "/nonexistent"), ("file", "$D/data")],
        "DIR" => &[("missing", "/nonexistent"), ("relative", "tmp"), ("dotdot", "/tmp/..")],
        "NAME" => &[
            ("too-long", "a-name-of-sixty-five-characters-is-longer-than-the-kernel-allows"),
            ("space", "with space"),
        ],
        "VAR" => &[("equals", "A=B"), ("space", "'A B'")],
        _ => &[],
    }
}

fn line(context: &str, words: &str, redirect: &str, probe: &str) -> String {
    let mut s = String::from("$BWRAP --ro-bind / / --tmpfs /tmp");
    for part in [context, words] {
        if !part.is_empty() {
            s.push(' ');
            s.push_str(part);
        }
    }
    if !probe.is_empty() {
        s.push_str(" -- ");
        s.push_str(probe);
    }
    if !redirect.is_empty() {
        s.push(' ');
        s.push_str(redirect);
    }
    s
}

/// What the valid form needs to exist before bwrap runs.
fn prelude(opt: &Opt) -> &'static str {
    if opt.probe == NS_PROBE {
        NS_SAVE
    } else if opt.name == "--args" {
        "printf '%s\\0' --setenv A 1 > a.args; "
    } else {
        ""
    }
}

/// The generated cases, about a dozen per option.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |id: String, script: String| cases.push(Case { id, script });
    for opt in OPTIONS {
        let name = opt.name;
        let pre = prelude(opt);
        let valid = opt.valid.join(" ");
        let words = format!("{name} {valid}").trim_end().to_string();
        match name {
            "--help" | "--version" => {
                add(format!("gen{name}"), format!("$BWRAP {name}"));
                add(format!("gen{name}:after-options"), format!("$BWRAP --ro-bind / / {name} true"));
                add(format!("gen{name}:after-error"), format!("$BWRAP --bogus {name}"));
                add(format!("gen{name}:twice"), format!("$BWRAP {name} {name}"));
                add(format!("gen{name}:after-dashdash"), format!("$BWRAP --ro-bind / / -- {name}"));
                continue;
            }
            _ => {}
        }
        add(
            format!("gen{name}:valid"),
            format!("{pre}{}", line(opt.context, &words, opt.redirect, opt.probe)),
        );
        // Fewer arguments than it takes: at the end of the command line.
        for k in 0..opt.args.len() {
            let given: Vec<&str> = opt.valid[..k].to_vec();
            add(format!("gen{name}:missing-{k}"), format!("$BWRAP --ro-bind / / {name} {}", given.join(" ")));
        }
        // No COMMAND after it.
        add(
            format!("gen{name}:no-command"),
            format!("{pre}$BWRAP --ro-bind / / {} {words} {}", opt.context, opt.redirect),
        );
        // Each argument the empty string.
        for (i, kind) in opt.args.iter().enumerate() {
            let mut args: Vec<&str> = opt.valid.to_vec();
            args[i] = "''";
            let w = format!("{name} {}", args.join(" "));
            let id = format!("gen{name}:{}-empty", kind.to_ascii_lowercase());
            add(id, format!("{pre}{}", line(opt.context, &w, opt.redirect, opt.probe)));
        }
        // Values of the wrong kind.
        for (i, kind) in opt.args.iter().enumerate() {
            for (label, bad) in invalid(kind) {
                let mut args: Vec<&str> = opt.valid.to_vec();
                args[i] = bad;
                let w = format!("{name} {}", args.join(" "));
                add(
                    format!("gen{name}:{}-{label}", kind.to_ascii_lowercase()),
                    format!("{pre}{}", line(opt.context, &w, opt.redirect, opt.probe)),
                );
            }
        }
        // Given twice.
        add(
            format!("gen{name}:twice"),
            format!("{pre}{}", line(opt.context, &format!("{words} {words}"), opt.redirect, opt.probe)),
        );
        // From an --args file, spliced where --args is.
        if name != "--args" {
            let words_nul = format!("{} {words}", opt.context).trim().to_string();
            add(
                format!("gen{name}:in-args"),
                format!(
                    "{pre}printf '%s\\0' {words_nul} > opt.args; {}",
                    line("", "--args 9", &format!("9<opt.args {}", opt.redirect), opt.probe)
                ),
            );
        }
        // After --level-prefix, with a wrong value: the message gets `<3>`.
        if let Some(kind) = opt.args.first() {
            if let Some((_, bad)) = invalid(kind).first() {
                let mut args: Vec<&str> = opt.valid.to_vec();
                args[0] = bad;
                let w = format!("--level-prefix {name} {}", args.join(" "));
                add(
                    format!("gen{name}:level-prefix"),
                    format!("{pre}{}", line(opt.context, &w, opt.redirect, opt.probe)),
                );
            }
        }
        // The modifiers, each directly before this option.
        for (modifier, tag) in
            [("--perms 0750", "perms"), ("--size 65536", "size"), ("--overlay-src $D/dir2", "overlay-src")]
        {
            let w = format!("{modifier} {words}");
            add(
                format!("gen{name}:after-{tag}"),
                format!("{pre}{}", line(opt.context, &w, opt.redirect, opt.probe)),
            );
        }
    }
    cases
}
