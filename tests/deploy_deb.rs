//! The Debian package in a fresh Debian 12: built with cargo-deb from the
//! binaries this test run built (scripts/build-deb.sh --binaries), installed
//! with dpkg in a minimal bookworm root made by debootstrap and booted with
//! systemd as PID 1 (scripts/deb-test.sh). Checked: the files where Debian
//! puts them, bubblewrap's /usr/bin/bwrap left alone while `bwrap` is
//! offered through update-alternatives, the unit installed but not enabled,
//! `systemctl start` with a config and a token, the daemon registering with
//! the backend stand-in and starting a run's sandbox, its metrics on the
//! unit's loopback address, and `apt remove` stopping everything it
//! started; then, without bubblewrap, /usr/bin/bwrap as our link, and
//! `dpkg --purge` taking it away.

mod docker_support;
mod proxy_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use docker_support::Booted;
use proxy_support::net::{backend_ip, private_network};
use proxy_support::{Backend, Pki, SECS, Scratch, jwt};
use serde_json::json;

const PORT: u16 = 8443;
const PROXY_ID: &str = "deb-host";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What this test asks of its container.
impl Booted {
    fn sh(&self, script: &str) -> Output {
        self.exec(&["sh", "-c", script])
    }

    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.status.success(), "{script}: {}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    /// The processes of the tuixiu user, `pid command` each.
    fn tuixiu_processes(&self) -> String {
        text(&self.sh("pgrep -a -u tuixiu || true").stdout)
    }
}

