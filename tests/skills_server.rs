//! The skills server against what a browser or a slow client could send,
//! and against an engine that writes without end; and skill package
//! installs. Real `skills serve`, raw HTTP.
//!
//! * JSON endpoints take `application/json` only (415), uploads
//!   `multipart/form-data` only (415), and no state-changing request from
//!   another origin (403): a page on this machine cannot start, reply to
//!   or clean up jobs.
//! * Request headers and bodies have time limits, connections a cap.
//! * An engine's stdout and stderr are capped on disk, with a marker.

mod common;
mod inputs_support;
mod skills_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Caller;
use inputs_support::{ZipEntry, zip};
use serde_json::{Value, json};
use skills_support::{Env, request, request_with};

fn create_body() -> Vec<u8> {
    json!({"skill_id": "tuixiu-demo", "engine": "command", "input": {"query": "q"}, "parameter": {"mode": "ok"}})
        .to_string()
        .into_bytes()
}

#[test]
fn only_json_and_multipart_bodies_from_this_origin_are_taken() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--temp-skills", "--install-skills"]);
    let addr = &server.addr;
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let r = request(addr, "POST", "/v1/jobs", ct, &create_body());
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
        assert!(
            r.detail()
                .as_str()
                .unwrap()
                .starts_with("Unsupported Media Type: the body must be application/json")
        );
        let r = request(addr, "POST", "/v1/temp-skill-runs", ct, b"{\"engine\": \"command\"}");
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
    }
    assert!(std::fs::read_dir(env.data.join("jobs")).unwrap().flatten().all(|e| e.file_name() == "cache"));
    let r = request(addr, "POST", "/v1/jobs", Some("application/json; charset=utf-8"), &create_body());
    assert_eq!(r.status, 200, "{}", r.text());
    let rid = r.json()["request_id"].as_str().unwrap().to_string();

    // Uploads: multipart only.
    let input = zip(&[ZipEntry::file("input_file", b"x")]);
    for ct in [None, Some("application/zip"), Some("text/plain")] {
        let r = request(addr, "POST", &format!("/v1/jobs/{rid}/upload"), ct, &input);
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
        let r = request(addr, "POST", "/v1/skill-packages/install", ct, &input);
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
    }
    let reply = format!("/v1/jobs/{rid}/interaction/reply");
    let r = request(addr, "POST", &reply, Some("text/plain"), b"{\"interaction_id\": 1, \"response\": 1}");
    assert_eq!(r.status, 415, "{}", r.text());

    // Another origin: refused whatever the body (a form can send these).
    let evil = ["Origin: http://evil.example"];
    let r = request_with(addr, "POST", "/v1/jobs", Some("application/json"), &evil, &create_body());
    assert_eq!(
        (r.status, r.detail()),
        (403, json!("Cross-origin requests are not allowed (Origin: http://evil.example)"))
    );
    let r = request_with(addr, "POST", &format!("/v1/jobs/{rid}/cancel"), None, &["Origin: null"], b"");
    assert_eq!(r.status, 403);
    let r = server.post_files(&format!("/v1/jobs/{rid}/upload"), &[("file", &input)]);
    assert_eq!(r.status, 200, "the upload itself: {}", r.text());
    // A page of this very server may; reading is never refused.
    let own = format!("Origin: http://{addr}");
    let r = request_with(addr, "POST", "/v1/jobs", Some("application/json"), &[&own], &create_body());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request_with(addr, "GET", &format!("/v1/jobs/{rid}"), None, &evil, b"");
    assert_eq!(r.status, 200);
}

/// Reads from `conn` until the server closes it; how long that took.
fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

