//! `manifest check`: validate a manifest and print its plan, running nothing.

use super::error::CmdError;
use crate::cli::{ExtractArgs, ManifestCheckArgs, ManifestCommand};
use crate::inputs::{Layout, Plan, ZipLimits, fsx, zip};
use crate::{EXIT_TOOL_ERROR, report_error};
use tuixiu_sandbox::launcher::error::RunError;
use tuixiu_sandbox::launcher::run_inputs;

/// `run`'s default `--user`.
const DEFAULT_USER: &str = "agent";

/// Exit status of `manifest check` for an invalid manifest.
const EXIT_INVALID: u8 = 1;

pub fn main(command: ManifestCommand) -> u8 {
    match command {
        ManifestCommand::Check(args) => check(&args),
    }
}

fn check(args: &ManifestCheckArgs) -> u8 {
    match plan(args) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            0
        }
        Err(e) => {
            report_error(e);
            EXIT_INVALID
        }
    }
}

fn plan(args: &ManifestCheckArgs) -> Result<Vec<String>, CmdError> {
    let manifest = run_inputs::read_manifest(&args.file)?;
    let mut allowed = args.plan.allow_host_path.clone();
    match &args.workspace {
        Some(ws) if ws.is_dir() => allowed.push(ws.clone()),
        Some(ws) => return Err(RunError::NotADirectory { flag: "--workspace", dir: ws.clone() }.into()),
        None => {}
    }
    let config = run_inputs::plan_config(&args.file, &allowed, args.plan.inputs_base_url.as_deref())?;
    let count = manifest.items.len();
    let plan = Plan::new(manifest, &config)?;

    // The user view as `run` makes it (with its refusals).
    let flags = run_inputs::UserFlags {
        name: args.user.as_deref().unwrap_or(DEFAULT_USER),
        name_given: args.user.is_some(),
        uid: 1000,
        gid: 1000,
        home_path: args.home_path.as_deref(),
    };
    let user = run_inputs::user_view(&flags, Some(plan.env_patch()))?;
    let layout = Layout::new(user.home);

    let mut lines = vec![format!("{}: valid agentInputs v1 manifest, {count} item(s)", args.file.display())];
    let patch = plan.env_patch().pairs();
    if !patch.is_empty() {
        let shown: Vec<String> = patch.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push(format!("envPatch: {}", shown.join(" ")));
    }
    if let Some((dir, access)) = plan.workspace() {
        lines.push(format!("workspace: {} ({})", dir.display(), access.as_str()));
    }
    lines.extend(plan.describe(&layout));
    Ok(lines)
}

/// `__extract ZIP DIR [--threads N] [--zip-max-*]`: the downloadExtract
/// extractor on its own (downloadExtract's default limits), for benchmarks
/// and debugging.
pub fn extract(args: ExtractArgs) -> u8 {
    let run = || -> Result<zip::Extracted, CmdError> {
        let archive = std::fs::File::open(&args.archive)
            .map_err(|source| CmdError::Archive { path: args.archive.clone(), source })?;
        let dir = nix::fcntl::open(&args.dir, fsx::dir_read_flags(), nix::sys::stat::Mode::empty())
            .map_err(|source| CmdError::ExtractDir { path: args.dir.clone(), source })?;
        use std::os::fd::AsFd;
        if !fsx::is_empty_dir(dir.as_fd())? {
            return Err(CmdError::DirNotEmpty(args.dir.clone()));
        }
        let workers = args.threads.map(usize::from);
        let limits = ZipLimits {
            max_entries: args.zip_max_entries,
            max_file_bytes: args.zip_max_file_bytes,
            max_total_bytes: args.zip_max_total_bytes,
        };
        Ok(zip::extract_with(&archive, dir.as_fd(), &limits, workers)?)
    };
    match run() {
        Ok(done) => {
            tracing::info!(files = done.files, dirs = done.dirs, bytes = done.bytes, "extracted");
            0
        }
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}
