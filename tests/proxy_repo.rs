//! Host-side git preparation (`TUIXIU_REPO_URL`) end to end: fake backend
//! → real daemon → real git, against a local bare repository and a real
//! smart-HTTP git server (git's own `http-backend` behind a small CGI
//! server with Basic authentication), then the agent in the sandbox
//! working in the checkout.

mod docker_support;
mod proxy_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxy_support::agent::{acp_config, contents, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

const PASSWORD: &str = "git-http-secret-3141592653";
const USER: &str = "tok-user";

fn git(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", cwd)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare repository at `bare` with two commits on `main` (README, a
/// file in a directory).
fn make_repo(bare: &Path) {
    let work = bare.with_extension("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&["init", "-q"], &work);
    std::fs::write(work.join("README.md"), "# the repository\n").unwrap();
    git(&["add", "."], &work);
    git(&["commit", "-q", "-m", "first"], &work);
    std::fs::create_dir_all(work.join("src")).unwrap();
    std::fs::write(work.join("src/lib.txt"), "second\n").unwrap();
    git(&["add", "."], &work);
    git(&["commit", "-q", "-m", "second"], &work);
    git(
        &["clone", "-q", "--bare", &work.display().to_string(), &bare.display().to_string()],
        bare.parent().unwrap(),
    );
    std::fs::remove_dir_all(&work).unwrap();
}

/// Adds a commit to `main` of `bare`.
fn commit_more(bare: &Path, file: &str) {
    let work = bare.with_extension("more");
    let _ = std::fs::remove_dir_all(&work);
    git(&["clone", "-q", &bare.display().to_string(), &work.display().to_string()], bare.parent().unwrap());
    std::fs::write(work.join(file), "more\n").unwrap();
    git(&["add", "."], &work);
    git(&["commit", "-q", "-m", "more"], &work);
    git(&["push", "-q", "origin", "main"], &work);
    std::fs::remove_dir_all(&work).unwrap();
}

fn repo_env(url: &str, branch: &str, mode: &str) -> Value {
    json!({"TUIXIU_REPO_URL": url, "TUIXIU_RUN_BRANCH": branch, "TUIXIU_BASE_BRANCH": "main",
           "TUIXIU_WORKSPACE_MODE": mode, "USER_HOME": "/home/agent"})
}

/// Sends `acp_open` and waits for its (new) `acp_opened`.
async fn open_with(b: &Backend, run: &str, env: Value) -> Value {
    let opened = |b: &Backend| -> Vec<Value> {
        b.received()
            .into_iter()
            .filter(|r| r.msg["type"] == "acp_opened" && r.msg["run_id"] == run)
            .map(|r| r.msg)
            .collect()
    };
    let before = opened(b).len();
    b.send(
        &json!({"type":"acp_open","run_id":run,"cwd":"/workspace","instance_name":format!("tuixiu-run-{run}"),
        "init":{"script":"","env":env,"agentInputs":{"version":1,"items":[]}}}),
    );
    b.wait_for("acp_opened", 120 * SECS, |_| opened(b).len() > before).await;
    opened(b).remove(before)
}

/// The `init_step`s of `run`, as `stage:status`.
fn steps(b: &Backend, run: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| r.msg["run_id"] == run && r.msg["content"]["type"] == "init_step")
        .map(|r| {
            format!(
                "{}:{}",
                r.msg["content"]["stage"].as_str().unwrap(),
                r.msg["content"]["status"].as_str().unwrap()
            )
        })
        .collect()
}

const DONE: [&str; 7] =
    ["auth:start", "auth:done", "clone:start", "clone:done", "checkout:start", "checkout:done", "ready:done"];

/// What the agent sees in its workspace: branch, files, origin, commits.
async fn agent_view(b: &Backend, run: &str, id: &str) -> String {
    let script = r#"term {"command":"cd /workspace && git rev-parse --abbrev-ref HEAD && cat README.md src/lib.txt && git remote get-url origin && git rev-list --count HEAD && touch new-file && git status --short"}"#;
    let r = prompt(b, run, id, Value::Null, script).await;
    assert_eq!(r["ok"], true, "{r}");
    let rep = reports(b, id);
    assert_eq!(rep[0]["exit"]["exitCode"], 0, "{}", rep[0]);
    rep[0]["tail"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_repository_clone_and_cached_modes() {
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new("repo-local");
    let bare = s.root.join("repos/project.git");
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    make_repo(&bare);
    let url = bare.display().to_string();
    let cfg = acp_config(&s, &b.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;

    // clone mode.
    let r = open_with(b, "c1", repo_env(&url, "run/c1", "clone")).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(steps(b, "c1"), DONE);
    let view = agent_view(b, "c1", "p1").await;
    assert_eq!(view, format!("run/c1\n# the repository\nsecond\n{url}\n2\n?? new-file\n"));

    // The cached mode: the first run makes the cache, the next fetches
    // into it (a commit made meanwhile arrives).
    let r = open_with(b, "w1", repo_env(&format!("file://{url}"), "run/w1", "worktree")).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(steps(b, "w1"), DONE);
    let caches: Vec<PathBuf> = std::fs::read_dir(s.state.join("git-cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "git"))
        .collect();
    assert_eq!(caches.len(), 1, "{caches:?}");
    commit_more(&bare, "third.txt");
    let r = open_with(b, "w2", repo_env(&format!("file://{url}"), "run/w2", "worktree")).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let ws2 = s.root.join("run-w2");
    assert!(ws2.join("third.txt").exists(), "the cache was fetched");
    // A standalone repository: its own objects, no link to the cache.
    assert!(ws2.join(".git").is_dir());
    assert!(!ws2.join(".git/objects/info/alternates").exists());
    let view = agent_view(b, "w2", "p2").await;
    assert_eq!(view, format!("run/w2\n# the repository\nsecond\nfile://{url}\n3\n?? new-file\n"));

    // Reopened (a new agent process), the checkout is kept as it is.
    b.send(&json!({"type":"acp_close","run_id":"w2"}));
    b.wait_type("acp_closed", "run_id", &json!("w2"), 20 * SECS).await;
    let before = steps(b, "w2").len();
    let r = open_with(b, "w2", repo_env(&format!("file://{url}"), "run/w2", "worktree")).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        steps(b, "w2")[before..],
        ["auth:start", "auth:done", "clone:skip", "checkout:skip", "ready:done"]
    );
    assert!(ws2.join("new-file").exists(), "the agent's work survives a reopen");

    // Refusals: each names the problem; nothing is deleted.
    let outside = s.dir.join("outside.git");
    make_repo(&outside);
    for (run, env, want) in [
        (
            "f1",
            repo_env(&outside.display().to_string(), "run/f1", "clone"),
            "must be under sandbox.workspaceHostRoot",
        ),
        ("f2", json!({"TUIXIU_REPO_URL": url}), "TUIXIU_RUN_BRANCH is required"),
        ("f3", repo_env("ext::sh -c id", "run/f3", "clone"), "not a repository URL"),
        ("f4", repo_env(&url, "--upload-pack=touch", "clone"), "not a valid branch name"),
    ] {
        let r = open_with(b, run, env).await;
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["error"].as_str().unwrap().contains(want), "{run}: {r}");
        assert!(
            contents(b, "init_step").iter().any(|c| c["stage"] == "init" && c["status"] == "failed"),
            "{run}"
        );
    }
    let ws = s.root.join("run-f5");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("precious.txt"), "keep me").unwrap();
    let r = open_with(b, "f5", repo_env(&url, "run/f5", "clone")).await;
    assert!(r["error"].as_str().unwrap().contains("neither empty nor a git checkout"), "{r}");
    assert_eq!(std::fs::read_to_string(ws.join("precious.txt")).unwrap(), "keep me");
    // A failed clone leaves the workspace empty again.
    let r = open_with(
        b,
        "f6",
        repo_env(&url, "run/f6", "clone")
            .as_object()
            .cloned()
            .map(|mut m| {
                m.insert("TUIXIU_BASE_BRANCH".into(), json!("no-such-branch"));
                Value::Object(m)
            })
            .unwrap(),
    )
    .await;
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("git clone failed"), "{r}");
    assert_eq!(std::fs::read_dir(s.root.join("run-f6")).unwrap().count(), 0);
    assert!(daemon.stop().success());
}

/// A smart-HTTP git server: `git http-backend` as a CGI program behind
/// Basic authentication (`USER`/`PASSWORD`), one thread per connection.
struct GitHttp {
    url: String,
    /// Requests without, and with valid, credentials.
    anonymous: Arc<AtomicUsize>,
    authorized: Arc<AtomicUsize>,
}

impl GitHttp {
    fn start(root: PathBuf) -> GitHttp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let (anonymous, authorized) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, z) = (anonymous.clone(), authorized.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (root, a, z) = (root.clone(), a.clone(), z.clone());
                std::thread::spawn(move || {
                    let _ = serve_cgi(conn, &root, &a, &z);
                });
            }
        });
        GitHttp { url, anonymous, authorized }
    }
}

