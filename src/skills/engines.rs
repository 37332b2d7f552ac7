//! Engines: how an agent CLI is started for a job, and how its answer is
//! read back.
//!
//! An engine is a command template (the prompt is always the last argument, as
//! upstream passes it) plus what the sandbox needs for it: variables, read-only
//! host binds (an install prefix), files copied into the per-run home
//! (credentials), a settings file written into the run directory, the network
//! policy, and where the skill package is shown (besides `/skill`). `codex`,
//! `gemini` and `iflow` are built in with the command lines of upstream
//! (docs/skills.md, "Engines"); a configuration file can change them or add
//! engines, such as a plain `command` engine for tests and custom CLIs. Nothing
//! from the server's environment reaches an engine unless `pass_env` names it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use super::package::BUILTIN_ENGINES;

/// One item of an argv template.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ArgItem {
    /// A word; `{prompt}`, `{model}`, `{skill_id}` are replaced.
    Word(String),
    /// Words used only when the request has that value (`"if": "model"`).
    Optional {
        #[serde(rename = "if")]
        when: String,
        args: Vec<String>,
    },
}

/// How the engine prints its final answer.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OutputFormat {
    /// The answer is somewhere in stdout.
    #[default]
    Text,
    /// codex `--json`: NDJSON events; the last `agent_message` is the answer.
    CodexJson,
    /// gemini `output.format=json`: one envelope whose `response` is the answer.
    GeminiJson,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostBind {
    pub src: PathBuf,
    pub dst: String,
}

/// A host file copied into the per-run home before the engine starts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HomeFile {
    pub src: PathBuf,
    /// Path relative to the home.
    pub dst: String,
}

/// A JSON settings file written into the run directory: the skill's
/// asset (if the package has it) merged with the enforced keys.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Path relative to the run directory, e.g. `.gemini/settings.json`.
    pub file: String,
    /// Path of the skill's defaults in its package, e.g. `assets/gemini_settings.json`.
    #[serde(default)]
    pub from_skill: Option<String>,
    /// Keys that always win.
    #[serde(default)]
    pub enforced: Value,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NetworkChoice {
    /// The host's network (engines call model APIs).
    #[default]
    On,
    /// Loopback only.
    Off,
    /// Loopback and the egress proxy to `allow_hosts` (docs/security.md).
    Allow,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Engine {
    pub argv: Vec<ArgItem>,
    #[serde(default)]
    pub output: OutputFormat,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub pass_env: Vec<String>,
    #[serde(default)]
    pub ro_binds: Vec<HostBind>,
    #[serde(default)]
    pub home_files: Vec<HomeFile>,
    #[serde(default)]
    pub settings: Option<Settings>,
    #[serde(default)]
    pub network: NetworkChoice,
    /// With `network: "allow"`: the destinations (`--allow-host` patterns).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// With `network: "allow"`: special ranges the proxy may connect to.
    #[serde(default)]
    pub allow_ranges: Vec<String>,
    /// Another guest path where the skill package is bound read-only
    /// (`{skill_id}` and `{home}` replaced), where the CLI discovers skills.
    #[serde(default)]
    pub skill_path: Option<String>,
    /// Models a request may ask for; any when absent.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// How an interactive job continues after a question: run again
    /// with the reply (`resumable`), or kept running and given the reply
    /// on its stdin (`sticky`, also when absent).
    #[serde(default)]
    pub interactive: Option<Interactive>,
}

/// An engine's interactive style (docs/skills.md, "Interactive jobs").
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "style", rename_all = "snake_case", deny_unknown_fields)]
pub enum Interactive {
    /// The engine exits after asking; it is started again with
    /// `resume_argv` (`{session}` is the session it named, `{prompt}` the
    /// reply) in the same run directory and home.
    Resumable { resume_argv: Vec<ArgItem>, session: String },
    /// The engine keeps running while the job waits: it prints its
    /// question as one line of JSON and reads the reply as one line
    /// `{"interaction_id": N, "response": ...}` on its standard input.
    Sticky,
}

/// Where a resumable engine names its session in a turn's stdout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionFrom {
    /// codex `--json`: `thread_id` of the first event, `thread.started`.
    CodexThread,
    /// The first `"NAME": "value"` pair in the output (gemini's
    /// `session_id`, iflow's `session-id`).
    Key(String),
}

impl SessionFrom {
    pub fn parse(text: &str) -> Option<SessionFrom> {
        match text {
            "codex-thread" => Some(SessionFrom::CodexThread),
            _ => text.strip_prefix("key:").filter(|k| !k.is_empty()).map(|k| SessionFrom::Key(k.into())),
        }
    }

