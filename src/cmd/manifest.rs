//! `manifest check`: validate a manifest and print its plan, running nothing.

use sandbox::UserView;

use super::run_inputs;
use crate::cli::{ManifestCheckArgs, ManifestCommand};
use crate::inputs::{Layout, Plan};
use crate::report_error;

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
        Err(message) => {
            report_error(message);
            EXIT_INVALID
        }
    }
}

fn plan(args: &ManifestCheckArgs) -> Result<Vec<String>, String> {
    let manifest = run_inputs::read_manifest(&args.file)?;
    let mut allowed = args.plan.allow_host_path.clone();
    if let Some(ws) = &args.workspace {
        allowed.push(ws.clone());
    }
    let config = run_inputs::plan_config(&args.file, &allowed, args.plan.inputs_base_url.as_deref())?;
    let count = manifest.items.len();
    let plan = Plan::new(manifest, &config).map_err(|e| e.to_string())?;

    let mut user = UserView::new(args.user.clone(), 1000, 1000);
    if let Some(home) = &args.home_path {
        user.home = home.clone();
    }
    if let Some(name) = &plan.env_patch().user
        && args.home_path.is_none()
    {
        user.home = format!("/home/{name}");
    }
    if let Some(home) = &plan.env_patch().home {
        user.home = home.clone();
    }
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
