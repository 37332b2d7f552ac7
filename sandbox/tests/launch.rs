//! Library-level checks of `launch` and `launch_with`, run from a plain
//! single-threaded `main` (libtest would run them on worker threads, and
//! the launcher refuses to clone from a threaded process). The CLI's
//! integration tests in `tests/` cover the user-facing behaviour for every
//! caller (root, unprivileged, nested).

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};
use std::path::{Path, PathBuf};

use sandbox::{Access, DeferredBind, LaunchError, LaunchOptions, SandboxBuilder};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandbox-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Creates `rel` under `root` (an O_PATH directory) with `RESOLVE_IN_ROOT`.
fn write_in_root(root: BorrowedFd<'_>, rel: &str, contents: &str) {
    let path = CString::new(rel).unwrap();
    // SAFETY: open_how is plain data; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC) as u64;
    how.mode = 0o644;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: valid descriptor, C string and open_how with its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    assert!(fd >= 0, "openat2({rel}): {}", std::io::Error::last_os_error());
    // SAFETY: openat2 returned a new descriptor that we now own.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd as i32) };
    std::io::Write::write_all(&mut file, contents.as_bytes()).unwrap();
}

fn apply_phase_writes_into_tmpfs_home_and_attaches_in_order() {
    let dir = scratch("apply");
    let ws = dir.join("ws");
    let dep = dir.join("dep");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&dep).unwrap();
    std::fs::write(dep.join("lib.txt"), "from-dep").unwrap();

    let mut builder = SandboxBuilder::new("sh")
        .args([
            "-c",
            "cat /home/agent/note.txt > /workspace/seen-note; \
             cat /workspace/dep/lib.txt > /workspace/seen-dep; \
             touch /workspace/dep/x 2> /workspace/ro-error; echo $? > /workspace/ro-status",
        ])
        .workspace(&ws);
    let index = builder.deferred_bind(DeferredBind {
        src: dep.clone(),
        dst: "/workspace/dep".into(),
        access: Access::Ro,
    });
    let spec = builder.build().unwrap();

    let status = sandbox::launch_with(&spec, &LaunchOptions::default(), |ctx| {
        // Into the private tmpfs home, which exists only inside the sandbox.
        write_in_root(ctx.root(), "home/agent/note.txt", "hello-home");
        ctx.attach(index)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(status.code(), 0);
    let read = |name: &str| std::fs::read_to_string(ws.join(name)).unwrap();
    assert_eq!(read("seen-note"), "hello-home");
    assert_eq!(read("seen-dep"), "from-dep");
    assert_ne!(read("ro-status").trim(), "0", "a write into a read-only deferred bind succeeded");
    assert!(read("ro-error").contains("Read-only"), "{}", read("ro-error"));
    // The tmpfs home never touched the host.
    assert!(!Path::new("/home/agent/note.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn failing_apply_starts_nothing() {
    let dir = scratch("apply-fail");
    let spec = SandboxBuilder::new("touch").arg("/workspace/started").workspace(&dir).build().unwrap();
    let err = sandbox::launch_with(&spec, &LaunchOptions::default(), |_ctx| Err("item x failed".into()))
        .unwrap_err();
    assert!(matches!(err, LaunchError::Apply(_)), "{err:?}");
    assert_eq!(err.to_string(), "item x failed");
    assert_eq!(err.exit_code(), 125);
    assert!(!dir.join("started").exists(), "the command ran although the apply phase failed");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn attach_twice_is_refused() {
    let dir = scratch("attach-twice");
    let mut builder = SandboxBuilder::new("true").workspace(&dir);
    let i = builder.deferred_bind(DeferredBind {
        src: "/etc".into(),
        dst: "/workspace/etc".into(),
        access: Access::Ro,
    });
    let spec = builder.build().unwrap();
    let err = sandbox::launch_with(&spec, &LaunchOptions::default(), |ctx| {
        ctx.attach(i)?;
        ctx.attach(i)?;
        Ok(())
    })
    .unwrap_err();
    assert!(err.to_string().contains("already attached"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn launch_attaches_deferred_binds_in_order() {
    let dir = scratch("deferred-order");
    let (a, b, ws) = (dir.join("a"), dir.join("b"), dir.join("ws"));
    for d in [&a, &b, &ws] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(a.join("who"), "a").unwrap();
    std::fs::write(b.join("who"), "b").unwrap();
    let mut builder =
        SandboxBuilder::new("sh").args(["-c", "cat /workspace/in/who > /workspace/result"]).workspace(&ws);
    builder.deferred_bind(DeferredBind { src: a, dst: "/workspace/in".into(), access: Access::Ro });
    builder.deferred_bind(DeferredBind { src: b, dst: "/workspace/in".into(), access: Access::Ro });
    let status = sandbox::launch(&builder.build().unwrap(), &LaunchOptions::default()).unwrap();
    assert!(status.success());
    // The later bind covers the earlier one.
    assert_eq!(std::fs::read_to_string(ws.join("result")).unwrap(), "b");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn threaded_callers_are_refused() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || rx.recv().ok());
    let spec = SandboxBuilder::new("true").build().unwrap();
    let err = sandbox::launch(&spec, &LaunchOptions::default()).unwrap_err();
    assert!(err.to_string().contains("must run in a single-threaded process"), "{err}");
    assert_eq!(err.exit_code(), 125);
    tx.send(()).unwrap();
    worker.join().unwrap();
}

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "apply_phase_writes_into_tmpfs_home_and_attaches_in_order",
            apply_phase_writes_into_tmpfs_home_and_attaches_in_order,
        ),
        ("failing_apply_starts_nothing", failing_apply_starts_nothing),
        ("attach_twice_is_refused", attach_twice_is_refused),
        ("launch_attaches_deferred_binds_in_order", launch_attaches_deferred_binds_in_order),
        // Last: it starts (and joins) a thread.
        ("threaded_callers_are_refused", threaded_callers_are_refused),
    ];
    for (name, test) in tests {
        test();
        println!("test {name} ... ok");
    }
    println!("\ntest result: ok. {} passed", tests.len());
}