    /// The session named in `stdout`, if any.
    pub fn find(&self, stdout: &str) -> Option<String> {
        let found = match self {
            SessionFrom::CodexThread => {
                let first = stdout.lines().map(str::trim).find(|l| !l.is_empty())?;
                let event: Value = serde_json::from_str(first).ok()?;
                (event.get("type")? == "thread.started").then_some(())?;
                event.get("thread_id")?.as_str()?.to_string()
            }
            SessionFrom::Key(key) => {
                let needle = format!("\"{key}\"");
                let mut rest = stdout;
                loop {
                    let at = rest.find(&needle)?;
                    rest = &rest[at + needle.len()..];
                    let Some(value) = rest.trim_start().strip_prefix(':').map(str::trim_start) else {
                        continue;
                    };
                    let mut stream = serde_json::Deserializer::from_str(value).into_iter::<Value>();
                    if let Some(Ok(Value::String(s))) = stream.next() {
                        break s;
                    }
                }
            }
        };
        let found = found.trim();
        (!found.is_empty() && found.len() <= 512 && !found.chars().any(char::is_control))
            .then(|| found.to_string())
    }
}

/// The engine configuration file: `{"engines": {"name": {...}}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    engines: BTreeMap<String, Engine>,
}

/// Every engine this server knows, built-ins first.
#[derive(Clone, Debug)]
pub struct Engines {
    list: Vec<(String, Engine)>,
}

/// Why the engines configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("engines config {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Read { path: PathBuf, source: std::io::Error },
    #[error("engines config {}: {source}", .path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("engines config {}: invalid engine name {name:?}", .path.display())]
    Name { path: PathBuf, name: String },
    #[error("engines config {}: engine {name:?}: {source}", .path.display())]
    Engine { path: PathBuf, name: String, source: EngineError },
}

/// What is wrong with one engine of the configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("argv must start with the program")]
    NoProgram,
    #[error("ro_binds destination {0:?} must be absolute")]
    RelativeBind(String),
    #[error("home_files destination {0:?} must be a relative path in the home")]
    HomeFile(String),
    #[error("settings file {0:?} must be a relative path in the run directory")]
    SettingsFile(String),
    #[error("allow_hosts/allow_ranges: {0}")]
    Allowlist(#[source] crate::egress::PatternError),
    #[error("allow_hosts and allow_ranges need \"network\": \"allow\"")]
    AllowlistWithoutAllow,
    #[error("interactive.resume_argv must start with the program")]
    NoResumeProgram,
    #[error("interactive.session {0:?} must be \"codex-thread\" or \"key:NAME\"")]
    Session(String),
}

/// The engine reported a failed turn instead of an answer.
#[derive(Debug, thiserror::Error)]
#[error("engine turn error: {0}")]
pub struct TurnError(pub Value);

impl Engines {
    /// The built-in engines only.
    pub fn builtin() -> Engines {
        Engines { list: BUILTIN_ENGINES.iter().map(|n| (n.to_string(), builtin(n))).collect() }
    }

