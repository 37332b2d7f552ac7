//! `run --network allow`: the command reaches the listed destinations
//! through the egress proxy (HTTP CONNECT, SOCKS5, plain HTTP by absolute
//! URI; curl, Python, Node's fetch, git over https) and nothing else: not a
//! name the allowlist lacks, not an address literal, not a listed name
//! that resolves to a refused range, not anything without the proxy. As
//! root, uid 65534 and inside `unshare -U -r`.
//!
//! Names resolve to loopback servers through the test builds' mapping
//! (`TUIXIU_SANDBOX_TEST_ONLY_EGRESS_HOSTS`); the servers' range is opened
//! with the operator's `--allow-range`, address by address.

mod common;
mod egress_support;
mod pki;

use std::sync::Arc;

use common::{Caller, Fixture, stderr};
use egress_support::{GitServer, HOSTS_ENV, Server, hosts_file};
use pki::Pki;

/// Certificates for `names` in the fixture's directory, and the HTTPS
/// stand-ins' configuration.
fn tls(f: &Fixture, names: &[&str]) -> (Pki, Arc<rustls::ServerConfig>) {
    let pki = Pki::generate_for(&f.dir, names);
    let config = Arc::new(pki.server_config(false));
    (pki, config)
}

/// One sandbox run with the proxy: the policy `extra`, the mapping
/// `hosts`, the fixture's directory at `/fx` (certificates).
fn run_allow(f: &Fixture, hosts: &[(&str, &str)], extra: &[&str], script: &str) -> std::process::Output {
    let mapping = hosts_file(&f.dir, hosts);
    let ws = f.workspace.to_str().unwrap();
    let fx = f.dir.to_str().unwrap();
    let mut args = vec!["run", "-v", "--workspace", ws, "--ro-bind", fx, "/fx", "--network", "allow"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let mut cmd = f.command(&args);
    cmd.env(HOSTS_ENV, mapping);
    cmd.output().unwrap()
}

/// `label ok|fail OUTPUT` per probe: the probe's output on one line.
const PROBE: &str = r#"p() { label=$1; shift; if out=$("$@" 2>&1); then r=ok; else r=fail; fi; echo "$label $r $(echo "$out" | tr '\n' ' ')"; }
"#;

fn line<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(&format!("{label} "))).unwrap_or_else(|| panic!("no {label} in {out}"))
}

