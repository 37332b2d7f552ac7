//! The Skill Runner's requests: a package (`assets/runner.json` and its
//! three schemas, `skills::package::load`), a create request
//! (`jobs::Service::create_with`, held for its upload so no engine runs)
//! and the input key matching of a run (`skills::inputs::build` against an
//! uploads directory).
//!
//! The input is six sections separated by lines `----`: runner.json, the
//! input, parameter and output schemas (written as
//! `assets/{input,parameter,output}.schema.json`), the request body
//! (`@SKILL@` becomes the package's name), and the uploads, one per line:
//! `f NAME` a file, `d NAME` a directory, `l NAME TARGET` a symlink. The
//! package directory is named for runner.json's id (when it is a plain
//! name), and SKILL.md names it too, so packages can load.
//!
//! Checked: no panic; package errors are one line; no schema is read from
//! outside the package (a valid schema holding a secret lies next to it,
//! and the package holds a link to it); a file input found by key
//! matching is a regular file directly in uploads/, never a link or a
//! directory, given as its path in the sandbox.
#![no_main]

use std::os::fd::AsFd;

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use tuixiu_sandbox::skills::engines::Engines;
use tuixiu_sandbox::skills::jobs::{Config, Service};
use tuixiu_sandbox::skills::package::{self, Source};
use tuixiu_sandbox::skills::{fsio, inputs};
use tuixiu_sandbox_fuzz::assert_one_line;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut sections = text.split("\n----\n");
    let mut next = || sections.next().unwrap_or("");
    let (runner, schemas, body, uploads) = (next(), [next(), next(), next()], next(), next());

    let dir = tuixiu_sandbox_fuzz::scratch();
    let secret = tuixiu_sandbox_fuzz::marker();
    let skills = dir.path().join("skills");
    let name = serde_json::from_str::<Value>(runner)
        .ok()
        .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_string))
        .filter(|id| fsio::is_plain_name(id) && !id.starts_with('.'))
        .unwrap_or_else(|| "skill".into());
    let pkg = skills.join(&name);
    std::fs::create_dir_all(pkg.join("assets")).unwrap();
    std::fs::write(pkg.join("SKILL.md"), format!("---\nname: {name}\n---\n\n# {name}\n")).unwrap();
    std::fs::write(pkg.join("assets/runner.json"), runner).unwrap();
    for (key, schema) in ["input", "parameter", "output"].iter().zip(schemas) {
        std::fs::write(pkg.join(format!("assets/{key}.schema.json")), schema).unwrap();
    }
    let outside = format!("{{\"type\": \"object\", \"title\": \"{secret}\"}}");
    std::fs::write(skills.join("outside.schema.json"), &outside).unwrap();
    std::fs::write(dir.path().join("outside.schema.json"), &outside).unwrap();
    std::os::unix::fs::symlink("../../outside.schema.json", pkg.join("assets/link.schema.json")).unwrap();

    let engines = Engines::builtin();
    let skill = match package::load(&pkg, &engines.names()) {
        Ok(skill) => Some(skill),
        Err(e) => {
            assert_one_line("package error", &e.to_string());
            None
        }
    };
    if let Some(skill) = &skill {
        for doc in [&skill.input, &skill.parameter, &skill.output] {
            assert!(!doc.json.to_string().contains(&secret), "{} was read from outside the package", doc.rel);
        }
    }

    let body = body.replace("@SKILL@", &name);
    let Ok(body) = serde_json::from_str::<Value>(&body) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = Config {
            max_concurrent: 1,
            max_queue: 4,
            max_upload_bytes: 1 << 20,
            ..Config::new(skills.clone(), dir.path().join("data"), Engines::builtin(), dir.path().join("no-such-launcher"))
        };
        let svc = Service::open(cfg).await.expect("the service opens");
        let _ = svc.create_with(&body, true).await;
    });
    drop(rt);

    let Some(skill) = skill else { return };
    let up = dir.path().join("uploads");
    std::fs::create_dir(&up).unwrap();
    for line in uploads.lines().take(32) {
        let mut parts = line.splitn(3, ' ');
        let (kind, file, target) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !fsio::is_plain_name(file) {
            continue;
        }
        let _ = match kind {
            Some("f") => std::fs::write(up.join(file), "upload"),
            Some("d") => std::fs::create_dir(up.join(file)),
            Some("l") => std::os::unix::fs::symlink(target, up.join(file)),
            _ => Ok(()),
        };
    }
    let object = |key: &str| body.get(key).and_then(Value::as_object).cloned().unwrap_or_else(Map::new);
    let uploads_fd = nix::fcntl::open(
        &up,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    if let Ok(ctx) = inputs::build(
        &skill,
        &object("input"),
        &object("parameter"),
        uploads_fd.as_fd(),
        "/workspace/uploads",
    ) {
        for (key, source) in skill.input_sources() {
            if source != Source::File {
                continue;
            }
            if let Some(v) = ctx.input.get(&key) {
                assert_eq!(v, &Value::String(format!("/workspace/uploads/{key}")), "file input {key:?}");
                let meta = std::fs::symlink_metadata(up.join(&key))
                    .unwrap_or_else(|e| panic!("file input {key:?} matched nothing: {e}"));
                assert!(meta.file_type().is_file(), "file input {key:?} matched a {:?}", meta.file_type());
            }
        }
    }
});
