//! deploy/ checked (docs/deploy.md): the systemd unit and its files verify,
//! the Kubernetes manifests validate offline against the schemas, and the
//! container image builds from this repository alone and its daemon
//! registers with the backend stand-in. The unit running under a real
//! systemd is in deploy_systemd.rs.

mod docker_support;
mod proxy_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use proxy_support::net::{backend_ip, private_network};
use proxy_support::{Backend, Pki, SECS, Scratch, binary, jwt};
use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The unit with its binaries where this build installed them.
fn unit_for_test(dir: &Path) -> PathBuf {
    let bin = binary().parent().unwrap().display().to_string();
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/tuixiu-sandbox.service")).unwrap();
    let path = dir.join("tuixiu-sandbox.service");
    std::fs::write(&path, unit.replace("/usr/local/bin", &bin)).unwrap();
    path
}

#[test]
fn systemd_unit_and_its_files_verify() {
    let s = Scratch::new("systemd-verify");
    let unit = unit_for_test(&s.dir);
    let verify = |unit: &Path| run(Command::new("systemd-analyze").arg("verify").arg(unit));
    let out = verify(&unit);
    assert!(out.status.success() && out.stderr.is_empty(), "systemd-analyze verify: {}", text(&out.stderr));

    // The check has teeth: a misspelt directive or a bad value is reported.
    for (from, to) in [("ProtectHome=yes", "ProtectHomee=yes"), ("PrivateUsers=yes", "PrivateUsers=maybe")] {
        let bad = s.dir.join("bad").join("tuixiu-sandbox.service");
        std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
        std::fs::write(&bad, std::fs::read_to_string(&unit).unwrap().replace(from, to)).unwrap();
        let out = verify(&bad);
        assert!(!out.stderr.is_empty(), "{to} went unnoticed");
    }

    // The user and the workspace root, made in a scratch root as a package
    // would make them.
    let root = s.dir.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let sysusers = repo().join("deploy/systemd/tuixiu-sandbox.sysusers");
    let out = run(Command::new("systemd-sysusers").arg(format!("--root={}", root.display())).arg(&sysusers));
    assert!(out.status.success(), "systemd-sysusers: {}", text(&out.stderr));
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd.lines().any(|l| l.starts_with("tuixiu:") && l.contains(":/var/lib/tuixiu-sandbox:")),
        "{passwd}"
    );
    let tmpfiles = repo().join("deploy/systemd/tuixiu-sandbox.tmpfiles");
    let out = run(Command::new("systemd-tmpfiles")
        .arg(format!("--root={}", root.display()))
        .arg("--create")
        .arg(&tmpfiles));
    assert!(out.status.success(), "systemd-tmpfiles: {}", text(&out.stderr));
    let ws = std::fs::metadata(root.join("srv/tuixiu/workspaces")).unwrap();
    assert!(ws.is_dir());
    let uid: u32 = passwd
        .lines()
        .find(|l| l.starts_with("tuixiu:"))
        .unwrap()
        .split(':')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&ws), uid);
}

fn kubernetes_validate(dir: &Path) -> Output {
    let python = std::env::var("TUIXIU_TEST_KUBERNETES_VALIDATE_PYTHON").expect(
        "TUIXIU_TEST_KUBERNETES_VALIDATE_PYTHON is not set: source scripts/ci-setup.d/40-deploy.sh (as scripts/test.sh does)",
    );
    // Without a network: the schemas must come from the package itself.
    run(Command::new("unshare")
        .args(["--net", "--"])
        .arg(python)
        .arg(repo().join("deploy/kubernetes/validate.py"))
        .arg(dir))
}

