//! Sharded delivery on a shared store. Subscriptions fall into partitions (by id); each
//! partition is delivered by one process at a time, the holder of its lease (a document taken
//! and renewed with conditional writes, read with GET). Live processes announce themselves in
//! a heartbeat document, and each partition goes to the live process that scores highest for
//! it among those under their fair share (rendezvous hashing with bounded loads, [`assign`]: a
//! process joining or leaving moves few partitions, and the shares stay even). A takeover raises the partition's epoch and stamps it on the partition's delivery
//! records, so that an ex-owner that was paused past its lease has its next write refused and
//! drops the partition; before that, it sends nothing, because a lane sends only while its
//! [`Grant`] is known to hold (renewed within the lease, by the monotonic clock).
//!
//! On the embedded store (one process) one grant covers everything, forever.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::store::Store;

use sha2::Digest;

use super::Hub;
use crate::model::websub::{partition_of, SubscriptionId};
use crate::store::PartitionLease;

/// The right to deliver a partition's subscriptions: its epoch, and until when it is known to
/// hold. Lanes check it before each send; the partition loop extends or revokes it.
pub struct Grant {
    pub partition: u32,
    pub epoch: u64,
    base: Instant,
    /// Milliseconds after `base` until which the lease is known to hold.
    valid_until_ms: AtomicU64,
    lost: AtomicBool,
}

impl Grant {
    /// The embedded store's grant: every subscription, for ever.
    pub fn everything() -> Arc<Grant> {
        Arc::new(Grant {
            partition: 0,
            epoch: 0,
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(u64::MAX),
            lost: AtomicBool::new(false),
        })
    }

    fn new(partition: u32, epoch: u64, until: Instant) -> Arc<Grant> {
        let g = Grant {
            partition,
            epoch,
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        };
        g.extend(until);
        Arc::new(g)
    }

