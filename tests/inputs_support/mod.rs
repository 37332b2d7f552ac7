//! Test support for the manifest tests: a real HTTP/1.1 server on
//! 127.0.0.1 that records what it was asked, and a byte-level zip writer
//! that can craft hostile archives (lying sizes, symlink entries, entries
//! sharing their data).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server answers on a path.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with a Content-Length.
    Body(Vec<u8>),
    /// 200 without Content-Length; the body ends when the connection closes.
    BodyUntilClose(Vec<u8>),
    /// Any status with a text body.
    Status(u16, String),
    /// 302 to this absolute URL.
    Redirect(String),
    /// 401 asking for HTTP basic credentials.
    Unauthorized,
    /// Headers at once, then the body only after a delay.
    Slow(Duration, Vec<u8>),
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    /// Header names in lowercase.
    pub headers: HashMap<String, String>,
}

pub struct HttpServer {
    addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl HttpServer {
    pub fn start() -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, st) = (routes.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (r, s) = (r.clone(), s.clone());
                std::thread::spawn(move || serve(conn, &r, &s));
            }
        });
        HttpServer { addr, routes, seen, stop }
    }

    /// `http://127.0.0.1:PORT`
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin())
    }

    pub fn route(&self, path: &str, reply: Reply) {
        self.routes.lock().unwrap().insert(path.to_string(), reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn seen_path(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, routes: &Mutex<HashMap<String, Reply>>, seen: &Mutex<Vec<Seen>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    seen.lock().unwrap().push(Seen { path: path.clone(), headers });
    let reply =
        routes.lock().unwrap().get(&path).cloned().unwrap_or(Reply::Status(404, "no such file".into()));
    let mut out = conn;
    let _ = match reply {
        Reply::Body(body) => write_response(&mut out, "200 OK", Some(body.len()), &[], &body),
        Reply::BodyUntilClose(body) => write_response(&mut out, "200 OK", None, &[], &body),
        Reply::Status(code, text) => {
            write_response(&mut out, &format!("{code} Status"), Some(text.len()), &[], text.as_bytes())
        }
        Reply::Redirect(to) => write_response(&mut out, "302 Found", Some(0), &[("Location", &to)], b""),
        Reply::Unauthorized => write_response(
            &mut out,
            "401 Unauthorized",
            Some(0),
            &[("WWW-Authenticate", "Basic realm=\"test\"")],
            b"",
        ),
        Reply::Slow(delay, body) => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = out.write_all(head.as_bytes());
            let _ = out.flush();
            std::thread::sleep(delay);
            out.write_all(&body)
        }
    };
    let _ = out.shutdown(std::net::Shutdown::Both);
}

fn write_response(
    out: &mut TcpStream,
    status: &str,
    length: Option<usize>,
    extra: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    if let Some(n) = length {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body)
}

// ---------------------------------------------------------------- zips

/// One entry of a crafted archive.
#[derive(Clone, Debug)]
pub struct ZipEntry {
    pub name: String,
    pub data: Vec<u8>,
    pub deflate: bool,
    /// Unix mode (type and permission bits) in the external attributes.
    pub unix_mode: Option<u32>,
    /// Uncompressed size written in the headers, instead of the real one.
    pub declared_size: Option<u32>,
    /// CRC-32 written in the headers, instead of the real one.
    pub declared_crc: Option<u32>,
    /// The compressed bytes end this many bytes early (headers agree).
    pub truncate: usize,
}

impl ZipEntry {
    pub fn file(name: &str, data: &[u8]) -> ZipEntry {
        ZipEntry {
            name: name.into(),
            data: data.to_vec(),
            deflate: true,
            unix_mode: Some(0o100644),
            declared_size: None,
            declared_crc: None,
            truncate: 0,
        }
    }

    pub fn dir(name: &str) -> ZipEntry {
        ZipEntry {
            name: name.into(),
            data: Vec::new(),
            deflate: false,
            unix_mode: Some(0o040755),
            declared_size: None,
            declared_crc: None,
            truncate: 0,
        }
    }

    pub fn symlink(name: &str, target: &str) -> ZipEntry {
        ZipEntry {
            name: name.into(),
            data: target.as_bytes().to_vec(),
            deflate: false,
            unix_mode: Some(0o120777),
            declared_size: None,
            declared_crc: None,
            truncate: 0,
        }
    }
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

struct Central {
    name: Vec<u8>,
    method: u16,
    crc: u32,
    compressed: u32,
    declared: u32,
    external: u32,
    offset: u32,
}

/// Builds a zip archive byte by byte.
pub fn zip(entries: &[ZipEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for e in entries {
        let (method, mut payload) = if e.deflate { (8u16, deflate(&e.data)) } else { (0u16, e.data.clone()) };
        payload.truncate(payload.len().saturating_sub(e.truncate));
        let crc = e.declared_crc.unwrap_or_else(|| crc32fast::hash(&e.data));
        let declared = e.declared_size.unwrap_or(e.data.len() as u32);
        let offset = out.len() as u32;
        local_header(&mut out, e.name.as_bytes(), method, crc, payload.len() as u32, declared);
        out.extend_from_slice(&payload);
        central.push(Central {
            name: e.name.as_bytes().to_vec(),
            method,
            crc,
            compressed: payload.len() as u32,
            declared,
            external: e.unix_mode.map_or(0, |m| m << 16),
            offset,
        });
    }
    finish(out, &central)
}

/// A non-recursive "overlap" bomb: one deflated kernel of `kernel_size`
/// zero bytes, referenced by `copies` central-directory entries.
pub fn overlap_bomb(kernel_size: usize, copies: usize) -> Vec<u8> {
    let data = vec![0u8; kernel_size];
    let payload = deflate(&data);
    let crc = crc32fast::hash(&data);
    let mut out = Vec::new();
    local_header(&mut out, b"kernel", 8, crc, payload.len() as u32, kernel_size as u32);
    out.extend_from_slice(&payload);
    let central: Vec<Central> = (0..copies)
        .map(|i| Central {
            name: format!("f{i}").into_bytes(),
            method: 8,
            crc,
            compressed: payload.len() as u32,
            declared: kernel_size as u32,
            external: 0o100644 << 16,
            offset: 0,
        })
        .collect();
    finish(out, &central)
}

fn local_header(out: &mut Vec<u8>, name: &[u8], method: u16, crc: u32, compressed: u32, declared: u32) {
    out.extend_from_slice(&0x04034b50u32.to_le_bytes());
    out.extend_from_slice(&20u16.to_le_bytes()); // version needed
    out.extend_from_slice(&0x0800u16.to_le_bytes()); // flags: UTF-8 names
    out.extend_from_slice(&method.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // time
    out.extend_from_slice(&0x21u16.to_le_bytes()); // date (1980-01-01)
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&compressed.to_le_bytes());
    out.extend_from_slice(&declared.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // extra length
    out.extend_from_slice(name);
}

fn finish(mut out: Vec<u8>, central: &[Central]) -> Vec<u8> {
    let start = out.len() as u32;
    for c in central {
        out.extend_from_slice(&0x02014b50u32.to_le_bytes());
        out.extend_from_slice(&((3u16 << 8) | 20).to_le_bytes()); // made by: Unix
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(&0x0800u16.to_le_bytes());
        out.extend_from_slice(&c.method.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&0x21u16.to_le_bytes());
        out.extend_from_slice(&c.crc.to_le_bytes());
        out.extend_from_slice(&c.compressed.to_le_bytes());
        out.extend_from_slice(&c.declared.to_le_bytes());
        out.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes()); // extra
        out.extend_from_slice(&0u16.to_le_bytes()); // comment
        out.extend_from_slice(&0u16.to_le_bytes()); // disk
        out.extend_from_slice(&0u16.to_le_bytes()); // internal attrs
        out.extend_from_slice(&c.external.to_le_bytes());
        out.extend_from_slice(&c.offset.to_le_bytes());
        out.extend_from_slice(&c.name);
    }
    let size = out.len() as u32 - start;
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(central.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u16).to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// sha256 in hex, via the system's `sha256sum` (the tests do not link sha2).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.wait().unwrap();
    out.split_whitespace().next().unwrap().to_string()
}

// ------------------------------------------------------------ fixtures

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{Caller, Fixture};

/// A fixture with what manifest runs need: an input cache owned by the
/// caller, an allowlisted directory of host inputs, and a manifest path.
pub struct Inputs {
    pub f: Fixture,
    pub cache: PathBuf,
    /// Allowlisted with --allow-host-path; readable by every caller.
    pub host: PathBuf,
    pub manifest: PathBuf,
}

impl Inputs {
    pub fn new(caller: Caller) -> Inputs {
        let f = Fixture::new(caller);
        let cache = f.dir.join("cache");
        let host = f.dir.join("host-inputs");
        std::fs::create_dir(&cache).unwrap();
        chown(&cache, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(&host).unwrap();
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
        let manifest = f.dir.join("manifest.json");
        Inputs { f, cache, host, manifest }
    }

    /// Writes `{"agentInputs": {"version": 1, "items": items}}` (plus envPatch).
    pub fn write(&self, items: serde_json::Value) -> &Path {
        self.write_full(serde_json::json!({"agentInputs": {"version": 1, "items": items}}))
    }

    pub fn write_full(&self, manifest: serde_json::Value) -> &Path {
        std::fs::write(&self.manifest, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
        std::fs::set_permissions(&self.manifest, std::fs::Permissions::from_mode(0o644)).unwrap();
        &self.manifest
    }

    /// The workspace bind item for this fixture.
    pub fn workspace_item(&self) -> serde_json::Value {
        serde_json::json!({"id": "workspace", "apply": "bindMount", "access": "rw",
            "source": {"type": "hostPath", "path": self.f.workspace}, "target": {"root": "WORKSPACE", "path": "."}})
    }

    /// `run --manifest M --inputs-cache C --allow-host-path H EXTRA -- sh -c SCRIPT`.
    pub fn run(&self, extra: &[&str], script: &str) -> Output {
        let (m, c, h) =
            (self.manifest.to_str().unwrap(), self.cache.to_str().unwrap(), self.host.to_str().unwrap());
        let mut args = vec!["--manifest", m, "--inputs-cache", c, "--allow-host-path", h];
        args.extend_from_slice(extra);
        self.f.run(&args, &["sh", "-c", script])
    }

    /// `run --workspace WS --manifest M --inputs-cache C --allow-host-path H
    /// EXTRA -- COMMAND...`, not started.
    pub fn command(&self, extra: &[&str], command: &[&str]) -> std::process::Command {
        let ws = self.f.workspace.to_str().unwrap();
        let (m, c, h) =
            (self.manifest.to_str().unwrap(), self.cache.to_str().unwrap(), self.host.to_str().unwrap());
        let mut args =
            vec!["run", "--workspace", ws, "--manifest", m, "--inputs-cache", c, "--allow-host-path", h];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        self.f.command(&args)
    }

    /// `run` with extra environment variables for the tool itself.
    pub fn run_with_env(&self, extra: &[&str], script: &str, vars: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(extra, &["sh", "-c", script]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// Like `run`, asserting success; returns stdout.
    pub fn ok(&self, extra: &[&str], script: &str) -> String {
        let out = self.run(extra, script);
        assert!(
            out.status.success(),
            "run failed ({:?})\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Like `run`, asserting the run was refused before the command started
    /// (exit 125, no marker file); returns stderr.
    pub fn refused(&self, extra: &[&str]) -> String {
        let out = self.run(extra, "touch /workspace/started");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(125), "stderr: {err}");
        assert!(!self.f.workspace.join("started").exists(), "the command ran: {err}");
        assert_eq!(
            err.trim_end().lines().filter(|l| l.starts_with("tuixiu-sandbox: ")).count(),
            1,
            "not one error line: {err}"
        );
        err
    }
}

/// `git ARGS` in `dir` with a fixed identity and no system or user config;
/// returns stdout, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.org")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.org")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