#[test]
fn slow_headers_and_bodies_are_cut_off() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--header-timeout", "1s", "--body-timeout", "1s"]);
    // Headers that never end, and a connection that sends nothing.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    let mut idle = TcpStream::connect(&server.addr).unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(10)).expect("a slow head is closed");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(closed_within(&mut idle, Duration::from_secs(10)).is_some(), "an idle connection is closed");

    // A body that stops halfway: 408, and no job.
    let mut body = TcpStream::connect(&server.addr).unwrap();
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 200\r\nConnection: close\r\n\r\n",
        server.addr
    );
    body.write_all(head.as_bytes()).unwrap();
    body.write_all(b"{\"skill_id\": \"tuixiu-demo\",").unwrap();
    body.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let mut answer = Vec::new();
    let _ = body.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("Request body timeout"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The server still answers.
    assert_eq!(server.get("/").status, 200);
}

#[test]
fn connections_are_capped() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--max-connections", "3", "--header-timeout", "2s"]);
    let hogs: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&server.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    // A fourth client waits while three connections are open...
    let t0 = Instant::now();
    assert!(server.get_within("/", Duration::from_millis(800)).is_none(), "served past the cap");
    // ...and is served once the idle ones are closed by the header timeout.
    let r = server.get_within("/", Duration::from_secs(10)).expect("served after the idle ones closed");
    assert_eq!(r.status, 200);
    assert!(t0.elapsed() >= Duration::from_millis(1200), "{:?}", t0.elapsed());
    drop(hogs);
}

#[test]
fn engine_output_is_capped_on_disk() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--max-log", "1M"]);
    let rid = server.start_demo("command", "flood", "flood", json!({}));
    let status = server.wait(&rid);
    // The answer is in the kept end, so the job still succeeds.
    assert_eq!(status["status"], "succeeded", "{status}");
    let logs = env.run_dir(&rid).join("logs");
    for name in ["stdout", "stderr"] {
        let text = std::fs::read_to_string(logs.join(format!("{name}.txt"))).unwrap();
        let marker = text
            .lines()
            .find(|l| l.starts_with("[tuixiu-sandbox: "))
            .unwrap_or_else(|| panic!("no marker in {name}"));
        assert!(marker.contains(&format!("bytes of {name} left out here;")), "{marker}");
        assert!(marker.ends_with("kept to 1048576 bytes (skills serve --max-log)]"), "{marker}");
        // What was kept, and the marker with its two newlines.
        assert_eq!(text.len(), (1 << 20) + marker.len() + 2, "{name}");
        let dropped: usize = marker["[tuixiu-sandbox: ".len()..].split(' ').next().unwrap().parse().unwrap();
        assert!(dropped >= 3_000_000 - (1 << 20), "{name}: {dropped}");
    }
    let stdout = std::fs::read_to_string(logs.join("stdout.txt")).unwrap();
    assert!(
        stdout.trim_end().ends_with("\"report_path\": \"/workspace/artifacts/report.json\"}"),
        "{}",
        &stdout[stdout.len() - 200..]
    );
    let stderr = std::fs::read_to_string(logs.join("stderr.txt")).unwrap();
    assert!(stderr.starts_with("eeee") && stderr.ends_with("eeee"));
}

/// The files of a package `id` (the demo skill under another id) at
/// `version`, under the top-level directory `id`, plus `extra` entries.
fn package(id: &str, version: Option<&str>, extra: Vec<ZipEntry>) -> Vec<u8> {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/skills/tuixiu-demo");
    let read = |rel: &str| std::fs::read(fixture.join(rel)).unwrap();
    let mut runner: Value = serde_json::from_slice(&read("assets/runner.json")).unwrap();
    runner["id"] = json!(id);
    match version {
        Some(v) => runner["version"] = json!(v),
        None => {
            runner.as_object_mut().unwrap().remove("version");
        }
    }
    let mut entries = vec![
        ZipEntry::file(&format!("{id}/SKILL.md"), format!("---\nname: {id}\n---\n# {id}\n").as_bytes()),
        ZipEntry::file(&format!("{id}/assets/runner.json"), runner.to_string().as_bytes()),
    ];
    for schema in ["input", "parameter", "output"] {
        let rel = format!("assets/{schema}.schema.json");
        entries.push(ZipEntry::file(&format!("{id}/{rel}"), &read(&rel)));
    }
    entries.extend(extra);
    zip(&entries)
}

