//! The agent host end to end: fake backend → real daemon → real sandbox
//! (native, and docker) → the fake agent (tests/fake/agent.rs).

mod docker_support;
mod proxy_support;

use std::path::Path;
use std::time::Duration;

use proxy_support::agent::{acp_config, chunks, contents, files_under, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

const SECRET: &str = "sk-acp-test-secret-77";
fn init(script: &str) -> Value {
    json!({"script": script, "timeout_seconds": 30,
           "env": {"OPENAI_API_KEY": SECRET, "GH_TOKEN": format!("gh-{SECRET}"), "TUIXIU_RUN_ID": "x", "USER_HOME": "/home/agent"},
           "agentInputs": {"version": 1, "items": [
               {"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": "from the manifest"},
                "target": {"root": "WORKSPACE", "path": "notes/readme.txt"}}]}})
}

/// `[sandbox]` lines for the docker provider. The busybox test image has
/// no python3 or bash: the host's /usr and loader are bound read-only for
/// the fake agent. `more` goes before the volume tables.
fn docker_extra(more: &str) -> String {
    format!(
        "provider = \"container_oci\"\nimage = \"{}\"\nenv = {{ PATH = \"/usr/bin:/bin\" }}\n{more}\n\
         [[sandbox.volumes]]\nhostPath = \"/usr\"\nguestPath = \"/usr\"\nreadOnly = true\n\
         [[sandbox.volumes]]\nhostPath = \"/usr/lib\"\nguestPath = \"/lib\"\nreadOnly = true\n\
         [[sandbox.volumes]]\nhostPath = \"/usr/lib64\"\nguestPath = \"/lib64\"\nreadOnly = true\n",
        docker_support::image()
    )
}

/// Removes docker containers when dropped.
struct Containers(Vec<String>);

impl Drop for Containers {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = docker_support::docker(&["rm", "-f", name]);
        }
    }
}

async fn open(b: &Backend, run: &str, script: &str) -> Value {
    b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init(script),
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":600}));
    b.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await
}

