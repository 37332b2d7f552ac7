//! `skills serve --metrics-listen`: jobs by status, queue depth, engine
//! slots and the result cache, scraped over a unix socket while jobs of the
//! fixture skill go through the stub engine (tests/fixtures): one that
//! succeeds, its repeat answered from the cache, an interactive one waiting
//! for its user. Read with a real parser of the text format
//! (tests/scrape/mod.rs).

mod common;
mod inputs_support;
mod scrape;
mod skills_support;

use common::Caller;
use inputs_support::{ZipEntry, zip};
use scrape::scrape_unix;
use serde_json::json;

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
    assert_eq!(m.value("tuixiu_skills_cache_lookups_total", &[("result", "miss")]), 1.0);
    assert_eq!(m.value("tuixiu_skills_cache_entries", &[]), 1.0);

    // The same inputs: a hit, no engine; counted once however often scraped.
    let again = server.create_demo("ok", "primes please");
    assert_eq!(server.upload(&again, &upload).json()["cache_hit"], true);
    for _ in 0..2 {
        let m = scrape_unix(&sock);
        assert_eq!(m.value("tuixiu_skills_cache_lookups_total", &[("result", "hit")]), 1.0);
        assert_eq!(m.value("tuixiu_skills_cache_lookups_total", &[("result", "miss")]), 1.0);
        assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "succeeded")]), 2.0);
    }

    // An interactive job waiting for its user: counted as such, no lookup,
    // and (resumable) no slot held while it waits.
    let asking = server.start_demo("command", "ask", "metrics", json!({"execution_mode": "interactive"}));
    server.wait_status(&asking, "waiting_user");
    let m = scrape_unix(&sock);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "waiting_user")]), 1.0);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "running")]), 0.0);
    assert_eq!(m.value("tuixiu_skills_slots_free", &[]), 2.0);
    assert_eq!(m.value("tuixiu_skills_cache_lookups_total", &[("result", "miss")]), 1.0);
    assert_eq!(server.reply(&asking, json!({"interaction_id": 1, "response": "md"})).status, 200);
    assert_eq!(server.wait(&asking)["status"], "succeeded");
    let m = scrape_unix(&sock);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "waiting_user")]), 0.0);
    assert_eq!(m.value("tuixiu_skills_jobs", &[("status", "succeeded")]), 3.0);
    assert_eq!(m.value("tuixiu_skills_cache_entries", &[]), 1.0, "interactive runs are not cached");
}
