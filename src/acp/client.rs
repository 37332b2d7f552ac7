//! The methods an agent calls on its client, served for one run.
//!
//! | method | served |
//! |---|---|
//! | `fs/read_text_file`, `fs/write_text_file` | in-process, through [`super::fs::GuestFs`] (no process per call) |
//! | `terminal/create|output|wait_for_exit|kill|release` | processes in the run's sandbox ([`super::terminal`]) |
//! | `session/request_permission` | by `permission_policy`: `allow_once`, `ask` (the backend decides), `deny` |
//! | anything else | `-32601` |
//!
//! Notifications: `session/update` becomes `acp_update` with the agent's
//! JSON unchanged, tagged with the active prompt; other notifications go
//! to the backend as `acp_message`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::fs::{FsError, GuestError, GuestFs};
use super::output::Tail;
use super::port::{Context, Event, PermissionAsk, PermissionPolicy, Relay};
use super::terminal::{self, Terminal, Terminals};
use super::transport::{BoxFuture, Handler, Reply, RpcError, UpdateParams, code};
use crate::blocking::Share;

/// Starts a terminal's process in the run's sandbox.
pub type Spawner = Arc<
    dyn Fn(
            crate::provider::ProcessSpec,
        ) -> BoxFuture<
            Result<(crate::provider::Process, crate::provider::Killer), crate::provider::ProviderError>,
        > + Send
        + Sync,
>;

/// A permission request waiting for the backend.
struct Pending {
    session_id: String,
    option_ids: Vec<String>,
    tx: oneshot::Sender<Value>,
}

/// The client side of one agent process.
pub struct Client {
    pub cx: Context,
    pub run_id: String,
    /// `run_id`, shared with the messages the relay queues.
    run_id_shared: Arc<str>,
    pub instance: String,
    pub fs: Option<Arc<GuestFs>>,
    /// Why `fs` is missing, for the error the agent gets.
    pub fs_error: String,
    pub terminals: Terminals,
    pub spawner: Spawner,
    /// Variables of terminal processes (the run's environment).
    pub env: Vec<(String, String)>,
    pub home_guest: String,
    pub policy: PermissionPolicy,
    permissions: Mutex<HashMap<String, Pending>>,
    /// The `prompt_id` updates are tagged with.
    pub active_prompt: Mutex<Option<String>>,
    /// Called when the agent's stdout closes.
    pub on_closed: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Host pid of the sandbox's PID 1 (native), whose pid namespace holds
    /// the agent, its children and its terminals.
    pub sandbox_pid1: Option<u32>,
    /// The run's share of the blocking pool: every filesystem call of
    /// this client runs there, never on the daemon's thread.
    blocking: Share,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fs_error(e: FsError) -> RpcError {
    let m = e.message();
    match e {
        FsError::BadPath(_) | FsError::Outside(_) => RpcError::invalid_params(m),
        FsError::NotFound(_) => RpcError::not_found(m),
        FsError::Failed(_) => RpcError::internal(m),
    }
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("{key} must be a string")))
}

fn opt_u64(params: &Value, key: &str) -> Result<Option<u64>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            RpcError::invalid_params(format!("{key} must be a non-negative integer, got {v}"))
        }),
    }
}

