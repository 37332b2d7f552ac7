//! The skill jobs' server's Prometheus metrics (`skills serve
//! --metrics-listen`), read from the service when scraped: jobs by status
//! (every job the data directory keeps, `waiting_user` included), the
//! queue's depth, the free slots, and the result cache (lookups that hit
//! or missed since the start, entries kept). Served by `crate::metrics`.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::jobs::Service;
use crate::metrics::{gauge_value, raise_to};

type Label = [(&'static str, &'static str); 1];

struct Families {
    registry: Registry,
    jobs: Family<Label, Gauge>,
    queue_depth: Gauge,
    slots_free: Gauge,
    max_concurrent: Gauge,
    cache_lookups: Family<Label, Counter>,
    cache_entries: Gauge,
}

/// What answers a scrape of `svc`'s metrics.
pub fn render(svc: Arc<Service>) -> crate::metrics::Render {
    let mut registry = Registry::with_prefix("tuixiu_skills");
    crate::metrics::register_build_info(&mut registry, "tuixiu-sandbox-full");
    let f = Families {
        jobs: Family::default(),
        queue_depth: Gauge::default(),
        slots_free: Gauge::default(),
        max_concurrent: Gauge::default(),
        cache_lookups: Family::default(),
        cache_entries: Gauge::default(),
        registry: Registry::default(),
    };
    registry.register(
        "jobs",
        "Jobs kept in the data directory, by status (created: waiting for its upload)",
        f.jobs.clone(),
    );
    registry.register("queue_depth", "Jobs waiting for an engine slot", f.queue_depth.clone());
    registry.register("slots_free", "Engine slots free (of --max-concurrent)", f.slots_free.clone());
    registry.register("max_concurrent", "Engines that may run at the same time", f.max_concurrent.clone());
    registry.register(
        "cache_lookups",
        "Result-cache lookups since the start, by result (hit: answered with a run, no engine)",
        f.cache_lookups.clone(),
    );
    registry.register(
        "cache_entries",
        "Result-cache entries kept (of --cache-entries)",
        f.cache_entries.clone(),
    );
    let f = Families { registry, ..f };
    // Scrapes may run at once; the counters catch up with the service's
    // totals one scrape at a time, so no delta is added twice.
    let one_at_a_time = std::sync::Mutex::new(());
    Arc::new(move || {
        let _turn = one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let (counts, free) = svc.status_counts();
        for (status, n) in counts {
            f.jobs.get_or_create(&[("status", status)]).set(gauge_value(n));
            if status == "queued" {
                f.queue_depth.set(gauge_value(n));
            }
        }
        f.slots_free.set(gauge_value(free));
        f.max_concurrent.set(gauge_value(svc.config().max_concurrent));
        let (hits, misses, entries) = svc.cache_counts();
        for (result, now) in [("hit", hits), ("miss", misses)] {
            raise_to(&f.cache_lookups.get_or_create(&[("result", result)]), now);
        }
        f.cache_entries.set(gauge_value(entries));
        crate::metrics::encode(&f.registry)
    })
}
