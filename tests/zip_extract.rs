//! The zip extractor as a library call (`inputs::zip`): several workers
//! give the same tree and the same error as one; the earliest failing
//! entry's error wins whatever the timing; entries larger than the
//! extractor's buffers, stored and deflated, come out whole; lying CRCs
//! and truncated data are refused; a failure under `fsx::replace_tree`
//! (what downloadExtract does) leaves neither the target changed nor a
//! staging directory behind.

#[allow(unused)]
mod common;
mod inputs_support;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use inputs_support::{ZipEntry, zip};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tuixiu_sandbox::inputs::fsx;
use tuixiu_sandbox::inputs::zip::{Extracted, ZipError, ZipLimits, extract, extract_with};

const LIMITS: ZipLimits =
    ZipLimits { max_entries: 5_000, max_file_bytes: 20 << 20, max_total_bytes: 100 << 20 };

fn archive_file(dir: &Path, bytes: &[u8]) -> File {
    let path = dir.join("archive.zip");
    File::create(&path).unwrap().write_all(bytes).unwrap();
    File::open(path).unwrap()
}

fn open_dir(path: &Path) -> OwnedFd {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).unwrap()
}

/// Every file under `dir` with its content, every directory as `None`.
fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if p.is_dir() {
                stack.push(p);
                out.insert(rel, None);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Bytes that deflate poorly (so the compressed entry outgrows the
/// extractor's input buffer too).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn extract_into(tmp: &Path, name: &str, bytes: &[u8], workers: usize) -> Result<Extracted, ZipError> {
    let into = tmp.join(name);
    std::fs::create_dir(&into).unwrap();
    let archive = archive_file(tmp, bytes);
    extract_with(&archive, open_dir(&into).as_fd(), &LIMITS, Some(workers))
}

#[test]
fn several_workers_extract_what_one_does() {
    let mut entries = vec![ZipEntry::dir("empty/"), ZipEntry::file("top.txt", b"top\n")];
    for i in 0..120 {
        let text = format!("line {i} of a text file\n").repeat(i * 37 + 1);
        entries.push(ZipEntry::file(&format!("d{}/t{i}.txt", i % 7), text.as_bytes()));
    }
    // Larger than the output buffer (256 KiB), deflated and stored, and
    // compressed past the input buffer (128 KiB).
    entries.push(ZipEntry::file("big/text.txt", "all work and no play\n".repeat(40_000).as_bytes()));
    entries.push(ZipEntry::file("big/noise.bin", &noise(700 << 10, 1)));
    entries.push(ZipEntry { deflate: false, ..ZipEntry::file("big/stored.bin", &noise(600 << 10, 2)) });
    entries.push(ZipEntry { deflate: false, ..ZipEntry::file("big/empty-stored", b"") });
    entries.push(ZipEntry::file("big/empty-deflated", b""));
    entries.push(ZipEntry { unix_mode: Some(0o100755), ..ZipEntry::file("bin/run.sh", b"#!/bin/sh\n") });
    let bytes = zip(&entries);

    let tmp = tempfile::tempdir().unwrap();
    let one = extract_into(tmp.path(), "one", &bytes, 1).unwrap();
    let want = tree(&tmp.path().join("one"));
    for (e, data) in entries.iter().filter(|e| !e.name.ends_with('/')).map(|e| (e, &e.data)) {
        assert_eq!(want.get(&e.name), Some(&Some(data.clone())), "{}", e.name);
    }
    assert_eq!(one.files, entries.len() as u64 - 1);
    assert_eq!(one.dirs, 1);
    for workers in [2, 3, 4, 8] {
        let name = format!("w{workers}");
        let got = extract_into(tmp.path(), &name, &bytes, workers).unwrap();
        assert_eq!(got, one, "{workers} workers");
        assert_eq!(tree(&tmp.path().join(&name)), want, "{workers} workers");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(tmp.path().join("w4/bin/run.sh")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    // The default (`extract`) goes parallel above 1 MiB: same tree.
    std::fs::create_dir(tmp.path().join("default")).unwrap();
    let archive = archive_file(tmp.path(), &bytes);
    assert_eq!(extract(&archive, open_dir(&tmp.path().join("default")).as_fd(), &LIMITS).unwrap(), one);
    assert_eq!(tree(&tmp.path().join("default")), want);
}

#[test]
fn the_earliest_failing_entry_wins_whatever_the_workers() {
    // 400 good files; entry 150 lies about its size and entry 260 about its
    // CRC. Both are caught only while extracting; one worker meets 150
    // first and stops, and so must any number of workers.
    let mut entries: Vec<ZipEntry> =
        (0..400).map(|i| ZipEntry::file(&format!("f{i:03}"), &noise(8 << 10, i))).collect();
    entries[150].declared_size = Some(100);
    entries[260].declared_crc = Some(7);
    let bytes = zip(&entries);
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..12 {
        for workers in [1, 2, 4] {
            let err = extract_into(tmp.path(), &format!("r{round}w{workers}"), &bytes, workers).unwrap_err();
            assert_eq!(
                err.to_string(),
                "zip entry size mismatch: f150 declared=100 actual>100",
                "{workers} workers"
            );
            assert!(matches!(err, ZipError::Unsafe(_)));
        }
    }
    // Without the size lie the CRC is the first failure.
    entries[150].declared_size = None;
    let err = extract_into(tmp.path(), "crc", &zip(&entries), 4).unwrap_err();
    assert_eq!(err.to_string(), "zip entry corrupt: f260: Invalid checksum");
}

#[test]
fn truncated_and_short_data_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "some text that deflates\n".repeat(5000);
    let cut = ZipEntry { truncate: 40, ..ZipEntry::file("cut.txt", text.as_bytes()) };
    let err = extract_into(tmp.path(), "cut", &zip(&[ZipEntry::file("a", b"a"), cut]), 2).unwrap_err();
    assert!(
        err.to_string().starts_with("zip entry size mismatch: cut.txt declared=120000 actual=")
            || err.to_string().starts_with("zip entry corrupt: cut.txt: "),
        "{err}"
    );
    let stored = ZipEntry { deflate: false, truncate: 1, ..ZipEntry::file("s.bin", b"0123456789") };
    let err = extract_into(tmp.path(), "stored", &zip(&[stored]), 1).unwrap_err();
    assert_eq!(err.to_string(), "zip entry size mismatch: s.bin declared=10 actual=9");
    let long = ZipEntry { deflate: false, declared_size: Some(4), ..ZipEntry::file("l.bin", b"0123456789") };
    let err = extract_into(tmp.path(), "long", &zip(&[long]), 1).unwrap_err();
    assert_eq!(err.to_string(), "zip entry size mismatch: l.bin declared=4 actual>4");
}

#[test]
fn collisions_are_found_from_the_names_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&[ZipEntry], &str); 4] = [
        (&[ZipEntry::file("a", b"1"), ZipEntry::file("a/b", b"2")], "a"),
        (&[ZipEntry::dir("a/"), ZipEntry::file("a", b"2")], "a"),
        (&[ZipEntry::file("x/a", b"1"), ZipEntry::file("x//a", b"2")], "x//a"),
        (&[ZipEntry::file("d/f", b"1"), ZipEntry::dir("d/f/")], "d/f"),
    ];
    for (i, (entries, name)) in cases.iter().enumerate() {
        let mut all = vec![ZipEntry::file("first.txt", &noise(2 << 20, 9))];
        all.extend(entries.iter().cloned());
        let err = extract_into(tmp.path(), &format!("c{i}"), &zip(&all), 2).unwrap_err();
        assert_eq!(err.to_string(), format!("zip entry conflicts with another entry: {name}"));
        assert_eq!(tree(&tmp.path().join(format!("c{i}"))), BTreeMap::new(), "case {i} wrote something");
    }
}

