//! Zip safety, end to end: hostile archives crafted byte by byte, served
//! by a real HTTP server, each refused before the command starts with the
//! item's id, and the previous target left exactly as it was.

mod common;
mod inputs_support;

use std::path::Path;

use common::Caller;
use inputs_support::{HttpServer, Inputs, Reply, ZipEntry, overlap_bomb, zip};
use serde_json::json;

const OLD: &str = "# old skill\n";

/// A fixture whose host home already holds the skill `demo`, and a manifest
/// that replaces it with whatever the server returns at /skill.zip.
fn setup(caller: Caller, archive: Vec<u8>) -> (Inputs, HttpServer) {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    server.route("/skill.zip", Reply::Body(archive));
    let skill = t.f.home.join(".codex/skills/demo");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(skill.join("SKILL.md"), OLD).unwrap();
    let owner = format!("{0}:{0}", caller.host_uid());
    assert!(
        std::process::Command::new("chown")
            .args(["-R", &owner])
            .arg(t.f.home.join(".codex"))
            .status()
            .unwrap()
            .success()
    );
    t.write(json!([{"id": "skill:demo", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": "/skill.zip"},
                    "target": {"root": "USER_HOME", "path": ".codex/skills/demo"}}]));
    (t, server)
}

fn home_args(t: &Inputs, server: &HttpServer, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--home".to_string(),
        t.f.home.to_str().unwrap().to_string(),
        "--inputs-base-url".into(),
        server.origin(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Every entry under `dir`, relative, sorted (to spot leftovers).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Runs with a hostile archive; asserts the refusal and an untouched target.
fn assert_refused(archive: Vec<u8>, extra: &[&str], want: &str) {
    let (t, server) = setup(Caller::Root, archive);
    let before = tree(&t.f.home);
    let args = home_args(&t, &server, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = t.refused(&args);
    assert!(err.contains(want), "expected {want:?} in: {err}");
    assert!(err.contains(":skill:demo: downloadExtract: "), "{err}");
    assert_eq!(std::fs::read_to_string(t.f.home.join(".codex/skills/demo/SKILL.md")).unwrap(), OLD);
    assert_eq!(tree(&t.f.home), before, "the home changed");
    assert_eq!(tree(&t.f.workspace), vec![] as Vec<String>, "something landed in the workspace");
}

fn skill_md() -> ZipEntry {
    ZipEntry::file("SKILL.md", b"# new\n")
}

#[test]
fn a_good_archive_replaces_the_skill_without_leftovers() {
    let archive = zip(&[
        skill_md(),
        ZipEntry::dir("lib/"),
        ZipEntry::file("lib/a.txt", b"a\n"),
        ZipEntry::file("b\\c.txt", b"c\n"),
    ]);
    let (t, server) = setup(Caller::Root, archive);
    let args = home_args(&t, &server, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    t.ok(&args, "true");
    let skill = t.f.home.join(".codex/skills/demo");
    assert_eq!(std::fs::read_to_string(skill.join("SKILL.md")).unwrap(), "# new\n");
    assert_eq!(tree(&skill), vec!["SKILL.md", "b", "b/c.txt", "lib", "lib/a.txt"]);
    assert_eq!(
        tree(&t.f.home.join(".codex/skills")),
        vec!["demo", "demo/SKILL.md", "demo/b", "demo/b/c.txt", "demo/lib", "demo/lib/a.txt"]
    );
}

#[test]
fn zip_slip_parent_directory() {
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("../x", b"escaped")]),
        &[],
        "AGENT_INPUTS_ZIP_UNSAFE:skill:demo: downloadExtract: zip entry path is not allowed: ../x",
    );
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("a/../../x", b"escaped")]),
        &[],
        "zip entry path is not allowed: a/../../x",
    );
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("..\\x", b"escaped")]),
        &[],
        "zip entry path is not allowed: ..\\x",
    );
}

#[test]
fn absolute_and_drive_letter_paths() {
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("/etc/x", b"escaped")]),
        &[],
        "AGENT_INPUTS_ZIP_UNSAFE:skill:demo: downloadExtract: zip entry path is not allowed: /etc/x",
    );
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("C:/x", b"escaped")]),
        &[],
        "zip entry path is not allowed: C:/x",
    );
    assert!(!Path::new("/etc/x").exists());
}

#[test]
fn symlink_entry() {
    assert_refused(
        zip(&[skill_md(), ZipEntry::symlink("passwd", "/etc/passwd")]),
        &[],
        "AGENT_INPUTS_ZIP_UNSAFE:skill:demo: downloadExtract: zip entry symlink is not allowed: passwd",
    );
}

#[test]
fn special_files_and_duplicates_and_conflicts() {
    let fifo = ZipEntry { unix_mode: Some(0o010644), ..ZipEntry::file("fifo", b"") };
    assert_refused(zip(&[skill_md(), fifo]), &[], "zip entry special file is not allowed: fifo");
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("a", b"1"), ZipEntry::file("a", b"2")]),
        &[],
        "zip has duplicate entry names",
    );
    assert_refused(
        zip(&[skill_md(), ZipEntry::file("a", b"1"), ZipEntry::file("a/b", b"2")]),
        &[],
        "zip entry conflicts with another entry: a",
    );
}