#[test]
fn kubernetes_manifests_validate_offline() {
    let out = kubernetes_validate(&repo().join("deploy/kubernetes"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    // Namespace, ServiceAccount, Secret, DaemonSet, the generated
    // ConfigMap, and the DaemonSet with the unmasked-proc component.
    assert!(stdout.ends_with("{\"checked\": 6, \"problems\": 0}\n"), "{stdout}");
    for what in
        ["daemonset.yaml (DaemonSet tuixiu-sandbox)", "unmasked-proc: DaemonSet tuixiu-sandbox patched"]
    {
        assert!(stdout.contains(&format!("ok   {what}")), "{stdout}");
    }

    // The ConfigMap's proxy.toml is a config the daemon takes as it is,
    // with the id the DaemonSet sets from the node's name.
    let env = [("ACP_PROXY_AGENT_ID".to_string(), "node-1".to_string())];
    let (cfg, warnings) =
        tuixiu_sandbox::proxy::config::Config::load(Some(&repo().join("deploy/kubernetes/proxy.toml")), env)
            .unwrap_or_else(|e| panic!("deploy/kubernetes/proxy.toml: {e}"));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(cfg.agent.id.as_deref(), Some("node-1"));

    // The validation has teeth: an unknown field, and Unmasked without a
    // pod user namespace, are reported.
    let s = Scratch::new("k8s-broken");
    let copy = s.dir.join("kubernetes");
    let out = run(Command::new("cp").arg("-r").arg(repo().join("deploy/kubernetes")).arg(&copy));
    assert!(out.status.success());
    let ds = copy.join("daemonset.yaml");
    let text_of = std::fs::read_to_string(&ds).unwrap();
    std::fs::write(&ds, text_of.replace("readOnlyRootFilesystem: true", "readOnlyRootFS: true")).unwrap();
    let patch = copy.join("unmasked-proc/daemonset-patch.yaml");
    let p = std::fs::read_to_string(&patch).unwrap();
    std::fs::write(&patch, p.replace("  value: false\n", "  value: true\n")).unwrap();
    let out = kubernetes_validate(&copy);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL daemonset.yaml") && stdout.contains("readOnlyRootFS"), "{stdout}");
    assert!(stdout.contains("procMount Unmasked without hostUsers: false"), "{stdout}");
}

/// Removes the image, container and volume of the image test.
struct ImageTest {
    image: String,
    container: String,
    volume: String,
}

impl Drop for ImageTest {
    fn drop(&mut self) {
        let _ = docker_support::docker(&["rm", "-f", &self.container]);
        let _ = docker_support::docker(&["volume", "rm", "-f", &self.volume]);
        let _ = docker_support::docker(&["rmi", "-f", &self.image]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_image_builds_and_its_daemon_registers() {
    docker_support::require_engine();
    let id = std::process::id();
    let t = ImageTest {
        image: format!("tuixiu-test/daemon-image:{id}"),
        container: format!("tuixiu-test-daemon-image-{id}"),
        volume: format!("tuixiu-test-daemon-state-{id}"),
    };
    // From this repository alone: the static binaries on `FROM scratch`.
    let out = run(Command::new(repo().join("deploy/container/build.sh"))
        .args(["--profile", "dev", "--tag", &t.image])
        .current_dir(repo()));
    assert!(out.status.success(), "build.sh: {}{}", text(&out.stdout), text(&out.stderr));
    let inspect = |format: &str| docker_support::inspect_format(&t.image, format);
    assert_eq!(inspect("{{.Config.User}}"), "10001:10001");
    assert!(inspect("{{json .Config.Volumes}}").contains("/var/lib/tuixiu-sandbox"));
    assert!(inspect("{{json .Config.Healthcheck}}").contains("--daemon"));
    // Nothing but what we put there: three binaries and a few files.
    assert_eq!(inspect("{{len .RootFS.Layers}}"), "2");

    // Its config and token, as an operator mounts them.
    let s = Scratch::new("image");
    let etc = s.dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let pki = Pki::generate_for(&s.dir.join("pki"), &[&backend_ip(1)]);
    std::fs::copy(&pki.ca_file, etc.join("ca.pem")).unwrap();
    let token = jwt("image", 3600);
    std::fs::write(etc.join("auth_token"), format!("{token}\n")).unwrap();
    // Readable by the image's user (10001).
    for f in ["ca.pem", "auth_token"] {
        std::fs::set_permissions(etc.join(f), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }

    // The backend's port in the test's own network namespace.
    const PORT: u16 = 8443;
    std::fs::write(
        etc.join("proxy.toml"),
        format!(
            "orchestrator_url = \"wss://{}:{PORT}/ws/agent\"\nheartbeat_seconds = 1\nreconnect_max_seconds = 1\n\
             [agent]\nid = \"image-host\"\n[sandbox]\nworkspaceHostRoot = \"/srv/tuixiu/workspaces\"\n\
             [tls]\nca_file = \"/etc/tuixiu-sandbox/ca.pem\"\n",
            backend_ip(1)
        ),
    )
    .unwrap();
    std::fs::set_permissions(etc.join("proxy.toml"), std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .unwrap();

    // The image's own command; no network but the link the test gives it
    // (the daemon retries until it is there).
    let out = docker_support::docker(&[
        "run",
        "-d",
        "--name",
        &t.container,
        "--network=none",
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "-v",
        &format!("{}:/var/lib/tuixiu-sandbox", t.volume),
        "-v",
        &format!("{}:/etc/tuixiu-sandbox:ro", etc.display()),
        &t.image,
    ]);
    assert!(out.status.success(), "docker run: {}", text(&out.stderr));
    let pid: u32 = docker_support::inspect_format(&t.container, "{{.State.Pid}}").parse().unwrap();
    let listener = private_network(&[pid], PORT);
    let backend = Backend::start_on(listener, Some(&pki), format!("wss://{}:{PORT}/ws/agent", backend_ip(1)));
    backend.set_valid_tokens(Some(vec![token.clone()]));
    let logs = || text(&docker_support::docker(&["logs", &t.container]).stderr);
    let deadline = Instant::now() + 60 * SECS;
    while !backend.is_connected("image-host") {
        assert!(Instant::now() < deadline, "the daemon in the image did not register:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(backend.auth(0).as_deref(), Some(format!("Bearer {token}").as_str()));

    // It runs as 10001, logs JSON, and its health check passes: a sandbox
    // runs (the container's /proc is masked: the bound one) and the daemon
    // is alive.
    let top = docker_support::docker(&["top", &t.container, "-o", "uid,comm"]);
    assert!(
        text(&top.stdout).lines().skip(1).all(|l| l.trim_start().starts_with("10001")),
        "{}",
        text(&top.stdout)
    );
    let health: Vec<&str> = vec![
        "exec",
        &t.container,
        "tuixiu-sandbox",
        "check",
        "--json",
        "--daemon",
        "/var/lib/tuixiu-sandbox",
    ];
    let deadline = Instant::now() + 30 * SECS;
    let report = loop {
        let out = docker_support::docker(&health);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("check --json: {e}: {}{}", text(&out.stdout), text(&out.stderr)));
        if out.status.success() {
            break report;
        }
        assert!(Instant::now() < deadline, "the health check fails: {report:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(report["runWorks"], true, "{report:#}");
    assert_eq!(report["proc"], "bind", "{report:#}");
    // No /bin/true in an image of three binaries: the tool's --version ran.
    let sandbox = report["checks"].as_array().unwrap().iter().find(|r| r["check"] == "sandbox").unwrap();
    assert!(sandbox["detail"].as_str().unwrap().contains("tuixiu-sandbox-full --version"), "{sandbox}");
    assert_eq!(report["daemonAlive"], true, "{report:#}");
    let log = logs();
    assert!(!log.contains(&token), "the token is logged");
    let json_lines = log.lines().filter(|l| serde_json::from_str::<Value>(l).is_ok()).count();
    assert!(json_lines >= 2 && json_lines == log.lines().count(), "{log}");
}
