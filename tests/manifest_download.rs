//! downloadExtract against a real HTTP server on 127.0.0.1: success and
//! the cache, HTTP errors, timeouts, size caps with and without
//! Content-Length, contentHash, and where the bearer token may go.

mod common;
mod inputs_support;

use std::time::{Duration, Instant};

use common::{Caller, stderr};
use inputs_support::{HttpServer, Inputs, Reply, ZipEntry, sha256_hex, zip};
use serde_json::json;

fn archive(text: &str) -> Vec<u8> {
    zip(&[ZipEntry::file("data.txt", format!("{text}\n").as_bytes())])
}

fn item(id: &str, uri: &str, hash: Option<&str>) -> serde_json::Value {
    let mut source = json!({"type": "httpZip", "uri": uri});
    if let Some(h) = hash {
        source["contentHash"] = json!(h);
    }
    json!({"id": id, "apply": "downloadExtract", "source": source, "target": {"root": "SCRATCH", "path": id}})
}

fn cached_files(t: &Inputs) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(t.cache.join("zips"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn download_with_hash_is_cached_and_reverified() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    let body = archive("v1");
    let hash = sha256_hex(&body);
    server.route("/p/a.zip", Reply::Body(body.clone()));
    t.write(json!([item("a", "/p/a.zip", Some(&hash))]));
    let base = server.origin();
    assert_eq!(t.ok(&["--inputs-base-url", &base], "cat /scratch/a/data.txt"), "v1\n");
    assert_eq!(cached_files(&t), vec![format!("{hash}.zip")]);

    // The server is gone: the cache serves it, without a request.
    server.route("/p/a.zip", Reply::Status(500, "down".into()));
    assert_eq!(t.ok(&["--inputs-base-url", &base], "cat /scratch/a/data.txt"), "v1\n");
    assert_eq!(server.seen_path("/p/a.zip").len(), 1);

    // A cached file that no longer matches its hash is not used.
    std::fs::write(t.cache.join("zips").join(format!("{hash}.zip")), b"tampered").unwrap();
    server.route("/p/a.zip", Reply::Body(body));
    let out = t.run(&["--inputs-base-url", &base], "cat /scratch/a/data.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v1\n");
    assert!(stderr(&out).contains("discarding it"), "{}", stderr(&out));
    assert_eq!(server.seen_path("/p/a.zip").len(), 2);
}

#[test]
fn download_without_hash_is_not_cached() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route("/b.zip", Reply::Body(archive("plain")));
    t.write(json!([item("b", &server.url("/b.zip"), None)]));
    assert_eq!(t.ok(&[], "cat /scratch/b/data.txt"), "plain\n");
    assert_eq!(t.ok(&[], "cat /scratch/b/data.txt"), "plain\n");
    assert!(cached_files(&t).is_empty());
    assert_eq!(server.seen_path("/b.zip").len(), 2);
    // No partial downloads are left behind.
    assert_eq!(std::fs::read_dir(t.cache.join("tmp")).unwrap().count(), 0);
}