#[test]
fn skill_packages_are_installed_and_updated() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let r =
        server.post_files("/v1/skill-packages/install", &[("file", &package("inst", Some("1.0.0"), vec![]))]);
    assert_eq!(r.status, 403, "off unless asked for: {}", r.text());
    drop(server);

    let server = env.serve(&["--install-skills"]);
    let install = |bytes: &[u8]| -> Value {
        let r = server.post_files("/v1/skill-packages/install", &[("file", bytes)]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], "queued");
        let id = r.json()["request_id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = server.get(&format!("/v1/skill-packages/{id}")).json();
            if matches!(s["status"].as_str(), Some("succeeded" | "failed")) {
                return s;
            }
            assert!(Instant::now() < deadline, "{s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let r = server.post_files("/v1/skill-packages/install", &[("file", b"")]);
    assert_eq!((r.status, r.detail()), (400, json!("Uploaded package is empty")));
    let r = server.get("/v1/skill-packages/nope");
    assert_eq!((r.status, r.detail()), (404, json!("Install request not found")));

    let git =
        vec![ZipEntry::file("inst/.git/config", b"[core]\n"), ZipEntry::file("inst/scripts/.git", b"x")];
    let s = install(&package("inst", Some("1.0.0"), git));
    assert_eq!((s["status"].clone(), s["action"].clone()), (json!("succeeded"), json!("install")), "{s}");
    assert_eq!((s["skill_id"].clone(), s["version"].clone()), (json!("inst"), json!("1.0.0")));
    assert!(!env.skills.join("inst/.git").exists() && !env.skills.join("inst/scripts/.git").exists());
    assert_eq!(server.get("/v1/skills/inst").json()["version"], "1.0.0");

    let refused: Vec<(Vec<u8>, &str)> = vec![
        (
            package("inst", Some("1.0.0"), vec![]),
            "Skill update requires strictly higher version: installed=1.0.0, uploaded=1.0.0",
        ),
        (
            package("inst", Some("0.9"), vec![]),
            "Skill update requires strictly higher version: installed=1.0.0, uploaded=0.9",
        ),
        (package("other", None, vec![]), "runner.json must define a non-empty version"),
        (
            zip(&[ZipEntry::file("../inst/SKILL.md", b"x")]),
            "Invalid zip package: zip entry path is not allowed: ../inst/SKILL.md",
        ),
        (
            package("inst", Some("2.0"), vec![ZipEntry::symlink("inst/scripts/passwd", "/etc/passwd")]),
            "Invalid zip package: zip entry symlink is not allowed",
        ),
        (
            zip(&[ZipEntry::file("a/x", b"x"), ZipEntry::file("b/y", b"y")]),
            "Skill package must contain exactly one top-level directory",
        ),
    ];
    for (bytes, message) in refused {
        let s = install(&bytes);
        assert_eq!(s["status"], "failed", "{message}: {s}");
        assert!(s["error"].as_str().unwrap().starts_with(message), "{message}: {s}");
    }
    assert_eq!(server.get("/v1/skills/inst").json()["version"], "1.0.0", "refused installs change nothing");
    assert!(server.get("/v1/skills/other").status == 404);

    let s = install(&package("inst", Some("1.1.0"), vec![]));
    assert_eq!((s["status"].clone(), s["action"].clone()), (json!("succeeded"), json!("update")), "{s}");
    assert_eq!(server.get("/v1/skills/inst").json()["version"], "1.1.0");
    assert!(env.skills.join(".archive/inst/1.0.0/assets/runner.json").is_file());
    let listed = server.get("/v1/skills").json();
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["inst", "tuixiu-demo"], "nothing staged or archived is listed");

    // The installed package runs.
    let r = server.post_json(
        "/v1/jobs",
        &json!({"skill_id": "inst", "engine": "command", "input": {"query": "installed"}, "parameter": {"mode": "ok"}}),
    );
    let rid = r.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(server.upload(&rid, &zip(&[ZipEntry::file("input_file", b"x")])).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded", "{}", env.server_log());
}