/// The package of this build's binaries, in `out`.
fn build_package(out: &Path) -> PathBuf {
    let bindir = Path::new(env!("CARGO_BIN_EXE_tuixiu-sandbox")).parent().unwrap();
    let built = Command::new(repo().join("scripts/build-deb.sh"))
        .arg("--binaries")
        .arg(bindir)
        .arg("--output")
        .arg(out)
        .arg("--fast")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(built.status.success(), "build-deb.sh: {}{}", text(&built.stdout), text(&built.stderr));
    let path = PathBuf::from(text(&built.stdout).lines().last().unwrap().trim());
    assert!(path.is_file(), "no package at {path:?}: {}", text(&built.stdout));
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_package_installs_starts_and_removes_cleanly() {
    docker_support::require_engine();
    let s = Scratch::new("deb");
    let deb = build_package(&s.dir.join("deb"));
    let name = format!("tuixiu-test-deb-{}", std::process::id());
    let out = Command::new(repo().join("scripts/deb-test.sh"))
        .args(["boot", &name, "--network=none"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let c = Booted(name);
    assert!(out.status.success(), "boot: {}{}", text(&out.stdout), text(&out.stderr));
    let cp = docker_support::docker(&[
        "cp",
        deb.to_str().unwrap(),
        &format!("{}:/var/tmp/tuixiu-sandbox.deb", c.0),
    ]);
    assert!(cp.status.success(), "{}", text(&cp.stderr));

    // Bubblewrap's own /usr/bin/bwrap, before.
    assert_eq!(c.ok("dpkg -S /usr/bin/bwrap").trim(), "bubblewrap: /usr/bin/bwrap");
    let bwrap_sum = c.ok("sha256sum /usr/bin/bwrap");

    c.ok("dpkg -i /var/tmp/tuixiu-sandbox.deb");
    for f in [
        "/usr/bin/tuixiu-sandbox",
        "/usr/bin/tuixiu-sandbox-full",
        "/usr/bin/tuixiu-sandbox-proxy",
        "/usr/lib/systemd/system/tuixiu-sandbox.service",
        "/usr/lib/sysusers.d/tuixiu-sandbox.conf",
        "/usr/lib/tmpfiles.d/tuixiu-sandbox.conf",
        "/usr/share/man/man1/tuixiu-sandbox.1.gz",
        "/usr/share/man/man1/tuixiu-sandbox-proxy.1.gz",
        "/usr/share/man/man1/tuixiu-sandbox-bwrap.1.gz",
        "/usr/share/bash-completion/completions/tuixiu-sandbox",
        "/usr/share/zsh/vendor-completions/_tuixiu-sandbox",
        "/usr/share/fish/vendor_completions.d/tuixiu-sandbox.fish",
        "/usr/share/tuixiu-sandbox/apparmor/tuixiu-sandbox",
    ] {
        c.ok(&format!("test -f {f}"));
    }
    let version = c.ok("tuixiu-sandbox --version");
    assert_eq!(version.trim(), format!("tuixiu-sandbox {}", env!("CARGO_PKG_VERSION")));
    c.ok("bash -c '. /usr/share/bash-completion/completions/tuixiu-sandbox && complete -p tuixiu-sandbox'");
    // bwrap: offered as an alternative, bubblewrap's file untouched.
    assert_eq!(c.ok("sha256sum /usr/bin/bwrap"), bwrap_sum);
    assert!(c.ok("update-alternatives --query bwrap").contains("Alternative: /usr/bin/tuixiu-sandbox"));
    // The user and the workspace root; the unit neither enabled nor started;
    // no AppArmor profile where the kernel does not restrict user namespaces.
    c.ok("id tuixiu");
    assert_eq!(c.ok("stat -c %U /srv/tuixiu/workspaces").trim(), "tuixiu");
    assert_eq!(text(&c.exec(&["systemctl", "is-enabled", "tuixiu-sandbox"]).stdout).trim(), "disabled");
    assert_eq!(text(&c.exec(&["systemctl", "is-active", "tuixiu-sandbox"]).stdout).trim(), "inactive");
    c.ok("test ! -e /etc/apparmor.d/tuixiu-sandbox");

    // Configured as docs/deploy.md says, with the backend stand-in on the
    // container's own link.
    let pki = Pki::generate_for(&s.dir.join("pki"), &[&backend_ip(1)]);
    let token = jwt("deb", 3600);
    let etc = s.dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::copy(&pki.ca_file, etc.join("ca.pem")).unwrap();
    std::fs::write(etc.join("auth_token"), format!("{token}\n")).unwrap();
    std::fs::write(
        etc.join("proxy.toml"),
        format!(
            "orchestrator_url = \"wss://{}:{PORT}/ws/agent\"\nheartbeat_seconds = 1\nreconnect_max_seconds = 1\n\
             agent_command = [\"/bin/sleep\", \"600\"]\nagent_shutdown_grace_seconds = 1\n\
             acp_request_timeout_seconds = 600\n\
             [agent]\nid = \"{PROXY_ID}\"\n[tls]\nca_file = \"/etc/tuixiu-sandbox/ca.pem\"\n\
             [sandbox]\nworkspaceHostRoot = \"/srv/tuixiu/workspaces\"\n",
            backend_ip(1)
        ),
    )
    .unwrap();
    c.ok("mkdir -p /etc/tuixiu-sandbox");
    let cp = docker_support::docker(&[
        "cp",
        &format!("{}/.", etc.display()),
        &format!("{}:/etc/tuixiu-sandbox/", c.0),
    ]);
    assert!(cp.status.success(), "{}", text(&cp.stderr));
    c.ok("chown -R root:root /etc/tuixiu-sandbox && chmod -R go+rX /etc/tuixiu-sandbox && chmod 0600 /etc/tuixiu-sandbox/auth_token");
    let pid: u32 = docker_support::inspect_format(&c.0, "{{.State.Pid}}").parse().unwrap();
    let listener = private_network(&[pid], PORT);
    let backend = Backend::start_on(listener, Some(&pki), format!("wss://{}:{PORT}/ws/agent", backend_ip(1)));
    backend.set_valid_tokens(Some(vec![token]));

    c.start_service();
    backend.wait_connected(PROXY_ID, 60 * SECS, || c.journal()).await;

    // A run: its sandbox and agent (which never answers initialize, so
    // the run stays opening) are processes of the service.
    backend.send_to(
        PROXY_ID,
        &json!({"type": "acp_open", "run_id": "deb1", "cwd": "/workspace",
                "init": {"script": "true", "timeout_seconds": 30, "env": {"USER_HOME": "/home/agent"},
                         "agentInputs": {"version": 1, "items": []}},
                "instance_name": "tuixiu-run-deb1", "keepalive_ttl_seconds": 600}),
    );
    let deadline = Instant::now() + 60 * SECS;
    while !c.tuixiu_processes().contains("/bin/sleep 600") {
        assert!(Instant::now() < deadline, "no agent process:\n{}\n{}", c.tuixiu_processes(), c.journal());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = c.tuixiu_processes();
    assert!(running.contains("tuixiu-sandbox __exec"), "{running}");

    // The unit serves metrics on loopback (bash's /dev/tcp: the root has no HTTP client).
    let scrape = c.ok(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/9478 && printf \"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n\" >&3 && cat <&3'",
    );
    assert!(scrape.starts_with("HTTP/1.1 200 OK"), "{scrape}");
    assert!(scrape.contains("tuixiu_backend_connected 1"), "{scrape}");
    assert!(scrape.contains("tuixiu_messages_received_total{type=\"acp_open\"} 1"), "{scrape}");

    // apt remove: the service stops, and everything it started with it.
    c.ok("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q tuixiu-sandbox");
    assert_eq!(c.tuixiu_processes(), "", "processes left after apt remove");
    assert!(!text(&c.sh("ps -eo args").stdout).contains("sleep 600"));
    assert_eq!(text(&c.exec(&["systemctl", "is-active", "tuixiu-sandbox"]).stdout).trim(), "inactive");
    c.ok("test ! -e /usr/bin/tuixiu-sandbox && test ! -e /usr/lib/systemd/system/tuixiu-sandbox.service");
    assert_eq!(c.ok("sha256sum /usr/bin/bwrap"), bwrap_sum);
    assert!(!c.sh("update-alternatives --query bwrap").status.success());
    // What runs made stays: a removal never deletes the agents' work.
    c.ok("test -d /srv/tuixiu/workspaces/run-deb1");

    // Without bubblewrap, /usr/bin/bwrap is the alternative: our launcher,
    // answering as bubblewrap, with its man page; purge takes both away.
    c.ok("dpkg -r bubblewrap && test ! -e /usr/bin/bwrap");
    c.ok("dpkg -i /var/tmp/tuixiu-sandbox.deb");
    assert_eq!(c.ok("readlink -f /usr/bin/bwrap").trim(), "/usr/bin/tuixiu-sandbox");
    assert_eq!(
        c.ok("readlink -f /usr/share/man/man1/bwrap.1.gz").trim(),
        "/usr/share/man/man1/tuixiu-sandbox-bwrap.1.gz"
    );
    assert!(c.ok("bwrap --version").starts_with("bubblewrap 0.11.1 (tuixiu-sandbox"));
    assert_eq!(
        c.ok("bwrap --ro-bind / / --proc /proc --dev /dev --unshare-pid /bin/echo nested").trim(),
        "nested"
    );
    c.ok("dpkg --purge tuixiu-sandbox");
    c.ok("test ! -e /usr/bin/bwrap && test ! -L /usr/bin/bwrap");
    // Bubblewrap comes back as it was.
    c.ok("dpkg -i /var/cache/apt/archives/bubblewrap_*.deb");
    assert_eq!(c.ok("sha256sum /usr/bin/bwrap"), bwrap_sum);
}