impl Client {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cx: Context,
        run_id: String,
        instance: String,
        fs: Result<GuestFs, GuestError>,
        spawner: Spawner,
        env: Vec<(String, String)>,
        home_guest: String,
    ) -> Client {
        let policy = cx.settings.permission_policy;
        let (fs, fs_error) = match fs {
            Ok(fs) => (Some(Arc::new(fs)), String::new()),
            Err(e) => (None, e.to_string()),
        };
        let blocking = cx.pool.share(&run_id);
        let terminals = Terminals::new(cx.settings.run_terminal_memory_bytes);
        Client {
            blocking,
            cx,
            run_id_shared: Arc::from(run_id.as_str()),
            run_id,
            instance,
            fs,
            fs_error,
            terminals,
            spawner,
            env,
            home_guest,
            policy,
            permissions: Mutex::new(HashMap::new()),
            active_prompt: Mutex::new(None),
            on_closed: Mutex::new(None),
            sandbox_pid1: None,
        }
    }

    fn fs(&self) -> Result<Arc<GuestFs>, RpcError> {
        self.fs.clone().ok_or_else(|| {
            RpcError::internal(format!("the run's files are not reachable: {}", self.fs_error))
        })
    }

    /// Runs `job` on the run's share of the blocking pool (a panic in it
    /// is an internal error for the agent).
    pub async fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, RpcError> {
        self.blocking.run(job).await.map_err(|e| RpcError::internal(e.to_string()))
    }

    pub fn prompt_id(&self) -> Value {
        lock(&self.active_prompt).clone().map_or(Value::Null, Value::String)
    }

    /// `fs/read_text_file`: the file read, and its result written as JSON
    /// (up to `fs_read_max_bytes` of text to escape), on the blocking pool.
    async fn read(&self, p: Value) -> Result<Reply, RpcError> {
        #[derive(serde::Serialize)]
        struct Content {
            content: String,
        }
        let path = str_param(&p, "path")?.to_string();
        let (line, limit) = (opt_u64(&p, "line")?, opt_u64(&p, "limit")?);
        let (fs, max) = (self.fs()?, self.cx.settings.fs_read_max_bytes);
        let result = self
            .blocking(move || {
                let content = fs.read(&path, line, limit, max).map_err(fs_error)?;
                serde_json::value::to_raw_value(&Content { content })
                    .map_err(|e| RpcError::internal(format!("fs/read_text_file: {e}")))
            })
            .await??;
        Ok(Reply::Raw(result))
    }

    /// `fs/write_text_file`: its params parsed, and the file written, on
    /// the blocking pool.
    async fn write(&self, params: Box<RawValue>) -> Result<Value, RpcError> {
        #[derive(serde::Deserialize)]
        struct Write {
            path: Value,
            content: Value,
        }
        let fs = self.fs();
        self.blocking(move || {
            let p: Write = serde_json::from_str(params.get())
                .map_err(|e| RpcError::invalid_params(format!("params: {e}")))?;
            let Value::String(path) = p.path else {
                return Err(RpcError::invalid_params("path must be a string"));
            };
            let Value::String(content) = p.content else {
                return Err(RpcError::invalid_params("content must be a string"));
            };
            fs?.write(&path, &content).map_err(fs_error)?;
            Ok(json!({}))
        })
        .await?
    }

    fn terminal(&self, p: &Value) -> Result<Arc<Terminal>, RpcError> {
        let id = str_param(p, "terminalId")?;
        self.terminals.get(id).ok_or_else(|| {
            RpcError::not_found(format!("terminal {id:?} does not exist (released, or never created)"))
        })
    }

    async fn terminal_create(&self, p: Value) -> Result<Value, RpcError> {
        let command = str_param(&p, "command")?.to_string();
        if command.trim().is_empty() {
            return Err(RpcError::invalid_params("command is required"));
        }
        let args: Vec<String> = match p.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| RpcError::invalid_params("args must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(RpcError::invalid_params("args must be an array of strings")),
        };
        let limit = terminal::output_limit(p.get("outputByteLimit"))
            .map_err(|e| RpcError::invalid_params(e.to_string()))?;
        // The working directory is resolved inside the run's view and the
        // terminal starts in it by descriptor (docs/acp.md, "terminal/*").
        let cwd = match p.get("cwd") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(_) => return Err(RpcError::invalid_params("cwd must be an absolute path")),
        };
        let (cwd, cwd_dir) = match (cwd, self.fs()) {
            (None, Err(_)) => (sandbox::WORKSPACE.to_string(), None),
            (cwd, fs) => {
                let (fs, cwd) = (fs?, cwd.unwrap_or_else(|| sandbox::WORKSPACE.to_string()));
                let dir = self.blocking(move || fs.open_dir(&cwd)).await?.map_err(fs_error)?;
                let shown = crate::hostfs::guest::shown(&dir.guest);
                (shown, Some(crate::provider::DirFd(Arc::new(dir.fd))))
            }
        };
        let mut env = self.env.clone();
        if let Some(Value::Array(vars)) = p.get("env") {
            for v in vars {
                let (Some(name), value) = (v.get("name").and_then(Value::as_str), v.get("value")) else {
                    return Err(RpcError::invalid_params("env entries are {name, value}"));
                };
                let value = value.and_then(Value::as_str).unwrap_or("").to_string();
                crate::provider::names::validate_env(name, &value)
                    .map_err(|e| RpcError::invalid_params(e.to_string()))?;
                env.retain(|(k, _)| k != name);
                env.push((name.to_string(), value));
            }
        }
        let argv = if args.is_empty() && terminal::needs_shell(&command) {
            vec!["sh".to_string(), "-c".to_string(), command]
        } else {
            std::iter::once(command).chain(args).collect()
        };
        let spec = crate::provider::ProcessSpec {
            argv,
            env,
            cwd: Some(cwd),
            cwd_dir,
            stdio: crate::provider::Stdio::Piped,
        };
        let slot = self.terminal_slot().await?;
        // Where its output goes: memory while the run's budget has room.
        let (budget, dir) = (self.terminals.budget().clone(), self.cx.settings.terminal_spill_dir.clone());
        let tail = self
            .blocking(move || Tail::new(limit, &budget, &dir))
            .await?
            .map_err(|e| RpcError::internal(format!("terminal/create: {e}")))?;
        let (process, killer) =
            (self.spawner)(spec).await.map_err(|e| RpcError::internal(format!("terminal/create: {e}")))?;
        let terminal = Terminal::start(process, killer, tail, self.blocking.clone());
        let id = self.terminals.insert(slot, terminal);
        Ok(json!({"terminalId": id}))
    }

    /// The run's bounds (docs/acp.md, "terminal/*"): terminals held at
    /// once, and processes in the run's sandbox, which the daemon counts
    /// (a walk of `/proc`, on the blocking pool).
    async fn terminal_slot(&self) -> Result<terminal::Slot<'_>, RpcError> {
        let max = self.cx.settings.run_max_terminals;
        let slot = self.terminals.reserve(max).ok_or_else(|| {
            RpcError::internal(format!(
                "terminal/create: this run already holds {max} terminals, the daemon's limit \
                 (run_max_terminals); release finished ones first"
            ))
        })?;
        let max = self.cx.settings.run_max_processes;
        // Native: the agent's pid namespace (the agent, everything it
        // started, the terminals' commands); elsewhere the agent and the
        // terminals still running.
        let counted = match self.sandbox_pid1 {
            Some(pid1) => self.blocking(move || terminal::processes_in_pid_ns_of(pid1)).await?,
            None => None,
        };
        let running = counted.unwrap_or_else(|| self.terminals.running() + 1);
        if running >= max {
            return Err(RpcError::internal(format!(
                "terminal/create: this run's sandbox already runs {running} processes, the daemon's limit \
                 (run_max_processes)"
            )));
        }
        Ok(slot)
    }

    async fn permission(&self, id: Value, p: Value) -> Result<Value, RpcError> {
        let options = permission_options(&p)?;
        // Only the ACP kinds count, exactly: an option of any other kind
        // is never picked by a policy.
        let pick = |kinds: [&str; 2]| -> Option<String> {
            kinds.iter().find_map(|k| options.iter().find(|o| o.kind == Some(*k))).map(|o| o.id.to_string())
        };
        let selected = |id: String| json!({"outcome": {"outcome": "selected", "optionId": id}});
        let cancelled = json!({"outcome": {"outcome": "cancelled"}});
        match self.policy {
            PermissionPolicy::AllowOnce => {
                Ok(pick(["allow_once", "allow_always"]).map_or(cancelled, selected))
            }
            PermissionPolicy::Deny => Ok(pick(["reject_once", "reject_always"]).map_or(cancelled, selected)),
            PermissionPolicy::Ask => {
                if options.is_empty() {
                    return Ok(cancelled);
                }
                let key = request_key(&id);
                let session_id = p.get("sessionId").and_then(Value::as_str).unwrap_or("").to_string();
                let option_ids = options.iter().map(|o| o.id.to_string()).collect();
                let (tx, rx) = oneshot::channel();
                lock(&self.permissions)
                    .insert(key.clone(), Pending { session_id: session_id.clone(), option_ids, tx });
                // Removed however this ends (answered, timed out, aborted).
                struct Forget<'a>(&'a Client, String);
                impl Drop for Forget<'_> {
                    fn drop(&mut self) {
                        lock(&self.0.permissions).remove(&self.1);
                    }
                }
                let _forget = Forget(self, key.clone());
                static NULL: Value = Value::Null;
                static NO_OPTIONS: Value = Value::Array(Vec::new());
                let ask = PermissionAsk {
                    request_id: &key,
                    session_id: &session_id,
                    prompt_id: self.prompt_id(),
                    tool_call: p.get("toolCall").unwrap_or(&NULL),
                    options: p.get("options").unwrap_or(&NO_OPTIONS),
                };
                self.cx.sink.event(&self.run_id, Event::Permission(ask));
                let timeout = self.cx.settings.permission_timeout;
                match tokio::time::timeout(timeout, rx).await {
                    Ok(Ok(outcome)) => Ok(outcome),
                    Ok(Err(_)) => Ok(cancelled),
                    Err(_) => {
                        tracing::info!(
                            "run {}: permission request {key} unanswered after {timeout:?}: cancelled",
                            self.run_id
                        );
                        Ok(cancelled)
                    }
                }
            }
        }
    }

    /// `session_permission` from the backend. `selected` with an option the
    /// request did not offer is **cancelled**, never allowed. False when no
    /// such request is pending.
    pub fn resolve_permission(&self, request_id: &Value, outcome: &str, option_id: Option<&str>) -> bool {
        let key = match request_id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(p) = lock(&self.permissions).remove(&key) else { return false };
        let answer = match (outcome, option_id) {
            ("selected", Some(o)) if p.option_ids.iter().any(|x| x == o) => {
                json!({"outcome": {"outcome": "selected", "optionId": o}})
            }
            ("selected", o) => {
                tracing::warn!(
                    "run {}: session_permission selected unknown option {o:?} for request {key}: cancelled",
                    self.run_id
                );
                json!({"outcome": {"outcome": "cancelled"}})
            }
            _ => json!({"outcome": {"outcome": "cancelled"}}),
        };
        let _ = p.tx.send(answer);
        true
    }

    /// After `session/cancel`: every pending request of the session is answered `cancelled`.
    pub fn cancel_permissions(&self, session_id: &str) {
        let keys: Vec<String> = lock(&self.permissions)
            .iter()
            .filter(|(_, p)| p.session_id == session_id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(p) = lock(&self.permissions).remove(&k) {
                let _ = p.tx.send(json!({"outcome": {"outcome": "cancelled"}}));
            }
        }
    }
}

