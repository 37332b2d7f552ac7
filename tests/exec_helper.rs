//! `tuixiu-sandbox __exec --spec-fd N`: the single-threaded launcher that
//! threaded callers (the daemon) spawn with a serialized spec.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use common::{Caller, Fixture};
use sandbox::{ProcMode, SandboxBuilder};

/// Runs `__exec` with `spec` written to a pipe passed as fd 3.
fn exec_spec(fx: &Fixture, spec_json: &[u8]) -> std::process::Output {
    exec_spec_with(fx, spec_json, &[])
}

/// As [`exec_spec`], with more `__exec` options.
fn exec_spec_with(fx: &Fixture, spec_json: &[u8], options: &[&str]) -> std::process::Output {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let mut args = vec!["__exec", "--spec-fd", "3"];
    args.extend_from_slice(options);
    let mut cmd = fx.command(&args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let read_raw = read.as_raw_fd();
    let onto_3 = move || {
        // dup2 onto itself would keep close-on-exec; clear it instead.
        let ok = if read_raw == 3 {
            // SAFETY: fcntl on a descriptor number; no memory is touched.
            unsafe { libc::fcntl(3, libc::F_SETFD, 0) }
        } else {
            // SAFETY: dup2 on descriptor numbers; no memory is touched.
            unsafe { libc::dup2(read_raw, 3) }
        };
        if ok < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: only dup2/fcntl (async-signal-safe) run between fork and exec.
    unsafe { cmd.pre_exec(onto_3) };
    let child = cmd.spawn().unwrap();
    drop(read);
    let mut writer = std::fs::File::from(write);
    writer.write_all(spec_json).unwrap();
    drop(writer);
    child.wait_with_output().unwrap()
}

for_each_caller!(runs_a_serialized_spec, |caller: Caller| {
    let fx = Fixture::new(caller);
    let spec = SandboxBuilder::new("sh")
        .args(["-c", "id -un; pwd; echo $HOME; exit 9"])
        .workspace(&fx.workspace)
        .build()
        .unwrap();
    let out = exec_spec(&fx, &spec.to_json());
    assert_eq!(out.status.code(), Some(9), "{}", common::stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "agent\n/workspace\n/home/agent\n");
});

for_each_caller!(proc_mode_from_the_spec_or_the_flag, |caller: Caller| {
    // In a fresh /proc the shell is PID 2 of its own namespace; in the
    // bound outer /proc, /proc/self is its pid out there.
    let fx = Fixture::new(caller);
    let self_pid = |mode: ProcMode, flag: &[&str]| {
        let spec = SandboxBuilder::new("readlink").arg("/proc/self").proc(mode).build().unwrap();
        let out = exec_spec_with(&fx, &spec.to_json(), flag);
        assert!(out.status.success(), "{mode:?} {flag:?}: {}", common::stderr(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(self_pid(ProcMode::Auto, &[]), "2");
    assert_ne!(self_pid(ProcMode::Bind, &[]), "2");
    assert_ne!(self_pid(ProcMode::Auto, &["--proc", "bind"]), "2");
    assert_eq!(self_pid(ProcMode::Bind, &["--proc", "fresh"]), "2");
});

#[test]
fn invalid_spec_is_one_line_and_exit_125() {
    let fx = Fixture::new(Caller::Root);
    let out = exec_spec(&fx, b"{\"argv\": 3}");
    assert_eq!(out.status.code(), Some(125));
    let err = common::stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tuixiu-sandbox: invalid sandbox spec on fd 3:"), "{err}");
}

#[test]
fn spec_fd_must_be_open() {
    let fx = Fixture::new(Caller::Root);
    let out = fx.command(&["__exec", "--spec-fd", "7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(common::stderr(&out).contains("--spec-fd 7: EBADF"), "{}", common::stderr(&out));
}