for_each_caller!(only_listed_destinations_are_reached, |caller: Caller| {
    let f = Fixture::new(caller);
    let (_pki, config) = tls(&f, &["api.model.test"]);
    let model = Server::start("127.0.0.2", Some(config), "model-ok");
    let plain = Server::start("127.0.0.2", None, "plain-ok");
    let metadata = Server::start("127.0.0.3", None, "metadata-LEAK");
    let private = Server::start("127.0.0.4", None, "private-LEAK");
    let hosts = [
        ("127.0.0.2", "api.model.test"),
        ("127.0.0.2", "plain.model.test"),
        ("127.0.0.3", "metadata.test"),
        ("169.254.169.254", "meta.test"),
        ("10.1.2.3", "private.test"),
        ("127.0.0.4", "private-lo.test"),
    ];
    let (m, p, md, pv) = (model.port, plain.port, metadata.port, private.port);
    let allow = [
        format!("api.model.test:{m}"),
        format!("plain.model.test:{p}"),
        format!("metadata.test:{md}"),
        "meta.test:80".to_string(),
        "private.test:80".to_string(),
        format!("private-lo.test:{pv}"),
    ];
    let mut extra: Vec<&str> = Vec::new();
    for a in &allow {
        extra.extend(["--allow-host", a]);
    }
    extra.extend(["--allow-range", "127.0.0.2/32"]);
    let script = format!(
        "{PROBE}\
         p connect curl -sS --cacert /fx/ca.pem https://api.model.test:{m}/v1/responses
         p socks curl -sS --cacert /fx/ca.pem -x socks5h://127.0.0.1:3128 https://api.model.test:{m}/
         p plain curl -sS http://plain.model.test:{p}/secret-path?token=hunter2
         p python python3 -c 'import ssl,urllib.request as u; print(u.urlopen(\"https://api.model.test:{m}/\", context=ssl.create_default_context(cafile=\"/fx/ca.pem\")).read().decode())'
         p unlisted curl -sS --cacert /fx/ca.pem https://other.test:{m}/
         p unlisted_socks curl -sS -x socks5h://127.0.0.1:3128 http://other.test:{p}/
         p literal curl -sS http://127.0.0.2:{p}/
         p loopback curl -sS http://metadata.test:{md}/
         p linklocal curl -sS http://meta.test/
         p private curl -sS http://private.test/
         p private_lo curl -sS http://private-lo.test:{pv}/
         p direct curl -sS --noproxy '*' --connect-timeout 5 http://127.0.0.2:{p}/
         p direct_out python3 -c 'import socket; socket.create_connection((\"10.1.2.3\", 80), timeout=5)'
         p dns getent hosts api.model.test
         "
    );
    let out = run_allow(&f, &hosts, &extra, &script);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = stderr(&out);
    assert!(out.status.success(), "{text}\n{err}");
    for (label, want) in
        [("connect", "model-ok"), ("socks", "model-ok"), ("plain", "plain-ok"), ("python", "model-ok")]
    {
        assert_eq!(line(&text, label), format!("{label} ok {want} "), "{err}");
    }
    assert!(line(&text, "unlisted").contains("fail") && line(&text, "unlisted").contains("403"), "{text}");
    assert!(line(&text, "unlisted_socks").starts_with("unlisted_socks fail"), "{text}");
    assert!(line(&text, "literal").contains("an address not in the allowlist"), "{text}");
    assert!(line(&text, "loopback").contains("127.0.0.3 is loopback"), "{text}");
    assert!(line(&text, "linklocal").contains("169.254.169.254 is link-local"), "{text}");
    assert!(line(&text, "private").contains("10.1.2.3 is private"), "{text}");
    assert!(line(&text, "private_lo").contains("refused"), "{text}");
    assert!(line(&text, "direct").starts_with("direct fail"), "{text}");
    assert!(line(&text, "direct_out").contains("Network is unreachable"), "{text}");
    assert!(line(&text, "dns").starts_with("dns fail"), "{text}");
    assert_eq!((metadata.hits(), private.hits()), (0, 0), "a refused server was contacted");
    // The plain request went out in origin form, without proxy headers.
    assert!(
        plain.last_request().starts_with("GET /secret-path?token=hunter2 HTTP/1.1\r\n"),
        "{}",
        plain.last_request()
    );
    assert!(plain.last_request().contains(&format!("Host: plain.model.test:{p}\r\n")));
    // One line per refusal on stderr (-v), never the request's path or query.
    assert!(
        err.contains(&format!("egress proxy: denied other.test:{m} (CONNECT): not in the allowlist")),
        "{err}"
    );
    assert!(
        err.contains(&format!("egress proxy: denied other.test:{p} (SOCKS5): not in the allowlist")),
        "{err}"
    );
    assert!(err.contains("egress proxy: denied meta.test:80 (HTTP): 169.254.169.254 is link-local"), "{err}");
    assert_eq!(err.matches("egress proxy: denied").count(), 7, "{err}");
    assert!(!err.contains("secret-path") && !err.contains("hunter2"), "{err}");
});

