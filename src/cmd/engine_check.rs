//! After `run --provider docker` returned: is the container engine still
//! there? A lost engine (stopped, killed, restarted) ends `docker run` or
//! `docker exec` with whatever status and output the broken stream left,
//! which must not pass for the command's (docs/providers.md).
//!
//! The check runs after every docker run, so it is cheap where it can be:
//! with a local engine socket (`DOCKER_HOST=unix://…`, or the default
//! socket when no other context is chosen) it is one HTTP request on the
//! socket (`/_ping`, `/containers/<name>/json`); otherwise, or for
//! `nerdctl`, the CLI answers (`version`, `inspect`). Podman has no engine.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the engine may take to answer.
const DEADLINE: Duration = Duration::from_secs(10);

/// `Ok` when the engine answers and, with `instance`, that container runs;
/// else why not (one line).
pub fn engine_still_there(cli: &str, instance: Option<&str>) -> Result<(), String> {
    let name = Path::new(cli).file_name().and_then(|n| n.to_str()).unwrap_or(cli);
    if name == "podman" {
        return Ok(());
    }
    let socket = if name == "docker" { local_socket() } else { None };
    match socket {
        Some(socket) => {
            let (status, _) = http_get(&socket, "/_ping")?;
            if status != 200 {
                return Err(format!("the engine answers HTTP {status} at {}", socket.display()));
            }
            if let Some(container) = instance {
                let (status, body) = http_get(&socket, &format!("/containers/{container}/json"))?;
                let running = status == 200
                    && serde_json::from_slice::<serde_json::Value>(&body)
                        .is_ok_and(|v| v.pointer("/State/Running") == Some(&serde_json::Value::Bool(true)));
                if !running {
                    return Err(format!("the engine no longer runs instance {container}"));
                }
            }
        }
        None => {
            cli_output(cli, &["version", "--format", "{{.Server.Version}}"])?;
            if let Some(container) = instance {
                let running = cli_output(
                    cli,
                    &["inspect", "--type=container", "--format", "{{.State.Running}}", "--", container],
                )?;
                if running.trim() != "true" {
                    return Err(format!("the engine no longer runs instance {container}"));
                }
            }
        }
    }
    Ok(())
}

/// The docker CLI's engine socket when it is a local one we can name
/// without reading its contexts: `DOCKER_HOST=unix://PATH`, or the default
/// socket when neither `DOCKER_HOST`, `DOCKER_CONTEXT` nor a current context
/// in the CLI's config chooses another engine.
fn local_socket() -> Option<PathBuf> {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => return host.strip_prefix("unix://").map(PathBuf::from),
        _ => {}
    }
    if std::env::var_os("DOCKER_CONTEXT").is_some_and(|c| !c.is_empty() && c != "default") {
        return None;
    }
    let config = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker"),
    };
    if let Ok(text) = std::fs::read(config.join("config.json")) {
        let context = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("currentContext").and_then(|c| c.as_str()).map(str::to_string));
        if context.is_some_and(|c| !c.is_empty() && c != "default") {
            return None;
        }
    }
    Some(PathBuf::from("/var/run/docker.sock"))
}

/// One HTTP/1.0 GET on a unix socket: the status and the body.
fn http_get(socket: &Path, path: &str) -> Result<(u16, Vec<u8>), String> {
    let fail = |e: std::io::Error| format!("{}: {}", socket.display(), sandbox::error::io_error_text(&e));
    let mut stream = UnixStream::connect(socket).map_err(fail)?;
    stream.set_read_timeout(Some(DEADLINE)).map_err(fail)?;
    stream.set_write_timeout(Some(DEADLINE)).map_err(fail)?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n").as_bytes()).map_err(fail)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(fail)?;
    let head_end = reply.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| {
        format!("{}: the engine's answer ended early ({} bytes)", socket.display(), reply.len())
    })?;
    let status = std::str::from_utf8(&reply[..head_end])
        .ok()
        .and_then(|head| head.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| format!("{}: not an HTTP answer", socket.display()))?;
    Ok((status, reply[head_end + 4..].to_vec()))
}

/// Runs `cli args…` with a deadline: its stdout, or why it failed (the last
/// line of its stderr).
fn cli_output(cli: &str, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(cli)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cli}: {}", sandbox::error::io_error_text(&e)))?;
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("`{cli} {}` did not answer within {DEADLINE:?}", args[0]));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no answer").trim().to_string())
    }
}
