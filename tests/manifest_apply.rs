//! `run --manifest`: each apply kind and root, binds, ordering, the first
//! failing item, envPatch, the env allowlist, checkouts, `manifest check`,
//! and every acceptance scenario (docs/manifest.md, "Acceptance
//! scenarios"; tests named `seed000_*`).

mod common;
mod inputs_support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{Caller, stderr};
use inputs_support::{HttpServer, Inputs, Reply, ZipEntry, git, sha256_hex, zip};
use serde_json::json;

fn skill_zip(text: &str) -> Vec<u8> {
    zip(&[
        ZipEntry::file("SKILL.md", format!("# demo skill\n{text}\n").as_bytes()),
        ZipEntry::dir("scripts/"),
        ZipEntry {
            unix_mode: Some(0o100755),
            ..ZipEntry::file("scripts/run.sh", b"#!/bin/sh\necho skill-ran\n")
        },
    ])
}

// The headline: a workspace bind, a writeFile, a downloadExtract and a
// read-only bind, for every kind of caller; the command must start.
for_each_caller!(bind_write_download_for_every_caller, |caller: Caller| {
    let t = Inputs::new(caller);
    let server = HttpServer::start();
    let archive = skill_zip("v1");
    server.route("/api/acp-proxy/skills/packages/demo.zip", Reply::Body(archive.clone()));
    std::fs::write(t.host.join("tool.txt"), "tool\n").unwrap();
    t.write(json!([
        t.workspace_item(),
        {"id": "agents-md", "apply": "writeFile", "source": {"type": "inlineText", "text": "be careful\n"},
         "target": {"root": "USER_HOME", "path": ".codex/AGENTS.md"}},
        {"id": "skill:demo", "apply": "downloadExtract",
         "source": {"type": "httpZip", "uri": "/api/acp-proxy/skills/packages/demo.zip", "contentHash": sha256_hex(&archive)},
         "target": {"root": "USER_HOME", "path": ".codex/skills/demo"}},
        {"id": "tools", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": t.host},
         "target": {"root": "WORKSPACE", "path": "vendor/tools"}}
    ]));
    let base = server.origin();
    let out = t.ok(
        &["--inputs-base-url", &base],
        "cat ~/.codex/AGENTS.md; head -1 ~/.codex/skills/demo/SKILL.md; ~/.codex/skills/demo/scripts/run.sh; \
         cat /workspace/vendor/tools/tool.txt; \
         if echo x > /workspace/vendor/tools/new 2>/dev/null; then echo ro-write-succeeded; fi; \
         echo ws-write > /workspace/written; pwd",
    );
    assert_eq!(out, "be careful\n# demo skill\nskill-ran\ntool\n/workspace\n");
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("written")).unwrap(), "ws-write\n");
    assert!(!t.host.join("new").exists());
    assert_eq!(server.seen_path("/api/acp-proxy/skills/packages/demo.zip").len(), 1);
});

// ------------------------------------------------------------ apply kinds

#[test]
fn write_file_into_every_root() {
    let t = Inputs::new(Caller::Root);
    let item = |id: &str, root: &str, path: &str| {
        json!({"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": format!("{id}\n")},
               "target": {"root": root, "path": path}})
    };
    t.write(json!([
        item("ws", "WORKSPACE", "a/b/ws.txt"),
        item("home", "USER_HOME", "deep/er/home.txt"),
        item("scratch", "SCRATCH", "s.txt"),
        item("backslash", "WORKSPACE", "win\\style.txt"),
    ]));
    let out = t.ok(&[], "cat /workspace/a/b/ws.txt ~/deep/er/home.txt /scratch/s.txt /workspace/win/style.txt; stat -c '%U %a' /scratch/s.txt ~/deep");
    assert_eq!(out, "ws\nhome\nscratch\nbackslash\nagent 644\nagent 755\n");
    // Only the workspace is on the host; the tmpfs home and /scratch are gone.
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("a/b/ws.txt")).unwrap(), "ws\n");
    assert!(!t.f.home.join("deep").exists());

    // With --home, USER_HOME is the host directory.
    let home = t.f.home.to_str().unwrap();
    t.ok(&["--home", home], "true");
    assert_eq!(std::fs::read_to_string(t.f.home.join("deep/er/home.txt")).unwrap(), "home\n");
}

