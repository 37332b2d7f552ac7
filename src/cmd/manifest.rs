//! `manifest check`: validate a manifest and print its plan, running nothing.

use super::error::CmdError;
use crate::cli::{ExtractArgs, ManifestCheckArgs, ManifestCommand};
use crate::inputs::{Described, Layout, Plan, ZipLimits, fsx, zip};
use crate::{EXIT_TOOL_ERROR, report_error};
use serde_json::json;
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
    let checked = plan(args);
    if args.json {
        println!("{}", as_json(args, &checked));
    }
    match checked {
        Ok(checked) => {
            if !args.json {
                for line in checked.lines() {
                    println!("{line}");
                }
            }
            0
        }
        Err(e) => {
            if !args.json {
                report_error(e);
            }
            EXIT_INVALID
        }
    }
}

/// A manifest that passed: what it does, in order.
struct Checked {
    items: usize,
    env_patch: Vec<(String, String)>,
    workspace: Option<(std::path::PathBuf, &'static str)>,
    plan: Vec<Described>,
    lines: Vec<String>,
}

impl Checked {
    fn lines(&self) -> impl Iterator<Item = &String> {
        self.lines.iter()
    }
}

/// `manifest check --json`'s object (docs/json.md).
fn as_json(args: &ManifestCheckArgs, checked: &Result<Checked, CmdError>) -> serde_json::Value {
    let file = args.file.display().to_string();
    match checked {
        Ok(c) => json!({
            "file": file,
            "valid": true,
            "items": c.items,
            "envPatch": c.env_patch.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "workspace": c.workspace.as_ref().map(|(dir, access)| json!({"path": dir, "access": access})),
            "plan": c.plan,
        }),
        Err(e) => {
            let (code, item) = match e {
                CmdError::Run(RunError::Manifest(m)) => (Some(m.code.as_str()), m.subject.clone()),
                CmdError::Run(RunError::Input(i)) | CmdError::Input(i) => {
                    (Some(i.code.as_str()), Some(i.item.clone()))
                }
                _ => (None, None),
            };
            json!({"file": file, "valid": false, "error": {"code": code, "item": item, "message": e.to_string()}})
        }
    }
}

fn plan(args: &ManifestCheckArgs) -> Result<Checked, CmdError> {
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
    let workspace = plan.workspace().map(|(dir, access)| (dir.to_path_buf(), access.as_str()));
    if let Some((dir, access)) = &workspace {
        lines.push(format!("workspace: {} ({access})", dir.display()));
    }
    lines.extend(plan.describe(&layout));
    Ok(Checked {
        items: count,
        env_patch: patch.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        workspace,
        plan: plan.described(&layout),
        lines,
    })
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
