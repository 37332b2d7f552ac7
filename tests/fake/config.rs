//! The daemon's proxy.toml as the tests and the benchmarks write it: the
//! lines every one of them needs (backend URL, state directory, proxy id,
//! workspace root) in one place, and what differs added by name.

use std::fmt::Write;
use std::path::Path;

/// A proxy.toml under construction; [`ProxyToml::build`] renders it.
pub struct ProxyToml {
    top: String,
    agent: String,
    sandbox: String,
    volumes: String,
}

impl ProxyToml {
    /// The daemon connects to `url`, keeps its state in `state`, registers
    /// as `id` and puts workspaces under `workspaces`.
    pub fn new(url: &str, state: &Path, id: &str, workspaces: &Path) -> ProxyToml {
        ProxyToml {
            top: format!("orchestrator_url = \"{url}\"\nstate_dir = \"{}\"\n", state.display()),
            agent: format!("id = \"{id}\"\n"),
            sandbox: format!("workspaceHostRoot = \"{}\"\n", workspaces.display()),
            volumes: String::new(),
        }
    }

    /// The agent's command line (a TOML array) and a one-second shutdown
    /// grace, so that closing a run does not wait for a slow agent.
    pub fn agent_command(self, argv: &str) -> ProxyToml {
        self.top(&format!("agent_command = {argv}\nagent_shutdown_grace_seconds = 1"))
    }

    /// Top-level lines (or whole tables: they come before `[agent]`).
    pub fn top(mut self, lines: &str) -> ProxyToml {
        push_lines(&mut self.top, lines);
        self
    }

    /// Lines of the `[agent]` table.
    pub fn agent(mut self, lines: &str) -> ProxyToml {
        push_lines(&mut self.agent, lines);
        self
    }

    /// Lines of the `[sandbox]` table.
    pub fn sandbox(mut self, lines: &str) -> ProxyToml {
        push_lines(&mut self.sandbox, lines);
        self
    }

    /// A `[[sandbox.volumes]]` entry: `host` bound at `guest`.
    pub fn volume(mut self, host: &Path, guest: &str, read_only: bool) -> ProxyToml {
        let _ = write!(
            self.volumes,
            "\n[[sandbox.volumes]]\nhostPath = \"{}\"\nguestPath = \"{guest}\"\nreadOnly = {read_only}\n",
            host.display()
        );
        self
    }

    pub fn build(&self) -> String {
        format!("{}\n[agent]\n{}\n[sandbox]\n{}{}", self.top, self.agent, self.sandbox, self.volumes)
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.build()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

fn push_lines(to: &mut String, lines: &str) {
    to.push_str(lines);
    if !lines.is_empty() && !lines.ends_with('\n') {
        to.push('\n');
    }
}