/// A JSON-RPC id as the backend sees it (`String(id)` in the Node proxy).
fn request_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Client {
    /// `session/update` relayed with the agent's `sessionId` and `update`
    /// JSON as they are.
    fn relay_update(&self, params: Option<UpdateParams<'_>>) {
        let (session_id, update) = params.map_or(("null", "null"), |p| {
            (p.session_id.map_or("null", RawValue::get), p.update.map_or("null", RawValue::get))
        });
        let active = lock(&self.active_prompt);
        let relay = Relay::Update { prompt_id: active.as_deref(), session_id, update };
        self.cx.sink.relay(&self.run_id_shared, relay);
    }
}

/// The kinds of permission options ACP defines (`PermissionOptionKind`).
const PERMISSION_KINDS: [&str; 4] = ["allow_once", "allow_always", "reject_once", "reject_always"];

/// One option of a permission request: its id, and its kind when it is
/// one ACP defines (any other kind is kept for the backend to show, and
/// never picked by a policy).
struct PermissionOption<'a> {
    id: &'a str,
    kind: Option<&'static str>,
}

/// The options of `session/request_permission`: each an object with a
/// string `optionId`, ids unique (a duplicate could make the answer mean
/// two options at once). Anything else is `-32602`.
fn permission_options(p: &Value) -> Result<Vec<PermissionOption<'_>>, RpcError> {
    let list = match p.get("options") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(RpcError::invalid_params("options must be an array")),
    };
    let mut out: Vec<PermissionOption<'_>> = Vec::with_capacity(list.len());
    for (i, o) in list.iter().enumerate() {
        let id = o
            .get("optionId")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid_params(format!("options[{i}].optionId must be a string")))?;
        if out.iter().any(|seen| seen.id == id) {
            return Err(RpcError::invalid_params(format!(
                "options[{i}].optionId {id:?} is used by an earlier option: option ids must be unique"
            )));
        }
        let kind = o.get("kind").and_then(Value::as_str);
        let kind = PERMISSION_KINDS.iter().find(|k| Some(**k) == kind).copied();
        out.push(PermissionOption { id, kind });
    }
    Ok(out)
}

