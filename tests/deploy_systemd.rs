//! deploy/systemd/tuixiu-sandbox.service under a real systemd: PID 1 of a
//! container (deploy/systemd/check-hardening.sh boots it, with this
//! machine's /usr), the unit as shipped (binaries at /opt/tuixiu/bin), its
//! user and workspace root from the packaged sysusers/tmpfiles files, the
//! token as a credential. With every hardening directive of the unit:
//! `check` passes as ExecStartPre, the daemon registers with the backend
//! stand-in, a run's agent works in a sandbox, the journal holds JSON lines,
//! and `Restart=on-failure` brings a killed daemon back.

mod docker_support;
mod proxy_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docker_support::Booted;
use proxy_support::agent::agent_binary;
use proxy_support::net::{backend_ip, private_network};
use proxy_support::{Backend, Pki, SECS, Scratch, binary, jwt};
use serde_json::{Value, json};

const PORT: u16 = 8443;
const PROXY_ID: &str = "systemd-host";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What this test asks of its container.
impl Booted {
    fn ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(out.status.success(), "{args:?}: {}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    fn main_pid(&self) -> String {
        self.ok(&["systemctl", "show", "-p", "MainPID", "--value", "tuixiu-sandbox"]).trim().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unit_runs_the_daemon_under_systemd() {
    docker_support::require_engine();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = format!("tuixiu-test-systemd-{}", std::process::id());
    let bindir = binary().parent().unwrap().to_str().unwrap().to_string();
    let out = Command::new(repo.join("deploy/systemd/check-hardening.sh"))
        .args(["boot", &name, &bindir, "--network=none"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let c = Booted(name);
    assert!(out.status.success(), "boot: {}{}", text(&out.stdout), text(&out.stderr));

    // The unit as shipped, the binaries where this container has them.
    let s = Scratch::new("systemd-unit");
    let unit = std::fs::read_to_string(repo.join("deploy/systemd/tuixiu-sandbox.service")).unwrap();
    std::fs::write(s.dir.join("tuixiu-sandbox.service"), unit.replace("/usr/local/bin/", "/opt/tuixiu/bin/"))
        .unwrap();
    let unit_src = format!("{}/tuixiu-sandbox.service", s.dir.display());
    let cp = docker_support::docker(&["cp", &unit_src, &format!("{}:/etc/systemd/system/", c.0)]);
    assert!(cp.status.success(), "{}", text(&cp.stderr));

    // /etc/tuixiu-sandbox: the config, the token (root's, 0600: only the
    // credential reaches the daemon), the CA, the fake agent.
    let etc = s.dir.join("etc-tuixiu");
    std::fs::create_dir_all(etc.join("agent")).unwrap();
    std::fs::copy(agent_binary(), etc.join("agent/fake_agent")).unwrap();
    let pki = Pki::generate_for(&s.dir.join("pki"), &[&backend_ip(1)]);
    std::fs::copy(&pki.ca_file, etc.join("ca.pem")).unwrap();
    let token = jwt("systemd", 3600);
    std::fs::write(etc.join("auth_token"), format!("{token}\n")).unwrap();
    std::fs::write(
        etc.join("proxy.toml"),
        format!(
            "orchestrator_url = \"wss://{}:{PORT}/ws/agent\"\nheartbeat_seconds = 1\nreconnect_max_seconds = 1\n\
             agent_command = [\"/agent/fake_agent\"]\nagent_shutdown_grace_seconds = 1\n\
             [agent]\nid = \"{PROXY_ID}\"\n[tls]\nca_file = \"/etc/tuixiu-sandbox/ca.pem\"\n\
             [sandbox]\nworkspaceHostRoot = \"/srv/tuixiu/workspaces\"\n\
             [[sandbox.volumes]]\nhostPath = \"/etc/tuixiu-sandbox/agent\"\nguestPath = \"/agent\"\nreadOnly = true\n",
            backend_ip(1)
        ),
    )
    .unwrap();
    let cp = docker_support::docker(&[
        "cp",
        &format!("{}/.", etc.display()),
        &format!("{}:/etc/tuixiu-sandbox/", c.0),
    ]);
    assert!(cp.status.success(), "{}", text(&cp.stderr));
    c.ok(&["sh", "-c", "chown -R root:root /etc/tuixiu-sandbox && chmod -R go+rX /etc/tuixiu-sandbox && chmod 0600 /etc/tuixiu-sandbox/auth_token"]);

    // The backend, reachable from the container's network namespace only.
    let pid: u32 = docker_support::inspect_format(&c.0, "{{.State.Pid}}").parse().unwrap();
    let listener = private_network(&[pid], PORT);
    let backend = Backend::start_on(listener, Some(&pki), format!("wss://{}:{PORT}/ws/agent", backend_ip(1)));
    backend.set_valid_tokens(Some(vec![token.clone()]));

    c.ok(&["systemctl", "daemon-reload"]);
    c.start_service();
    backend.wait_connected(PROXY_ID, 60 * SECS, || c.journal()).await;
    assert_eq!(backend.auth(0).as_deref(), Some(format!("Bearer {token}").as_str()));
    // Its user, not root.
    let main = c.main_pid();
    let status = c.ok(&["cat", &format!("/proc/{main}/status")]);
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap();
    let tuixiu = c.ok(&["id", "-u", "tuixiu"]);
    assert_eq!(uid, tuixiu.trim());

    // A run: the agent in a sandbox under every hardening directive.
    backend.send_to(
        PROXY_ID,
        &json!({"type": "acp_open", "run_id": "sd1", "cwd": "/workspace",
                "init": {"script": "true", "timeout_seconds": 30, "env": {"USER_HOME": "/home/agent"},
                         "agentInputs": {"version": 1, "items": []}},
                "instance_name": "tuixiu-run-sd1", "keepalive_ttl_seconds": 600}),
    );
    let opened = backend.wait_type("acp_opened", "run_id", &json!("sd1"), 60 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", c.journal());
    backend.send_to(
        PROXY_ID,
        &json!({"type": "prompt_send", "run_id": "sd1", "prompt_id": "q1", "session_id": null, "cwd": "/workspace",
                "prompt": [{"type": "text", "text": "say hello\nfile /workspace/out.txt written under systemd"}],
                "timeout_ms": 60000}),
    );
    let result = backend.wait_type("prompt_result", "prompt_id", &json!("q1"), 60 * SECS).await;
    assert_eq!(result["ok"], true, "{result}\n{}", c.journal());
    assert_eq!(c.ok(&["cat", "/srv/tuixiu/workspaces/run-sd1/out.txt"]), "written under systemd");

    // The journal: ExecStartPre's table, then the daemon's JSON lines,
    // without the token.
    let journal = c.journal();
    assert!(journal.contains("tuixiu-sandbox run works on this host."), "{journal}");
    assert!(!journal.contains(&token), "the token is in the journal");
    let json: Vec<Value> =
        journal.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(
        json.iter().any(|v| v["message"].as_str().is_some_and(|m| m.contains("link: connected"))),
        "{journal}"
    );

    // The health check, as root inside the container.
    let out =
        c.exec(&["/opt/tuixiu/bin/tuixiu-sandbox", "check", "--json", "--daemon", "/var/lib/tuixiu-sandbox"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success() && report["daemonAlive"] == true, "{report:#}");

    // Restart=on-failure: killed, it comes back and registers again.
    c.ok(&["kill", "-KILL", &main]);
    let deadline = Instant::now() + 30 * SECS;
    loop {
        let registrations = backend.received().iter().filter(|r| r.msg["type"] == "register_agent").count();
        if registrations >= 2 && backend.is_connected(PROXY_ID) {
            break;
        }
        assert!(Instant::now() < deadline, "not restarted:\n{}", c.journal());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(c.main_pid(), main);
}
