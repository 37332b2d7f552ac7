//! What the docker provider hands to the docker CLI, observed through a
//! fake `docker` on PATH that records every invocation. This proves what
//! the real-engine tests cannot: that invalid input never reaches the CLI
//! at all, and that variables travel only through the env file.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Records `argv` (NUL-separated, one invocation per line) in $FAKE_LOG and
/// the env file's contents in $FAKE_LOG.env; answers like docker does.
const FAKE_DOCKER: &str = r#"#!/bin/sh
for a in "$@"; do printf '%s\0' "$a" >> "$FAKE_LOG"; done
printf '\n' >> "$FAKE_LOG"
for a in "$@"; do
  case "$a" in --env-file=*) cat "${a#--env-file=}" >> "$FAKE_LOG.env" ;; esac
done
case "$1" in
  inspect)
    for last in "$@"; do :; done
    case "$last" in
      tuixiu-run-managed) echo '[{"Id":"c0ffee","Name":"/tuixiu-run-managed","State":{"Status":"running"},"Config":{"Labels":{"acp-proxy.managed":"1","acp-proxy.run_id":"managed","acp-proxy.agent_mode":"exec"}}}]' ;;
      *) echo "Error: No such container: $last" >&2; exit 1 ;;
    esac ;;
  stop) echo "Error response from daemon: cannot stop container: boom" >&2; exit 1 ;;
  ps) ;;
  run) exit 0 ;;
  version) echo 20.10.24 ;;
  *) echo "fake docker: unexpected $1" >&2; exit 1 ;;
esac
"#;

struct Fake {
    dir: PathBuf,
    log: PathBuf,
}