    /// Built-ins changed or extended by the configuration file at `path`.
    pub fn load(path: &Path) -> Result<Engines, ConfigError> {
        let text =
            std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let config: ConfigFile = serde_json::from_slice(&text)
            .map_err(|source| ConfigError::Json { path: path.to_path_buf(), source })?;
        let mut engines = Engines::builtin();
        for (name, engine) in config.engines {
            if !crate::hostfs::beneath::is_plain_name(&name) || name.contains(char::is_whitespace) {
                return Err(ConfigError::Name { path: path.to_path_buf(), name });
            }
            if let Err(source) = engine.check() {
                return Err(ConfigError::Engine { path: path.to_path_buf(), name, source });
            }
            match engines.list.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = engine,
                None => engines.list.push((name, engine)),
            }
        }
        Ok(engines)
    }

    pub fn names(&self) -> Vec<String> {
        self.list.iter().map(|(n, _)| n.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Engine> {
        self.list.iter().find(|(n, _)| n == name).map(|(_, e)| e)
    }
}

impl Engine {
    fn check(&self) -> Result<(), EngineError> {
        if !matches!(self.argv.first(), Some(ArgItem::Word(w)) if !w.is_empty()) {
            return Err(EngineError::NoProgram);
        }
        for b in &self.ro_binds {
            if !b.dst.starts_with('/') {
                return Err(EngineError::RelativeBind(b.dst.clone()));
            }
        }
        for f in &self.home_files {
            if !crate::hostfs::beneath::is_plain_relative(&f.dst) {
                return Err(EngineError::HomeFile(f.dst.clone()));
            }
        }
        if let Some(s) = &self.settings
            && !crate::hostfs::beneath::is_plain_relative(&s.file)
        {
            return Err(EngineError::SettingsFile(s.file.clone()));
        }
        if let Some(Interactive::Resumable { resume_argv, session }) = &self.interactive {
            if !matches!(resume_argv.first(), Some(ArgItem::Word(w)) if !w.is_empty()) {
                return Err(EngineError::NoResumeProgram);
            }
            if SessionFrom::parse(session).is_none() {
                return Err(EngineError::Session(session.clone()));
            }
        }
        if self.network != NetworkChoice::Allow
            && !(self.allow_hosts.is_empty() && self.allow_ranges.is_empty())
        {
            return Err(EngineError::AllowlistWithoutAllow);
        }
        self.egress_policy()?;
        Ok(())
    }

    /// The egress proxy's policy of `network: "allow"`.
    pub fn egress_policy(&self) -> Result<Option<crate::egress::Policy>, EngineError> {
        if self.network != NetworkChoice::Allow {
            return Ok(None);
        }
        crate::egress::Policy::parse(&self.allow_hosts, &self.allow_ranges)
            .map(Some)
            .map_err(EngineError::Allowlist)
    }

    /// How the engine's session is found, for a resumable engine.
    pub fn resumable(&self) -> Option<SessionFrom> {
        match &self.interactive {
            Some(Interactive::Resumable { session, .. }) => SessionFrom::parse(session),
            _ => None,
        }
    }

    /// The command line that resumes `session` with `prompt` (the reply),
    /// for a resumable engine.
    pub fn resume_argv(
        &self,
        prompt: &str,
        model: Option<&str>,
        skill_id: &str,
        session: &str,
    ) -> Option<Vec<String>> {
        match &self.interactive {
            Some(Interactive::Resumable { resume_argv, .. }) => {
                Some(expand(resume_argv, prompt, model, skill_id, session))
            }
            _ => None,
        }
    }

    /// The command line for one job.
    pub fn argv(&self, prompt: &str, model: Option<&str>, skill_id: &str) -> Vec<String> {
        expand(&self.argv, prompt, model, skill_id, "")
    }

    /// The answer text in the engine's stdout, and whether taking it out
    /// of an envelope counts as a repair.
    pub fn answer(&self, stdout: &str) -> Result<(String, bool), TurnError> {
        match self.output {
            OutputFormat::Text => Ok((stdout.to_string(), false)),
            OutputFormat::CodexJson => {
                let mut last = stdout
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
                    .filter_map(|ev| {
                        let item = ev.get("item")?;
                        (ev.get("type")? == "item.completed" && item.get("type")? == "agent_message")
                            .then(|| item.get("text")?.as_str().map(str::to_string))?
                    });
                Ok(last.next_back().map_or_else(|| (stdout.to_string(), false), |t| (t, false)))
            }
            OutputFormat::GeminiJson => {
                let Ok(envelope) = serde_json::from_str::<Value>(stdout.trim()) else {
                    return Ok((stdout.to_string(), false));
                };
                match envelope.get("response") {
                    Some(Value::String(s)) => Ok((s.clone(), true)),
                    Some(v @ Value::Object(_)) => Ok((v.to_string(), true)),
                    _ => match envelope.get("error") {
                        Some(e) => Err(TurnError(e.clone())),
                        None => Ok((stdout.to_string(), false)),
                    },
                }
            }
        }
    }
}

/// An argv template with `{prompt}`, `{model}`, `{skill_id}` and
/// `{session}` replaced.
fn expand(
    template: &[ArgItem],
    prompt: &str,
    model: Option<&str>,
    skill_id: &str,
    session: &str,
) -> Vec<String> {
    let subst = |w: &str| {
        w.replace("{model}", model.unwrap_or_default())
            .replace("{skill_id}", skill_id)
            .replace("{session}", session)
            .replace("{prompt}", prompt)
    };
    let mut out = Vec::new();
    for item in template {
        match item {
            ArgItem::Word(w) => out.push(subst(w)),
            ArgItem::Optional { when, args } => {
                if when == "model" && model.is_some() {
                    out.extend(args.iter().map(|a| subst(a)));
                }
            }
        }
    }
    out
}

fn word(w: &str) -> ArgItem {
    ArgItem::Word(w.into())
}

fn model_flag(flag: &str) -> ArgItem {
    ArgItem::Optional { when: "model".into(), args: vec![flag.into(), "{model}".into()] }
}

fn builtin(name: &str) -> Engine {
    let base = Engine {
        argv: Vec::new(),
        output: OutputFormat::Text,
        env: BTreeMap::new(),
        pass_env: Vec::new(),
        ro_binds: Vec::new(),
        home_files: Vec::new(),
        settings: None,
        network: NetworkChoice::On,
        allow_hosts: Vec::new(),
        allow_ranges: Vec::new(),
        skill_path: None,
        models: None,
        interactive: None,
    };
    match name {
        "codex" => codex(base),
        "gemini" => gemini(base),
        "iflow" => iflow(base),
        _ => unreachable!("not a built-in engine: {name}"),
    }
}

/// codex: its own sandbox off, since the tuixiu sandbox is the boundary
/// (upstream's `--yolo` fallback); resumed by thread.
fn codex(base: Engine) -> Engine {
    Engine {
        argv: vec![
            word("codex"),
            word("exec"),
            word("--dangerously-bypass-approvals-and-sandbox"),
            word("--skip-git-repo-check"),
            word("--json"),
            model_flag("-m"),
            word("{prompt}"),
        ],
        output: OutputFormat::CodexJson,
        skill_path: Some("{home}/.codex/skills/{skill_id}".into()),
        interactive: Some(Interactive::Resumable {
            resume_argv: vec![
                word("codex"),
                word("exec"),
                word("--dangerously-bypass-approvals-and-sandbox"),
                word("resume"),
                word("--skip-git-repo-check"),
                word("--json"),
                model_flag("-m"),
                word("{session}"),
                word("{prompt}"),
            ],
            session: "codex-thread".into(),
        }),
        ..base
    }
}

/// gemini: JSON output, the skill's settings asset merged; resumed by session.
fn gemini(base: Engine) -> Engine {
    Engine {
        argv: vec![word("gemini"), word("--yolo"), model_flag("-m"), word("{prompt}")],
        output: OutputFormat::GeminiJson,
        settings: Some(Settings {
            file: ".gemini/settings.json".into(),
            from_skill: Some("assets/gemini_settings.json".into()),
            enforced: json!({
                "output": {"format": "json"},
                "tools": {"autoAccept": true},
                "experimental": {"skills": true},
                "privacy": {"usageStatisticsEnabled": false}
            }),
        }),
        skill_path: Some("/workspace/.gemini/skills/{skill_id}".into()),
        interactive: Some(Interactive::Resumable {
            resume_argv: vec![
                word("gemini"),
                word("--resume"),
                word("{session}"),
                word("--yolo"),
                model_flag("-m"),
                word("{prompt}"),
            ],
            session: "key:session_id".into(),
        }),
        ..base
    }
}

/// iflow: text output, the skill's settings asset merged; resumed by session.
fn iflow(base: Engine) -> Engine {
    Engine {
        argv: vec![word("iflow"), word("--yolo"), model_flag("-m"), word("-p"), word("{prompt}")],
        settings: Some(Settings {
            file: ".iflow/settings.json".into(),
            from_skill: Some("assets/iflow_settings.json".into()),
            enforced: json!({"sandbox": "false", "approvalMode": "yolo", "telemetry": {"enabled": false}}),
        }),
        skill_path: Some("/workspace/.iflow/skills/{skill_id}".into()),
        interactive: Some(Interactive::Resumable {
            resume_argv: vec![
                word("iflow"),
                word("--resume"),
                word("{session}"),
                word("--yolo"),
                model_flag("-m"),
                word("-p"),
                word("{prompt}"),
            ],
            session: "key:session-id".into(),
        }),
        ..base
    }
}

/// `base` with `over` merged in, objects key by key, `over` winning.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The output JSON object in `text`, with upstream's deterministic repair:
/// the text itself, trimmed, a ```json fence, then the first balanced
/// `{...}`. Returns the object and whether it had to be repaired.
pub fn extract_json(text: &str) -> Option<(Value, bool)> {
    let object = |s: &str| serde_json::from_str::<Value>(s).ok().filter(Value::is_object);
    if let Some(v) = object(text) {
        return Some((v, false));
    }
    let trimmed = text.trim();
    if let Some(v) = object(trimmed) {
        return Some((v, true));
    }
    for fence in ["```json", "```"] {
        let mut rest = trimmed;
        while let Some(start) = rest.find(fence) {
            let body = &rest[start + fence.len()..];
            let Some(end) = body.find("```") else { break };
            if let Some(v) = object(body[..end].trim()) {
                return Some((v, true));
            }
            rest = &body[end + 3..];
        }
    }
    first_balanced_object(text).and_then(object).map(|v| (v, true))
}

/// The first `{...}` whose braces balance, strings and escapes respected.
/// Each `{` is tried in turn, so an output full of unmatched braces would
/// cost time quadratic in its length (16 MiB are read back): the search
/// gives up once it has looked at 8 times the text's bytes (at least
/// 1 MiB).
fn first_balanced_object(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut budget = text.len().saturating_mul(8).max(1 << 20);
    let mut from = 0;
    while let Some(pos) = text[from..].find('{') {
        let start = from + pos;
        let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            budget = budget.checked_sub(1)?;
            if in_str {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        let candidate = &text[start..=i];
                        budget = budget.checked_sub(candidate.len())?;
                        if serde_json::from_str::<Value>(candidate).is_ok() {
                            return Some(candidate);
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        from = start + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_levels() {
        assert_eq!(extract_json(r#"{"a":1}"#), Some((json!({"a": 1}), false)));
        assert_eq!(extract_json(" {\"a\":1}\n"), Some((json!({"a": 1}), false)));
        assert_eq!(extract_json("done:\n```json\n{\"a\": \"}\"}\n```\n"), Some((json!({"a": "}"}), true)));
        assert_eq!(extract_json("x {\"a\": {\"b\": \"{\"}} y"), Some((json!({"a": {"b": "{"}}), true)));
        assert_eq!(extract_json("[1]"), None);
        assert_eq!(extract_json("nothing"), None);
    }

    /// Every `{` was scanned to the end of the text: 64 KiB of them took
    /// 27 s in the `skills_answer` fuzz target, 16 MiB would take days.
    #[test]
    fn unmatched_braces_end_the_search() {
        assert_eq!(extract_json(&"{".repeat(1 << 20)), None);
        let text = format!("{}{{\"a\": 1}}", "x{".repeat(500));
        assert_eq!(extract_json(&text), Some((json!({"a": 1}), true)));
    }

    #[test]
    fn argv_templates() {
        let e = builtin("codex");
        assert_eq!(
            e.argv("do it", Some("gpt-5"), "s"),
            [
                "codex",
                "exec",
                "--dangerously-bypass-approvals-and-sandbox",
                "--skip-git-repo-check",
                "--json",
                "-m",
                "gpt-5",
                "do it"
            ]
        );
        assert_eq!(builtin("gemini").argv("p", None, "s"), ["gemini", "--yolo", "p"]);
    }

    #[test]
    fn answers() {
        let codex = builtin("codex");
        let ndjson = "{\"type\":\"thread.started\"}\n{\"type\":\"item.completed\",\"item\":{\"type\":\"agent_message\",\"text\":\"{\\\"a\\\":1}\"}}\n";
        assert_eq!(codex.answer(ndjson).unwrap().0, "{\"a\":1}");
        let gemini = builtin("gemini");
        assert_eq!(gemini.answer("{\"response\":\"{\\\"a\\\":1}\"}").unwrap(), ("{\"a\":1}".into(), true));
        assert!(gemini.answer("{\"error\":{\"message\":\"quota\"}}").is_err());
    }

    #[test]
    fn sessions() {
        let codex = SessionFrom::parse("codex-thread").unwrap();
        assert_eq!(codex.find("{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}\n{}"), Some("t-1".into()));
        assert_eq!(codex.find("{\"type\":\"turn.started\"}"), None);
        let key = SessionFrom::parse("key:session-id").unwrap();
        assert_eq!(key.find("x \"session-id\" : \"abc\" y"), Some("abc".into()));
        assert_eq!(key.find("\"session-id\" 5 \"session-id\": \"b\""), Some("b".into()));
        assert_eq!(key.find("\"session-id\": 5"), None);
        assert_eq!(SessionFrom::parse("key:"), None);
        assert_eq!(SessionFrom::parse("other"), None);
        assert_eq!(
            builtin("codex").resume_argv("yes", None, "s", "t-1").unwrap(),
            [
                "codex",
                "exec",
                "--dangerously-bypass-approvals-and-sandbox",
                "resume",
                "--skip-git-repo-check",
                "--json",
                "t-1",
                "yes"
            ]
        );
    }

    #[test]
    fn merging() {
        let mut a = json!({"a": {"b": 1, "c": 2}, "d": 1});
        merge(&mut a, &json!({"a": {"b": 3}, "e": 4}));
        assert_eq!(a, json!({"a": {"b": 3, "c": 2}, "d": 1, "e": 4}));
    }
}
