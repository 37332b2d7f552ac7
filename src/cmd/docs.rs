//! `completions SHELL` and the hidden `__man DIR`: shell completions and
//! man pages made from the command-line definitions themselves, so they
//! never drift from `--help`.
//!
//! They are made by the binary, not by `build.rs`: the definitions live in
//! this binary's modules (and in the library's), which a build script
//! cannot use without compiling them a second time for the host, on every
//! build. The package build (scripts/build-deb.sh) runs these two commands
//! once on the binary it packages.

use std::io::Write;
use std::path::Path;

use clap::{Arg, ArgAction, CommandFactory};
use clap_complete::Shell;

use crate::cli::Cli;
use crate::cli::docs::{CompletionShell, CompletionsArgs, ManArgs};
use crate::{EXIT_TOOL_ERROR, report_error};
use tuixiu_sandbox::bwrap::options::{EXTRAS, NOTES, OPTIONS};

/// `completions SHELL`: the script on stdout.
pub fn completions(args: &CompletionsArgs) -> u8 {
    let shell = match args.shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    let mut cmd = without_hidden(Cli::command());
    let mut out = Vec::new();
    if shell == Shell::Bash {
        // clap_complete's bash script spells its states two ways when the
        // name has a hyphen, and then completes nothing after a
        // subcommand (clap-rs/clap#6421): made for a name without one,
        // then registered for the real name.
        clap_complete::generate(shell, &mut cmd, "tuixiu_sandbox", &mut out);
        out = String::from_utf8_lossy(&out)
            .lines()
            .map(|line| match line.trim_start().starts_with("complete -F ") {
                true => format!("{}tuixiu-sandbox\n", line.strip_suffix("tuixiu_sandbox").unwrap_or(line)),
                false => format!("{line}\n"),
            })
            .collect::<String>()
            .into_bytes();
    } else {
        clap_complete::generate(shell, &mut cmd, "tuixiu-sandbox", &mut out);
    }
    match std::io::stdout().write_all(&out) {
        Ok(()) => 0,
        Err(e) => {
            report_error(format!("completions: stdout: {e}"));
            EXIT_TOOL_ERROR
        }
    }
}

/// `cmd` without its hidden subcommands (`__exec`, `__man`, ...), which
/// the completion scripts would otherwise offer.
fn without_hidden(cmd: clap::Command) -> clap::Command {
    let mut out = clap::Command::new("tuixiu-sandbox")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand_required(true);
    for arg in cmd.get_arguments().filter(|a| !matches!(a.get_id().as_str(), "help" | "version")) {
        out = out.arg(arg.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(sub.clone());
    }
    out
}

/// `__man DIR`: one page per command (`tuixiu-sandbox.1`,
/// `tuixiu-sandbox-run.1`, `tuixiu-sandbox-skills-serve.1`, ...), the
/// `bwrap` one with bubblewrap's options as they are served here, and
/// `tuixiu-sandbox-full.1` for the full tool's binary.
pub fn man(args: &ManArgs) -> u8 {
    match write_pages(&args.dir) {
        Ok(()) => 0,
        Err(e) => {
            report_error(format!("__man {}: {e}", args.dir.display()));
            EXIT_TOOL_ERROR
        }
    }
}

fn write_pages(dir: &Path) -> std::io::Result<()> {
    let cmd = Cli::command().version(env!("CARGO_PKG_VERSION"));
    clap_mangen::generate_to(cmd, dir)?;
    let mut page = Vec::new();
    clap_mangen::Man::new(bwrap_command()).title("tuixiu-sandbox-bwrap").render(&mut page)?;
    std::fs::write(dir.join("tuixiu-sandbox-bwrap.1"), page)?;
    // The binary the launcher execs for every other command: the same
    // commands under its own name.
    let full = Cli::command().name("tuixiu-sandbox-full").version(env!("CARGO_PKG_VERSION"));
    let mut page = Vec::new();
    clap_mangen::Man::new(full).render(&mut page)?;
    std::fs::write(dir.join("tuixiu-sandbox-full.1"), page)
}

/// bubblewrap's command line as a clap command, for its page only (the
/// front end parses with bubblewrap's own rules: `bwrap/parse.rs`): each
/// option with bubblewrap's description and how it is served here.
fn bwrap_command() -> clap::Command {
    let mut cmd = clap::Command::new("bwrap")
        .version(tuixiu_sandbox::bwrap::VERSION)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .about("bubblewrap's command line, served by tuixiu-sandbox")
        .long_about(
            "bubblewrap 0.11's command line, served by tuixiu-sandbox's runtime. Installed as \
             `bwrap` (a link named bwrap to the tuixiu-sandbox launcher, or `tuixiu-sandbox bwrap`): \
             inside a tuixiu-sandbox sandbox, where it is on PATH as /run/tuixiu/bin/bwrap, the \
             nested sandbox is built by the outer sandbox's launcher, outside the agent's \
             confinement; outside any sandbox it runs on the host, with bubblewrap's namespaces \
             and messages. Each option below gives bubblewrap's description, then how it is served \
             (\"host\": outside any sandbox of ours; \"nested\": inside one).",
        )
        .after_long_help(
            "Exit status: COMMAND's own; 1 when the sandbox could not be set up, with \
             bubblewrap's message on stderr (`bwrap: ...`).\n\nSee also: tuixiu-sandbox(1), and \
             docs/bwrap.md in tuixiu-sandbox's documentation.",
        );
    for o in OPTIONS.iter().chain(EXTRAS) {
        let note = NOTES.iter().find(|(n, _)| *n == o.name).map_or("", |(_, t)| *t);
        let help =
            format!("{}.\n\ntuixiu-sandbox: {}.", o.help.replace('\n', " "), note.replace(['`', '*'], ""));
        let name = o.name.trim_start_matches('-');
        let mut arg = Arg::new(name).long(name).help(help);
        arg = if o.args.is_empty() {
            arg.action(ArgAction::SetTrue)
        } else {
            arg.value_names(o.args.iter().copied()).action(ArgAction::Append)
        };
        cmd = cmd.arg(arg);
    }
    cmd.arg(Arg::new("COMMAND").num_args(1..).trailing_var_arg(true).value_name("COMMAND"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bwrap_page_lists_every_option() {
        let mut page = Vec::new();
        clap_mangen::Man::new(bwrap_command()).render(&mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        for o in OPTIONS.iter().chain(EXTRAS) {
            // roff escapes each `-` of an option name.
            let escaped = o.name.replace('-', "\\-");
            assert!(page.contains(&escaped), "{} missing", o.name);
        }
    }
}