    /// The lease holds at least until `until` (a renewal sent before it was granted).
    fn extend(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.valid_until_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// Whether a delivery may be sent under this grant now.
    pub fn valid(&self) -> bool {
        !self.is_lost()
            && (self.base.elapsed().as_millis() as u64) < self.valid_until_ms.load(Ordering::SeqCst)
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Revoked: lanes under it stop before their next send.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// How this process shares the store with others (on the embedded store: alone).
pub(super) struct Sharing {
    /// Whether this process notifies, redoes stale verifications and adopts external writes
    /// (always on the embedded store; on a shared store, while it holds the leader lease).
    pub delivering: AtomicBool,
    /// The embedded store's one grant (every subscription, for ever).
    pub everything: Arc<Grant>,
    /// On a shared store: the delivery partitions this process holds, and their count.
    pub held: std::sync::Mutex<HashMap<u32, Held>>,
    pub count: std::sync::atomic::AtomicU32,
    /// The newest message handed to the lanes from the log (shared store).
    pub synced_through: std::sync::atomic::AtomicI64,
    /// This process's name in leases.
    pub owner: String,
    /// The live delivering processes as this one last read them (shared store).
    pub live: std::sync::Mutex<Vec<String>>,
    /// Where the leases are kept, and the store errors counted.
    store: Store,
    metrics: Arc<Metrics>,
    /// `hub.partition_lease_secs`.
    lease: Duration,
}

impl Sharing {
    pub fn new(store: Store, metrics: Arc<Metrics>, lease: Duration) -> Sharing {
        Sharing {
            delivering: AtomicBool::new(false),
            everything: Grant::everything(),
            held: Default::default(),
            count: Default::default(),
            synced_through: Default::default(),
            owner: format!("{}-{}", std::process::id(), super::challenge()),
            live: Default::default(),
            store,
            metrics,
            lease,
        }
    }

    /// The grant a lane for subscription `id` delivers under, if this process delivers it.
    pub(super) fn grant_for(&self, id: SubscriptionId) -> Option<Arc<Grant>> {
        if !self.store.is_shared() {
            return Some(self.everything.clone());
        }
        let count = self.count.load(Ordering::SeqCst);
        if count == 0 {
            return None;
        }
        let held = self.held.lock().expect("held partitions");
        held.get(&partition_of(id, count))
            .map(|h| h.grant.clone())
            .filter(|g| !g.is_lost())
    }

    /// On a shared store, the live delivering processes as this one last saw them, each with
    /// the partitions it is assigned (this process's name is `owner`); empty alone.
    pub fn processes(&self) -> Vec<(String, usize)> {
        if !self.store.is_shared() {
            return vec![];
        }
        let live = self.live.lock().expect("live").clone();
        let count = self.count.load(Ordering::SeqCst);
        let mut out: Vec<(String, usize)> = live.iter().map(|n| (n.clone(), 0)).collect();
        for owner in assign(&live, count).into_iter().flatten() {
            if let Some(e) = out.iter_mut().find(|(n, _)| n == owner) {
                e.1 += 1;
            }
        }
        out
    }

    /// Partitions held now.
    pub fn partitions_held(&self) -> usize {
        if !self.store.is_shared() {
            return 1;
        }
        self.held.lock().expect("held partitions").len()
    }

    /// The partitions `assign` gives this process among `live`.
    fn wanted(&self, live: &[String], count: u32) -> HashSet<u32> {
        assign(live, count)
            .into_iter()
            .enumerate()
            .filter(|(_, o)| *o == Some(self.owner.as_str()))
            .map(|(p, _)| p as u32)
            .collect()
    }

    /// Takes those of `wanted` no one holds: raises their epochs, stamps the epochs on their
    /// subscriptions (fencing a paused ex-owner; one pass for all of them), and only then
    /// counts them held. Partitions taken but not fenced are left to lapse and taken again.
    async fn take(&self, wanted: &[u32], count: u32) {
        let (lease, secs) = (self.lease, self.lease.as_secs());
        let mut taken = Vec::new();
        for &p in wanted {
            let sent = Instant::now();
            match self.store.take_partition(p, &self.owner, secs).await {
                Ok(Some(l)) => taken.push((p, l, sent)),
                Ok(None) => {}
                Err(e) => {
                    self.metrics.store_errors.inc();
                    tracing::warn!(partition = p, error = %e, "taking a partition failed");
                }
            }
        }
        if taken.is_empty() {
            return;
        }
        let epochs: Vec<(u32, u64)> = taken.iter().map(|(p, l, _)| (*p, l.epoch)).collect();
        if let Err(e) = self.store.fence(&epochs, count).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "stamping taken partitions' epochs failed; taking them again later");
            return;
        }
        let mut held = self.held.lock().expect("held");
        for (p, l, sent) in taken {
            let grant = Grant::new(p, l.epoch, sent + lease - margin(lease));
            held.insert(p, Held { grant, lease: l });
        }
        let mut nos: Vec<u32> = epochs.iter().map(|(p, _)| *p).collect();
        nos.sort();
        tracing::info!(partitions = ?nos, "delivering these partitions now");
    }

    /// Renews every held partition, side by side; a partition someone else wrote is lost.
    async fn renew_all(&self) {
        let (lease, secs) = (self.lease, self.lease.as_secs());
        let held: Vec<(u32, PartitionLease, Arc<Grant>)> = self
            .held
            .lock()
            .expect("held")
            .iter()
            .map(|(p, h)| (*p, h.lease.clone(), h.grant.clone()))
            .collect();
        let renewals = held.into_iter().map(|(p, l, grant)| async move {
            let sent = Instant::now();
            let r = self.store.renew_partition(p, &l, &self.owner, secs).await;
            (p, grant, sent, r)
        });
        use futures_util::StreamExt;
        let done: Vec<_> = futures_util::stream::iter(renewals.collect::<Vec<_>>())
            .buffer_unordered(16)
            .collect()
            .await;
        let mut held = self.held.lock().expect("held");
        for (p, grant, sent, r) in done {
            match r {
                Ok(Some(l)) => {
                    grant.extend(sent + lease - margin(lease));
                    if let Some(h) = held.get_mut(&p) {
                        h.lease = l;
                    }
                }
                Ok(None) => {
                    tracing::warn!(
                        partition = p,
                        epoch = grant.epoch,
                        "partition lease taken by another process: its lanes stop"
                    );
                    grant.lose();
                }
                Err(e) => {
                    self.metrics.store_errors.inc();
                    // The grant lapses by itself if renewals keep failing.
                    tracing::warn!(partition = p, error = %e, "renewing a partition lease failed");
                }
            }
        }
    }

    /// Forgets the partitions whose grant was lost (fenced or taken over); whether any was.
    fn forget_lost(&self) -> bool {
        let mut held = self.held.lock().expect("held");
        let before = held.len();
        held.retain(|_, h| !h.grant.is_lost());
        held.len() != before
    }

    /// At a clean stop (lanes ended, outcomes written): every partition released at once.
    pub(super) async fn release_all(&self) {
        let held: Vec<(u32, Held)> = self.held.lock().expect("held").drain().collect();
        for (p, h) in held {
            if let Err(e) = self.store.release_partition(p, &h.lease).await {
                tracing::warn!(partition = p, error = %e, "releasing a partition failed; its lease lapses by itself");
            }
        }
    }
}

/// A partition this process holds.
pub(super) struct Held {
    pub grant: Arc<Grant>,
    lease: PartitionLease,
}

fn score(node: &str, p: u32) -> u64 {
    let h = sha2::Sha256::new()
        .chain_update(node.as_bytes())
        .chain_update(p.to_le_bytes())
        .finalize();
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}

/// The process that delivers each of `count` partitions among the live `nodes`: rendezvous
/// hashing with bounded loads. Each partition goes to the highest-scoring process that has
/// fewer than its fair share (`ceil(count / nodes)`), so a process joining or leaving moves
/// few partitions and the shares stay even (plain rendezvous left one of three processes
/// with 15% of them). Every process computes the same answer from the same set.
pub fn assign(nodes: &[String], count: u32) -> Vec<Option<&str>> {
    if nodes.is_empty() {
        return vec![None; count as usize];
    }
    let cap = (count as usize).div_ceil(nodes.len());
    let mut load: HashMap<&str, usize> = HashMap::new();
    (0..count)
        .map(|p| {
            let mut ranked: Vec<&str> = nodes.iter().map(String::as_str).collect();
            ranked.sort_by_key(|n| std::cmp::Reverse(score(n, p)));
            let chosen = ranked
                .into_iter()
                .find(|n| load.get(n).copied().unwrap_or(0) < cap)?;
            *load.entry(chosen).or_default() += 1;
            Some(chosen)
        })
        .collect()
}

/// A renewal is sent this often (a fifth of the lease): a lease survives a few failed ones.
fn renew_every(lease: Duration) -> Duration {
    lease / 5
}

/// The margin kept below the lease when trusting it locally (clock rates and request time).
fn margin(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_millis(500))
}

