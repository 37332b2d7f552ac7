//! A skill job's engine with `"network": "allow"`: it reaches its listed
//! model API through the egress proxy the skill server serves for the job,
//! and nothing else; refusals go to the job's `logs/egress.txt`.

mod common;
mod egress_support;
mod inputs_support;
mod skills_support;

use common::Caller;
use egress_support::{HOSTS_ENV, Server, hosts_file};
use serde_json::{Value, json};
use skills_support::Env;

#[test]
fn an_engine_reaches_only_its_allowlist() {
    let env = Env::new(Caller::Root);
    let model = Server::start("127.0.0.2", None, "model-ok");
    let p = model.port;
    let engine_dir = env.fx.dir.join("engine");
    let script = format!(
        "curl -sS http://api.model.test:{p}/ > model.txt; curl -sS http://other.test:{p}/ > other.txt; \
         exec sh /engine/stub-engine.sh \"$0\""
    );
    let config = json!({"engines": {"command": {
        "argv": ["sh", "-c", script, "{prompt}"],
        "ro_binds": [{"src": engine_dir, "dst": "/engine"}],
        "network": "allow",
        "allow_hosts": [format!("api.model.test:{p}")],
        "allow_ranges": ["127.0.0.2"],
    }}});
    std::fs::write(&env.engines, serde_json::to_vec(&config).unwrap()).unwrap();
    let mapping = hosts_file(&env.fx.dir, &[("127.0.0.2", "api.model.test"), ("127.0.0.2", "other.test")]);
    let input = env.fx.dir.join("in.txt");
    std::fs::write(&input, "numbers: 1 2\n").unwrap();
    let skill = env.skills.join("tuixiu-demo");
    let data = env.fx.dir.join("cli-data");
    let file_arg = format!("input_file={}", input.display());
    let args = [
        "skills",
        "run",
        "--skill",
        skill.to_str().unwrap(),
        "--parameter",
        "mode=ok",
        "--engine",
        "command",
        "--engines",
        env.engines.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--file",
        &file_arg,
        "--input",
        "query=q",
    ];
    let out = env.fx.command(&args).env(HOSTS_ENV, &mapping).output().unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(result["status"], "success", "{result}\n{}", common::stderr(&out));
    let runs: Vec<_> = std::fs::read_dir(data.join("runs")).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1);
    let run = runs[0].path();
    let read = |rel: &str| std::fs::read_to_string(run.join(rel)).unwrap_or_default();
    assert_eq!(read("workspace/model.txt"), "model-ok");
    assert!(read("workspace/other.txt").contains("not in the allowlist"), "{}", read("workspace/other.txt"));
    assert_eq!(read("logs/egress.txt"), format!("denied other.test:{p} (HTTP): not in the allowlist\n"));
    assert_eq!(model.hits(), 1);

    // An allowlist without "allow" is a configuration error, named.
    let bad = json!({"engines": {"command": {"argv": ["true"], "allow_hosts": ["a.test"]}}});
    std::fs::write(&env.engines, serde_json::to_vec(&bad).unwrap()).unwrap();
    let out = env.fx.command(&args).output().unwrap();
    assert!(
        common::stderr(&out)
            .contains("engine \"command\": allow_hosts and allow_ranges need \"network\": \"allow\""),
        "{}",
        common::stderr(&out)
    );
}
