//! Test support for skill jobs: the real `skills serve` process on a free
//! port, a raw HTTP/1.1 client (raw, so paths such as `artifacts/../x`
//! reach the server exactly as written), and the fixture skill with the
//! stub engine (tests/fixtures).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Caller, Fixture};

/// A fixture with the skills, the engines config and a data directory.
pub struct Env {
    pub fx: Fixture,
    pub skills: PathBuf,
    pub data: PathBuf,
    pub engines: PathBuf,
}

impl Env {
    pub fn new(caller: Caller) -> Env {
        let fx = Fixture::new(caller);
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let skills = fx.dir.join("skills");
        let engine_dir = fx.dir.join("engine");
        copy_tree(&src.join("skills"), &skills);
        std::fs::create_dir_all(&engine_dir).unwrap();
        std::fs::copy(src.join("stub-engine.sh"), engine_dir.join("stub-engine.sh")).unwrap();
        let data = fx.dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        chown(&data, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
        let engines = fx.dir.join("engines.json");
        // `command` is resumable (run again with the reply), `sticky`
        // keeps running while its question waits.
        let config = json!({"engines": {
            "command": {
                "argv": ["sh", "/engine/stub-engine.sh", "{prompt}"],
                "ro_binds": [{"src": engine_dir, "dst": "/engine"}],
                "network": "off",
                "models": ["stub-model", "stub-model-large"],
                "interactive": {"style": "resumable", "session": "key:session_id",
                                "resume_argv": ["sh", "/engine/stub-engine.sh", "--resume", "{session}", "{prompt}"]}
            },
            "sticky": {
                "argv": ["sh", "/engine/stub-engine.sh", "{prompt}"],
                "ro_binds": [{"src": engine_dir, "dst": "/engine"}],
                "network": "off",
                "interactive": {"style": "sticky"}
            }
        }});
        std::fs::write(&engines, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        for p in [&skills, &engine_dir] {
            make_readable(p);
        }
        Env { fx, skills, data, engines }
    }

    /// Writes a skill package `id` with these files (path → content).
    pub fn write_skill(&self, dir: &str, files: &[(&str, String)]) {
        let root = self.skills.join(dir);
        for (rel, content) in files {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
        }
        make_readable(&root);
    }

    /// `skills serve` on a free port.
    pub fn serve(&self, extra: &[&str]) -> Server {
        let (s, d, e) =
            (self.skills.to_str().unwrap(), self.data.to_str().unwrap(), self.engines.to_str().unwrap());
        let mut args = vec![
            "skills",
            "serve",
            "--skills-dir",
            s,
            "--data-dir",
            d,
            "--listen",
            "127.0.0.1:0",
            "--engines",
            e,
        ];
        args.extend_from_slice(extra);
        let log = std::fs::File::create(self.fx.dir.join("server.log")).unwrap();
        let mut child = self
            .fx
            .command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start the server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| {
            let _ = child.kill();
            panic!("server did not start: {line:?}; log: {}", self.server_log())
        });
        Server { child, addr: addr.to_string() }
    }

    /// The host directory of the run of `request_id` (from its job record).
    pub fn run_dir(&self, request_id: &str) -> PathBuf {
        let record: Value = serde_json::from_slice(
            &std::fs::read(self.data.join(format!("jobs/{request_id}.json"))).unwrap(),
        )
        .unwrap();
        self.data.join("runs").join(record["run_id"].as_str().expect("the job has a run"))
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.fx.dir.join("server.log")).unwrap_or_default()
    }
}

fn copy_tree(src: &Path, dst: &Path) {
    let status = std::process::Command::new("cp").arg("-r").arg(src).arg(dst).status().unwrap();
    assert!(status.success());
}