impl Hub {
    /// On a shared store: keeps this process's heartbeat, takes the partitions it wins and
    /// no one holds, renews those it holds, gives up those another live process wins, and
    /// keeps the lanes of its partitions in step with the store.
    pub(super) async fn run_partitions(self: Arc<Self>) {
        let lease = self.settings.partition_lease;
        let secs = lease.as_secs();
        let count = loop {
            match self.store.partition_count(self.settings.partitions).await {
                Ok(n) => break n,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the partition count failed; retrying");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        if count != self.settings.partitions {
            tracing::warn!(
                configured = self.settings.partitions,
                in_store = count,
                "hub.partitions differs from the count the store was set up with: using the store's"
            );
        }
        match self.store.hub_last_message().await {
            Ok(last) => self.sharing.synced_through.store(last, Ordering::SeqCst),
            Err(e) => tracing::warn!(error = %e, "reading the log's end failed"),
        }
        self.sharing.count.store(count, Ordering::SeqCst);
        let mut live: Vec<String> = Vec::new();
        let mut last_beat: Option<Instant> = None;
        let mut tick = tokio::time::interval(super::SYNC_EVERY);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if last_beat.is_none_or(|t| t.elapsed() >= renew_every(lease)) {
                let sent = Instant::now();
                match self.store.heartbeat(&self.sharing.owner, secs).await {
                    Ok(nodes) => {
                        if nodes != live {
                            tracing::info!(
                                processes = nodes.len(),
                                "delivering processes: {}",
                                nodes.join(", ")
                            );
                        }
                        live = nodes;
                        live.clone_into(&mut self.sharing.live.lock().expect("live"));
                        last_beat = Some(sent);
                    }
                    Err(e) => {
                        self.metrics.store_errors.inc();
                        tracing::warn!(error = %e, "heartbeat failed");
                    }
                }
                self.sharing.renew_all().await;
            }
            if self.sharing.forget_lost() {
                // Their lanes stop.
                self.lanes().retain(|_, lane| !lane.grant.is_lost());
            }
            let wanted = self.sharing.wanted(&live, count);
            let held: Vec<u32> = self
                .sharing
                .held
                .lock()
                .expect("held")
                .keys()
                .copied()
                .collect();
            for p in held.iter().filter(|p| !wanted.contains(p)) {
                self.hand_over(*p);
            }
            let free: Vec<u32> = {
                let held = self.sharing.held.lock().expect("held");
                wanted
                    .iter()
                    .copied()
                    .filter(|p| !held.contains_key(p))
                    .collect()
            };
            if !free.is_empty() {
                if self.cancel.is_cancelled() {
                    return;
                }
                self.sharing.take(&free, count).await;
            }
            self.metrics
                .partitions_held
                .set(self.sharing.partitions_held() as i64);
            if !self.sharing.held.lock().expect("held").is_empty() {
                if let Err(e) = self.sync().await {
                    self.metrics.store_errors.inc();
                    tracing::warn!(error = %e, "hub: reading subscriptions and messages failed");
                }
            }
        }
    }

