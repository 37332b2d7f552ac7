//! What an engine (the model's code) leaves in its run directory is
//! hostile. A FIFO, a socket, a device node or a symlink to one of them in
//! `artifacts/` must never block the server nor be opened by it: not by
//! the required-artifact check after the run, the artifact list, a
//! download, or either bundle. The server keeps answering and still stops
//! on SIGTERM. Run as root, as uid 65534 and nested in `unshare -U -r`.
//!
//! The engine cannot make a device node (mknod is EPERM in the sandbox,
//! and a hard link or a rename from another mount is EXDEV), so the test
//! puts one into the run's `artifacts/` from outside while the stub engine
//! waits for it. Whether the server opened a file is seen with inotify
//! (`IN_OPEN`), which an `O_PATH` descriptor does not trigger.

mod common;
mod inputs_support;
mod skills_support;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use common::Caller;
use serde_json::json;
use skills_support::{Env, unzip};

/// Long enough for a loaded machine, far shorter than "never".
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A skill whose three required artifacts are the special files the stub
/// engine's `special` mode leaves.
fn write_special_skill(env: &Env) {
    let artifact = |name: &str| json!({"type": "string", "x-type": "artifact", "x-filename": name});
    let output = json!({"type": "object", "properties": {
        "dev": artifact("dev"), "fifo": artifact("fifo"), "sock": artifact("sock")
    }, "required": ["dev", "fifo", "sock"]});
    let runner = json!({
        "id": "special-files", "execution_modes": ["auto"],
        "entrypoint": {"prompts": {"command": "mode=special\n"}},
        "schemas": {"input": "assets/input.schema.json", "parameter": "assets/parameter.schema.json", "output": "assets/output.schema.json"}
    });
    let empty = json!({"type": "object", "properties": {}}).to_string();
    env.write_skill(
        "special-files",
        &[
            ("SKILL.md", "---\nname: special-files\n---\n# special files\n".to_string()),
            ("assets/runner.json", runner.to_string()),
            ("assets/input.schema.json", empty.clone()),
            ("assets/parameter.schema.json", empty),
            ("assets/output.schema.json", output.to_string()),
        ],
    );
}

/// Counts `IN_OPEN` events on watched files.
struct OpenWatch {
    fd: OwnedFd,
}

impl OpenWatch {
    fn new() -> OpenWatch {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor we own.
        OpenWatch { fd: unsafe { OwnedFd::from_raw_fd(fd) } }
    }

    fn add(&self, path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid C string; the descriptor is ours.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0, "inotify_add_watch {}: {}", path.display(), std::io::Error::last_os_error());
    }

    /// How many opens were seen since the last call.
    fn opens(&self) -> usize {
        let mut count = 0;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a buffer we own, of the length given.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return count;
            }
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                if mask & libc::IN_OPEN != 0 {
                    count += 1;
                }
                at += 16 + len;
            }
        }
    }
}