#[test]
fn declared_size_lie() {
    // The headers claim 10 bytes; the data inflates to 8 MiB. Extraction
    // stops past byte 10, whatever the caps.
    let big = ZipEntry { declared_size: Some(10), ..ZipEntry::file("big", &vec![0u8; 8 << 20]) };
    assert_refused(
        zip(&[skill_md(), big]),
        &[],
        "AGENT_INPUTS_ZIP_UNSAFE:skill:demo: downloadExtract: zip entry size mismatch: big declared=10 actual>10",
    );
    // And fewer bytes than declared.
    let short = ZipEntry { declared_size: Some(1000), ..ZipEntry::file("short", b"tiny") };
    assert_refused(zip(&[skill_md(), short]), &[], "zip entry size mismatch: short declared=1000 actual=4");
}

#[test]
fn too_many_entries() {
    let mut entries = vec![skill_md()];
    entries.extend((0..5000).map(|i| ZipEntry::file(&format!("f{i}"), b"")));
    assert_refused(
        zip(&entries),
        &[],
        "AGENT_INPUTS_ZIP_LIMIT:skill:demo: downloadExtract: zip too many entries: maxEntries=5000",
    );
    assert_refused(zip(&entries[..11]), &["--zip-max-entries", "10"], "zip too many entries: maxEntries=10");
}

#[test]
fn oversize_file_and_total() {
    let file = ZipEntry::file("big.bin", &vec![7u8; (20 << 20) + 1]);
    assert_refused(
        zip(&[skill_md(), file]),
        &[],
        "AGENT_INPUTS_ZIP_LIMIT:skill:demo: downloadExtract: zip entry too large: big.bin size=20971521 maxFileBytes=20971520",
    );
    let part = |n: usize| ZipEntry::file(&format!("part{n}"), &vec![1u8; 600 << 10]);
    assert_refused(
        zip(&[skill_md(), part(1), part(2)]),
        &["--zip-max-total-bytes", "1M"],
        "zip too large: total=1228806 maxTotalBytes=1048576",
    );
}

#[test]
fn one_kilobyte_to_one_gigabyte_bomb() {
    // 1 MiB of zeros deflates to about a kilobyte; 1024 central-directory
    // entries all point at it: 1 GiB if extracted.
    let bomb = overlap_bomb(1 << 20, 1024);
    assert!(bomb.len() < 100 << 10, "bomb is {} bytes", bomb.len());
    assert_refused(
        bomb,
        &[],
        "AGENT_INPUTS_ZIP_LIMIT:skill:demo: downloadExtract: zip too large: total=105906176 maxTotalBytes=104857600",
    );
}

#[test]
fn not_a_zip_and_missing_skill_md() {
    assert_refused(
        b"this is not a zip archive at all".to_vec(),
        &[],
        "AGENT_INPUTS_ZIP_INVALID:skill:demo: downloadExtract: not a valid zip archive",
    );
    assert_refused(
        zip(&[ZipEntry::file("README.md", b"no skill")]),
        &[],
        "AGENT_INPUTS_SKILL_MD_MISSING:skill:demo: downloadExtract: SKILL_MD_MISSING",
    );
}

// Acceptance scenario "a malicious zip cannot escape the target directory"
// (docs/manifest.md, "Acceptance scenarios"), for every caller.
crate::for_each_caller!(seed000_malicious_zip_cannot_escape_target_directory, |caller: Caller| {
    let (t, server) =
        setup(caller, zip(&[skill_md(), ZipEntry::file("ok", b"1"), ZipEntry::file("../../../evil", b"x")]));
    let before = tree(&t.f.home);
    let args = home_args(&t, &server, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = t.refused(&args);
    assert!(err.contains("zip entry path is not allowed: ../../../evil"), "{err}");
    assert_eq!(tree(&t.f.home), before);
    assert!(!t.f.dir.join("evil").exists());
});

#[test]
fn a_large_archive_lands_whole_and_owned_by_the_mapped_user() {
    // Above 1 MiB the extractor's workers write the files: on other threads
    // than the one the apply phase switched to the mapped ids (setfsuid).
    // Every file must still belong to the sandbox user and be complete.
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    let mut entries = vec![skill_md()];
    let mut expected = String::new();
    for i in 0..48 {
        let text = format!("file {i}: {}\n", "words of a skill ".repeat(4000));
        expected.push_str(&text);
        entries.push(ZipEntry::file(&format!("d{}/f{i:02}.txt", i % 4), text.as_bytes()));
    }
    let archive = zip(&entries);
    server.route("/big.zip", Reply::Body(archive));
    t.write(json!([{"id": "skill:big", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": "/big.zip"},
                    "target": {"root": "USER_HOME", "path": ".codex/skills/big"}}]));
    let base = server.origin();
    let out = t.ok(
        &["--inputs-base-url", &base, "--map-uid", "4321", "--map-gid", "4321"],
        "cd ~/.codex/skills/big && find . -type f -exec stat -c '%U:%G' {} + | sort | uniq -c; \
         for i in $(seq -w 0 47); do cat d*/f$i.txt; done | sha256sum",
    );
    let sha = inputs_support::sha256_hex(expected.as_bytes());
    assert_eq!(out, format!("     49 agent:agent\n{sha}  -\n"));
}
