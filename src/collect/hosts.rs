//! Politeness over processes: on a shared store, the requests in flight at one host (scheme,
//! host, port) are limited over every process of the server together, by slots kept as leases
//! in the store (`host:<authority>:<n>`, the same leases as the collectors' own and delivery's
//! partitions). A request takes a free slot (or waits for one), holds it until its body is read,
//! and gives it back; the lease is renewed while the request is in flight, so a killed
//! process's slots come free when their lease runs out (`hub.partition_lease_secs`, as its
//! collectors). With
//! `requests_per_sec`, a slot is held at least `slots / requests_per_sec` seconds, so that no
//! more than that many requests start at the host in any second, whatever the processes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::destination::fetch::SharedSlots;
use crate::store::Store;

/// The store's slots at each host.
pub struct StoreSlots {
    store: Store,
    /// This process's name in leases; each request takes its slot as `owner/<n>`.
    owner: String,
    next: AtomicU64,
    slots: usize,
    lease_secs: u64,
    /// The least time a slot is held at each authority (its per-second limit).
    min_hold: std::collections::HashMap<String, Duration>,
}

impl StoreSlots {
    /// `per_sec`: each authority's limit of request starts per second.
    pub fn new(
        store: Store,
        owner: String,
        slots: usize,
        lease_secs: u64,
        per_sec: &std::collections::HashMap<String, f64>,
    ) -> StoreSlots {
        let min_hold = per_sec
            .iter()
            .filter(|(_, r)| **r > 0.0)
            .map(|(a, r)| (a.clone(), Duration::from_secs_f64(slots as f64 / r)))
            .collect();
        StoreSlots {
            store,
            owner,
            next: AtomicU64::new(0),
            slots: slots.max(1),
            lease_secs,
            min_hold,
        }
    }
}

/// A slot held: given back when dropped (once held `min_hold`).
struct Held {
    store: Store,
    name: String,
    owner: String,
    since: Instant,
    min_hold: Duration,
    /// Renews the lease while the request is in flight.
    renew: tokio::task::AbortHandle,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renew.abort();
        let (store, name, owner) = (self.store.clone(), self.name.clone(), self.owner.clone());
        let left = self.min_hold.saturating_sub(self.since.elapsed());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(left).await;
                let _ = store.release(&name, &owner).await;
            });
        }
    }
}

#[async_trait::async_trait]
impl SharedSlots for StoreSlots {
    async fn enter(&self, authority: &str) -> Box<dyn std::any::Any + Send> {
        let owner = format!(
            "{}/{}",
            self.owner,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut pause = Duration::from_millis(10);
        loop {
            for n in 0..self.slots {
                let name = format!("host:{authority}:{n}");
                match self.store.lease(&name, &owner, self.lease_secs).await {
                    Ok(true) => {
                        let (store, n, o, secs) = (
                            self.store.clone(),
                            name.clone(),
                            owner.clone(),
                            self.lease_secs,
                        );
                        let renew = tokio::spawn(async move {
                            loop {
                                tokio::time::sleep(Duration::from_millis(secs * 1000 / 3)).await;
                                let _ = store.lease(&n, &o, secs).await;
                            }
                        })
                        .abort_handle();
                        return Box::new(Held {
                            renew,
                            store: self.store.clone(),
                            name,
                            owner,
                            since: Instant::now(),
                            min_hold: self.min_hold.get(authority).copied().unwrap_or_default(),
                        });
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(authority, error = %crate::cause::chain(&e), "cannot reach the store for a host's slot; waiting");
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// Each collected host's limit of request starts per second: the lowest `requests_per_sec`
/// of the collectors at it (0: none).
pub fn per_sec(config: &crate::config::Config) -> std::collections::HashMap<String, f64> {
    let mut out: std::collections::HashMap<String, f64> = Default::default();
    for c in config.collect.values().filter(|c| c.requests_per_sec > 0.0) {
        if let Ok(u) = url::Url::parse(&c.url) {
            let r = out
                .entry(u.origin().ascii_serialization())
                .or_insert(f64::MAX);
            *r = r.min(c.requests_per_sec);
        }
    }
    out
}

/// The limits at each host a process's collectors keep: two requests in flight and
/// `requests_per_sec` in this process, and on a shared store the same over every process.
/// Every fetcher of the collectors (OAI-PMH client, discovery, listing runs, the harvest
/// engine) goes through them.
pub fn hosts(
    config: &crate::config::Config,
    store: &Store,
    owner: &str,
) -> crate::destination::fetch::Hosts {
    let per_sec = per_sec(config);
    let delays = per_sec
        .iter()
        .map(|(a, r)| (a.clone(), Duration::from_secs_f64(1.0 / r)))
        .collect();
    let shared = store.is_shared().then(|| {
        Arc::new(StoreSlots::new(
            store.clone(),
            owner.to_string(),
            super::client::IN_FLIGHT,
            config.hub.partition_lease_secs.max(1),
            &per_sec,
        )) as Arc<dyn SharedSlots>
    });
    crate::destination::fetch::Hosts::with(delays, shared)
}
