//! A network of the test's own: "hosts" that are network namespaces (a
//! holder process's, or a container's), each joined to a private backend
//! namespace by a veth pair created there (10.77.<n>.1 on the backend's
//! side, 10.77.<n>.2 on host n). Nothing touches the machine's network or
//! docker's bridge. Needs root.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process that only holds a fresh network namespace.
pub struct NetHolder(Child);

impl NetHolder {
    pub fn start() -> NetHolder {
        let child = Command::new("unshare")
            .args(["--net", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn unshare --net");
        let holder = NetHolder(child);
        // `unshare` execs `sleep` once the namespace exists.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{}/comm", holder.pid())).unwrap_or_default().trim()
            != "sleep"
        {
            assert!(Instant::now() < deadline, "unshare --net did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        holder
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for NetHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `program args`, asserting success.
pub fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The backend's address on host `n`'s link.
pub fn backend_ip(n: usize) -> String {
    format!("10.77.{n}.1")
}

/// Host `n`'s address.
pub fn host_ip(n: usize) -> String {
    format!("10.77.{n}.2")
}

/// Creates the backend's namespace (entered by a thread of its own, so the
/// test's other threads stay where they are) with one veth pair per host
/// pid (host n = `pids[n-1]`), configures both ends, and returns a listener
/// bound there on every address, on `port` (0: any; the namespace is the
/// test's own, so a fixed port cannot clash), which stays in that
/// namespace for its life.
pub fn private_network(pids: &[u32], port: u16) -> std::net::TcpListener {
    let pids = pids.to_vec();
    let listener = std::thread::spawn({
        let pids = pids.clone();
        move || {
            // SAFETY: unshare only changes this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare(CLONE_NEWNET)");
            // Children spawned from this thread start in its namespace.
            sh("ip", &["link", "set", "lo", "up"]);
            for (i, pid) in pids.iter().enumerate() {
                let n = i + 1;
                let (near, far) = (format!("vb{n}"), format!("vd{n}"));
                sh(
                    "ip",
                    &["link", "add", &near, "type", "veth", "peer", "name", &far, "netns", &pid.to_string()],
                );
                sh("ip", &["addr", "add", &format!("{}/24", backend_ip(n)), "dev", &near]);
                sh("ip", &["link", "set", &near, "up"]);
            }
            std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind the backend in its namespace")
        }
    })
    .join()
    .expect("the network thread");
    for (i, pid) in pids.iter().enumerate() {
        let n = i + 1;
        let far = format!("vd{n}");
        let pid = pid.to_string();
        let in_host = |cmd: &[&str]| {
            let mut args = vec!["--target", pid.as_str(), "--net", "--"];
            args.extend_from_slice(cmd);
            sh("nsenter", &args);
        };
        in_host(&["ip", "link", "set", "lo", "up"]);
        in_host(&["ip", "addr", "add", &format!("{}/24", host_ip(n)), "dev", &far]);
        in_host(&["ip", "link", "set", &far, "up"]);
    }
    listener
}
