//! What a killed run leaves in a target root, and who removes it.
//!
//! Trees are built in a staging directory next to their target
//! (`.tuixiu-stage-*`) and renamed into place. A SIGKILL mid-extraction
//! leaves that directory behind; the next run that lands an item in the
//! same directory removes it, but only when no live process holds it (its
//! writer keeps it locked), and never a file: files are written as
//! anonymous files (`O_TMPFILE`, hostfs/atomic.rs) that a kill leaves
//! nothing of, so no file is ever removed by its name.

mod common;
mod inputs_support;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::{Caller, stderr};
use inputs_support::{HttpServer, Inputs, Reply, ZipEntry, zip};
use serde_json::json;

/// Staging entries in `dir`.
fn litter(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".tuixiu-stage-") || n.starts_with(".tuixiu-write-"))
        .collect();
    names.sort();
    names
}

/// An archive whose extraction takes a while: many files, near the
/// default limits (5000 entries, 100 MB).
fn slow_archive() -> Vec<u8> {
    let data = vec![7u8; 16 << 10];
    let entries: Vec<ZipEntry> =
        (0..4900).map(|i| ZipEntry::file(&format!("d{}/f{i}", i % 50), &data)).collect();
    zip(&entries)
}

fn write_note(t: &Inputs, text: &str) {
    t.write(json!([t.workspace_item(), {"id": "note", "apply": "writeFile",
        "source": {"type": "inlineText", "text": text}, "target": {"root": "WORKSPACE", "path": "note.txt"}}]));
}

crate::for_each_caller!(a_run_killed_mid_extraction_leaves_litter_the_next_run_removes, |caller: Caller| {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    server.route("/big.zip", Reply::Body(slow_archive()));
    t.write(json!([t.workspace_item(), {"id": "big", "apply": "downloadExtract",
        "source": {"type": "httpZip", "uri": server.url("/big.zip")},
        "target": {"root": "WORKSPACE", "path": "big"}}]));
    let mut run = t.command(&[], &["true"]).spawn().unwrap();

    // Kill the launcher once the staging directory is filling up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let staging = loop {
        let found = litter(&t.f.workspace);
        if let Some(name) = found.first()
            && std::fs::read_dir(t.f.workspace.join(name)).is_ok_and(|d| d.count() > 0)
        {
            break name.clone();
        }
        assert!(run.try_wait().unwrap().is_none(), "the run ended before it was killed");
        assert!(Instant::now() < deadline, "no staging directory appeared");
        std::thread::sleep(Duration::from_millis(2));
    };
    // SAFETY: signalling the child we spawned.
    unsafe { libc::kill(run.id() as i32, libc::SIGKILL) };
    run.wait().unwrap();
    assert!(!t.f.workspace.join("big").exists(), "the half-extracted tree was renamed into place");
    assert_eq!(litter(&t.f.workspace), [staging], "what the killed run left");

    // A user's files with similar names, or a staging name's exact form,
    // are not ours to remove.
    let theirs = [".tuixiu-stage-notes", ".tuixiu-stage-1-a-2", ".tuixiu-write-1-a-2"];
    for name in theirs {
        std::fs::write(t.f.workspace.join(name), "mine").unwrap();
    }
    write_note(&t, "after the crash");
    let out = t.run(&[], "cat /workspace/note.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "after the crash");
    let mut want = theirs.to_vec();
    want.sort();
    assert_eq!(litter(&t.f.workspace), want, "stale staging directories are removed, files are not");
    for name in theirs {
        assert_eq!(std::fs::read_to_string(t.f.workspace.join(name)).unwrap(), "mine");
    }
});

crate::for_each_caller!(a_live_writers_staging_entry_is_left_alone, |caller: Caller| {
    let t = Inputs::new(caller);
    // A staging directory of another, live run (it holds it locked), and a
    // locked file in the old staging file's name form.
    let dir = t.f.workspace.join(".tuixiu-stage-4242-1a2b3c-0");
    let file = t.f.workspace.join(".tuixiu-write-4242-1a2b3c-1");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("partial"), "half").unwrap();
    std::fs::write(&file, "half").unwrap();
    for p in [&dir, &dir.join("partial"), &file] {
        std::os::unix::fs::chown(p, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
    }
    let locks: Vec<std::fs::File> = [&dir, &file]
        .iter()
        .map(|p| {
            let f = std::fs::File::open(p).unwrap();
            // SAFETY: flock on a descriptor we own.
            assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
            f
        })
        .collect();
    write_note(&t, "one");
    assert!(t.run(&[], "true").status.success());
    assert_eq!(litter(&t.f.workspace).len(), 2, "a locked staging entry was removed");
    assert!(dir.join("partial").exists());

    // Its writer is gone (the locks with it): the next run removes the
    // directory. The file is left: nothing proves a file is ours, and our
    // own writes leave none.
    drop(locks);
    write_note(&t, "two");
    assert!(t.run(&[], "true").status.success());
    assert_eq!(litter(&t.f.workspace), [".tuixiu-write-4242-1a2b3c-1"]);
});
