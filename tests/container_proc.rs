//! Sandboxes inside containers (CI jobs, pods): `tuixiu-sandbox run` in a
//! docker container the way CI systems start them.
//!
//! The image is made here: `docker import` of a busybox-static root file
//! system with nothing but busybox and the static launcher (no /etc/passwd,
//! so the generated one has no target to bind over). In it, as root and as
//! a non-root container user:
//! * with seccomp and AppArmor unconfined: the sandbox works, with the one
//!   stderr line saying /proc is the container's (docker masks parts of
//!   /proc, so the kernel refuses a fresh one); the pid namespace stays
//!   private; /etc has the container's entries plus passwd and group;
//! * with an unmasked /proc as well: a fresh /proc, no fallback line;
//! * `--proc fresh` where the fallback would be needed: exit 125 and why;
//! * docker's default seccomp profile: exit 125 and the hint;
//! * what the fallback shows of the container's other processes: their
//!   command lines, not their environment, memory map or root.
//! * an agent's own `bwrap` (a nested sandbox) there: its `--proc` follows
//!   the outer sandbox's fallback, its user namespace still gets its maps.

mod docker_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use docker_support::{docker, require_engine};

const UNCONFINED: &[&str] =
    &["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"];
const FALLBACK_LINE: &str = "/proc: a fresh procfs was refused";

/// The busybox + launcher image; removed when dropped.
struct Image(String);

