//! Whether the daemon's private directories lie where its sandboxes look
//! (docs/security.md, "Runs cannot see each other"): the workspace root
//! (every run's workspace and home) and the state directory (every run's
//! `init.env`, tokens included). Each sandbox gets them covered anyway
//! (`InstanceConfig::hidden`); this only tells the operator, at startup
//! and through `check --daemon`, that they are better elsewhere.

use std::path::{Path, PathBuf};

use super::config::{Config, ProviderChoice};

/// One line per private directory that lies inside a host path the
/// sandboxes see: the native system view (read-only) or a `sandbox.volumes`
/// bind. None for the host provider, which has no view to keep it out of
/// (its processes see the whole host: docs/providers.md).
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut seen: Vec<(PathBuf, String)> = Vec::new();
    match cfg.sandbox.provider {
        ProviderChoice::Host => return Vec::new(),
        ProviderChoice::Native => {
            for dir in sandbox::system_dirs().unwrap_or_default() {
                seen.push((canonical(Path::new(&dir)), format!("{dir}, which every sandbox sees read-only")));
            }
        }
        ProviderChoice::Docker => {}
    }
    for v in &cfg.sandbox.volumes {
        seen.push((
            canonical(&v.host_path),
            format!(
                "{}, which every sandbox sees at {} (sandbox.volumes)",
                v.host_path.display(),
                v.guest_path
            ),
        ));
    }
    let mut out = Vec::new();
    for (key, dir) in
        [("sandbox.workspaceHostRoot", &cfg.sandbox.workspace_host_root), ("state_dir", &cfg.state_dir)]
    {
        let real = canonical(dir);
        if let Some((_, what)) = seen.iter().find(|(s, _)| real.starts_with(s)) {
            out.push(format!(
                "{key} {} lies inside {what}: each sandbox gets it covered (an empty read-only tmpfs), \
                 but keep it where no sandbox looks (e.g. under /srv or /var/lib)",
                dir.display()
            ));
        }
    }
    out
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
