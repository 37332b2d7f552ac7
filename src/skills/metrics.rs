//! The skill jobs' server's Prometheus metrics (`skills serve
//! --metrics-listen`), read from the service when scraped: jobs by status
//! (every job the data directory keeps), the queue's depth, engines
//! running and the free slots. Served by `crate::metrics`.

use std::sync::Arc;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::jobs::Service;
use crate::metrics::gauge_value;

struct Families {
    registry: Registry,
    jobs: Family<[(&'static str, &'static str); 1], Gauge>,
    queue_depth: Gauge,
    slots_free: Gauge,
    max_concurrent: Gauge,
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
    let f = Families { registry, ..f };
    Arc::new(move || {
        let (counts, free) = svc.status_counts();
        for (status, n) in counts {
            f.jobs.get_or_create(&[("status", status)]).set(gauge_value(n));
            if status == "queued" {
                f.queue_depth.set(gauge_value(n));
            }
        }
        f.slots_free.set(gauge_value(free));
        f.max_concurrent.set(gauge_value(svc.config().max_concurrent));
        crate::metrics::encode(&f.registry)
    })
}