impl Fake {
    fn new(label: &str) -> Fake {
        common::require_root();
        let dir = std::env::temp_dir().join(format!("tuixiu-fake-docker-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("ws")).unwrap();
        let docker = dir.join("bin/docker");
        std::fs::write(&docker, FAKE_DOCKER).unwrap();
        std::fs::set_permissions(&docker, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fake { log: dir.join("calls"), dir }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(common::binary())
            .args(args)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", self.dir.join("bin").display()))
            .env("FAKE_LOG", &self.log)
            .env("TUIXIU_STATE_DIR", self.dir.join("state"))
            .current_dir(self.dir.join("ws"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Every recorded invocation, as argv vectors.
    fn calls(&self) -> Vec<Vec<String>> {
        let Ok(bytes) = std::fs::read(&self.log) else {
            return Vec::new();
        };
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .collect()
    }

    fn env_file(&self) -> String {
        std::fs::read_to_string(self.log.with_extension("env")).unwrap_or_default()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn invalid_names_and_images_never_reach_the_cli() {
    let fake = Fake::new("invalid");
    let long = format!("tuixiu-run-{}", "a".repeat(200));
    let cases: Vec<Vec<String>> = vec![
        vec!["inspect", "--provider", "docker", "--", "--privileged"],
        vec!["stop", "--provider", "docker", "--", "-x"],
        vec!["rm", "--provider", "docker", "tuixiu-run-a b"],
        vec!["rm", "--provider", "docker", "other-prefix"],
        vec!["rm", "--provider", "docker", long.as_str()],
        vec!["run", "--provider", "docker", "--image", "img", "--instance-name=--privileged", "--", "true"],
        vec![
            "run",
            "--provider",
            "docker",
            "--image",
            "img",
            "--instance-name",
            "tuixiu-run-../x",
            "--",
            "true",
        ],
        vec!["run", "--provider", "docker", "--image=--privileged", "--", "true"],
        vec!["run", "--provider", "docker", "--image", "Not/Valid", "--", "true"],
        vec!["run", "--provider", "docker", "--image", "img;rm", "--", "true"],
        vec!["run", "--provider", "docker", "--", "true"],
        vec![
            "run",
            "--provider",
            "docker",
            "--image",
            "img",
            "--env",
            "A=line\nbreak",
            "--env-allow",
            "A",
            "--",
            "true",
        ],
        vec!["run", "--provider", "docker", "--image", "img", "--run-id", "../etc", "--", "true"],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(str::to_string).collect())
    .collect();
    for case in cases {
        let args: Vec<&str> = case.iter().map(String::as_str).collect();
        let out = fake.cli(&args);
        assert_eq!(out.status.code(), Some(125), "{case:?}: {}", stderr(&out));
        let message = stderr(&out);
        assert!(
            message.starts_with("tuixiu-sandbox: ") && message.lines().count() == 1,
            "{case:?}: {message}"
        );
        assert!(fake.calls().is_empty(), "{case:?} reached the docker CLI: {:?}", fake.calls());
    }
    assert!(
        !fake.dir.join("state/docker").exists()
            || std::fs::read_dir(fake.dir.join("state/docker")).unwrap().count() == 0
    );
}

#[test]
fn no_such_container_is_missing_and_the_recorder_works() {
    let fake = Fake::new("missing");
    let out = fake.cli(&["inspect", "--provider", "docker", "--json", "tuixiu-run-nothing"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["status"], "missing");
    assert_eq!(fake.calls(), [["inspect", "--type=container", "--", "tuixiu-run-nothing"]]);
}

#[test]
fn cli_errors_carry_the_cli_stderr() {
    let fake = Fake::new("stderr");
    let out = fake.cli(&["stop", "--provider", "docker", "tuixiu-run-managed"]);
    assert_eq!(out.status.code(), Some(125));
    let message = stderr(&out);
    assert!(message.contains("`docker stop tuixiu-run-managed` failed (exit 1)"), "{message}");
    assert!(message.contains("cannot stop container: boom"), "{message}");
}

#[test]
fn variables_travel_only_in_the_env_file() {
    let fake = Fake::new("envfile");
    let out = Command::new(common::binary())
        .args([
            "run",
            "--provider",
            "docker",
            "--image",
            "img",
            "--pass-env",
            "OPENAI_API_KEY",
            "--env",
            "PLAIN=v",
            "--env-allow",
            "PLAIN",
        ])
        .args(["--", "sh", "-c", "echo hi"])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", fake.dir.join("bin").display()))
        .env("FAKE_LOG", &fake.log)
        .env("TUIXIU_STATE_DIR", fake.dir.join("state"))
        .env("OPENAI_API_KEY", "sk-fake-0123456789")
        .current_dir(fake.dir.join("ws"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let calls = fake.calls();
    // The run, then the check that the engine is still there.
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1], ["version", "--format", "{{.Server.Version}}"]);
    let argv = &calls[0];
    assert!(argv.iter().all(|a| !a.contains("sk-fake")), "{argv:?}");
    assert!(argv.iter().any(|a| a.starts_with("--env-file=/dev/fd/")), "{argv:?}");
    let env = fake.env_file();
    assert!(env.lines().any(|l| l == "OPENAI_API_KEY=sk-fake-0123456789"), "{env}");
    assert!(env.lines().any(|l| l == "PLAIN=v") && env.lines().any(|l| l == "USER=agent"), "{env}");
    // The command and its arguments follow `--` and the image, untouched.
    let dashdash = argv.iter().position(|a| a == "--").unwrap();
    assert_eq!(argv[dashdash + 1..], ["img", "sh", "-c", "echo hi"]);
    // The one-off's host files (passwd, group) are gone afterwards.
    let state = fake.dir.join("state/docker");
    assert_eq!(std::fs::read_dir(&state).map(|d| d.count()).unwrap_or(0), 0);
}

#[test]
fn a_missing_cli_is_a_clear_error() {
    let fake = Fake::new("nocli");
    let empty = fake.dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = Command::new(common::binary())
        .args(["run", "--provider", "docker", "--image", "img", "--", "true"])
        .env_clear()
        .env("PATH", &empty)
        .env("TUIXIU_STATE_DIR", fake.dir.join("state"))
        .current_dir(fake.dir.join("ws"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let message = stderr(&out);
    assert!(message.contains("docker: cannot run it: ENOENT"), "{message}");
    assert!(message.contains("--container-cli"), "{message}");
}