/// World-readable, so every caller can read the skills and the stub.
fn make_readable(p: &Path) {
    let status = std::process::Command::new("chmod").args(["-R", "a+rX"]).arg(p).status().unwrap();
    assert!(status.success());
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
}

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Server {
    /// SIGKILL, as a crash.
    pub fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn get(&self, path: &str) -> Resp {
        request(&self.addr, "GET", path, None, &[])
    }

    /// `GET path`, or `None` when no answer came within `limit` (the
    /// request is left hanging on its own thread).
    pub fn get_within(&self, path: &str, limit: Duration) -> Option<Resp> {
        let (addr, path) = (self.addr.clone(), path.to_string());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(request(&addr, "GET", &path, None, &[]));
        });
        rx.recv_timeout(limit).ok()
    }

    /// SIGTERM, then waits up to `limit` for the server to exit.
    pub fn terminate_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Resp {
        request(&self.addr, "POST", path, Some("application/json"), &serde_json::to_vec(body).unwrap())
    }

    pub fn post(&self, path: &str) -> Resp {
        request(&self.addr, "POST", path, None, &[])
    }

    /// multipart/form-data with one file field per `(name, bytes)`.
    pub fn post_files(&self, path: &str, fields: &[(&str, &[u8])]) -> Resp {
        let boundary = "----tuixiu-test-boundary-7d2f";
        let mut body = Vec::new();
        for (field, bytes) in fields {
            write!(
                body,
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{field}.zip\"\r\n\
                 Content-Type: application/zip\r\n\r\n"
            )
            .unwrap();
            body.extend_from_slice(bytes);
            body.extend_from_slice(b"\r\n");
        }
        write!(body, "--{boundary}--\r\n").unwrap();
        let ct = format!("multipart/form-data; boundary={boundary}");
        request(&self.addr, "POST", path, Some(&ct), &body)
    }

    /// multipart/form-data with one field `field` holding `bytes`.
    pub fn upload_as(&self, request_id: &str, field: &str, bytes: &[u8]) -> Resp {
        self.post_files(&format!("/v1/jobs/{request_id}/upload"), &[(field, bytes)])
    }

    pub fn upload(&self, request_id: &str, bytes: &[u8]) -> Resp {
        self.upload_as(request_id, "file", bytes)
    }

    /// Creates a job of the demo skill; returns its request id.
    pub fn create_demo(&self, mode: &str, query: &str) -> String {
        let r = self.post_json(
            "/v1/jobs",
            &json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": query}, "parameter": {"mode": mode}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["status"], Value::Null, "the demo skill waits for its upload: {v}");
        v["request_id"].as_str().unwrap().to_string()
    }

    /// Polls the job until it is terminal; returns its status JSON.
    pub fn wait(&self, request_id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get(&format!("/v1/jobs/{request_id}"));
            if r.status == 200 {
                let v = r.json();
                if matches!(v["status"].as_str(), Some("succeeded" | "failed" | "canceled")) {
                    return v;
                }
            }
            assert!(Instant::now() < deadline, "job {request_id} did not finish: {}", r.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Creates a job of the demo skill with `engine`, `mode` and extra
    /// runtime options, and uploads its input file; returns its id.
    pub fn start_demo(&self, engine: &str, mode: &str, query: &str, options: Value) -> String {
        let r = self.post_json(
            "/v1/jobs",
            &json!({"skill_id": "tuixiu-demo", "engine": engine, "input": {"query": query},
                    "parameter": {"mode": mode}, "runtime_options": options}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let rid = r.json()["request_id"].as_str().unwrap().to_string();
        let zip = crate::inputs_support::zip(&[crate::inputs_support::ZipEntry::file(
            "input_file",
            b"numbers: 2 3 5 7\n",
        )]);
        let r = self.upload(&rid, &zip);
        assert_eq!(r.status, 200, "{}", r.text());
        rid
    }

    /// Polls until the job's status is `want`; panics when it ends
    /// otherwise.
    pub fn wait_status(&self, request_id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get(&format!("/v1/jobs/{request_id}"));
            if r.status == 200 {
                let v = r.json();
                if v["status"] == want {
                    return v;
                }
                let ended = matches!(v["status"].as_str(), Some("succeeded" | "failed" | "canceled"));
                assert!(!ended, "job {request_id} ended as {v}, not {want}");
            }
            assert!(Instant::now() < deadline, "job {request_id} not {want}: {}", r.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `POST .../interaction/reply` with `body`.
    pub fn reply(&self, request_id: &str, body: Value) -> Resp {
        self.post_json(&format!("/v1/jobs/{request_id}/interaction/reply"), &body)
    }

    /// Polls until the job's artifacts list contains `path`.
    pub fn wait_artifact(&self, request_id: &str, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get(&format!("/v1/jobs/{request_id}/artifacts"));
            if r.status == 200 && r.json()["artifacts"].as_array().unwrap().iter().any(|a| a == path) {
                return;
            }
            assert!(Instant::now() < deadline, "no {path} for {request_id}: {}", r.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.crash();
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The `detail` of an error body.
    pub fn detail(&self) -> Value {
        self.json()["detail"].clone()
    }
}

/// One request on a fresh connection; `path` is sent exactly as given.
pub fn request(addr: &str, method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Resp {
    request_with(addr, method, path, content_type, &[], body)
}

/// As [`request`], with more header lines (`"Name: value"`).
pub fn request_with(
    addr: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    extra: &[&str],
    body: &[u8],
) -> Resp {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    for line in extra {
        head.push_str(&format!("{line}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(String::from_utf8_lossy(&data[..end]).trim(), 16).unwrap();
        data = &data[end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// The names and contents of a zip (the bundle).
pub fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut f = archive.by_index(i).unwrap();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (f.name().unwrap().into_owned(), data)
        })
        .collect()
}

/// Host processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(format!("{name}: {text}"));
            }
        }
    }
    found
}
