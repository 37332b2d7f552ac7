//! A container engine lost while `tuixiu-sandbox run --provider docker`
//! runs (docs/reliability.md, "Fault matrix"): the run must fail, saying
//! so, never pass off the status and the output it had so far as the
//! command's.
//!
//! The engine is a **private** dockerd started here, so stopping it
//! touches nothing else: the shared engine other tests and users rely on
//! is never stopped. It has its own socket, data root, exec root, managed
//! containerd, cgroup parent and an empty config file, no iptables, no IP
//! forwarding, and a bridge of its own made for it on a private subnet.
//! Never `--bridge=none`: a dockerd without a bridge deletes the host's
//! `docker0`, the shared engine's default network. Root only.

mod docker_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A dockerd of this test's own.
struct PrivateEngine {
    dir: PathBuf,
    host: String,
    /// The engine's own bridge interface.
    bridge: String,
    daemon: Option<Child>,
    /// Reach the engine through a docker CLI context rather than
    /// `DOCKER_HOST` (the check then asks the CLI, not the socket).
    via_context: bool,
}

impl PrivateEngine {
    fn start(label: &str) -> PrivateEngine {
        docker_support::require_engine();
        // Short: the socket path must fit in sun_path.
        let dir = PathBuf::from(format!("/tmp/tx-eng-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let host = format!("unix://{}/d.sock", dir.display());
        std::fs::write(dir.join("daemon.json"), "{}").unwrap();
        // The bridge first (with the engine's subnet), so the engine never
        // picks one of the host's.
        let pid = std::process::id();
        let bridge = format!("txe{pid}");
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        let subnet = format!("10.213.{}.1/24", pid % 250);
        for args in [
            vec!["link", "add", "name", &bridge, "type", "bridge"],
            vec!["addr", "add", &subnet, "dev", &bridge],
            vec!["link", "set", &bridge, "up"],
        ] {
            let out = Command::new("ip").args(&args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut engine = PrivateEngine { dir, host, bridge, daemon: None, via_context: false };
        engine.spawn();
        let image = docker_support::image();
        let mut save = Command::new("docker").args(["save", &image]).stdout(Stdio::piped()).spawn().unwrap();
        let load = Command::new("docker")
            .args(["-H", &engine.host, "load", "-q"])
            .stdin(save.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(save.wait().unwrap().success(), "docker save {image}");
        assert!(load.status.success(), "loading {image}: {}", String::from_utf8_lossy(&load.stderr));
        let context = Command::new("docker")
            .arg("--config")
            .arg(engine.dir.join("cli"))
            .args(["context", "create", "private", "--docker", &format!("host={}", engine.host)])
            .output()
            .unwrap();
        assert!(
            context.status.success(),
            "docker context create: {}",
            String::from_utf8_lossy(&context.stderr)
        );
        engine
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let d = &self.dir;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(d.join("dockerd.log")).unwrap();
        let mut cmd = Command::new("dockerd");
        cmd.arg(format!("--host={}", self.host))
            .arg(format!("--data-root={}", d.join("data").display()))
            .arg(format!("--exec-root={}", d.join("exec").display()))
            .arg(format!("--pidfile={}", d.join("dockerd.pid").display()))
            .arg(format!("--config-file={}", d.join("daemon.json").display()))
            .arg(format!("--bridge={}", self.bridge))
            .arg(format!("--cgroup-parent={}", self.cgroup_parent()))
            .args(["--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"])
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        self.daemon = Some(cmd.spawn().map_err(|e| format!("start a private dockerd: {e}"))?);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.answers() {
            if Instant::now() > deadline {
                return Err(format!("the private dockerd did not come up:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn answers(&self) -> bool {
        Command::new("docker")
            .args(["-H", &self.host, "version", "--format", "{{.Server.Version}}"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// Stops the engine and waits until it has exited: SIGTERM to dockerd
    /// (it stops its containers and its containerd), or SIGKILL to dockerd
    /// and its containerd at once (its own process group; the containers'
    /// shims run on in their sessions, as after a crash).
    fn stop_with(&mut self, signal: i32) {
        let Some(mut daemon) = self.daemon.take() else { return };
        let pid = daemon.id() as i32;
        let target = if signal == libc::SIGKILL { -pid } else { pid };
        // SAFETY: signalling our own child (and its process group).
        unsafe { libc::kill(target, signal) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while daemon.try_wait().unwrap().is_none() || in_group(pid) {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The killed containerd's pid file stays; dockerd would take a pid
        // that is not yet reaped (or reused) for a running containerd and
        // wait for it in vain.
        let _ = std::fs::remove_file(self.dir.join("exec/containerd/containerd.pid"));
    }

    /// `tuixiu-sandbox run --provider docker ARGS -- CMD…` against this
    /// engine, started now.
    fn run(&self, args: &[&str], state: &Path) -> Child {
        let bin = env!("CARGO_BIN_EXE_tuixiu-sandbox");
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--provider", "docker", "--state-dir"]).arg(state).args(args);
        if self.via_context {
            cmd.env("DOCKER_CONFIG", self.dir.join("cli")).env("DOCKER_CONTEXT", "private");
        } else {
            cmd.env("DOCKER_HOST", &self.host);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }
}

/// Whether a process of process group `pgid` is still running.
fn in_group(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
            st.rsplit_once(')').is_some_and(|(_, rest)| {
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
            })
        })
    })
}

impl PrivateEngine {
    /// After a killed engine: the containers it left running (their shims
    /// live on, orphaned) are ended, so that a restart, which adopts and
    /// cleans up their shims, does not hang on them. Only processes below
    /// this engine's own shims are touched.
    fn end_orphans(&self) {
        let address = format!("{}/exec/containerd/containerd.sock", self.dir.display());
        let children = |pid: u32| -> Vec<u32> {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
                .collect()
        };
        let shims: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&address))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut below: Vec<u32> = shims.iter().flat_map(|s| children(*s)).collect();
            let mut i = 0;
            while i < below.len() {
                let more = children(below[i]);
                below.extend(more);
                i += 1;
            }
            if below.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in below {
                // SAFETY: plain kill(2) on a process below this test's shims.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the engine again after a loss.
    fn restart(&mut self) {
        self.end_orphans();
        self.spawn();
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        // A killed engine leaves its containers' shims behind: a restart
        // adopts and cleans them, a graceful stop then ends everything.
        if self.daemon.is_none() {
            self.end_orphans();
            if self.try_spawn().is_err() {
                self.stop_with(libc::SIGKILL);
            }
        }
        if self.daemon.is_some() {
            let _ = Command::new("docker")
                .args(["-H", &self.host, "rm", "-f", "--"])
                .args(self.containers())
                .output();
            self.stop_with(libc::SIGTERM);
        }
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| Path::new(m).starts_with(&self.dir))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        // The (empty) cgroup parent in every hierarchy.
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let parent = hierarchy.path().join(self.cgroup_parent());
            if let Ok(children) = std::fs::read_dir(&parent) {
                for child in children.flatten().filter(|c| c.path().is_dir()) {
                    let _ = std::fs::remove_dir(child.path());
                }
                let _ = std::fs::remove_dir(&parent);
            }
        }
    }
}

impl PrivateEngine {
    /// The engine's containers' cgroups go below this one.
    fn cgroup_parent(&self) -> String {
        format!("tuixiu-engine-loss-{}", std::process::id())
    }

    fn containers(&self) -> Vec<String> {
        let out = Command::new("docker").args(["-H", &self.host, "ps", "-aq"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
    }
}

/// Prints a line every 100 ms for 6 s.
const COUNTING: &str = "i=0; while [ $i -lt 60 ]; do echo line$i; i=$((i+1)); sleep 0.1; done";

/// Starts a run, stops the engine with `signal` once output flows, and
/// checks that the run fails naming the lost engine.
fn lose_engine_during(engine: &mut PrivateEngine, args: &[&str], state: &Path, signal: i32) {
    let mut run = engine.run(args, state);
    let mut stdout = run.stdout.take().unwrap();
    // Wait for the first line: the command runs.
    let mut first = [0u8; 5];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"line0");
    engine.stop_with(signal);
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut rest);
        rest
    });
    let out = run.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!printed.contains("line59"), "the command finished: the engine was not lost in time");
    assert_ne!(out.status.code(), Some(0), "a lost engine passed for success:\n{stderr}");
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("the container engine was lost while the command ran")
            && stderr.contains("is not the command's"),
        "signal {signal}: no clear error:\n{stderr}"
    );
    engine.restart();
}

#[test]
fn a_lost_engine_fails_the_run_clearly() {
    let mut engine = PrivateEngine::start("loss");
    let state = engine.dir.join("state");
    let workspace = engine.dir.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let image = docker_support::image();
    let one_off = ["--image", &image, "--", "sh", "-c", COUNTING];
    let ws = workspace.display().to_string();
    // The engine's socket checked directly (DOCKER_HOST), or through the
    // CLI (a context).
    for via_context in [false, true] {
        engine.via_context = via_context;
        for signal in [libc::SIGKILL, libc::SIGTERM] {
            lose_engine_during(&mut engine, &one_off, &state, signal);
            let name = format!("tuixiu-run-loss{signal}-{via_context}");
            let instance =
                ["--image", &image, "--workspace", &ws, "--instance-name", &name, "--", "sh", "-c", COUNTING];
            lose_engine_during(&mut engine, &instance, &state, signal);
        }
    }
    // With the engine up, a run is what it was.
    let out = engine
        .run(&["--image", &image, "--", "sh", "-c", "echo fine; exit 3"], &state)
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
}