/// The whole life of a run on one provider.
async fn run_lifecycle(b: &Backend, s: &Scratch, run: &str, daemon: &mut Daemon, cfg: &str) {
    let ws = s.root.join(format!("run-{run}"));
    // The workspace exists before the open so a symlink can be planted.
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("etc-link")).unwrap();

    // acp_open: manifest, init script steps, agent, initialize.
    let script = "echo __TUIXIU_INIT_STEP__:prepare:start\necho hello from init $GH_TOKEN\n\
                  echo __TUIXIU_INIT_STEP__:prepare:done:ready\necho oops >&2";
    let opened = open(b, run, script).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let steps = contents(b, "init_step");
    assert_eq!(steps[0], json!({"type":"init_step","stage":"prepare","status":"start"}));
    assert_eq!(steps[1], json!({"type":"init_step","stage":"prepare","status":"done","message":"ready"}));
    let texts: Vec<String> =
        contents(b, "text").iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    assert!(texts.contains(&"[init:stdout] hello from init [REDACTED]".to_string()), "{texts:?}");
    assert!(texts.contains(&"[init:stderr] oops".to_string()), "{texts:?}");
    assert_eq!(contents(b, "init_result"), [json!({"type":"init_result","ok":true})]);
    assert_eq!(contents(b, "transport_connected").len(), 1);
    assert_eq!(std::fs::read_to_string(ws.join("notes/readme.txt")).unwrap(), "from the manifest");

    // A prompt: session/new, updates relayed in order, the result.
    let r = prompt(b, run, "p1", Value::Null, "updates 200\nsay done").await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["stop_reason"], "end_turn");
    assert_eq!(r["session_created"], true);
    let session = r["session_id"].as_str().unwrap().to_string();
    let first =
        b.wait_for("session_created", SECS, |m| m.msg["update"]["sessionUpdate"] == "session_created").await;
    assert_eq!(first.msg["session_id"], session.as_str());
    let mut want: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    want.push("done".into());
    assert_eq!(chunks(b, "p1"), want);

    // Client methods, escapes included.
    let script = [
        r#"call fs/write_text_file {"path":"/workspace/dir/a.txt","content":"hello\nworld\n"}"#,
        r#"call fs/read_text_file {"path":"/workspace/dir/a.txt","line":2,"limit":1}"#,
        r#"call fs/read_text_file {"path":"/etc/passwd"}"#,
        r#"call fs/read_text_file {"path":"/workspace/../../etc/passwd"}"#,
        r#"call fs/read_text_file {"path":"dir/a.txt"}"#,
        r#"call fs/read_text_file {"path":"/workspace/etc-link/passwd"}"#,
        r#"call fs/write_text_file {"path":"/workspace/etc-link/evil","content":"x"}"#,
        r#"call fs/read_text_file {"path":"/workspace/missing.txt"}"#,
        r#"call fs/read_text_file {"path":"/home/agent/.scripted-agent/sessions.json"}"#,
        r#"calls 8 fs/read_text_file {"path":"/workspace/notes/readme.txt"}"#,
        r#"term {"command":"head -c 10000000 /dev/zero | tr '\\000' x; echo -n end","outputByteLimit":1000}"#,
        r#"term {"command":"sh","args":["-c","echo $TUIXIU_RUN_ID $OPENAI_API_KEY; pwd; exit 3"],"cwd":"/workspace/dir"}"#,
        r#"termkill {"command":"sleep 30"}"#,
        r#"term {"command":"true","cwd":"/etc"}"#,
        r#"call session/request_permission {"toolCall":{"toolCallId":"t1"},"options":[{"optionId":"no","kind":"reject_once","name":"No"},{"optionId":"yes","kind":"allow_once","name":"Yes"}]}"#,
        r#"call _vendor/unknown {}"#,
        "file /tmp/agent-was-here private tmp",
        r#"term {"command":"cat /tmp/agent-was-here; id -u; id -un"}"#,
    ]
    .join("\n");
    let r = prompt(b, run, "p2", json!(session), &script).await;
    assert_eq!(r["ok"], true, "{r}");
    let rep = reports(b, "p2");
    assert_eq!(rep.len(), 8 + 16, "{rep:#?}");
    assert_eq!(rep[0]["result"], json!({}));
    assert_eq!(std::fs::read_to_string(ws.join("dir/a.txt")).unwrap(), "hello\nworld\n");
    assert_eq!(rep[1]["result"]["content"], "world\n");
    for (i, what) in [(2, "outside"), (3, "outside"), (4, "absolute"), (5, "outside"), (6, "outside")] {
        assert_eq!(rep[i]["error"]["code"], -32602, "{i}: {}", rep[i]);
        assert!(rep[i]["error"]["message"].as_str().unwrap().contains(what), "{i}: {}", rep[i]);
    }
    assert!(!Path::new("/etc/evil").exists());
    assert_eq!(rep[7]["error"]["code"], -32002, "{}", rep[7]);
    assert!(
        rep[8]["result"]["content"].as_str().unwrap().contains(&session),
        "the home is readable: {}",
        rep[8]
    );
    for r8 in &rep[9..17] {
        assert_eq!(r8["result"]["content"], "from the manifest");
    }
    let big = &rep[17];
    assert_eq!(big["exit"], json!({"exitCode":0,"signal":null}), "{big}");
    assert_eq!(big["len"], 1000);
    assert_eq!(big["truncated"], true);
    assert!(big["tail"].as_str().unwrap().ends_with("xxxend"), "{big}");
    assert_eq!(big["released"], true);
    assert_eq!(big["after_release"], -32002);
    let env = &rep[18];
    assert_eq!(env["exit"], json!({"exitCode":3,"signal":null}), "{env}");
    assert_eq!(
        env["tail"], "x\n/workspace/dir\n",
        "the run's env (no secret outside the allowlist), cwd: {env}"
    );
    assert_eq!(env["exitStatus"], json!({"exitCode":3,"signal":null}));
    let killed = &rep[19];
    assert_eq!(killed["exit"], json!({"exitCode":null,"signal":"SIGKILL"}), "{killed}");
    assert_eq!(rep[20]["error"]["code"], -32602, "a cwd outside: {}", rep[20]);
    assert_eq!(rep[21]["result"], json!({"outcome":{"outcome":"selected","optionId":"yes"}}));
    assert_eq!(rep[22]["error"]["code"], -32601);
    // Terminals run next to the agent: its /tmp, its user view.
    assert_eq!(rep[23]["tail"], "private tmp1000\nagent\n", "{}", rep[23]);

    // Cancel during a prompt: answered at once; the turn ends "cancelled".
    b.send(&json!({"type":"prompt_send","run_id":run,"prompt_id":"p3","session_id":session,
        "prompt":[{"type":"text","text":"wait_cancel"}]}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A session control is not queued behind the prompt either.
    b.send(&json!({"type":"session_set_config_option","run_id":run,"control_id":"c0","session_id":session,
        "config_id":"mode","value":"auto"}));
    let c = b.wait_type("session_control_result", "control_id", &json!("c0"), 10 * SECS).await;
    assert_eq!(c["ok"], true, "{c}");
    b.send(&json!({"type":"session_cancel","run_id":run,"control_id":"c1","session_id":session}));
    let c = b.wait_type("session_control_result", "control_id", &json!("c1"), 10 * SECS).await;
    assert_eq!(c["ok"], true, "{c}");
    let r = b.wait_type("prompt_result", "prompt_id", &json!("p3"), 20 * SECS).await;
    assert_eq!((r["ok"].clone(), r["stop_reason"].clone()), (json!(true), json!("cancelled")), "{r}");
    let cfg_update = b
        .wait_for("config_option_update", SECS, |m| {
            m.msg["update"]["sessionUpdate"] == "config_option_update"
                && m.msg["update"]["configOptions"][0]["currentValue"] == "auto"
        })
        .await;
    assert_eq!(cfg_update.msg["prompt_id"], "p3");

    // Agent crash: acp_exit, and the next prompt restarts it and loads the session.
    let r = prompt(b, run, "p4", json!(session), "stderr about to crash\nexit 3").await;
    assert_eq!(r["ok"], false, "{r}");
    let exit = b.wait_type("acp_exit", "run_id", &json!(run), 20 * SECS).await;
    assert_eq!((exit["code"].clone(), exit["signal"].clone()), (json!(3), Value::Null), "{exit}");
    let disc = contents(b, "transport_disconnected");
    assert_eq!(disc[0]["reason"], "agent_exit");
    assert!(contents(b, "text").iter().any(|c| c["text"] == "[agent:stderr] about to crash"));
    let r = prompt(b, run, "p5", json!(session), "say after restart").await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["session_id"], session.as_str());
    let replay: Vec<Value> = b
        .received()
        .iter()
        .filter(|m| m.msg["prompt_id"] == "p5" && m.msg["update"]["sessionUpdate"] == "user_message_chunk")
        .map(|m| m.msg["update"]["content"]["text"].clone())
        .collect();
    assert!(
        replay.len() >= 3 && replay[0] == "updates 200\nsay done",
        "session/load replayed the history: {replay:?}"
    );
    assert_eq!(chunks(b, "p5"), ["after restart"]);

    // A daemon restart, then a prompt without init: the persisted init opens the agent.
    assert!(daemon.stop().success(), "{}", daemon.stderr());
    *daemon = Daemon::start(s, "second", cfg);
    b.wait_for("second connection", 20 * SECS, |m| m.conn >= 1 && m.msg["type"] == "register_agent").await;
    let r = prompt(b, run, "p6", json!(session), "say again").await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(chunks(b, "p6"), ["again"]);

    // Nothing secret left the daemon.
    for m in b.received() {
        assert!(!m.msg.to_string().contains(SECRET), "secret in {}", m.msg);
    }
    assert!(!daemon.stderr().contains(SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_agent_end_to_end() {
    let backend = Backend::start().await;
    let s = Scratch::new("acp-native");
    let cfg = acp_config(&s, &backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    run_lifecycle(&backend, &s, "a1", &mut daemon, &cfg).await;
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_policies_ask_and_deny() {
    let backend = Backend::start().await;
    let s = Scratch::new("acp-ask");
    let cfg = acp_config(&s, &backend.url, "permission_policy = \"ask\"\npermission_timeout_seconds = 2", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    assert_eq!(open(&backend, "q1", "true").await["ok"], true, "{}", daemon.stderr());
    let perm = r#"call session/request_permission {"toolCall":{"toolCallId":"t1"},"options":[{"optionId":"no","kind":"reject_once","name":"No"},{"optionId":"yes","kind":"allow_once","name":"Yes"}]}"#;
    let ask = |id: &'static str| {
        backend.send(&json!({"type":"prompt_send","run_id":"q1","prompt_id":id,"session_id":null,
            "prompt":[{"type":"text","text":perm}]}));
    };
    let b = &backend;
    let request = |n: usize| async move {
        b.wait_for("permission_request", 20 * SECS, |m| {
            contents(b, "permission_request").len() >= n && m.msg["content"]["type"] == "permission_request"
        })
        .await;
        contents(b, "permission_request")[n - 1].clone()
    };
    // An option the request did not offer: cancelled, not allowed.
    ask("k1");
    let req = request(1).await;
    assert_eq!(req["prompt_id"], "k1");
    assert_eq!(req["options"][1]["optionId"], "yes");
    backend.send(&json!({"type":"session_permission","run_id":"q1","session_id":req["session_id"],
        "request_id":req["request_id"],"outcome":"selected","option_id":"allow-everything"}));
    backend.wait_type("prompt_result", "prompt_id", &json!("k1"), 20 * SECS).await;
    assert_eq!(reports(&backend, "k1")[0]["result"], json!({"outcome":{"outcome":"cancelled"}}));
    // A valid choice.
    ask("k2");
    let req = request(2).await;
    backend.send(&json!({"type":"session_permission","run_id":"q1","session_id":req["session_id"],
        "request_id":req["request_id"],"outcome":"selected","option_id":"no"}));
    backend.wait_type("prompt_result", "prompt_id", &json!("k2"), 20 * SECS).await;
    assert_eq!(
        reports(&backend, "k2")[0]["result"],
        json!({"outcome":{"outcome":"selected","optionId":"no"}})
    );
    // No answer within the timeout: cancelled.
    ask("k3");
    request(3).await;
    backend.wait_type("prompt_result", "prompt_id", &json!("k3"), 20 * SECS).await;
    assert_eq!(reports(&backend, "k3")[0]["result"], json!({"outcome":{"outcome":"cancelled"}}));
    assert!(daemon.stop().success());

    // deny: the reject option.
    let backend = Backend::start().await;
    let s = Scratch::new("acp-deny");
    let cfg = acp_config(&s, &backend.url, "permission_policy = \"deny\"", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    assert_eq!(open(&backend, "q2", "").await["ok"], true);
    let r = prompt(&backend, "q2", "d1", Value::Null, perm).await;
    assert_eq!(r["ok"], true);
    assert_eq!(
        reports(&backend, "d1")[0]["result"],
        json!({"outcome":{"outcome":"selected","optionId":"no"}})
    );
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_failures_name_the_step() {
    let backend = Backend::start().await;
    let s = Scratch::new("acp-fail");
    let cfg = acp_config(&s, &backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    // No manifest: nothing started.
    backend.send(&json!({"type":"acp_open","run_id":"f1","init":{"script":"","env":{}}}));
    let r = backend.wait_type("acp_opened", "run_id", &json!("f1"), 30 * SECS).await;
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"], "init.agentInputs missing");
    // A bad item: its id.
    backend.send(&json!({"type":"acp_open","run_id":"f2","init":{"env":{},"agentInputs":{"version":1,"items":[
        {"id":"bad","apply":"writeFile","source":{"type":"inlineText","text":"x"},"target":{"root":"WORKSPACE","path":"../x"}}]}}}));
    let r = backend.wait_type("acp_opened", "run_id", &json!("f2"), 30 * SECS).await;
    assert!(r["error"].as_str().unwrap().contains(":bad:"), "{r}");
    // A failing init script: the exit code, and no agent.
    backend.send(&json!({"type":"acp_open","run_id":"f3","init":init("echo x; exit 7")}));
    let r = backend.wait_type("acp_opened", "run_id", &json!("f3"), 30 * SECS).await;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("exitCode=7"), "{r}");
    assert!(
        contents(&backend, "init_result")
            .contains(&json!({"type":"init_result","ok":false,"exitCode":7,"error":"exitCode=7"}))
    );
    assert!(contents(&backend, "transport_connected").is_empty());
    // A timeout.
    backend.send(&json!({"type":"acp_open","run_id":"f4","init":{"script":"sleep 30","timeout_seconds":1,"env":{},"agentInputs":{"version":1,"items":[]}}}));
    let r = backend.wait_type("acp_opened", "run_id", &json!("f4"), 30 * SECS).await;
    assert!(r["error"].as_str().unwrap().contains("timeout after 1s"), "{r}");
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_agent_end_to_end() {
    docker_support::require_engine();
    let backend = Backend::start().await;
    let s = Scratch::new("acp-docker");
    let run = format!("ad{}", std::process::id());
    let name = format!("tuixiu-run-{run}");
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = docker_support::docker(&["rm", "-f", &self.0]);
        }
    }
    let _rm = Rm(name.clone());
    let cfg = acp_config(&s, &backend.url, "", &docker_extra(""));
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    run_lifecycle(&backend, &s, &run, &mut daemon, &cfg).await;
    assert!(daemon.stop().success());
}

/// The daemon as an unprivileged user, and nested in a user namespace:
/// the agent, its files and a joined terminal work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprivileged_and_nested_daemons_run_agents() {
    for nested in [false, true] {
        let backend = Backend::start().await;
        let s = Scratch::new(if nested { "acp-nested" } else { "acp-nobody" });
        // A secret file of the daemon's user, readable by it only.
        let secret_file = s.dir.join("token.secret");
        std::fs::write(&secret_file, "nobody-secret-0123456789\n").unwrap();
        std::fs::set_permissions(&secret_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&secret_file, Some(65534), Some(65534)).unwrap();
        let secrets = format!("secretFiles = {{ token = \"{}\" }}", secret_file.display());
        let cfg = acp_config(&s, &backend.url, "", &secrets);
        let env = [("ACP_PROXY_AGENT_STATE_PATH", "/home/agent/.scripted-agent")];
        let mut daemon = Daemon::start_unprivileged_env(&s, "proxy", &cfg, nested, &env);
        backend.registered(0, 20 * SECS).await;
        let mut init1 = init("echo ok");
        init1["agentInputs"]["items"].as_array_mut().unwrap().push(json!({"id": "s", "apply": "writeFile",
            "source": {"type": "inlineText", "text": "scratch"}, "target": {"root": "SCRATCH", "path": "s.txt"}}));
        backend.send(&json!({"type":"acp_open","run_id":"n1","cwd":"/workspace","init":init1}));
        let opened = backend.wait_type("acp_opened", "run_id", &json!("n1"), 60 * SECS).await;
        assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
        let script = [
            r#"call fs/write_text_file {"path":"/workspace/w.txt","content":"written"}"#,
            r#"call fs/read_text_file {"path":"/workspace/w.txt"}"#,
            "file /tmp/t x",
            r#"term {"command":"cat /tmp/t /workspace/w.txt; id -u"}"#,
            r#"term {"command":"cat /scratch/s.txt; echo; wc -c < /run/secrets/token; ls ~/.scripted-agent"}"#,
        ]
        .join("\n");
        let r = prompt(&backend, "n1", "p1", Value::Null, &script).await;
        assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
        let rep = reports(&backend, "p1");
        assert_eq!(rep[1]["result"]["content"], "written");
        assert_eq!(rep[2]["tail"], "xwritten1000\n", "{}", rep[2]);
        // Scratch, secret file and the agent's state directory work for an
        // unprivileged daemon too.
        assert_eq!(rep[3]["tail"], "scratch\n25\nsessions.json\n", "{}", rep[3]);
        assert!(s.state.join("agents/proxy-test/state/sessions.json").exists());
        let meta = std::fs::metadata(s.root.join("run-n1/w.txt")).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&meta),
            65534,
            "owned by the daemon's user on the host"
        );
        assert!(daemon.stop().success(), "{}", daemon.stderr());
    }
}

/// The per-run scratch, the agent's state directory across runs, and a
/// secret file at /run/secrets, on one provider.
async fn mounts_scenario(docker: bool) {
    if docker {
        docker_support::require_engine();
    }
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new(if docker { "acp-mounts-docker" } else { "acp-mounts" });
    let tag = format!("{}{}", if docker { "md" } else { "mn" }, std::process::id());
    let (run1, run2) = (format!("{tag}a"), format!("{tag}b"));
    let _containers = Containers(vec![format!("tuixiu-run-{run1}"), format!("tuixiu-run-{run2}")]);
    let secret = format!("sk-file-secret-{}-{tag}-0123456789", std::process::id());
    let secret_file = s.dir.join("token.secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&secret_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let secrets = format!("secretFiles = {{ token = \"{}\" }}", secret_file.display());
    let sandbox_extra = if docker { docker_extra(&secrets) } else { secrets };
    let cfg = acp_config(&s, &b.url, "", &sandbox_extra);
    // The fake agent keeps its sessions in ~/.scripted-agent.
    let env = [("ACP_PROXY_AGENT_STATE_PATH", "/home/agent/.scripted-agent")];
    let mut daemon = Daemon::start_env(&s, "proxy", &cfg, &env);
    b.registered(0, 20 * SECS).await;

    // A SCRATCH item lands before the init script and the agent see it.
    let mut init1 = init("cat /scratch/in/s.txt; echo; ls -ld /scratch | cut -c1-10");
    init1["agentInputs"]["items"].as_array_mut().unwrap().push(json!({"id": "scratch-note", "apply": "writeFile",
        "source": {"type": "inlineText", "text": "from scratch"}, "target": {"root": "SCRATCH", "path": "in/s.txt"}}));
    b.send(&json!({"type":"acp_open","run_id":run1,"cwd":"/workspace","init":init1,
        "instance_name":format!("tuixiu-run-{run1}"),"keepalive_ttl_seconds":600}));
    let opened = b.wait_type("acp_opened", "run_id", &json!(run1), 60 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let texts: Vec<String> =
        contents(b, "text").iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    assert!(texts.contains(&"[init:stdout] from scratch".to_string()), "{texts:?}");
    assert!(texts.contains(&"[init:stdout] drwx------".to_string()), "a private scratch: {texts:?}");

    let script = [
        r#"term {"command":"cat /scratch/in/s.txt; echo; echo t > /scratch/t && echo wrote; sha256sum /run/secrets/token | cut -c1-64; (echo x > /run/secrets/token) 2>/dev/null || echo read-only"}"#,
        "stderrfile /run/secrets/token",
        r#"call fs/read_text_file {"path":"/run/secrets/token"}"#,
        r#"call fs/read_text_file {"path":"/scratch/in/s.txt"}"#,
        r#"call fs/read_text_file {"path":"/home/agent/.scripted-agent/sessions.json"}"#,
    ]
    .join("\n");
    let r = prompt(b, &run1, "p1", Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let session = r["session_id"].as_str().unwrap().to_string();
    let rep = reports(b, "p1");
    let digest = {
        let out = std::process::Command::new("sha256sum").arg(&secret_file).output().unwrap();
        String::from_utf8_lossy(&out.stdout)[..64].to_string()
    };
    assert_eq!(rep[0]["tail"], format!("from scratch\nwrote\n{digest}\nread-only\n"), "{}", rep[0]);
    for (i, what) in [(1, "/run/secrets/token"), (2, "/scratch/in/s.txt")] {
        assert_eq!(
            rep[i]["error"]["code"], -32602,
            "fs/* stay in the workspace and home: {what}: {}",
            rep[i]
        );
    }
    // fs/* see the agent's state directory where the agent does.
    assert!(rep[3]["result"]["content"].as_str().unwrap_or("").contains(&session), "{}", rep[3]);
    let stderr_line = b
        .wait_for("the agent's stderr", 10 * SECS, |m| {
            m.msg["content"]["type"] == "text"
                && m.msg["content"]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("[agent:stderr] [REDACTED]"))
        })
        .await;
    assert_eq!(stderr_line.msg["content"]["text"], "[agent:stderr] [REDACTED]");
    // The agent's sessions are in the daemon's per-agent directory.
    let state_file = s.state.join("agents/proxy-test/state/sessions.json");
    assert!(std::fs::read_to_string(&state_file).unwrap().contains(&session));

    // The instance goes: its scratch goes with it; the agent's state stays.
    let r = b
        .control(json!({"action":"remove","run_id":run1,"instance_name":format!("tuixiu-run-{run1}")}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let scratch = s.state.join(format!("scratch/{run1}"));
    for _ in 0..100 {
        if !scratch.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!scratch.exists(), "{} outlived its instance", scratch.display());
    assert!(state_file.exists());

    // Another run, another sandbox and home: the agent loads the session
    // from its state directory.
    assert_eq!(open(b, &run2, "true").await["ok"], true, "{}", daemon.stderr());
    let r = prompt(b, &run2, "p2", json!(session), "say loaded").await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(r["session_id"], session.as_str(), "{r}");
    assert_eq!(r["session_recreated_from"], Value::Null, "{r}");
    let replayed: Vec<Value> = b
        .received()
        .iter()
        .filter(|m| m.msg["prompt_id"] == "p2" && m.msg["update"]["sessionUpdate"] == "user_message_chunk")
        .map(|m| m.msg["update"]["content"]["text"].clone())
        .collect();
    assert_eq!(replayed, [json!(script)], "session/load replayed the first run's prompt");

    // The secret: not in the workspaces, homes or messages, not in the log.
    for f in files_under(&s.root) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(&secret), "secret in {}", f.display());
    }
    for m in b.received() {
        assert!(!m.msg.to_string().contains(&secret), "secret in {}", m.msg);
    }
    assert!(daemon.stop().success());
    assert!(!daemon.stderr().contains(&secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_scratch_agent_state_and_secret_files() {
    mounts_scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_scratch_agent_state_and_secret_files() {
    mounts_scenario(true).await;
}

/// bindMount items are the instance's mounts: another host directory at
/// its target, read-only when asked; a read-only WORKSPACE bind keeps the
/// workspace read-only for the agent, its terminals and fs/*.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_binds_are_mounted_with_their_access() {
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new("acp-binds");
    let cfg = acp_config(&s, &b.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    let data = s.root.join("shared-data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("x.txt"), "shared").unwrap();
    let ws = s.root.join("run-b2");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("given.txt"), "given").unwrap();
    let open_items = |run: &str, items: Value| {
        b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","instance_name":format!("tuixiu-run-{run}"),
            "init":{"env":{"USER_HOME":"/home/agent"},"agentInputs":{"version":1,"items":items}}}));
    };
    open_items(
        "b1",
        json!([{"id":"data","apply":"bindMount","access":"ro","source":{"type":"hostPath","path":data},
                "target":{"root":"USER_HOME","path":"data"}}]),
    );
    let r = b.wait_type("acp_opened", "run_id", &json!("b1"), 60 * SECS).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let r = prompt(
        b,
        "b1",
        "p1",
        Value::Null,
        r#"term {"command":"cat ~/data/x.txt; echo; (touch ~/data/y) 2>/dev/null || echo read-only"}"#,
    )
    .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(reports(b, "p1")[0]["tail"], "shared\nread-only\n");
    assert!(!data.join("y").exists());

    open_items(
        "b2",
        json!([{"id":"workspace","apply":"bindMount","access":"ro","source":{"type":"hostPath","path":ws},
                "target":{"root":"WORKSPACE","path":"."}}]),
    );
    let r = b.wait_type("acp_opened", "run_id", &json!("b2"), 60 * SECS).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let script = [
        r#"term {"command":"cat /workspace/given.txt; echo; (touch /workspace/z) 2>/dev/null || echo read-only"}"#,
        r#"call fs/write_text_file {"path":"/workspace/w.txt","content":"x"}"#,
        r#"call fs/read_text_file {"path":"/workspace/given.txt"}"#,
    ]
    .join("\n");
    let r = prompt(b, "b2", "p2", Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{r}");
    let rep = reports(b, "p2");
    assert_eq!(rep[0]["tail"], "given\nread-only\n");
    assert!(rep[1]["error"]["message"].as_str().unwrap_or("").contains("EROFS"), "{}", rep[1]);
    assert_eq!(rep[2]["result"]["content"], "given");
    assert!(!ws.join("z").exists() && !ws.join("w.txt").exists());
    assert!(daemon.stop().success());
}

/// An agent writing faster than the link sends waits for room in the
/// outbox instead of losing its oldest updates: a small outbox, a burst
/// much larger than it, every update delivered in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_bursts_wait_for_the_link_instead_of_dropping() {
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new("acp-burst");
    let cfg = acp_config(&s, &b.url, "outbox_max_messages = 64", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    assert_eq!(open(b, "u1", "true").await["ok"], true, "{}", daemon.stderr());
    let r = prompt(b, "u1", "p1", Value::Null, "updates 5000\nsay done").await;
    assert_eq!(r["ok"], true, "{r}");
    let mut want: Vec<String> = (0..5000).map(|i| format!("u{i}")).collect();
    want.push("done".into());
    assert_eq!(chunks(b, "p1"), want);
    assert!(!daemon.stderr().contains("outbox full"), "{}", daemon.stderr());
    assert!(daemon.stop().success());
}