impl Image {
    fn build() -> Image {
        require_engine();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let tag = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let name = format!("tuixiu-test/launcher-busybox:{tag}");
        let root = std::env::temp_dir().join(format!("tuixiu-launcher-rootfs-{tag}"));
        let _ = std::fs::remove_dir_all(&root);
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::copy("/bin/busybox", bin.join("busybox"))
            .expect("busybox-static (scripts/ci-setup.d/20-docker.sh)");
        // The list from the original: a copy just written may be held open
        // by a child another test thread forked meanwhile (ETXTBSY).
        let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
        for applet in String::from_utf8(list.stdout).unwrap().lines().filter(|a| *a != "busybox") {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
        // The launcher is a static PIE: it needs nothing else in the image.
        let launcher = Path::new(env!("CARGO_BIN_EXE_tuixiu-sandbox"));
        let strip =
            Command::new("strip").arg("-o").arg(bin.join("tuixiu-sandbox")).arg(launcher).status().unwrap();
        assert!(strip.success(), "strip the launcher");
        assert!(!root.join("etc/passwd").exists());
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let import = Command::new("docker")
            .args(["import", "--change", "ENV PATH=/bin", "-", &name])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(tar.wait().unwrap().success(), "tar of the root file system");
        assert!(import.status.success(), "docker import: {}", String::from_utf8_lossy(&import.stderr));
        std::fs::remove_dir_all(&root).unwrap();
        Image(name)
    }

    /// `docker run --rm OPTIONS IMAGE ARGS...`.
    fn run(&self, options: &[&str], args: &[&str]) -> Output {
        let mut all = vec!["run", "--rm"];
        // No network: nothing here needs one (and no dependence on a bridge).
        all.push("--network=none");
        all.extend_from_slice(options);
        all.push(&self.0);
        all.extend_from_slice(args);
        docker(&all)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = docker(&["rmi", "-f", &self.0]);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{:?}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    (stdout, stderr)
}

/// `--user` options for root and for a non-root container user.
const USERS: &[&[&str]] = &[&[], &["--user", "1000:1000"]];

#[test]
fn sandboxes_inside_containers() {
    let image = Image::build();

    for user in USERS {
        let with = |more: &[&'static str]| -> Vec<&'static str> { [UNCONFINED, user, more].concat() };

        // The plain command: works, with the fallback line, once.
        let (stdout, stderr) = ok(&image.run(&with(&[]), &["tuixiu-sandbox", "run", "--", "id"]));
        assert!(stdout.starts_with("uid=1000(agent) gid=1000(agent)"), "{user:?}: {stdout}");
        assert_eq!(stderr.matches(FALLBACK_LINE).count(), 1, "{user:?}: {stderr}");
        assert!(stderr.contains("shows the container's processes"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");

        // Inside: the sandbox's own pid namespace (the shell is its PID 2),
        // the container's /proc (its PID 1 is the launcher), read-only; /etc
        // has the container's entries and the generated passwd and group.
        let script = "echo pid=$$; readlink /proc/self; cat /proc/1/comm; \
                      (echo 0 > /proc/self/oom_score_adj) 2>/dev/null && echo proc-writable || echo proc-ro; \
                      ls /etc | tr '\\n' ' '; echo; (touch /etc/x) 2>/dev/null && echo etc-writable || echo etc-ro";
        let (stdout, _) = ok(&image.run(&with(&[]), &["tuixiu-sandbox", "run", "--", "sh", "-c", script]));
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], "pid=2", "{stdout}");
        assert_ne!(lines[1], "2", "/proc/self is the container's view: {stdout}");
        assert_eq!(lines[2], "tuixiu-sandbox", "the container's PID 1: {stdout}");
        assert_eq!(lines[3], "proc-ro", "{stdout}");
        let etc: Vec<&str> = lines[4].split_whitespace().collect();
        for entry in ["group", "hostname", "hosts", "passwd", "resolv.conf"] {
            assert!(etc.contains(&entry), "{entry} in /etc: {stdout}");
        }
        assert_eq!(lines[5], "etc-ro", "{stdout}");

        // An unmasked /proc: a fresh one, no fallback.
        let unmasked = with(&["--security-opt", "systempaths=unconfined"]);
        let script = "cat /proc/1/comm; echo $$";
        let (stdout, stderr) =
            ok(&image.run(&unmasked, &["tuixiu-sandbox", "run", "--", "sh", "-c", script]));
        assert_eq!(stdout, "tuixiu-sandbox\n2\n", "the sandbox's own PID 1 in a fresh /proc");
        assert!(!stderr.contains(FALLBACK_LINE), "{stderr}");
        let (stdout, _) = ok(&image
            .run(&unmasked, &["tuixiu-sandbox", "run", "--proc", "fresh", "--", "readlink", "/proc/self"]));
        assert_eq!(stdout.trim(), "2");

        // --proc fresh where the kernel refuses it: 125 and why.
        let out = image.run(&with(&[]), &["tuixiu-sandbox", "run", "--proc", "fresh", "--", "id"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(stderr.contains("mount proc on /proc: fsmount(\"proc\") => EPERM"), "{stderr}");
        assert!(stderr.contains("--proc auto") && stderr.contains("procMount: Unmasked"), "{stderr}");

        // Docker's default seccomp profile: 125 and the hint.
        let out = image.run(user, &["tuixiu-sandbox", "run", "--", "id"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(stderr.contains("clone(CLONE_NEWUSER"), "{stderr}");
        assert!(stderr.contains("--security-opt seccomp=unconfined"), "{stderr}");
        assert!(text(&out.stdout).is_empty());
    }
}

/// What the /proc fallback shows of the container's other processes, with
/// Landlock and without: their command lines and status, never their
/// environment, memory map or root (the kernel refuses ptrace-style access
/// across user namespaces).
#[test]
fn proc_fallback_exposure_is_what_the_docs_say() {
    let image = Image::build();
    let opts = [UNCONFINED, &["--user", "1000:1000", "-e", "CONTAINER_SECRET=s3cret"]].concat();
    // A neighbour of the same user, with a marker on its command line.
    // (The pattern is written so that it does not match this script's own
    // command line; /proc/1 is the container's shell, whose does.)
    let probe = "for p in /proc/[0-9]*; do [ $p != /proc/1 ] && grep -q marker-on-arg[v] $p/cmdline 2>/dev/null && n=$p; done; \
                 echo cmdline=$(grep -c marker-on-arg[v] $n/cmdline); \
                 for f in environ maps; do cat $n/$f >/dev/null 2>&1 && echo $f=readable || echo $f=denied; done; \
                 ls $n/root/ >/dev/null 2>&1 && echo root=readable || echo root=denied; \
                 cat /proc/self/environ >/dev/null 2>&1 && echo own=readable || echo own=denied";
    for landlock in ["off", "best-effort"] {
        let inner = format!(
            "sh -c 'sleep 30; : marker-on-argv' & sleep 0.2; tuixiu-sandbox run --landlock {landlock} -- sh -c '{probe}'"
        );
        let (stdout, stderr) = ok(&image.run(&opts, &["sh", "-c", &inner]));
        assert_eq!(
            stdout, "cmdline=1\nenviron=denied\nmaps=denied\nroot=denied\nown=readable\n",
            "--landlock {landlock}: {stderr}"
        );
        assert!(stderr.contains(FALLBACK_LINE), "{stderr}");
    }
}

/// An agent's own `bwrap` (codex's probe call) inside a sandbox inside a
/// container: the kernel refuses the nested sandbox a fresh procfs just as
/// it refused the outer one, so the nested `--proc` follows the outer
/// sandbox's mode (`auto`: the outer /proc bound read-only) and its id maps
/// are written through a private writable copy of that /proc; with an
/// unmasked container /proc, both are fresh.
#[test]
fn nested_bwrap_inside_containers() {
    let image = Image::build();
    let probe = "bwrap --ro-bind / / --dev /dev --unshare-user --unshare-pid --unshare-net --proc /proc \
                 -- sh -c 'echo nested $$; (echo 0 > /proc/self/oom_score_adj) 2>/dev/null \
                 && echo proc-writable || echo proc-ro; exec readlink /proc/self'";
    for user in USERS {
        let with = |more: &[&'static str]| -> Vec<&'static str> { [UNCONFINED, user, more].concat() };
        let (stdout, stderr) =
            ok(&image.run(&with(&[]), &["tuixiu-sandbox", "run", "--", "sh", "-c", probe]));
        let lines: Vec<&str> = stdout.lines().collect();
        // COMMAND is pid 3 of the nested pid namespace: pid 2 was the
        // short-lived helper that made its user namespace under a filter
        // (docs/bwrap.md, "Differences from bubblewrap (nested)").
        assert_eq!(lines[..2], ["nested 3", "proc-ro"], "{user:?}: {stdout}\n{stderr}");
        assert_ne!(lines[2], "3", "/proc is the container's, bound: {stdout}");
        assert_eq!(stderr.matches(FALLBACK_LINE).count(), 1, "the outer sandbox says it once: {stderr}");

        let unmasked = with(&["--security-opt", "systempaths=unconfined"]);
        let (stdout, stderr) = ok(&image.run(&unmasked, &["tuixiu-sandbox", "run", "--", "sh", "-c", probe]));
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!((lines[0], lines[2]), ("nested 3", "3"), "a fresh nested /proc: {stdout}\n{stderr}");
        assert!(!stderr.contains(FALLBACK_LINE), "{stderr}");
    }
}
