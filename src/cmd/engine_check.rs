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

/// Why the engine does not count as still there: one line, shown inside
/// `run`'s "the container engine was lost" error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the engine answers HTTP {status} at {}", .socket.display())]
    Status { status: u16, socket: PathBuf },
    #[error("the engine no longer runs instance {0}")]
    NotRunning(String),
    /// The engine's socket: connecting, writing or reading.
    #[error("{}: {}", .socket.display(), sandbox::error::io_error_text(.source))]
    Socket {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the engine's answer ended early ({len} bytes)", .socket.display())]
    EarlyEnd { socket: PathBuf, len: usize },
    #[error("{}: not an HTTP answer", .socket.display())]
    NotHttp { socket: PathBuf },
    /// The CLI could not be started.
    #[error("{cli}: {}", sandbox::error::io_error_text(.source))]
    Spawn {
        cli: String,
        #[source]
        source: std::io::Error,
    },
    /// Waiting for the CLI failed.
    #[error(transparent)]
    Wait(std::io::Error),
    #[error("`{cli} {command}` did not answer within {:?}", DEADLINE)]
    Timeout { cli: String, command: String },
    /// The CLI failed: the last line of its stderr, or "no answer".
    #[error("{0}")]
    Cli(String),
}

/// `Ok` when the engine answers and, with `instance`, that container runs;
/// else why not (one line).
pub fn engine_still_there(cli: &str, instance: Option<&str>) -> Result<(), EngineError> {
    let name = Path::new(cli).file_name().and_then(|n| n.to_str()).unwrap_or(cli);
    if name == "podman" {
        return Ok(());
    }
    let socket = if name == "docker" { local_socket() } else { None };
    match socket {
        Some(socket) => {
            let (status, _) = http_get(&socket, "/_ping")?;
            if status != 200 {
                return Err(EngineError::Status { status, socket });
            }
            if let Some(container) = instance {
                let (status, body) = http_get(&socket, &format!("/containers/{container}/json"))?;
                let running = status == 200
                    && serde_json::from_slice::<serde_json::Value>(&body)
                        .is_ok_and(|v| v.pointer("/State/Running") == Some(&serde_json::Value::Bool(true)));
                if !running {
                    return Err(EngineError::NotRunning(container.to_string()));
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
                    return Err(EngineError::NotRunning(container.to_string()));
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
fn http_get(socket: &Path, path: &str) -> Result<(u16, Vec<u8>), EngineError> {
    let fail = |source| EngineError::Socket { socket: socket.to_path_buf(), source };
    let mut stream = UnixStream::connect(socket).map_err(fail)?;
    stream.set_read_timeout(Some(DEADLINE)).map_err(fail)?;
    stream.set_write_timeout(Some(DEADLINE)).map_err(fail)?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n").as_bytes()).map_err(fail)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(fail)?;
    let head_end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| EngineError::EarlyEnd { socket: socket.to_path_buf(), len: reply.len() })?;
    let status = std::str::from_utf8(&reply[..head_end])
        .ok()
        .and_then(|head| head.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| EngineError::NotHttp { socket: socket.to_path_buf() })?;
    Ok((status, reply[head_end + 4..].to_vec()))
}

/// Runs `cli args…` with a deadline: its stdout, or why it failed (the last
/// line of its stderr).
fn cli_output(cli: &str, args: &[&str]) -> Result<String, EngineError> {
    let mut child = Command::new(cli)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| EngineError::Spawn { cli: cli.to_string(), source })?;
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().map_err(EngineError::Wait)?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(EngineError::Timeout { cli: cli.to_string(), command: args[0].to_string() });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().map_err(EngineError::Wait)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no answer");
        Err(EngineError::Cli(last.trim().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        let socket = PathBuf::from("/var/run/docker.sock");
        let e = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let again = || std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let cases: Vec<(EngineError, String)> = vec![
            (
                EngineError::Status { status: 500, socket: socket.clone() },
                format!("the engine answers HTTP {} at {}", 500, socket.display()),
            ),
            (EngineError::NotRunning("c".into()), format!("the engine no longer runs instance {}", "c")),
            (
                EngineError::Socket { socket: socket.clone(), source: again() },
                format!("{}: {}", socket.display(), sandbox::error::io_error_text(&e)),
            ),
            (
                EngineError::EarlyEnd { socket: socket.clone(), len: 3 },
                format!("{}: the engine's answer ended early ({} bytes)", socket.display(), 3),
            ),
            (
                EngineError::NotHttp { socket: socket.clone() },
                format!("{}: not an HTTP answer", socket.display()),
            ),
            (
                EngineError::Spawn { cli: "nerdctl".into(), source: again() },
                format!("{}: {}", "nerdctl", sandbox::error::io_error_text(&e)),
            ),
            (EngineError::Wait(again()), e.to_string()),
            (
                EngineError::Timeout { cli: "nerdctl".into(), command: "version".into() },
                format!("`{} {}` did not answer within {DEADLINE:?}", "nerdctl", "version"),
            ),
            (EngineError::Cli("Cannot connect".into()), "Cannot connect".into()),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
    }
}
