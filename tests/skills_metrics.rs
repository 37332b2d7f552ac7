//! `skills serve --metrics-listen`: jobs by status, queue depth and engine
//! slots, scraped over a unix socket while a job of the fixture skill goes
//! through the stub engine (tests/fixtures), read with a real parser of the
//! text format (tests/scrape/mod.rs).

mod common;
mod inputs_support;
mod scrape;
mod skills_support;

use common::Caller;
use inputs_support::{ZipEntry, zip};
use scrape::scrape_unix;

#[test]
fn skills_serve_metrics_follow_jobs() {
    let env = skills_support::Env::new(Caller::Root);
    let sock = env.fx.dir.join("skills-metrics.sock");
    let listen = format!("unix:{}", sock.display());
    let server = env.serve(&["--metrics-listen", &listen, "--max-concurrent", "2"]);
    let m = scrape_unix(&sock);
    assert_eq!(m.value("tuixiu_skills_max_concurrent", &[]), 2.0);
    assert_eq!(m.value("tuixiu_skills_slots_free", &[]), 2.0);
    assert_eq!(m.value("tuixiu_skills_queue_depth", &[]), 0.0);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "created")]), 0.0);
    assert_eq!(m.value("tuixiu_skills_build_info", &[("binary", "tuixiu-sandbox-full")]), 1.0);

    let rid = server.create_demo("ok", "primes please");
    assert_eq!(scrape_unix(&sock).value("tuixiu_skills_jobs", &[("status", "created")]), 1.0);
    let upload = zip(&[ZipEntry::file("input_file", b"numbers: 2 3 5 7\n")]);
    assert_eq!(server.upload(&rid, &upload).status, 200);
    assert_eq!(server.wait(&rid)["status"], "succeeded");
    let m = scrape_unix(&sock);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "created")]), 0.0);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "succeeded")]), 1.0);
    assert_eq!(m.value("tuixiu_skills_slots_free", &[]), 2.0);
}