impl Handler for Client {
    fn notification(&self, method: &str, params: Option<&RawValue>) {
        if method == "session/update" {
            self.relay_update(params.and_then(|p| serde_json::from_str::<UpdateParams<'_>>(p.get()).ok()));
        } else {
            // The params stay the agent's text: a tree (`json!`) cannot hold
            // every number JSON allows (`1e999`), and the relay drops nothing.
            self.cx.sink.relay(&self.run_id_shared, Relay::Notification { method, params });
        }
    }

    fn session_update(&self, params: UpdateParams<'_>) {
        self.relay_update(Some(params));
    }

    fn backpressure(&self) -> Option<BoxFuture<()>> {
        if !self.cx.sink.is_backed_up() {
            return None;
        }
        Some(self.cx.sink.clone().wait_for_room())
    }

    fn request(
        self: Arc<Self>,
        id: Value,
        method: String,
        params: Box<RawValue>,
    ) -> BoxFuture<Result<Reply, RpcError>> {
        Box::pin(async move {
            let terminal_off = || {
                Err(RpcError::new(
                    code::METHOD_NOT_FOUND,
                    format!(
                        "{method}: terminals are disabled on this daemon (sandbox.terminalEnabled = false)"
                    ),
                ))
            };
            let terminals = self.cx.settings.terminal_enabled;
            // A write's params may be 16 MB of text: parsed off the
            // daemon's thread, with the write. The others are small.
            if method == "fs/write_text_file" {
                return self.write(params).await.map(Reply::from);
            }
            let params: Value = serde_json::from_str(params.get())
                .map_err(|e| RpcError::invalid_params(format!("params: {e}")))?;
            match method.as_str() {
                "fs/read_text_file" => self.read(params).await,
                "session/request_permission" => self.permission(id, params).await.map(Reply::from),
                m if m.starts_with("terminal/") && !terminals => terminal_off(),
                "terminal/create" => self.terminal_create(params).await.map(Reply::from),
                "terminal/output" => self
                    .terminal(&params)?
                    .output()
                    .await
                    .map(Reply::Raw)
                    .map_err(|e| RpcError::internal(format!("terminal/output: {e}"))),
                "terminal/wait_for_exit" => {
                    let t = self.terminal(&params)?;
                    Ok(t.wait().await.to_json().into())
                }
                "terminal/kill" => {
                    self.terminal(&params)?.kill().await;
                    Ok(json!({}).into())
                }
                "terminal/release" => {
                    let id = str_param(&params, "terminalId")?;
                    let t = self
                        .terminals
                        .remove(id)
                        .ok_or_else(|| RpcError::not_found(format!("terminal {id:?} does not exist")))?;
                    t.kill().await;
                    Ok(json!({}).into())
                }
                _ => Err(RpcError {
                    code: code::METHOD_NOT_FOUND,
                    message: format!("method not found: {method}"),
                    data: Some(json!(method)),
                }),
            }
        })
    }

    fn closed(&self) {
        if let Some(f) = lock(&self.on_closed).take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::proxy::Daemon;
    use crate::proxy::config::Config;

    /// Each class of guest path error keeps its JSON-RPC code.
    #[test]
    fn fs_errors_keep_their_codes() {
        use crate::hostfs::guest::{BadPath, Failed, NotFound, Outside};
        let cases: Vec<(FsError, i64)> = vec![
            (BadPath::Nul.into(), -32602),
            (Outside::Path { path: "/etc".into() }.into(), -32602),
            (NotFound::File { path: "/x".into() }.into(), -32002),
            (Failed::NotARegularFile { path: "/x".into() }.into(), -32603),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let rpc = fs_error(e);
            assert_eq!((rpc.code, rpc.message), (code, text));
        }
    }

    // Found by the acp_transport fuzz target: `json!` turned the params
    // into a tree, which has no place for 1e9990, and the unwrap in the
    // macro took the daemon down.
    #[tokio::test]
    async fn notifications_keep_params_as_written() {
        let dir = std::env::temp_dir().join(format!("tuixiu-client-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("ws")).unwrap();
        let text = format!(
            "orchestrator_url = \"ws://127.0.0.1:1/ws/agent\"\nstate_dir = \"{0}/state\"\n\
             [sandbox]\nprovider = \"host\"\nnoIsolationAcknowledged = true\nworkspaceHostRoot = \"{0}/ws\"\n",
            dir.display()
        );
        let (cfg, _) =
            Config::from_table("t.toml", toml::from_str(&text).unwrap(), &BTreeMap::new()).unwrap();
        let d = Arc::new(Daemon::new(cfg, "p".into()).unwrap());
        let spawner: Spawner =
            Arc::new(|_| Box::pin(async { Err(crate::provider::InvalidError::EmptyCommand.into()) }));
        let client = Client::new(
            d.acp_context(),
            "r1".into(),
            "i".into(),
            Err(GuestError::Open { path: "/nope".into(), errno: nix::errno::Errno::ENOENT }),
            spawner,
            vec![],
            "/h".into(),
        );
        let params = RawValue::from_string(r#"{"x": 1e9990, "y": [1, "z"]}"#.into()).unwrap();
        client.notification("_vendor/notice", Some(&params));
        client.notification("_vendor/bare", None);
        let sent: Vec<String> = d
            .outbox()
            .peek_batch(2, usize::MAX, Some(usize::MAX))
            .await
            .texts()
            .iter()
            .map(|t| t.as_str().to_string())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            sent,
            [
                r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","method":"_vendor/notice","params":{"x": 1e9990, "y": [1, "z"]}}}"#,
                r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","method":"_vendor/bare","params":null}}"#,
            ]
        );
    }
}