#[test]
fn write_file_stays_inside_its_root_through_symlinks() {
    let t = Inputs::new(Caller::Root);
    // Agent-made symlinks in the workspace pointing at host paths: writes
    // through them land inside the workspace, never on the host.
    std::os::unix::fs::symlink("/etc", t.f.workspace.join("etc-link")).unwrap();
    std::os::unix::fs::symlink("../../../../../tmp", t.f.workspace.join("up-link")).unwrap();
    std::fs::create_dir(t.f.workspace.join("etc")).unwrap();
    std::fs::create_dir(t.f.workspace.join("tmp")).unwrap();
    let marker = format!("tuixiu-escape-{}", std::process::id());
    let write = |id: &str, path: String| {
        json!({"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": id},
        "target": {"root": "WORKSPACE", "path": path}})
    };
    t.write(json!([
        t.workspace_item(),
        write("abs", format!("etc-link/{marker}")),
        write("rel", format!("up-link/{marker}"))
    ]));
    t.ok(&[], "true");
    assert!(!std::path::Path::new("/etc").join(&marker).exists());
    assert!(!std::path::Path::new("/tmp").join(&marker).exists());
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("etc").join(&marker)).unwrap(), "abs");
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("tmp").join(&marker)).unwrap(), "rel");

    // A link whose in-root target does not exist is an error, not an escape.
    std::fs::remove_dir_all(t.f.workspace.join("tmp")).unwrap();
    t.write(json!([t.workspace_item(), write("dangling", format!("up-link/{marker}"))]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_TARGET_FAILED:dangling: writeFile: "), "{err}");
    assert!(!std::path::Path::new("/tmp").join(&marker).exists());
}

#[test]
fn copy_keeps_symlinks_as_symlinks() {
    let t = Inputs::new(Caller::Root);
    let src = t.host.join("pkg");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/file.txt"), "content\n").unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("sub/file.txt", src.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("abs-link")).unwrap();
    std::fs::write(t.host.join("single.txt"), "single\n").unwrap();
    t.write(json!([
        {"id": "pkg", "apply": "copy", "source": {"type": "hostPath", "path": src}, "target": {"root": "USER_HOME", "path": "pkg"}},
        {"id": "one", "apply": "copy", "source": {"type": "hostPath", "path": t.host.join("single.txt")},
         "target": {"root": "SCRATCH", "path": "copied.txt"}}
    ]));
    let out = t.ok(
        &[],
        "cd ~/pkg && cat sub/file.txt rel-link && readlink rel-link abs-link && ./run.sh && cat /scratch/copied.txt",
    );
    assert_eq!(out, "content\ncontent\nsub/file.txt\n/etc/hostname\nran\nsingle\n");
}

#[test]
fn copy_refuses_special_files_and_paths_outside_the_allowlist() {
    let t = Inputs::new(Caller::Root);
    let src = t.host.join("with-fifo");
    std::fs::create_dir(&src).unwrap();
    assert!(Command::new("mkfifo").arg(src.join("pipe")).status().unwrap().success());
    t.write(json!([{"id": "fifo", "apply": "copy", "source": {"type": "hostPath", "path": src},
                    "target": {"root": "WORKSPACE", "path": "x"}}]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_COPY_FAILED:fifo: copy: copy from "), "{err}");
    assert!(err.contains("pipe is a fifo"), "{err}");
    assert!(!t.f.workspace.join("x").exists());

    t.write(json!([{"id": "secrets", "apply": "copy", "source": {"type": "hostPath", "path": "/etc"},
                    "target": {"root": "WORKSPACE", "path": "etc"}}]));
    let err = t.refused(&[]);
    assert!(
        err.contains(
            "AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:secrets: host path /etc is not under an allowed root"
        ),
        "{err}"
    );

    // The workspace itself is not a way out either: --workspace is allowed,
    // but a symlink inside it pointing elsewhere resolves outside.
    std::os::unix::fs::symlink("/etc", t.f.workspace.join("out")).unwrap();
    t.write(json!([{"id": "via-link", "apply": "copy", "source": {"type": "hostPath", "path": t.f.workspace.join("out")},
                    "target": {"root": "SCRATCH", "path": "x"}}]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:via-link:"), "{err}");
}

#[test]
fn bind_rw_and_ro() {
    let t = Inputs::new(Caller::Root);
    let (rw, ro) = (t.host.join("rw"), t.host.join("ro"));
    for d in [&rw, &ro] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("f"), "orig\n").unwrap();
    }
    std::fs::set_permissions(&rw, std::fs::Permissions::from_mode(0o777)).unwrap();
    t.write(json!([
        {"id": "rw", "apply": "bindMount", "source": {"type": "hostPath", "path": rw}, "target": {"root": "USER_HOME", "path": "rw"}},
        {"id": "ro", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": ro},
         "target": {"root": "SCRATCH", "path": "ro"}},
        {"id": "ro-file", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": ro.join("f")},
         "target": {"root": "WORKSPACE", "path": "ro-file"}}
    ]));
    let out = t.ok(
        &[],
        "echo new > ~/rw/g && cat ~/rw/f /scratch/ro/f /workspace/ro-file; \
         echo x > /scratch/ro/f 2>/dev/null || echo ro-dir-refused; \
         echo x > /workspace/ro-file 2>/dev/null || echo ro-file-refused; \
         grep -c ' /scratch/ro .*\\bro\\b' /proc/self/mountinfo",
    );
    assert_eq!(out, "orig\norig\norig\nro-dir-refused\nro-file-refused\n1\n");
    assert_eq!(std::fs::read_to_string(rw.join("g")).unwrap(), "new\n");
    assert_eq!(std::fs::read_to_string(ro.join("f")).unwrap(), "orig\n");
}

#[test]
fn bind_target_cannot_leave_its_root_through_a_symlink() {
    let t = Inputs::new(Caller::Root);
    std::fs::create_dir(t.host.join("d")).unwrap();
    // Inside the sandbox /workspace/tmp-link -> /tmp (outside WORKSPACE).
    std::os::unix::fs::symlink("/tmp", t.f.workspace.join("tmp-link")).unwrap();
    // In the workspace, the link leads to /workspace/tmp; from the sandbox's
    // `/` it leads to /tmp: the bind must not go there.
    std::fs::create_dir(t.f.workspace.join("tmp")).unwrap();
    t.write(json!([{"id": "escape", "apply": "bindMount", "source": {"type": "hostPath", "path": t.host.join("d")},
                    "target": {"root": "WORKSPACE", "path": "tmp-link/x"}}]));
    let err = t.refused(&[]);
    assert!(
        err.contains(
            "AGENT_INPUTS_BIND_FAILED:escape: bindMount: /workspace/tmp-link/x leads out of /workspace"
        ),
        "{err}"
    );
}

#[test]
fn a_later_item_overwrites_an_earlier_one() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route(
        "/a.zip",
        Reply::Body(zip(&[ZipEntry::file("cfg.txt", b"from-zip\n"), ZipEntry::file("keep.txt", b"keep\n")])),
    );
    std::fs::create_dir(t.host.join("tree")).unwrap();
    std::fs::write(t.host.join("tree/cfg.txt"), "from-copy\n").unwrap();
    let text = |id: &str, body: &str, path: &str| {
        json!({"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": body},
               "target": {"root": "WORKSPACE", "path": path}})
    };
    t.write(json!([
        text("first", "first\n", "same.txt"),
        text("second", "second\n", "same.txt"),
        {"id": "copy", "apply": "copy", "source": {"type": "hostPath", "path": t.host.join("tree")},
         "target": {"root": "WORKSPACE", "path": "dir"}},
        {"id": "zip", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": server.url("/a.zip")},
         "target": {"root": "WORKSPACE", "path": "dir"}},
        text("patch", "patched\n", "dir/cfg.txt"),
    ]));
    let out = t.ok(&[], "cat /workspace/same.txt /workspace/dir/cfg.txt /workspace/dir/keep.txt; ls -A /workspace | tr '\\n' ' '");
    assert_eq!(out, "second\npatched\nkeep\ndir same.txt ");
}

#[test]
fn the_first_failing_item_stops_the_run() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    std::fs::write(t.f.workspace.join("existing"), "old\n").unwrap();
    t.write(json!([
        {"id": "ok", "apply": "writeFile", "source": {"type": "inlineText", "text": "1"}, "target": {"root": "WORKSPACE", "path": "one"}},
        {"id": "broken-download", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": server.url("/missing.zip")},
         "target": {"root": "WORKSPACE", "path": "existing"}},
        {"id": "never", "apply": "writeFile", "source": {"type": "inlineText", "text": "3"}, "target": {"root": "WORKSPACE", "path": "three"}}
    ]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_DOWNLOAD_FAILED:broken-download: download failed: 404"), "{err}");
    // Downloads happen before the sandbox exists: nothing was written at all.
    assert!(!t.f.workspace.join("one").exists());
    assert!(!t.f.workspace.join("three").exists());
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("existing")).unwrap(), "old\n");

    // A failure at apply time: items before it landed, none after it did.
    t.write(json!([
        {"id": "ok", "apply": "writeFile", "source": {"type": "inlineText", "text": "1"}, "target": {"root": "WORKSPACE", "path": "one"}},
        {"id": "not-a-dir", "apply": "writeFile", "source": {"type": "inlineText", "text": "2"}, "target": {"root": "WORKSPACE", "path": "one/two"}},
        {"id": "never", "apply": "writeFile", "source": {"type": "inlineText", "text": "3"}, "target": {"root": "WORKSPACE", "path": "three"}}
    ]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_TARGET_FAILED:not-a-dir: writeFile: "), "{err}");
    assert!(err.contains("ENOTDIR"), "{err}");
    assert_eq!(std::fs::read_to_string(t.f.workspace.join("one")).unwrap(), "1");
    assert!(!t.f.workspace.join("three").exists());
}

#[test]
fn manifest_workspace_replaces_the_workspace_flag() {
    let t = Inputs::new(Caller::Root);
    let other = t.host.join("run-42");
    std::fs::create_dir(&other).unwrap();
    t.write(json!([
        {"id": "workspace", "apply": "bindMount", "source": {"type": "hostPath", "path": other}, "target": {"root": "WORKSPACE", "path": "."}}
    ]));
    t.ok(&[], "pwd > /workspace/where");
    assert_eq!(std::fs::read_to_string(other.join("where")).unwrap(), "/workspace\n");
    assert!(!t.f.workspace.join("where").exists());

    // A read-only workspace.
    t.write(json!([
        {"id": "workspace", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": other},
         "target": {"root": "WORKSPACE", "path": "."}}
    ]));
    let out = t.ok(&[], "pwd; cat /workspace/where; touch /workspace/x 2>/dev/null || echo refused");
    assert_eq!(out, "/workspace\n/workspace\nrefused\n");
}

// ------------------------------------------------------------ checkout

/// A bare repository with two commits on `main` and a branch `feature`;
/// returns (bare path, first commit id).
fn bare_repo(t: &Inputs) -> (std::path::PathBuf, String) {
    let work = t.f.dir.join("repo-work");
    let bare = t.host.join("repo.git");
    std::fs::create_dir(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README.md"), "v1\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-qm", "one"]);
    let first = git(&work, &["rev-parse", "HEAD"]);
    std::fs::write(work.join("README.md"), "v2\n").unwrap();
    git(&work, &["commit", "-qam", "two"]);
    git(&work, &["checkout", "-qb", "feature"]);
    std::fs::write(work.join("FEATURE"), "f\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-qm", "feature"]);
    git(&t.f.dir, &["clone", "-q", "--bare", work.to_str().unwrap(), bare.to_str().unwrap()]);
    assert!(Command::new("chmod").args(["-R", "a+rX"]).arg(&bare).status().unwrap().success());
    (bare, first)
}

for_each_caller!(checkout_from_a_local_bare_repository, |caller: Caller| {
    let t = Inputs::new(caller);
    let (bare, first) = bare_repo(&t);
    let repo = bare.to_str().unwrap();
    t.write(json!([
        t.workspace_item(),
        {"id": "repo", "apply": "checkout", "source": {"type": "git", "repo": repo, "ref": "main"}, "target": {"root": "WORKSPACE", "path": "."}},
        {"id": "feature", "apply": "checkout", "source": {"type": "git", "repo": repo, "ref": "feature"}, "target": {"root": "SCRATCH", "path": "feature"}},
        {"id": "pinned", "apply": "checkout", "source": {"type": "git", "repo": format!("file://{repo}"), "ref": first},
         "target": {"root": "USER_HOME", "path": "src/pinned"}}
    ]));
    let out = t.ok(
        &[],
        "cat README.md; git -c safe.directory='*' rev-parse --abbrev-ref HEAD; cat /scratch/feature/FEATURE; \
         cat ~/src/pinned/README.md; git -c safe.directory='*' -C ~/src/pinned rev-parse HEAD",
    );
    assert_eq!(out, format!("v2\nmain\nf\nv1\n{first}\n"));
    assert!(t.f.workspace.join(".git").is_dir());
});

#[test]
fn checkout_refusals() {
    let t = Inputs::new(Caller::Root);
    let (bare, _) = bare_repo(&t);
    std::fs::write(t.f.workspace.join("dirty"), "x").unwrap();
    t.write(json!([{"id": "repo", "apply": "checkout", "source": {"type": "git", "repo": bare}, "target": {"root": "WORKSPACE", "path": "."}}]));
    let err = t.refused(&[]);
    assert!(
        err.contains("AGENT_INPUTS_TARGET_FAILED:repo: checkout: the checkout target is not empty"),
        "{err}"
    );

    t.write(json!([{"id": "no-branch", "apply": "checkout", "source": {"type": "git", "repo": bare, "ref": "nope"},
                    "target": {"root": "SCRATCH", "path": "r"}}]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_GIT_FAILED:no-branch: checkout: git clone failed"), "{err}");

    // A repository outside the allowlist.
    t.write(json!([{"id": "outside", "apply": "checkout", "source": {"type": "git", "repo": t.f.dir.join("repo-work")},
                    "target": {"root": "SCRATCH", "path": "r"}}]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:outside:"), "{err}");
}

#[test]
fn checkout_credentials_go_through_askpass_and_stay_out_of_messages() {
    // A remote that always fails: git must ask the askpass helper, and the
    // password must not appear in the error line.
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route("/r.git/info/refs?service=git-upload-pack", Reply::Unauthorized);
    let env_file = t.f.dir.join("init.env");
    std::fs::write(&env_file, "TUIXIU_GIT_HTTP_USERNAME=bot\nTUIXIU_GIT_HTTP_PASSWORD=s3cret-git-pass\n")
        .unwrap();
    t.write(
        json!([{"id": "remote", "apply": "checkout", "source": {"type": "git", "repo": server.url("/r.git")},
                    "target": {"root": "SCRATCH", "path": "r"}}]),
    );
    let err = t.refused(&["--env-file", env_file.to_str().unwrap()]);
    assert!(err.contains("AGENT_INPUTS_GIT_FAILED:remote:"), "{err}");
    assert!(!err.contains("s3cret-git-pass"), "{err}");
    // git asked twice: once without credentials, once with them (basic auth).
    let auth: Vec<String> =
        server.seen().iter().filter_map(|s| s.headers.get("authorization").cloned()).collect();
    assert!(
        auth.iter().any(|a| a.starts_with("Basic ")),
        "git never sent the askpass credentials: {:?}",
        server.seen()
    );
}

// ------------------------------------------------------------ environment

#[test]
fn env_patch_merges_and_moves_the_user_view() {
    let t = Inputs::new(Caller::Root);
    t.write_full(json!({"version": 1, "envPatch": {"HOME": "/home/bob", "USER": "bob", "LOGNAME": "bob"},
        "items": [{"id": "note", "apply": "writeFile", "source": {"type": "inlineText", "text": "mine\n"},
                   "target": {"root": "USER_HOME", "path": "note"}}]}));
    let out = t.ok(&["--env", "HOME=/from/init"], "echo $HOME $USER $LOGNAME; id -un; cat ~/note; python3 -c 'import pwd,os; print(pwd.getpwuid(os.getuid()).pw_dir)'");
    assert_eq!(out, "/home/bob bob bob\nbob\nmine\n/home/bob\n");

    // A conflict with an explicit flag is an error, not a silent choice.
    let err = t.refused(&["--home-path", "/home/other"]);
    assert!(err.contains("envPatch.HOME \"/home/bob\" conflicts with --home-path"), "{err}");
}

// `manifest check` refuses what `run` refuses: a home over a system
// directory or in the workspace, and envPatch conflicts with the flags.
for_each_caller!(manifest_check_refuses_what_run_refuses, |caller: Caller| {
    let t = Inputs::new(caller);
    let m = t.manifest.to_str().unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(common::binary()).args(["manifest", "check", m]).args(extra).output().unwrap();
        (out.status.code(), stderr(&out))
    };
    for (patch, flags, why) in [
        (json!({"HOME": "/etc"}), &[][..], "envPatch: home path \"/etc\" must not be /etc or inside it"),
        (
            json!({"HOME": "/usr/bin"}),
            &[][..],
            "envPatch: home path \"/usr/bin\" must not be /usr or inside it",
        ),
        (json!({"HOME": "/proc/self"}), &[][..], "must not be /proc or inside it"),
        (json!({"HOME": "/workspace/h"}), &[][..], "must not be /workspace or inside it"),
        (
            json!({"USER": "alice"}),
            &["--user", "bob"][..],
            "envPatch.USER \"alice\" conflicts with --user \"bob\"",
        ),
        (
            json!({"HOME": "/home/x"}),
            &["--home-path", "/home/y"][..],
            "envPatch.HOME \"/home/x\" conflicts with --home-path",
        ),
    ] {
        t.write_full(json!({"version": 1, "envPatch": patch, "items": []}));
        let (code, err) = check(flags);
        assert_eq!(code, Some(1), "manifest check accepted {patch} {flags:?}: {err}");
        assert!(err.contains(why), "{patch}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        let err = t.refused(flags);
        assert!(err.contains(why), "run with {patch}: {err}");
    }
    // And both accept an ordinary home.
    t.write_full(json!({"version": 1, "envPatch": {"HOME": "/srv/agent"}, "items": []}));
    assert_eq!(check(&[]).0, Some(0));
    assert_eq!(t.ok(&[], "echo $HOME"), "/srv/agent\n");
});

#[test]
fn env_allowlist_names_dropped_keys_never_values() {
    let t = Inputs::new(Caller::Root);
    t.write(json!([]));
    let env_file = t.f.dir.join("init.env");
    std::fs::write(
        &env_file,
        "# init.env\nTUIXIU_RUN_ID=run-7\nOPENAI_API_KEY=sk-very-secret-value\nexport EXTRA='quoted value'\n",
    )
    .unwrap();
    let ef = env_file.to_str().unwrap();
    let out = t.run(
        &["--env-file", ef, "--env", "FROM_FLAG=flag-secret-123"],
        "env | sort | grep -E '^(TUIXIU_RUN_ID|OPENAI_API_KEY|EXTRA|FROM_FLAG)=' || true",
    );
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{err}");
    // A variable typed with --env is the caller's own choice: it passes.
    assert_eq!(stdout, "FROM_FLAG=flag-secret-123\nTUIXIU_RUN_ID=run-7\n");
    assert!(err.contains("env: not in the allowlist, dropped: EXTRA, OPENAI_API_KEY"), "{err}");
    assert!(!err.contains("sk-very-secret-value") && !err.contains("flag-secret-123"), "{err}");

    let out = t.ok(
        &["--env-file", ef, "--env-allow", "OPENAI_API_KEY", "--env-allow", "EXTRA"],
        "env | sort | grep -E '^(TUIXIU_RUN_ID|OPENAI_API_KEY|EXTRA)='",
    );
    assert_eq!(out, "EXTRA=quoted value\nOPENAI_API_KEY=sk-very-secret-value\nTUIXIU_RUN_ID=run-7\n");

    let out = t.ok(
        &["--env-file", ef, "--no-default-env-allow", "--env-allow", "EXTRA"],
        "env | sort | grep -E '^(TUIXIU_RUN_ID|EXTRA)='",
    );
    assert_eq!(out, "EXTRA=quoted value\n");

    // The caller's own environment never leaks in.
    let out = t.ok(&[], "env");
    assert!(!out.contains(common::LEAK_MARKER.1), "{out}");

    std::fs::write(&env_file, "GOOD=1\nthis line is wrong sk-hidden\n").unwrap();
    let out = t.run(&["--env-file", ef], "true");
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(err.contains("--env-file") && err.contains("line 2: expected KEY=VALUE"), "{err}");
    assert!(!err.contains("sk-hidden"), "{err}");
}

// ------------------------------------------------------------ manifest check

#[test]
fn manifest_check_prints_the_plan_or_the_first_error() {
    let t = Inputs::new(Caller::Root);
    t.write(json!([
        t.workspace_item(),
        {"id": "skill:x", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": "/p/x.zip"},
         "target": {"root": "USER_HOME", "path": ".codex/skills/x"}}
    ]));
    let m = t.manifest.to_str().unwrap();
    let ws = t.f.workspace.to_str().unwrap();
    let out = Command::new(common::binary())
        .args([
            "manifest",
            "check",
            m,
            "--workspace",
            ws,
            "--inputs-base-url",
            "https://backend.example",
            "--user",
            "dev",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout.contains("valid agentInputs v1 manifest, 2 item(s)"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "1. workspace: bindMount rw (the workspace) {ws} -> /workspace (WORKSPACE/.)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "2. skill:x: downloadExtract https://backend.example/p/x.zip -> /home/dev/.codex/skills/x"
        ),
        "{stdout}"
    );

    // Without --workspace the host path is not allowed: the first error, one line.
    let out = Command::new(common::binary()).args(["manifest", "check", m]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("tuixiu-sandbox: AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:workspace: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());

    std::fs::write(&t.manifest, r#"{"version": 1, "items": [{"id": "x", "apply": "copy", "source": {"type": "hostPath", "path": "/a"}, "target": {"root": "WORKSPACE", "path": "../x"}}]}"#).unwrap();
    let out = Command::new(common::binary()).args(["manifest", "check", m]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "tuixiu-sandbox: INVALID_AGENT_INPUTS_ITEM_TARGET:x: target.path must not escape root\n"
    );
}

#[test]
fn audit_log_records_every_item() {
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    let archive = skill_zip("audit");
    server.route("/s.zip?token=secret-q", Reply::Body(archive.clone()));
    t.write(json!([
        t.workspace_item(),
        {"id": "w", "apply": "writeFile", "source": {"type": "inlineText", "text": "12345"}, "target": {"root": "SCRATCH", "path": "w"}},
        {"id": "z", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": format!("{}?token=secret-q", server.url("/s.zip"))},
         "target": {"root": "USER_HOME", "path": ".codex/skills/z"}}
    ]));
    let log = t.f.dir.join("audit.jsonl");
    t.ok(&["--audit-log", log.to_str().unwrap(), "-v"], "true");
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 3, "{text}");
    assert_eq!(records[1]["id"], "w");
    assert_eq!(records[1]["bytes"], 5);
    assert_eq!(records[1]["target"], "/scratch/w");
    assert_eq!(records[2]["apply"], "downloadExtract");
    assert_eq!(records[2]["sha256"], sha256_hex(&archive));
    assert_eq!(records[2]["source"], server.url("/s.zip"));
    assert_eq!(records[2]["outcome"], "applied");
    assert!(records[2]["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(!text.contains("secret-q"), "{text}");
}

// ------------------------------------------------- acceptance scenarios

#[test]
fn seed000_backend_provides_a_single_list_of_inputs() {
    // Workspace and a runtime input package (an MCP/agent instruction
    // package) in one manifest; both land.
    let t = Inputs::new(Caller::Root);
    let server = HttpServer::start();
    server.route("/mcp.zip", Reply::Body(zip(&[ZipEntry::file("mcp.json", b"{\"servers\": []}\n")])));
    t.write(json!([
        t.workspace_item(),
        {"id": "mcp", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": "/mcp.zip"}, "target": {"root": "USER_HOME", "path": ".tuixiu/mcp"}}
    ]));
    let out = t.ok(&["--inputs-base-url", &server.origin()], "pwd; cat ~/.tuixiu/mcp/mcp.json");
    assert_eq!(out, "/workspace\n{\"servers\": []}\n");
}

#[test]
fn seed000_unknown_manifest_version_is_rejected() {
    let t = Inputs::new(Caller::Root);
    t.write_full(json!({"agentInputs": {"version": 2, "items": []}}));
    let err = t.refused(&[]);
    assert!(err.contains("UNSUPPORTED_AGENT_INPUTS_VERSION: version 2 is not supported"), "{err}");
}

#[test]
fn seed000_items_apply_without_policy_branching() {
    // Each item is applied from its own source/target/apply/access alone:
    // the same copy item lands under whichever root it names.
    let t = Inputs::new(Caller::Root);
    std::fs::write(t.host.join("cfg"), "c\n").unwrap();
    let copy = |id: &str, root: &str| {
        json!({"id": id, "apply": "copy", "access": "rw",
        "source": {"type": "hostPath", "path": t.host.join("cfg")}, "target": {"root": root, "path": "cfg"}})
    };
    t.write(json!([copy("a", "WORKSPACE"), copy("b", "USER_HOME"), copy("c", "SCRATCH")]));
    assert_eq!(t.ok(&[], "cat /workspace/cfg ~/cfg /scratch/cfg"), "c\nc\nc\n");
}

#[test]
fn seed000_env_patch_cannot_override_unrelated_env() {
    let t = Inputs::new(Caller::Root);
    for key in ["TUIXIU_RUN_ID", "GH_TOKEN", "PATH"] {
        t.write_full(json!({"version": 1, "envPatch": {key: "x"}, "items": []}));
        let err = t.refused(&[]);
        assert!(
            err.contains(&format!(
                "INVALID_AGENT_INPUTS_ENV_PATCH_KEY:{key}: envPatch may only set HOME, USER, LOGNAME"
            )),
            "{err}"
        );
    }
}

#[test]
fn seed000_one_failing_item_prevents_agent_start() {
    let t = Inputs::new(Caller::Root);
    t.write(json!([
        t.workspace_item(),
        {"id": "missing-source", "apply": "bindMount", "source": {"type": "hostPath", "path": t.host.join("nope")},
         "target": {"root": "WORKSPACE", "path": "x"}}
    ]));
    let err = t.refused(&[]);
    assert!(err.contains("AGENT_INPUTS_HOST_PATH:missing-source:"), "{err}");
}

#[test]
fn seed000_path_traversal_is_rejected() {
    let t = Inputs::new(Caller::Root);
    for (path, why) in
        [("../escape", "target.path must not escape root"), ("/etc/passwd", "target.path must be relative")]
    {
        t.write(json!([{"id": "evil", "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
                        "target": {"root": "WORKSPACE", "path": path}}]));
        let err = t.refused(&[]);
        assert!(err.contains(&format!("INVALID_AGENT_INPUTS_ITEM_TARGET:evil: {why}")), "{err}");
    }
    assert!(!t.f.dir.join("escape").exists());
}

#[test]
fn seed000_user_home_resolves_inside_the_sandbox() {
    let t = Inputs::new(Caller::Root);
    t.write(json!([{"id": "h", "apply": "writeFile", "source": {"type": "inlineText", "text": "here\n"},
                    "target": {"root": "USER_HOME", "path": "marker"}}]));
    assert_eq!(
        t.ok(&["--user", "coder"], "cat ~/marker; echo $HOME; cd ~ && pwd"),
        "here\n/home/coder\n/home/coder\n"
    );
}

#[test]
fn seed000_username_resolves_via_getpwuid() {
    let t = Inputs::new(Caller::Root);
    t.write_full(json!({"version": 1, "envPatch": {"USER": "agent7"}, "items": []}));
    let out = t.ok(
        &["--uid", "1234"],
        "id -un; id -u; python3 -c 'import pwd,os; print(pwd.getpwuid(os.getuid()).pw_name)'",
    );
    assert_eq!(out, "agent7\n1234\nagent7\n");
}

#[test]
fn seed000_agent_starts_in_workspace() {
    let t = Inputs::new(Caller::Root);
    t.write(json!([t.workspace_item()]));
    assert_eq!(t.ok(&[], "pwd"), "/workspace\n");
}

for_each_caller!(seed000_agent_can_write_state_under_user_home, |caller: Caller| {
    let t = Inputs::new(caller);
    t.write(json!([{"id": "seed", "apply": "writeFile", "source": {"type": "inlineText", "text": "{}"},
                    "target": {"root": "USER_HOME", "path": ".codex/state/config.json"}}]));
    let out = t.ok(&[], "mkdir -p ~/.codex/log && echo started > ~/.codex/log/agent.log && echo more >> ~/.codex/state/config.json && cat ~/.codex/log/agent.log");
    assert_eq!(out, "started\n");
    let home = t.f.home.to_str().unwrap();
    t.ok(&["--home", home], "echo persisted > ~/state.log");
    assert_eq!(std::fs::read_to_string(t.f.home.join("state.log")).unwrap(), "persisted\n");
});

#[test]
fn root_caller_mapping_the_user_onto_other_ids() {
    // The apply phase writes with the mapped ids (4321): everything it reads
    // then (checkouts, copy sources) must be reachable for them.
    let t = Inputs::new(Caller::Root);
    let (bare, _) = bare_repo(&t);
    let server = HttpServer::start();
    server.route("/z.zip", Reply::Body(skill_zip("mapped")));
    std::os::unix::fs::chown(&t.f.workspace, Some(4321), Some(4321)).unwrap();
    std::fs::create_dir(t.host.join("pkg")).unwrap();
    std::fs::write(t.host.join("pkg/a"), "a\n").unwrap();
    t.write(json!([
        t.workspace_item(),
        {"id": "repo", "apply": "checkout", "source": {"type": "git", "repo": bare}, "target": {"root": "WORKSPACE", "path": "src"}},
        {"id": "pkg", "apply": "copy", "source": {"type": "hostPath", "path": t.host.join("pkg")}, "target": {"root": "USER_HOME", "path": "pkg"}},
        {"id": "skill:z", "apply": "downloadExtract", "source": {"type": "httpZip", "uri": server.url("/z.zip")},
         "target": {"root": "USER_HOME", "path": ".codex/skills/z"}},
        {"id": "note", "apply": "writeFile", "source": {"type": "inlineText", "text": "n\n"}, "target": {"root": "WORKSPACE", "path": "note"}}
    ]));
    let out = t.ok(&["--map-uid", "4321", "--map-gid", "4321"], "cat src/README.md ~/pkg/a note; head -2 ~/.codex/skills/z/SKILL.md | tail -1; stat -c %U src/README.md ~/pkg/a");
    assert_eq!(out, "v2\na\nn\nmapped\nagent\nagent\n");
    use std::os::unix::fs::MetadataExt;
    for p in ["note", "src", "src/README.md", "src/.git"] {
        assert_eq!(std::fs::metadata(t.f.workspace.join(p)).unwrap().uid(), 4321, "{p}");
    }
}

// Item ids and targets may hold Unicode format characters (U+202E
// RIGHT-TO-LEFT OVERRIDE, zero-width ones): log and error lines show them
// escaped, as control characters are, so a line reads as what it is.
#[test]
fn format_characters_in_ids_are_escaped_in_log_lines() {
    let t = Inputs::new(Caller::Root);
    let id = "skill\u{202e}txt.exe";
    let shown = "skill\\u{202e}txt.exe";
    let raw = |s: &str| s.contains(['\u{202e}', '\u{200b}', '\u{2028}']);
    t.write(json!([{"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
        "target": {"root": "SCRATCH", "path": "a\u{200b}b\u{2028}c"}}]));
    let out = t.run(&["-v"], "true");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("input applied"), "{err}");
    assert!(!raw(&err), "raw format characters in: {err}");
    assert!(err.contains(shown), "{err}");
    assert!(err.contains("a\\u{200b}b\\u{2028}c"), "{err}");

    // The one error line of a failing item.
    t.write(
        json!([{"id": id, "apply": "copy", "source": {"type": "hostPath", "path": "/nonexistent-source"},
        "target": {"root": "SCRATCH", "path": "x"}}]),
    );
    let err = t.refused(&[]);
    assert!(!raw(&err), "raw format characters in: {err}");
    assert!(err.contains(&format!(":{shown}: ")), "{err}");

    // A manifest error naming the id, and `manifest check`'s plan.
    let m = t.manifest.to_str().unwrap();
    t.write(json!([{"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
        "target": {"root": "SCRATCH", "path": "../x"}}]));
    let out = Command::new(common::binary()).args(["manifest", "check", m]).output().unwrap();
    assert!(!raw(&stderr(&out)) && stderr(&out).contains(shown), "{}", stderr(&out));
    t.write(json!([{"id": id, "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
        "target": {"root": "SCRATCH", "path": "x"}}]));
    let out = Command::new(common::binary()).args(["manifest", "check", m]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!raw(&stdout) && stdout.contains(shown), "{stdout}");
}