fn serve_cgi(
    conn: TcpStream,
    root: &Path,
    anonymous: &AtomicUsize,
    authorized: &AtomicUsize,
) -> std::io::Result<()> {
    use base64::Engine;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut body = Vec::new();
    if let Some(len) = headers.get("content-length") {
        body.resize(len.parse().unwrap_or(0), 0);
        reader.read_exact(&mut body)?;
    } else if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    let expected =
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}")));
    if headers.get("authorization") != Some(&expected) {
        anonymous.fetch_add(1, Ordering::SeqCst);
        conn.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
    authorized.fetch_add(1, Ordering::SeqCst);
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cgi = Command::new("git");
    cgi.arg("http-backend")
        .env_clear()
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REMOTE_USER", USER)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (h, var) in [
        ("content-type", "CONTENT_TYPE"),
        ("content-encoding", "HTTP_CONTENT_ENCODING"),
        ("git-protocol", "GIT_PROTOCOL"),
    ] {
        if let Some(v) = headers.get(h) {
            cgi.env(var, v);
        }
    }
    let mut child = cgi.spawn()?;
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out)?;
    let _ = child.wait();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let (head, rest) = match split {
        Some((i, n)) => (String::from_utf8_lossy(&out[..i]).to_string(), &out[i + n..]),
        None => (String::new(), &out[..]),
    };
    let mut status = "200 OK".to_string();
    let mut response = String::new();
    for h in head.lines() {
        match h.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some(_) => response.push_str(&format!("{}\r\n", h.trim_end())),
            None => {}
        }
    }
    conn.write_all(
        format!("HTTP/1.1 {status}\r\n{response}Content-Length: {}\r\nConnection: close\r\n\r\n", rest.len())
            .as_bytes(),
    )?;
    conn.write_all(rest)?;
    Ok(())
}

