//! `proxy.toml`: `proxy::config::Config::load`'s checks of every key, with
//! the `ACP_PROXY_*` environment overrides.
//!
//! The input is the file's text; lines after a line `#env` are `KEY=VALUE`
//! variables. `sandbox.workspaceHostRoot`, which loading creates, and
//! `state_dir`, where the daemon below keeps its instances (file or
//! variable), are pointed at a scratch directory.
//!
//! Checked: no panic; errors and warnings are one line; a config that
//! loads gives a daemon whose capabilities serialize.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::proxy::config::Config;
use tuixiu_sandbox_fuzz::assert_one_line;

const ROOT_VAR: &str = "ACP_PROXY_SANDBOX_WORKSPACE_HOST_ROOT";
const STATE_VAR: &str = "ACP_PROXY_STATE_DIR";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (file, vars) = match text.split_once("\n#env\n") {
        Some((file, vars)) => (file, vars),
        None => (&*text, ""),
    };
    let dir = tuixiu_sandbox_fuzz::scratch();
    let root = dir.path().join("root").display().to_string();
    let state = dir.path().join("state").display().to_string();
    let env: BTreeMap<String, String> = vars
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = match k {
                ROOT_VAR => root.clone(),
                STATE_VAR => state.clone(),
                _ => v.to_string(),
            };
            (k.to_string(), v)
        })
        .collect();

    let mut table: toml::Table = match toml::from_str(file) {
        Ok(t) => t,
        Err(_) => {
            // Not TOML: the error as `load` reports it (nothing is created).
            let path = dir.path().join("proxy.toml");
            std::fs::write(&path, file).unwrap();
            let e = Config::load(Some(&path), env).expect_err("load accepted what toml refused");
            return assert_one_line("config error", &e.to_string());
        }
    };
    if let Some(toml::Value::Table(sandbox)) = table.get_mut("sandbox")
        && let Some(v @ toml::Value::String(_)) = sandbox.get_mut("workspaceHostRoot")
    {
        *v = toml::Value::String(root.clone());
    }
    if let Some(v @ toml::Value::String(_)) = table.get_mut("state_dir") {
        *v = toml::Value::String(state.clone());
    }
    match Config::from_table("proxy.toml", table, &env) {
        Ok((mut cfg, warnings)) => {
            // Without state_dir the default is the caller's own.
            cfg.state_dir = state.into();
            for w in &warnings {
                assert_one_line("config warning", w);
            }
            // A daemon starts its lanes' task on the runtime it is made in.
            let rt = tuixiu_sandbox_fuzz::runtime();
            let _in_runtime = rt.enter();
            let d = tuixiu_sandbox_fuzz::daemon(cfg);
            serde_json::to_string(&d.capabilities()).expect("capabilities serialize");
        }
        Err(e) => assert_one_line("config error", &e.to_string()),
    }
});