/// Makes a character device (1, 3) at `path`, as root, from outside the sandbox.
fn mknod_null(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

fn special_files_never_block_the_server(caller: Caller) {
    let env = Env::new(caller);
    write_special_skill(&env);
    let mut server = env.serve(&[]);
    for debug in [false, true] {
        let r = server.post_json(
            "/v1/jobs",
            &json!({"skill_id": "special-files", "engine": "command", "runtime_options": {"debug": debug}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let rid = r.json()["request_id"].as_str().unwrap().to_string();
        server.wait_artifact(&rid, "artifacts/started");

        let artifacts = env.run_dir(&rid).join("workspace/artifacts");
        let watch = OpenWatch::new();
        watch.add(&artifacts.join("fifo"));
        // The device is watched before it takes its name, so the server
        // cannot open it unseen.
        let staging = artifacts.join(".dev-staging");
        mknod_null(&staging);
        watch.add(&staging);
        std::fs::rename(&staging, artifacts.join("dev")).unwrap();

        // The required-artifact check after the run: special files are
        // missing artifacts, and checking them does not block.
        let status = server.wait(&rid);
        assert_eq!(status["status"], "failed", "{status}\n{}", env.server_log());
        assert_eq!(status["error"]["message"], "Missing required artifacts: dev, fifo, sock");
        let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
        assert_eq!(result["result"]["artifacts"], json!(["artifacts/started"]));

        let base = format!("/v1/jobs/{rid}/artifacts");
        let list = server.get_within(&base, ANSWER_WITHIN).expect("the artifact list did not answer");
        assert_eq!(list.json()["artifacts"], json!(["artifacts/started"]));
        for (path, status, detail) in [
            ("artifacts/fifo", 404, "Artifact not found"),
            ("artifacts/sock", 404, "Artifact not found"),
            ("artifacts/dev", 404, "Artifact not found"),
            ("artifacts/fifo-link", 400, "Invalid artifact path"),
        ] {
            let r = server
                .get_within(&format!("{base}/{path}"), ANSWER_WITHIN)
                .unwrap_or_else(|| panic!("GET {path}: no answer within {ANSWER_WITHIN:?}"));
            assert_eq!((r.status, r.detail()), (status, json!(detail)), "{path}");
        }

        // Many downloads of the FIFO at once: none of them holds the server.
        let hammer: Vec<_> = (0..50)
            .map(|_| {
                let (addr, path) = (server.addr.clone(), format!("{base}/artifacts/fifo"));
                std::thread::spawn(move || skills_support::request(&addr, "GET", &path, None, &[]).status)
            })
            .collect();
        for h in hammer {
            assert_eq!(h.join().unwrap(), 404);
        }
        let skills = server.get_within("/v1/skills", ANSWER_WITHIN).expect("GET /v1/skills did not answer");
        assert_eq!(skills.status, 200);

        // The bundle (normal, or debug for the second job) has none of them.
        let r = server.get_within(&format!("/v1/jobs/{rid}/bundle"), ANSWER_WITHIN).expect("no bundle");
        assert_eq!(r.status, 200, "{}", r.text());
        let names: Vec<String> = unzip(&r.body).into_iter().map(|(n, _)| n).collect();
        if debug {
            assert!(names.iter().any(|n| n == "artifacts/started"), "{names:?}");
            assert!(names.iter().any(|n| n == "bundle/manifest_debug.json"), "{names:?}");
        } else {
            assert_eq!(names, ["result/result.json", "artifacts/started", "bundle/manifest.json"]);
        }
        for special in ["fifo", "sock", "dev", "fifo-link", ".dev-staging"] {
            assert!(!names.iter().any(|n| n.ends_with(special)), "{special} bundled: {names:?}");
        }

        assert_eq!(watch.opens(), 0, "the server opened the FIFO or the device node (debug bundle: {debug})");
    }

    let status = server.terminate_within(ANSWER_WITHIN).expect("the server did not stop on SIGTERM");
    assert!(status.success(), "{status:?}\n{}", env.server_log());
}

for_each_caller!(special_files_in_artifacts, special_files_never_block_the_server);

/// SIGTERM stops the server even while a client holds a download open
/// without reading it: open requests get a bounded time to finish.
fn sigterm_stops_the_server_despite_a_stalled_download(caller: Caller) {
    use std::io::Write;
    let env = Env::new(caller);
    let mut server = env.serve(&[]);
    let rid = server.create_demo("ok", "q");
    let input = inputs_support::zip(&[inputs_support::ZipEntry::file("input_file", b"x\n")]);
    assert_eq!(server.upload(&rid, &input).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    // Far more than the socket buffers hold.
    let big = env.run_dir(&rid).join("workspace/artifacts/big.bin");
    std::fs::write(&big, vec![0u8; 64 << 20]).unwrap();

    let mut stalled = std::net::TcpStream::connect(&server.addr).unwrap();
    let head = format!("GET /v1/jobs/{rid}/artifacts/artifacts/big.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    stalled.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let status = server
        .terminate_within(Duration::from_secs(20))
        .expect("the server did not stop on SIGTERM while a download was stalled");
    assert!(status.success(), "{status:?}\n{}", env.server_log());
    drop(stalled);
}

for_each_caller!(sigterm_with_a_stalled_download, sigterm_stops_the_server_despite_a_stalled_download);
