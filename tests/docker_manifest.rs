//! A manifest applied to a container: `run --provider docker --manifest`,
//! against a real Docker Engine. Bind items become binds of the container;
//! the other items land in the host directories behind its volumes, as the
//! container's user, before it starts.

mod common;
mod docker_support;

use std::process::{Command, Output, Stdio};

use docker_support::{Scratch, docker, image, unique_name};

fn cli(scratch: &Scratch, args: &[&str]) -> Output {
    Command::new(common::binary())
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("TUIXIU_STATE_DIR", &scratch.state)
        .current_dir(&scratch.dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A manifest binding the scratch workspace and landing an item in each root.
fn write_manifest(scratch: &Scratch, extra_items: &str) -> String {
    let data = scratch.dir.join("data");
    let src = scratch.dir.join("src");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(data.join("d.txt"), "data-file\n").unwrap();
    std::fs::write(src.join("c.txt"), "copied\n").unwrap();
    let manifest = format!(
        r##"{{"version":1,"items":[
  {{"id":"ws","apply":"bindMount","access":"rw","source":{{"type":"hostPath","path":"{ws}"}},"target":{{"root":"WORKSPACE","path":"."}}}},
  {{"id":"agents-md","apply":"writeFile","source":{{"type":"inlineText","text":"# hi\n"}},"target":{{"root":"USER_HOME","path":".codex/AGENTS.md"}}}},
  {{"id":"note","apply":"writeFile","source":{{"type":"inlineText","text":"ws note\n"}},"target":{{"root":"WORKSPACE","path":"notes/n.txt"}}}},
  {{"id":"tmp","apply":"writeFile","source":{{"type":"inlineText","text":"tmp\n"}},"target":{{"root":"SCRATCH","path":"s.txt"}}}},
  {{"id":"data","apply":"bindMount","access":"ro","source":{{"type":"hostPath","path":"{data}"}},"target":{{"root":"WORKSPACE","path":"data"}}}},
  {{"id":"copy","apply":"copy","source":{{"type":"hostPath","path":"{src}"}},"target":{{"root":"USER_HOME","path":"copied"}}}}
  {extra_items}
]}}"##,
        ws = scratch.workspace.display(),
        data = data.display(),
        src = src.display(),
    );
    let path = scratch.dir.join("m.json");
    std::fs::write(&path, manifest).unwrap();
    path.display().to_string()
}

const CHECK: &str = "cat ~/.codex/AGENTS.md /workspace/notes/n.txt /scratch/s.txt /workspace/data/d.txt ~/copied/c.txt; \
    touch /workspace/data/y 2>/dev/null && echo data-writable; \
    echo more >> ~/.codex/AGENTS.md && echo ws > /workspace/notes/n.txt && echo mine";

#[test]
fn a_manifest_lands_in_a_one_off_container() {
    let scratch = Scratch::new("manifest-oneoff");
    let manifest = write_manifest(&scratch, "");
    let allow = scratch.dir.display().to_string();
    let image = image();
    let out = cli(
        &scratch,
        &[
            "run",
            "--provider",
            "docker",
            "--image",
            &image,
            "--manifest",
            &manifest,
            "--allow-host-path",
            &allow,
            "--",
            "sh",
            "-c",
            CHECK,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Every item is there, the ro bind is read-only, and the agent owns what landed.
    assert_eq!(text(&out.stdout), "# hi\nws note\ntmp\ndata-file\ncopied\nmine\n");
    assert_eq!(std::fs::read_to_string(scratch.workspace.join("notes/n.txt")).unwrap(), "ws\n");
    // The one-off's home and scratch are gone with it.
    let left = std::fs::read_dir(scratch.state.join("docker")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0);
}

#[test]
fn a_manifest_lands_in_a_named_instance() {
    let scratch = Scratch::new("manifest-named");
    let manifest = write_manifest(&scratch, "");
    let allow = scratch.dir.display().to_string();
    let image = image();
    let name = scratch.track(&unique_name("manifest"));
    let args = [
        "run",
        "--provider",
        "docker",
        "--image",
        &image,
        "--instance-name",
        &name,
        "--manifest",
        &manifest,
        "--allow-host-path",
        &allow,
    ];
    let out = cli(&scratch, &[&args[..], &["--", "sh", "-c", CHECK]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "# hi\nws note\ntmp\ndata-file\ncopied\nmine\n");
    // Reused: the home keeps what the first process appended.
    let out = cli(
        &scratch,
        &[
            "run",
            "--provider",
            "docker",
            "--image",
            &image,
            "--instance-name",
            &name,
            "--workspace",
            &scratch.workspace.display().to_string(),
            "--",
            "cat",
            "/home/agent/.codex/AGENTS.md",
        ],
    );
    assert_eq!(text(&out.stdout), "# hi\nmore\n", "{}", text(&out.stderr));

    // The manifest again: what the first command changed is left as it is
    // and reported (docs/manifest.md, "Landing again"), what it did not
    // touch stays as it landed.
    let show = ["--", "cat", "/home/agent/.codex/AGENTS.md", "/workspace/notes/n.txt", "/scratch/s.txt"];
    let out = cli(&scratch, &[&args[..], &show].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "# hi\nmore\nws\ntmp\n", "the manifest overwrote the command's work");
    let err = text(&out.stderr);
    for id in ["agents-md", "note"] {
        assert!(
            err.lines()
                .any(|l| l.contains(&format!("item {id}:")) && l.contains("changed since it was applied")),
            "{id} not reported: {err}"
        );
    }
    // With new content for an item the command changed: kept aside.
    std::fs::write(&manifest, std::fs::read_to_string(&manifest).unwrap().replace("ws note", "note v2"))
        .unwrap();
    let out = cli(&scratch, &[&args[..], &show].concat());
    assert_eq!(text(&out.stdout), "# hi\nmore\nws\ntmp\n", "{}", text(&out.stderr));
    let aside = scratch.state.join("docker").join(&name).join("incoming/workspace/notes/n.txt");
    assert_eq!(std::fs::read_to_string(&aside).unwrap(), "note v2\n");
    assert!(text(&out.stderr).contains(&aside.display().to_string()), "{}", text(&out.stderr));
}

#[test]
fn a_failing_item_starts_nothing() {
    let scratch = Scratch::new("manifest-fail");
    let missing = r#",{"id":"broken-copy","apply":"copy","source":{"type":"hostPath","path":"/nonexistent/x"},"target":{"root":"WORKSPACE","path":"x"}}"#;
    let manifest = write_manifest(&scratch, missing);
    let allow = scratch.dir.display().to_string();
    let image = image();
    let run_id = format!("mfail-{}", std::process::id());
    let out = cli(
        &scratch,
        &[
            "run",
            "--provider",
            "docker",
            "--image",
            &image,
            "--run-id",
            &run_id,
            "--manifest",
            &manifest,
            "--allow-host-path",
            &allow,
            "--",
            "touch",
            "/workspace/started",
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("broken-copy"), "{}", text(&out.stderr));
    assert!(!scratch.workspace.join("started").exists());
    let ps = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=acp-proxy.run_id={run_id}"),
        "--format",
        "{{.Names}}",
    ]);
    assert_eq!(text(&ps.stdout).trim(), "", "no container may have been created");
    let left = std::fs::read_dir(scratch.state.join("docker")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0);
}
