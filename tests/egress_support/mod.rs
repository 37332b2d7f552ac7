//! Fixtures for the egress proxy's tests: loopback HTTP and HTTPS servers
//! standing in for a model API, a "metadata" and a "private" service
//! (each counting its connections), the test builds' name mapping, and a
//! git smart-HTTP server over HTTPS (tests/fixtures/git_https_server.py).
//! Certificates: tests/pki.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The variable test builds read their name mapping from.
pub const HOSTS_ENV: &str = "TUIXIU_SANDBOX_TEST_ONLY_EGRESS_HOSTS";

/// An HTTP(S) server on `ip`, port chosen by the kernel, answering every
/// request with `body`; it counts connections and keeps the last request
/// head.
pub struct Server {
    pub port: u16,
    hits: Arc<AtomicUsize>,
    last: Arc<std::sync::Mutex<String>>,
}

impl Server {
    pub fn start(ip: &str, tls: Option<Arc<rustls::ServerConfig>>, body: &'static str) -> Server {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(std::sync::Mutex::new(String::new()));
        let (h, l) = (hits.clone(), last.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                h.fetch_add(1, Ordering::SeqCst);
                let (tls, last) = (tls.clone(), l.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    match tls {
                        Some(config) => {
                            let conn = rustls::ServerConnection::new(config).unwrap();
                            answer(rustls::StreamOwned::new(conn, stream), body, &last);
                        }
                        None => answer(stream, body, &last),
                    }
                });
            }
        });
        Server { port, hits, last }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn last_request(&self) -> String {
        self.last.lock().unwrap().clone()
    }
}

fn answer<S: Read + Write>(mut stream: S, body: &str, last: &std::sync::Mutex<String>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    *last.lock().unwrap() = String::from_utf8_lossy(&head).into_owned();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.flush();
}

/// A hosts-file style mapping in `dir` (`ADDRESS NAME` lines).
pub fn hosts_file(dir: &Path, entries: &[(&str, &str)]) -> PathBuf {
    let text: String = entries.iter().map(|(ip, name)| format!("{ip} {name}\n")).collect();
    let path = dir.join("hosts");
    std::fs::write(&path, text).unwrap();
    path
}

/// A bare repository `repo.git` (one commit with `README`) under `root`,
/// served by git's smart-HTTP backend over HTTPS on `ip`.
pub struct GitServer {
    pub port: u16,
    child: std::process::Child,
}

impl GitServer {
    /// `cert` and `key`: the server's certificate and key (PEM files).
    pub fn start(root: &Path, cert: &Path, key: &Path, ip: &str) -> GitServer {
        let work = root.join("work");
        let git = |args: &[&str], dir: &Path| {
            let out = std::process::Command::new("git")
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("HOME", root)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        std::fs::create_dir_all(&work).unwrap();
        git(&["init", "-q", "-b", "main"], &work);
        std::fs::write(work.join("README"), "cloned through the egress proxy\n").unwrap();
        git(&["add", "README"], &work);
        git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"], &work);
        git(&["clone", "-q", "--bare", "work", "repo.git"], root);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/git_https_server.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .args([root, cert, key])
            .arg(ip)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        GitServer { port: line.trim().parse().expect("the git server's port"), child }
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `ip:port` accepts connections from here (the test's own
/// network namespace).
pub fn reachable(ip: &str, port: u16) -> bool {
    TcpStream::connect((ip, port)).is_ok()
}
