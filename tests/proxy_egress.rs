//! The daemon with `sandbox.network = "allow"`: every sandbox of a run (the
//! agent, its init script, its terminals) reaches the listed destinations
//! through an egress proxy the daemon serves, and nothing else; each
//! refusal is a `[proxy:network] denied …` event of the run; a run's own
//! list (`init.network.allowHosts`) narrows the policy and is refused when
//! it would widen it. As root, uid 65534 and inside `unshare -U -r`.

mod egress_support;
mod proxy_support;

use egress_support::{HOSTS_ENV, Server, hosts_file};
use proxy_support::agent::{acp_config, contents, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

fn open_msg(run: &str, script: &str, network: Option<Value>) -> Value {
    let mut init = json!({"script": script, "timeout_seconds": 30, "env": {"USER_HOME": "/home/agent"},
        "agentInputs": {"version": 1, "items": []}});
    if let Some(network) = network {
        init["network"] = network;
    }
    json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init,
           "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":600})
}

fn texts(b: &Backend, run: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| {
            r.msg["type"] == "proxy_update" && r.msg["run_id"] == run && r.msg["content"]["type"] == "text"
        })
        .filter_map(|r| r.msg["content"]["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_reach_only_their_allowlist() {
    for caller in ["root", "nobody", "nested"] {
        let backend = Backend::start().await;
        let s = Scratch::new(&format!("egress-{caller}"));
        let model = Server::start("127.0.0.2", None, "model-ok");
        let p = model.port;
        let mapping = hosts_file(&s.dir, &[("127.0.0.2", "api.model.test"), ("127.0.0.2", "other.test")]);
        let sandbox = format!(
            "network = \"allow\"\nallowHosts = [\"api.model.test:{p}\"]\nallowRanges = [\"127.0.0.2\"]"
        );
        let cfg = acp_config(&s, &backend.url, "", &sandbox);
        let env = [(HOSTS_ENV, mapping.to_str().unwrap())];
        let mut daemon = match caller {
            "root" => Daemon::start_env(&s, "proxy", &cfg, &env),
            _ => Daemon::start_unprivileged_env(&s, "proxy", &cfg, caller == "nested", &env),
        };
        backend.registered(0, 20 * SECS).await;

        // The init script runs in a sandbox of its own, with its own proxy.
        let init_script = format!("curl -sS http://api.model.test:{p}/ > /workspace/init.txt");
        backend.send(&open_msg("e1", &init_script, None));
        let opened = backend.wait_type("acp_opened", "run_id", &json!("e1"), 60 * SECS).await;
        assert_eq!(opened["ok"], true, "{caller}: {opened}\n{}", daemon.stderr());
        assert_eq!(std::fs::read_to_string(s.root.join("run-e1/init.txt")).unwrap(), "model-ok");

        let script = [
            format!("run curl -sS http://api.model.test:{p}/"),
            format!("run curl -sS http://other.test:{p}/private?token=abc"),
            format!("run curl -sS --noproxy * --connect-timeout 5 http://127.0.0.2:{p}/"),
            format!(r#"term {{"command":"curl -sS http://api.model.test:{p}/"}}"#),
        ]
        .join("\n");
        let r = prompt(&backend, "e1", "p1", Value::Null, &script).await;
        assert_eq!(r["ok"], true, "{caller}: {r}\n{}", daemon.stderr());
        let rep = reports(&backend, "p1");
        assert_eq!(
            (rep[0]["code"].clone(), rep[0]["stdout"].clone()),
            (json!(0), json!("model-ok")),
            "{caller}: {rep:?}"
        );
        assert!(rep[1]["stdout"].as_str().unwrap().contains("not in the allowlist"), "{rep:?}");
        assert_ne!(rep[2]["code"], 0, "a direct connection went through: {rep:?}");
        assert_eq!(rep[3]["tail"], "model-ok", "{caller}: the joined terminal: {rep:?}");
        let denied: Vec<String> =
            texts(&backend, "e1").into_iter().filter(|t| t.starts_with("[proxy:network]")).collect();
        assert_eq!(
            denied,
            [format!("[proxy:network] denied other.test:{p} (HTTP): not in the allowlist")],
            "{caller}"
        );
        // Nothing of the request itself reached the backend or the log.
        assert!(
            !backend
                .received()
                .iter()
                .any(|r| r.msg.to_string().contains("token=abc") && r.msg["type"] == "proxy_update")
        );
        assert!(!daemon.stderr().contains("token=abc"));

        // A run's own list narrows the policy...
        backend.send(&open_msg("e2", "", Some(json!({"allowHosts": []}))));
        let opened = backend.wait_type("acp_opened", "run_id", &json!("e2"), 60 * SECS).await;
        assert_eq!(opened["ok"], true, "{opened}");
        let r =
            prompt(&backend, "e2", "p2", Value::Null, &format!("run curl -sS http://api.model.test:{p}/"))
                .await;
        assert_eq!(r["ok"], true, "{r}");
        let rep = reports(&backend, "p2");
        assert!(rep[0]["stdout"].as_str().unwrap().contains("not in the allowlist"), "{rep:?}");
        // ...and never widens it.
        backend.send(&open_msg("e3", "", Some(json!({"allowHosts": ["api.evil.test"]}))));
        let opened = backend.wait_type("acp_opened", "run_id", &json!("e3"), 60 * SECS).await;
        assert_eq!(opened["ok"], false);
        assert!(
            opened["error"].as_str().unwrap().contains(
                "init.network.allowHosts: api.evil.test:443 is not allowed by this proxy's network policy (allow)"
            ),
            "{opened}"
        );
        assert_eq!(model.hits(), 3, "{caller}: init script, agent, terminal");

        // `inspect` shows the run's counters (written within a second).
        let inspect = || {
            let out = std::process::Command::new(proxy_support::binary())
                .args(["inspect", "--json", "--state-dir"])
                .arg(&s.state)
                .arg("tuixiu-run-e1")
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut info = inspect();
        while info["egress"]["denied"] != 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            info = inspect();
        }
        assert_eq!(info["egress"]["denied"], 1, "{caller}: {info}");
        assert!(
            contents(&backend, "text")
                .iter()
                .any(|t| t["text"].as_str().unwrap_or("").starts_with("[proxy:network]"))
        );
        assert!(daemon.stop().success(), "{}", daemon.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_is_checked() {
    let s = Scratch::new("egress-config");
    for (sandbox, want) in [
        ("allowHosts = [\"a.test\"]", "sandbox.allowHosts: needs sandbox.network = \"allow\""),
        ("network = \"allow\"\nallowHosts = [\"a b\"]", "sandbox.allowHosts: \"a b\": not a host name"),
        ("network = \"allow\"\nallowRanges = [\"10/8\"]", "sandbox.allowRanges: \"10/8\""),
        (
            "network = \"allow\"\nprovider = \"container_oci\"\nimage = \"x\"",
            "allow (the egress proxy) needs the native provider",
        ),
        ("network = \"sometimes\"", "use on, off or allow"),
    ] {
        let cfg = s.config("ws://127.0.0.1:9/ws/agent", "", sandbox);
        let mut daemon = Daemon::start(&s, "bad", &cfg);
        let status = daemon.wait_exit(std::time::Duration::from_secs(20));
        assert!(!status.success());
        assert!(daemon.stderr().contains(want), "{sandbox}: {}", daemon.stderr());
    }
}