/// Reads every process's command line until stopped: the ones holding
/// `secret`, and how many git command lines it saw at all.
struct ArgvWatch {
    stop: Arc<AtomicBool>,
    found: Arc<Mutex<Vec<String>>>,
    gits: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ArgvWatch {
    fn start(secret: &'static str) -> ArgvWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (found, gits) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (s, f, g) = (stop.clone(), found.clone(), gits.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                for e in std::fs::read_dir("/proc").unwrap().flatten() {
                    let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
                    let text = String::from_utf8_lossy(&raw).replace('\0', " ");
                    if text.contains(secret) {
                        f.lock().unwrap().push(text.clone());
                    }
                    let first = text.split(' ').next().unwrap_or("");
                    if (first == "git" || first.ends_with("/git") || first.contains("git-remote-http"))
                        && !text.contains("http-backend")
                    {
                        let mut g = g.lock().unwrap();
                        if !g.contains(&text) {
                            g.push(text);
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        ArgvWatch { stop, found, gits, thread: Some(thread) }
    }

    /// (command lines with the secret, git command lines seen)
    fn finish(mut self) -> (Vec<String>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        (self.found.lock().unwrap().clone(), self.gits.lock().unwrap().clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_credentials_reach_git_only_through_askpass() {
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new("repo-http");
    let served = s.dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    make_repo(&served.join("project.git"));
    let server = GitHttp::start(served.clone());
    let url = format!("{}/project.git", server.url);
    let cfg = acp_config(&s, &b.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    let with_creds = |branch: &str, mode: &str, password: &str| {
        let mut env = repo_env(&url, branch, mode);
        env["TUIXIU_GIT_HTTP_USERNAME"] = json!(USER);
        env["TUIXIU_GIT_HTTP_PASSWORD"] = json!(password);
        env
    };

    let watch = ArgvWatch::start(PASSWORD);
    let r = open_with(b, "h1", with_creds("run/h1", "clone", PASSWORD)).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let r2 = open_with(b, "h2", with_creds("run/h2", "worktree", PASSWORD)).await;
    assert_eq!(r2["ok"], true, "{r2}\n{}", daemon.stderr());
    let (found, gits) = watch.finish();
    assert!(found.is_empty(), "the password was on a command line: {found:?}");
    assert!(
        gits.iter().any(|g| g.contains(" clone ") && g.contains(&url)),
        "the watch saw git run: {gits:?}"
    );
    assert!(server.anonymous.load(Ordering::SeqCst) >= 1, "git asked without credentials first");
    assert!(server.authorized.load(Ordering::SeqCst) >= 2, "then with them");
    assert_eq!(steps(b, "h1"), DONE);
    assert_eq!(steps(b, "h2"), DONE);
    assert_eq!(
        agent_view(b, "h1", "p1").await,
        format!("run/h1\n# the repository\nsecond\n{url}\n2\n?? new-file\n")
    );
    // The checkout holds no credentials either.
    let config = std::fs::read_to_string(s.root.join("run-h2/.git/config")).unwrap();
    assert!(!config.contains(PASSWORD) && config.contains(&url), "{config}");

    // A wrong password: a clear failure, and the password is nowhere.
    let r = open_with(b, "h3", with_creds("run/h3", "clone", "wrong-password-2718281828")).await;
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("git clone failed"), "{r}");

    for m in b.received() {
        let text = m.msg.to_string();
        assert!(!text.contains(PASSWORD) && !text.contains("wrong-password-2718281828"), "secret in {text}");
    }
    assert!(daemon.stop().success());
    let log = daemon.stderr();
    assert!(!log.contains(PASSWORD) && !log.contains("wrong-password-2718281828"), "secret in the log");
    assert!(
        !s.state.join("tmp").exists() || std::fs::read_dir(s.state.join("tmp")).unwrap().count() == 0,
        "askpass files removed"
    );
}

/// Docker: the checkout belongs to the container's user, who can work in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_checkout_belongs_to_the_container_user() {
    docker_support::require_engine();
    let backend = Backend::start().await;
    let b = &backend;
    let s = Scratch::new("repo-docker");
    let bare = s.root.join("repos/project.git");
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    make_repo(&bare);
    let url = bare.display().to_string();
    let run = format!("rd{}", std::process::id());
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = docker_support::docker(&["rm", "-f", &self.0]);
        }
    }
    let _rm = Rm(format!("tuixiu-run-{run}"));
    let sandbox_extra = format!(
        "provider = \"container_oci\"\nimage = \"{}\"\nenv = {{ PATH = \"/usr/bin:/bin\" }}\n\
         [[sandbox.volumes]]\nhostPath = \"/usr\"\nguestPath = \"/usr\"\nreadOnly = true\n\
         [[sandbox.volumes]]\nhostPath = \"/usr/lib\"\nguestPath = \"/lib\"\nreadOnly = true\n\
         [[sandbox.volumes]]\nhostPath = \"/usr/lib64\"\nguestPath = \"/lib64\"\nreadOnly = true\n",
        docker_support::image()
    );
    let cfg = acp_config(&s, &b.url, "", &sandbox_extra);
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    let r = open_with(b, &run, repo_env(&url, "run/d1", "worktree")).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let meta = std::fs::metadata(s.root.join(format!("run-{run}/.git/HEAD"))).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 1000);
    let view = agent_view(b, &run, "p1").await;
    assert_eq!(view, format!("run/d1\n# the repository\nsecond\n{url}\n2\n?? new-file\n"));
    assert!(daemon.stop().success());
}