    /// Gives partition `p` to the process that wins it now: its lanes stop before their next
    /// send, and once the last has finished (its outcome written) the lease is released, so
    /// that the new owner starts from a cursor that includes everything sent here.
    fn hand_over(self: &Arc<Self>, p: u32) {
        let Some(h) = self.sharing.held.lock().expect("held").remove(&p) else {
            return;
        };
        h.grant.lose();
        self.lanes()
            .retain(|_, lane| !Arc::ptr_eq(&lane.grant, &h.grant));
        let hub = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + hub.settings.request_timeout + Duration::from_secs(2);
            while Arc::strong_count(&h.grant) > 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            match hub.store.release_partition(p, &h.lease).await {
                Ok(()) => tracing::debug!(partition = p, "partition handed over"),
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "releasing a partition failed; its lease lapses by itself")
                }
            }
        });
    }

    /// Lanes per partition (for logs and tests).
    pub fn lanes_by_partition(&self) -> HashMap<u32, usize> {
        let mut m = HashMap::new();
        for lane in self.lanes().values() {
            *m.entry(lane.grant.partition).or_default() += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_spread_evenly_and_few_move_when_a_process_joins() {
        let two: Vec<String> = vec!["a".into(), "b".into()];
        let three: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        let before = assign(&two, 64);
        let after = assign(&three, 64);
        let mut share: HashMap<&str, usize> = HashMap::new();
        for o in &after {
            *share.entry(o.unwrap()).or_default() += 1;
        }
        assert!(share.values().all(|n| (20..=22).contains(n)), "{share:?}");
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        // A third has to move to the newcomer; bounded loads move a few more, not all.
        assert!((21..=32).contains(&moved), "{moved} of 64 moved");
        // Everyone computes the same assignment, whatever the order it lists the processes in.
        let shuffled: Vec<String> = vec!["c".into(), "a".into(), "b".into()];
        assert_eq!(assign(&shuffled, 64), after);
        assert_eq!(assign(&[], 4), vec![None; 4]);
    }

    #[test]
    fn a_grant_holds_until_its_time_and_not_once_lost() {
        let g = Grant::new(3, 2, Instant::now() + Duration::from_secs(60));
        assert!(g.valid());
        let past = Grant::new(3, 2, Instant::now());
        assert!(!past.valid(), "a lapsed lease sends nothing");
        g.lose();
        assert!(!g.valid());
        assert!(Grant::everything().valid());
    }
}