#[test]
fn http_errors_name_the_item() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route("/forbidden.zip", Reply::Status(403, "no access for you".into()));
    t.write(json!([item("missing", &server.url("/missing.zip"), None)]));
    let err = t.refused(&[]);
    assert!(err.contains(&format!("AGENT_INPUTS_DOWNLOAD_FAILED:missing: download failed: 404 Not Found from {}/missing.zip: no such file", server.origin())), "{err}");

    t.write(json!([item("forbidden", &server.url("/forbidden.zip"), None)]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_DOWNLOAD_FAILED:forbidden: download failed: 403 Forbidden"), "{err}");

    // Nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    t.write(json!([item("refused", &format!("http://{dead}/x.zip"), None)]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_DOWNLOAD_FAILED:refused: download failed: "), "{err}");
}

#[test]
fn slow_download_times_out() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route("/slow.zip", Reply::Slow(Duration::from_secs(5), archive("late")));
    t.write(json!([item("slow", &server.url("/slow.zip"), None)]));
    let started = Instant::now();
    let err = t.refused(&["--download-timeout", "1"]);
    let took = started.elapsed();
    assert!(err.contains("AGENT_INPUTS_DOWNLOAD_TIMEOUT:slow: download timed out after 1s"), "{err}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn oversize_downloads_are_refused() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    let big = vec![b'x'; 4096];
    server.route("/with-length.zip", Reply::Body(big.clone()));
    server.route("/no-length.zip", Reply::BodyUntilClose(big));
    t.write(json!([item("declared", &server.url("/with-length.zip"), None)]));
    let err = t.refused(&["--download-max-bytes", "1K"]);
    assert!(
        err.contains(
            "AGENT_INPUTS_DOWNLOAD_TOO_LARGE:declared: download too large: contentLength=4096 maxBytes=1024"
        ),
        "{err}"
    );

    t.write(json!([item("streamed", &server.url("/no-length.zip"), None)]));
    let err = t.refused(&["--download-max-bytes", "1K"]);
    assert!(
        err.contains("AGENT_INPUTS_DOWNLOAD_TOO_LARGE:streamed: download too large: maxBytes=1024"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(t.cache.join("tmp")).unwrap().count(), 0);

    // The same body under the default cap (200 MiB) is fine as a download
    // (and then fails as a zip, which is another check).
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_ZIP_INVALID:streamed:"), "{err}");
}

#[test]
fn wrong_content_hash_is_refused_and_not_cached() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    let body = archive("real");
    server.route("/h.zip", Reply::Body(body.clone()));
    let claimed = "0".repeat(64);
    t.write(json!([item("hashed", &server.url("/h.zip"), Some(&claimed))]));
    let err = t.refused(&[]);
    assert!(
        err.contains(&format!("AGENT_INPUTS_CONTENT_HASH_MISMATCH:hashed: contentHash mismatch: expected sha256 {claimed}, got {}", sha256_hex(&body))),
        "{err}"
    );
    assert!(cached_files(&t).is_empty());
}

#[test]
fn token_goes_only_to_the_configured_origin() {
    let t = Inputs::new(Caller::Root);
    let (home, other) = (HttpServer::start(), HttpServer::start());
    home.route("/a.zip", Reply::Body(archive("a")));
    home.route("/hop.zip", Reply::Redirect(other.url("/c.zip")));
    home.route("/local-hop.zip", Reply::Redirect(home.url("/a.zip")));
    other.route("/b.zip", Reply::Body(archive("b")));
    other.route("/c.zip", Reply::Body(archive("c")));
    t.write(json!([
        item("a", "/a.zip", None),
        item("b", &other.url("/b.zip"), None),
        item("c", "/hop.zip", None),
        item("d", "/local-hop.zip", None),
    ]));
    let token = "tok-0123456789-secret";
    let out = t.run_with_env(
        &["--inputs-base-url", &home.origin(), "-vv"],
        "cat /scratch/a/data.txt /scratch/b/data.txt /scratch/c/data.txt /scratch/d/data.txt",
        &[("TUIXIU_INPUTS_TOKEN", token)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nb\nc\na\n");
    assert!(!stderr(&out).contains(token), "the token was logged: {}", stderr(&out));
    let bearer = format!("Bearer {token}");
    for seen in home.seen() {
        assert_eq!(seen.headers.get("authorization"), Some(&bearer), "{} got no token", seen.path);
    }
    assert_eq!(home.seen().len(), 4);
    for seen in other.seen() {
        assert_eq!(seen.headers.get("authorization"), None, "{} got the token", seen.path);
    }
    assert_eq!(other.seen().len(), 2);

    // From a file, same rule; without --inputs-base-url nobody gets it.
    let file = t.f.dir.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    t.write(json!([item("a", &home.url("/a.zip"), None)]));
    t.ok(&["--inputs-token-file", file.to_str().unwrap()], "true");
    assert_eq!(home.seen().last().unwrap().headers.get("authorization"), None);
    t.ok(&["--inputs-token-file", file.to_str().unwrap(), "--inputs-base-url", &home.origin()], "true");
    assert_eq!(home.seen().last().unwrap().headers.get("authorization"), Some(&bearer));
}

crate::for_each_caller!(download_then_launch_for_every_caller, |caller: Caller| {
    // A cache miss: the HTTP client ran in this process, which must still
    // be able to launch the sandbox (single-threaded) afterwards.
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    let body = archive("fresh");
    server.route("/f.zip", Reply::Body(body.clone()));
    t.write(json!([item("f", &server.url("/f.zip"), Some(&sha256_hex(&body)))]));
    assert_eq!(t.ok(&[], "cat /scratch/f/data.txt"), "fresh\n");
    assert_eq!(server.seen_path("/f.zip").len(), 1);
});

// The default input cache when the home cannot hold one (uid 65534 with
// HOME=/nonexistent, as in CI user namespaces): a private per-user
// directory in TMPDIR, with one warning line; when that directory is not
// ours either, the download works without a cache. Never a failure.
crate::for_each_caller!(unwritable_home_falls_back_for_the_input_cache, |caller: Caller| {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    let body = archive("skill");
    let hash = sha256_hex(&body);
    server.route("/s.zip", Reply::Body(body));
    t.write(json!([item("skill-zip", &server.url("/s.zip"), Some(&hash))]));
    let tmpdir = t.f.dir.join("tmpdir");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::set_permissions(&tmpdir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    // Root could create /nonexistent; nothing can be created under /proc.
    let home = if caller == Caller::Root { "/proc/no-home" } else { "/nonexistent" };
    // The launcher's own uid: nested, it is root of its user namespace.
    let uid = if caller == Caller::Unprivileged { 65534 } else { 0 };
    let per_user = tmpdir.join(format!("tuixiu-sandbox-{uid}"));
    let run = || {
        let ws = t.f.workspace.to_str().unwrap();
        let m = t.manifest.to_str().unwrap();
        let args = ["run", "--workspace", ws, "--manifest", m, "--", "cat", "/scratch/skill-zip/data.txt"];
        t.f.command(&args).env("HOME", home).env("TMPDIR", &tmpdir).output().unwrap()
    };
    let cache_lines = |err: &str| err.lines().filter(|l| l.contains("input cache")).count();

    let out = run();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "skill\n");
    assert_eq!(cache_lines(&err), 1, "{err}");
    assert!(err.contains(&format!("input cache {home}/.cache/tuixiu-sandbox/inputs: ")), "{err}");
    assert!(err.contains(&format!("using {}/inputs instead", per_user.display())), "{err}");
    assert!(per_user.join(format!("inputs/zips/{hash}.zip")).is_file());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&per_user).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);

    // Someone else's directory in its place: not used, and no failure.
    std::fs::remove_dir_all(&per_user).unwrap();
    std::fs::create_dir(&per_user).unwrap();
    std::os::unix::fs::chown(&per_user, Some(4321), Some(4321)).unwrap();
    let out = run();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "skill\n");
    assert_eq!(cache_lines(&err), 1, "{err}");
    assert!(err.contains("downloading without a cache"), "{err}");
    assert_eq!(std::fs::read_dir(&per_user).unwrap().count(), 0);
    assert_eq!(server.seen_path("/s.zip").len(), 2);
});

// An `--inputs-cache` that cannot be used fails as the first download
// item's `AGENT_INPUTS_CACHE` error, naming the directory.
crate::for_each_caller!(unusable_inputs_cache_names_code_and_item, |caller: Caller| {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    server.route("/s.zip", Reply::Body(archive("x")));
    t.write(json!([item("the-skill", &server.url("/s.zip"), None)]));
    let cache = t.cache.display().to_string();
    // Writable by others.
    std::fs::set_permissions(&t.cache, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let err = t.refused(&[]);
    assert!(
        err.contains(&format!(
            "AGENT_INPUTS_CACHE:the-skill: input cache {cache} must be a directory owned by"
        )),
        "{err}"
    );
    // Someone else's.
    std::fs::set_permissions(&t.cache, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&t.cache, Some(4321), Some(4321)).unwrap();
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_CACHE:the-skill: input cache "), "{err}");
    // Not a directory at all.
    std::fs::remove_dir_all(&t.cache).unwrap();
    std::fs::write(&t.cache, "").unwrap();
    let err = t.refused(&[]);
    assert!(err.contains(&format!("AGENT_INPUTS_CACHE:the-skill: input cache {cache}")), "{err}");
});