#[test]
fn a_failure_under_replace_tree_leaves_the_target_and_no_staging() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("skills/demo");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("SKILL.md"), "old\n").unwrap();
    let mut entries: Vec<ZipEntry> =
        (0..200).map(|i| ZipEntry::file(&format!("d{}/f{i}", i % 5), &noise(32 << 10, i))).collect();
    entries[180].declared_size = Some(1);
    let archive = archive_file(tmp.path(), &zip(&entries));
    let root = open_dir(tmp.path());
    let before = tree(&tmp.path().join("skills"));
    let result: Result<Extracted, ZipError> = fsx::replace_tree(
        root.as_fd(),
        "skills/demo",
        |stage| extract_with(&archive, stage, &LIMITS, Some(4)),
        |_| Ok(()),
    );
    assert_eq!(result.unwrap_err().to_string(), "zip entry size mismatch: d0/f180 declared=1 actual>1");
    assert_eq!(tree(&tmp.path().join("skills")), before, "the target or its parent changed");

    // The same archive without the lie replaces the target whole.
    entries[180].declared_size = None;
    let archive = archive_file(tmp.path(), &zip(&entries));
    let done = fsx::replace_tree(
        root.as_fd(),
        "skills/demo",
        |stage| extract_with(&archive, stage, &LIMITS, Some(4)),
        |_| Ok::<(), ZipError>(()),
    )
    .unwrap();
    assert_eq!(done.files, 200);
    let after = tree(&tmp.path().join("skills"));
    assert_eq!(after.keys().filter(|k| k.starts_with("demo/")).count(), 205);
    assert!(after.keys().all(|k| k == "demo" || k.starts_with("demo/")), "{:?}", after.keys());
}
