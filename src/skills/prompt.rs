//! The prompt handed to the engine.
//!
//! A skill may give a template per engine (`runner.json`
//! `entrypoint.prompts.<engine>`); otherwise the engine's default prompt is
//! used (docs/skills.md, "Inputs, parameters and the prompt"). Templates are
//! rendered with variable lookups only: `{{ input.x }}`, `{{ parameter.x }}`,
//! `{{ skill_id }}`, `{{ run_dir }}`, `{{ skill_dir }}`. A string renders as
//! itself, any other value as compact JSON, an undefined name as nothing
//! (upstream's lenient Jinja). There are no filters, loops or calls: a template
//! is data from a skill package, and rendering it cannot run anything.
//!
//! The installed `SKILL.md` is bound read-only, so upstream's runtime patch
//! of it (where artifacts go; never ask the user) is appended to the prompt
//! instead.

use serde_json::{Map, Value};

use super::package::Skill;

/// Variables a template can name.
pub struct Vars<'a> {
    pub skill: &'a Skill,
    pub input: &'a Map<String, Value>,
    pub parameter: &'a Map<String, Value>,
    /// The run directory as the engine sees it (`/workspace`).
    pub run_dir: &'a str,
    /// The skill package as the engine sees it.
    pub skill_dir: &'a str,
    /// An interactive job: the engine may ask the user.
    pub interactive: bool,
}

impl Vars<'_> {
    fn lookup(&self, path: &str) -> Option<Value> {
        let mut parts = path.split('.');
        let head = parts.next()?;
        let root = match head {
            "input" => Value::Object(self.input.clone()),
            "parameter" => Value::Object(self.parameter.clone()),
            "skill_id" => Value::String(self.skill.id.clone()),
            "run_dir" => Value::String(self.run_dir.to_string()),
            "skill_dir" => Value::String(self.skill_dir.to_string()),
            "skill" => self.skill.to_json(),
            _ => return None,
        };
        let mut current = root;
        for part in parts {
            current = match current {
                Value::Object(mut m) => m.remove(part)?,
                Value::Array(a) => a.into_iter().nth(part.parse().ok()?)?,
                _ => return None,
            };
        }
        Some(current)
    }
}

/// A value as it appears in a prompt.
pub fn show(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn is_expression(expr: &str) -> bool {
    let mut parts = expr.split('.');
    let head_ok = parts.next().is_some_and(|h| {
        h.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    head_ok
        && parts
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
}

/// Renders `{{ name.path }}` lookups; anything else between braces is kept
/// as written.
pub fn render(template: &str, vars: &Vars<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let expr = after[..end].trim();
        if is_expression(expr) {
            if let Some(v) = vars.lookup(expr) {
                out.push_str(&show(&v));
            }
        } else {
            out.push_str(&rest[start..start + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The prompt for `engine`: the skill's template or the engine's default,
/// then the runtime instructions.
pub fn build(engine: &str, vars: &Vars<'_>) -> String {
    let mut prompt = match vars.skill.prompt_template(engine) {
        Some(template) => render(template, vars),
        None => default_prompt(engine, vars),
    };
    if !prompt.ends_with('\n') {
        prompt.push('\n');
    }
    prompt.push_str(&runtime_patch(vars));
    prompt
}

fn list(out: &mut String, map: &Map<String, Value>) {
    for (k, v) in map {
        out.push_str(&format!("- {k}: {}\n", show(v)));
    }
}

fn default_prompt(engine: &str, vars: &Vars<'_>) -> String {
    let id = &vars.skill.id;
    let mut out = if engine == "codex" {
        format!("${id}: Execute the skill using the inputs and parameters listed below.\n\n")
    } else {
        format!("Please call the skill named \"{id}\".\n\n")
    };
    out.push_str("# Inputs\n");
    list(&mut out, vars.input);
    out.push_str("# Parameters\n");
    list(&mut out, vars.parameter);
    out.push('\n');
    if engine == "codex" {
        out.push_str(&format!("P.S. The skill can be found in {}\n", vars.skill_dir));
    } else {
        out.push_str("Task: Execute the skill using the above inputs and parameters.\n");
    }
    out
}

fn runtime_patch(vars: &Vars<'_>) -> String {
    let mut out = String::new();
    if !vars.skill.artifacts.is_empty() {
        out.push_str("\n# Runtime Output Overrides\n");
        for a in &vars.skill.artifacts {
            out.push_str(&format!(
                "- {} ({}) -> {}/artifacts/{}\n",
                a.role, a.pattern, vars.run_dir, a.pattern
            ));
        }
        out.push_str("Write these files at exactly those paths, not in the current directory.\n");
    }
    out.push_str("\n# Automation Context\n");
    out.push_str("You must ensure that the output is a schema-compatible JSON.\n");
    if vars.interactive {
        out.push_str(ASK_USER_CONTRACT);
    } else {
        out.push_str("You must NOT ask the user for anything: decide on your own and finish the task.\n");
    }
    out
}

/// How an interactive job's engine asks (upstream's contract; the kinds
/// and fields of `GET /v1/jobs/{id}/interaction/pending`).
const ASK_USER_CONTRACT: &str = "\
You may ask the user when you cannot decide on your own. To ask, output only the JSON object
{\"ask_user\": {\"interaction_id\": <1 for the first question, then 2, ...>, \"kind\": \"choose_one\" | \"confirm\" | \"fill_fields\" | \"open_text\" | \"risk_ack\", \"prompt\": \"<the question>\"}}
optionally with \"options\": [{\"label\": ..., \"value\": ...}], \"ui_hints\", \"default_decision_policy\" and \"required_fields\".
The user's answer comes back as your next instruction. Once you have everything, output the final JSON.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions() {
        assert!(is_expression("input.input_file"));
        assert!(is_expression("parameter.x-y"));
        assert!(!is_expression("input | upper"));
        assert!(!is_expression("input..x"));
        assert!(!is_expression(""));
    }
}