#[test]
fn loopback_needs_the_operators_range() {
    let f = Fixture::new(Caller::Root);
    let plain = Server::start("127.0.0.2", None, "plain-ok");
    let allow = format!("api.model.test:{}", plain.port);
    let script = format!("{PROBE}p get curl -sS http://api.model.test:{}/\n", plain.port);
    let out = run_allow(&f, &[("127.0.0.2", "api.model.test")], &["--allow-host", &allow], &script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(line(&text, "get").contains("127.0.0.2 is loopback (127.0.0.0/8), refused"), "{text}");
    assert_eq!(plain.hits(), 0);
    // Without -v the refusal is the client's to show; stderr stays quiet.
    let mapping = hosts_file(&f.dir, &[("127.0.0.2", "api.model.test")]);
    let ws = f.workspace.to_str().unwrap();
    let mut cmd = f.command(&[
        "run",
        "--workspace",
        ws,
        "--network",
        "allow",
        "--allow-host",
        &allow,
        "--",
        "curl",
        "-sS",
        &format!("http://api.model.test:{}/", plain.port),
    ]);
    cmd.env(HOSTS_ENV, mapping);
    let quiet = cmd.output().unwrap();
    assert!(!stderr(&quiet).contains("egress proxy: denied"), "{}", stderr(&quiet));
}

for_each_caller!(git_and_node_go_through_the_proxy, |caller: Caller| {
    let f = Fixture::new(caller);
    let (pki, config) = tls(&f, &["api.model.test", "git.model.test"]);
    let model = Server::start("127.0.0.2", Some(config), "model-ok");
    let git_root = f.dir.join("git");
    std::fs::create_dir(&git_root).unwrap();
    let git = GitServer::start(&git_root, &pki.server_cert, &pki.server_key, "127.0.0.5");
    let undici = std::env::var("TUIXIU_TEST_UNDICI_DIR")
        .unwrap_or_else(|_| "/opt/tuixiu-ci/undici-6.29.1/node_modules".into());
    assert!(
        std::path::Path::new(&undici).join("undici/package.json").exists(),
        "undici is missing at {undici}: run scripts/ci-setup.d/45-egress.sh"
    );
    let (m, g) = (model.port, git.port);
    let node = format!(
        "const {{ fetch, EnvHttpProxyAgent, setGlobalDispatcher }} = require('undici'); \
         setGlobalDispatcher(new EnvHttpProxyAgent()); \
         fetch('https://api.model.test:{m}/').then(r => r.text()).then(t => console.log(t), e => {{ console.log(String(e.cause || e)); process.exit(1); }});"
    );
    let script = format!(
        "{PROBE}cd /tmp
         p git sh -c 'git -c http.sslCAInfo=/fx/ca.pem clone -q https://git.model.test:{g}/repo.git && cat repo/README'
         p node env NODE_PATH={undici} NODE_EXTRA_CA_CERTS=/fx/ca.pem node --no-warnings -e \"{node}\"
         p git_unlisted git -c http.sslCAInfo=/fx/ca.pem clone -q https://gitlab.test:{g}/repo.git other
         "
    );
    let hosts =
        [("127.0.0.2", "api.model.test"), ("127.0.0.5", "git.model.test"), ("127.0.0.5", "gitlab.test")];
    let (ah, gh) = (format!("api.model.test:{m}"), format!("git.model.test:{g}"));
    let extra = [
        "--allow-host",
        &ah,
        "--allow-host",
        &gh,
        "--allow-range",
        "127.0.0.2",
        "--allow-range",
        "127.0.0.5",
    ];
    let out = run_allow(&f, &hosts, &extra, &script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(line(&text, "git"), "git ok cloned through the egress proxy ", "{text}\n{}", stderr(&out));
    assert_eq!(line(&text, "node"), "node ok model-ok ", "{text}\n{}", stderr(&out));
    assert!(line(&text, "git_unlisted").starts_with("git_unlisted fail"), "{text}");
    assert!(
        stderr(&out).contains(&format!("denied gitlab.test:{g} (CONNECT): not in the allowlist")),
        "{}",
        stderr(&out)
    );
});

for_each_caller!(nested_sandboxes_share_the_proxy_and_nothing_more, |caller: Caller| {
    let f = Fixture::new(caller);
    let plain = Server::start("127.0.0.2", None, "plain-ok");
    let p = plain.port;
    let allow = format!("api.model.test:{p}");
    let script = format!(
        "{PROBE}p shared bwrap --ro-bind / / --dev /dev --proc /proc -- curl -sS http://api.model.test:{p}/
         p shared_unlisted bwrap --ro-bind / / --dev /dev --proc /proc -- curl -sS http://other.test:{p}/
         p unshared bwrap --ro-bind / / --dev /dev --proc /proc --unshare-net -- curl -sS --connect-timeout 5 http://api.model.test:{p}/
         "
    );
    let hosts = [("127.0.0.2", "api.model.test"), ("127.0.0.2", "other.test")];
    let out = run_allow(&f, &hosts, &["--allow-host", &allow, "--allow-range", "127.0.0.2"], &script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(line(&text, "shared"), "shared ok plain-ok ", "{text}\n{}", stderr(&out));
    assert!(line(&text, "shared_unlisted").contains("not in the allowlist"), "{text}");
    assert!(line(&text, "unshared").starts_with("unshared fail"), "{text}");
    assert_eq!(plain.hits(), 1);
});

#[test]
fn allowlist_options_are_checked() {
    let f = Fixture::new(Caller::Root);
    let refused = |extra: &[&str], want: &str| {
        let out = f.run(extra, &["true"]);
        assert_eq!(out.status.code(), Some(125), "{extra:?}");
        let err = stderr(&out);
        assert!(err.contains(want), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    };
    refused(
        &["--allow-host", "a.test"],
        "--allow-host, --allow-hosts-file and --allow-range need --network allow",
    );
    refused(&["--network", "allow", "--allow-host", "bücher.test"], "\"bücher.test\": not a host name");
    refused(&["--network", "allow", "--allow-host", "a.test:99999"], "the port must be a number");
    refused(&["--network", "allow", "--allow-range", "10.0.0.0/40"], "the prefix length is longer");
    let file = f.dir.join("allow.txt");
    std::fs::write(&file, "# model\napi.model.test\nnot a host\n").unwrap();
    let file_arg = file.to_str().unwrap();
    refused(&["--network", "allow", "--allow-hosts-file", file_arg], "allow.txt:3: \"not a host\"");
    refused(&["--network", "allow", "--provider", "docker", "--image", "x"], "--network allow");
}

#[test]
fn a_named_instance_counts_its_refusals() {
    let f = Fixture::new(Caller::Root);
    let plain = Server::start("127.0.0.2", None, "plain-ok");
    let state = f.dir.join("state");
    let name = format!("tuixiu-run-egress-{}", std::process::id());
    let allow = format!("api.model.test:{}", plain.port);
    let script =
        format!("curl -sS http://api.model.test:{0}/; curl -sS http://other.test:{0}/; true", plain.port);
    let mut extra = vec!["--instance-name", &name, "--state-dir", state.to_str().unwrap()];
    extra.extend(["--allow-host", &allow, "--allow-range", "127.0.0.2"]);
    let out = run_allow(&f, &[("127.0.0.2", "api.model.test"), ("127.0.0.2", "other.test")], &extra, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("plain-ok"));
    // The counters reach the instance's file within a second.
    let inspect = || {
        let out = f
            .command(&["inspect", "--json", "--state-dir", state.to_str().unwrap(), &name])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let info = loop {
        let info = inspect();
        if info["egress"]["denied"] == 1 || std::time::Instant::now() > deadline {
            break info;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(info["egress"]["denied"], 1, "{info}");
    assert_eq!(info["egress"]["connections"], 2, "{info}");
    assert!(info["egress"]["bytesIn"].as_u64().unwrap() > 0, "{info}");
    let list = f.command(&["instances", "--state-dir", state.to_str().unwrap()]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.lines().next().unwrap().ends_with("DENIED"), "{list}");
    assert!(list.lines().any(|l| l.starts_with(&name) && l.ends_with(" 1")), "{list}");
    let _ = f.command(&["rm", "--state-dir", state.to_str().unwrap(), &name]).output();
}
