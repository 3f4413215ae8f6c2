//! The poller: follows every set's change documents from a durable per-set state and publishes
//! change notifications and framework notifications on the set's two hub topics.
//!
//! Exactly once: a notification and the state it advances (the set's watermark, the Resource
//! List parts and Change Lists announced) are written in one store transaction, guarded by the
//! state's version, so a crash never repeats or skips one, and of several notifiers on one
//! store only one wins each step. Intervals: a change notification covers [watermark, until);
//! the next one starts at that `until`. With `hold_back_secs` = 0, `until` is just after the
//! newest change notified, and the embedded store refuses later changes dated before it; with a
//! hold-back, only changes older than it are notified and `until` is now − hold-back, so writers
//! may be that late. A batch is cut at `max_entries`, never inside a group of changes sharing
//! one datetime.

pub mod render;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::context::Context;
use crate::hub::Hub;
use crate::model::websub::Topic;
use crate::model::{Change, ChangeType, SetName, Timestamp};
use crate::store::{ChangeListInfo, NotifyState, PartInfo, Store, StoreError};
use render::{change_notification, framework_notification, FrameworkEntry};

const XML: &str = "application/xml";

pub struct Notifier {
    config: Arc<Config>,
    ctx: Arc<Context>,
    hub: Arc<Hub>,
    wake: Notify,
    /// Changes ingested since the last sweep (to cut at max_entries without waiting).
    poked: AtomicUsize,
}

/// What one step published.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub changes: usize,
    pub framework: usize,
    /// More changes are waiting (the batch was cut).
    pub more: bool,
}

impl Notifier {
    pub fn new(config: Arc<Config>, ctx: Arc<Context>, hub: Arc<Hub>) -> Arc<Notifier> {
        Arc::new(Notifier {
            config,
            ctx,
            hub,
            wake: Notify::new(),
            poked: AtomicUsize::new(0),
        })
    }

    fn store(&self) -> &Store {
        self.ctx.store()
    }

    /// Tells the poller that `n` changes were just committed by this process.
    pub fn poke(&self, n: usize) {
        self.poked.fetch_add(n, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// The topics of a set's two channels.
    pub fn topics(&self, set: &SetName) -> (Topic, Topic) {
        let c =
            Topic::parse(&self.config.change_topic(set.as_str())).expect("topic URLs are valid");
        let f =
            Topic::parse(&self.config.framework_topic(set.as_str())).expect("topic URLs are valid");
        (c, f)
    }

    /// Polls until cancelled: at once (after `max_delay_ms`) when poked, else every
    /// `poll_interval_ms`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let n = &self.config.notify;
        let poll = Duration::from_millis(n.poll_interval_ms);
        let delay = Duration::from_millis(n.max_delay_ms);
        loop {
            // On a shared store only the process holding the leader lease notifies.
            let sweep = if self.hub.is_delivering() {
                self.sweep().await
            } else {
                Ok(())
            };
            if let Err(e) = sweep {
                self.hub.metrics().store_errors.inc();
                tracing::warn!(error = %e, "notifier: store unavailable; retrying");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.wake.notified() => {
                    if self.poked.load(Ordering::Relaxed) < n.max_entries {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// One pass over every set, stepping each until nothing is left.
    pub async fn sweep(&self) -> Result<(), StoreError> {
        self.poked.store(0, Ordering::Relaxed);
        for set in self.store().sets().await? {
            for _ in 0..10_000 {
                match self.step(&set.name).await {
                    Ok(s) if s.more => continue,
                    Ok(_) => break,
                    Err(StoreError::Conflict(why)) => {
                        tracing::debug!(set = %set.name, %why, "notifier: another step won; stepping again");
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Publishes what is due for one set: one change notification, framework notifications.
    pub async fn step(&self, set: &SetName) -> Result<Step, StoreError> {
        let store = self.store();
        let now = Timestamp::now();
        let hold = self.config.notify.hold_back_secs;
        let bound = (hold > 0).then(|| Timestamp(now.micros() - (hold as i64) * 1_000_000));
        let parts = store.parts(set).await?;
        let lists = store.changelists(set).await?;
        let Some(state) = store.notify_state(set).await? else {
            // A set from before the notifier: start from here, replay nothing.
            let (c, f) = self.topics(set);
            self.hub.register_topic(c).await?;
            self.hub.register_topic(f).await?;
            let latest = store
                .latest_change(set)
                .await?
                .map_or(Timestamp(0), |c| Timestamp(c.datetime.micros() + 1));
            store
                .notify_init(NotifyState {
                    set: set.clone(),
                    watermark: bound.unwrap_or(now).max(latest),
                    parts_seen: parts.iter().map(|p| p.no).max().unwrap_or(0),
                    lists_seen: lists.iter().map(|l| l.no).max().unwrap_or(0),
                    announced: true,
                    version: 0,
                    covers: None,
                })
                .await?;
            return Ok(Step {
                more: true,
                ..Step::default()
            });
        };

        let (changes, until, more) = self.due_changes(set, state.watermark, bound).await?;
        let mut next = state.clone();
        next.version += 1;
        let mut payloads: Vec<(Topic, String, Bytes)> = Vec::new();
        let (change_topic, framework_topic) = self.topics(set);
        let urls = self.ctx.urls();
        let sc = self.ctx.set_config(set);
        let mut step = Step {
            more,
            ..Step::default()
        };
        if let Some(until) = until {
            let xml = change_notification(
                &urls.capability_list(set),
                state.watermark,
                until,
                &sc,
                &changes,
            );
            payloads.push((change_topic.clone(), XML.into(), Bytes::from(xml)));
            next.watermark = until;
            next.covers = Some(changes.len() as u64);
            step.changes = changes.len();
        }

        if !state.announced {
            // A new set: its Capability List was created, and the Source Description updated
            // (told on every framework channel).
            self.hub.register_topic(change_topic.clone()).await?;
            self.hub.register_topic(framework_topic.clone()).await?;
            let sd = urls.source_description();
            let created_at = lists.first().map_or(now, |l| l.from);
            let sd_entry = FrameworkEntry {
                loc: sd.clone(),
                change: ChangeType::Updated,
                capability: "description",
                datetime: created_at,
                index: None,
            };
            let cl_entry = FrameworkEntry {
                loc: urls.capability_list(set),
                change: ChangeType::Created,
                capability: "capabilitylist",
                datetime: created_at,
                index: None,
            };
            let xml = framework_notification(Some(&sd), &[cl_entry, sd_entry.clone()]);
            payloads.push((framework_topic.clone(), XML.into(), Bytes::from(xml)));
            for other in store.sets().await? {
                if &other.name != set {
                    let xml = framework_notification(None, std::slice::from_ref(&sd_entry));
                    payloads.push((self.topics(&other.name).1, XML.into(), Bytes::from(xml)));
                }
            }
            next.announced = true;
            step.framework += 1;
        }

        let entries = self.document_events(set, &state, &parts, &lists, now);
        if !entries.is_empty() {
            let xml = framework_notification(Some(&urls.capability_list(set)), &entries);
            payloads.push((framework_topic, XML.into(), Bytes::from(xml)));
            step.framework += 1;
        }
        next.parts_seen = state.parts_seen.max(
            parts
                .iter()
                .filter(|p| p.count > 0)
                .map(|p| p.no)
                .max()
                .unwrap_or(0),
        );
        next.lists_seen = state
            .lists_seen
            .max(lists.iter().map(|l| l.no).max().unwrap_or(0));
        if payloads.is_empty()
            && next.parts_seen == state.parts_seen
            && next.lists_seen == state.lists_seen
        {
            return Ok(step);
        }
        self.hub
            .publish_all(payloads, Some((state.version, next)))
            .await?;
        if step.changes > 0 || step.framework > 0 {
            tracing::debug!(set = %set, changes = step.changes, framework = step.framework, "notified");
        }
        Ok(step)
    }

    /// The changes to notify next, their interval's end, and whether more are waiting.
    async fn due_changes(
        &self,
        set: &SetName,
        from: Timestamp,
        bound: Option<Timestamp>,
    ) -> Result<(Vec<Change>, Option<Timestamp>, bool), StoreError> {
        let max = self.config.notify.max_entries;
        let store = self.store();
        let mut page = store.changes(set, from, bound, None, max + 1).await?;
        if page.items.is_empty() {
            // With a hold-back, an empty interval is not announced: the next notification
            // simply starts at the same watermark.
            return Ok((vec![], None, false));
        }
        if page.items.len() <= max {
            let last = page.items.last().map_or(from, |c| c.datetime);
            let until = bound.unwrap_or(Timestamp(last.micros() + 1));
            return Ok((page.items, Some(until), false));
        }
        // Cut before the datetime group that would straddle the limit.
        let cut = page.items[max].datetime;
        let mut items = page.items;
        items.truncate(max);
        while items.last().is_some_and(|c| c.datetime == cut) {
            items.pop();
        }
        if !items.is_empty() {
            return Ok((items, Some(cut), true));
        }
        // More than max_entries changes share one datetime: they go out together.
        let mut group = Vec::new();
        let mut after = None;
        loop {
            page = store
                .changes(set, cut, Some(Timestamp(cut.micros() + 1)), after, 5000)
                .await?;
            group.extend(page.items);
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok((group, Some(Timestamp(cut.micros() + 1)), true))
    }

    /// Framework entries for Resource List parts and Change Lists created since `state`.
    fn document_events(
        &self,
        set: &SetName,
        state: &NotifyState,
        parts: &[PartInfo],
        lists: &[ChangeListInfo],
        now: Timestamp,
    ) -> Vec<FrameworkEntry> {
        let urls = self.ctx.urls();
        let mut out = Vec::new();
        let live: Vec<&PartInfo> = parts.iter().filter(|p| p.count > 0).collect();
        let rl_indexed = live.len() > 1;
        let rl_index = rl_indexed.then(|| urls.resource_list(set));
        let part_loc = |no: u32| {
            if rl_indexed {
                urls.resource_list_part(set, no)
            } else {
                urls.resource_list(set)
            }
        };
        for p in live.iter().filter(|p| p.no > state.parts_seen) {
            out.push(FrameworkEntry {
                loc: part_loc(p.no),
                change: ChangeType::Created,
                capability: "resourcelist",
                datetime: p.last_change,
                index: rl_index.clone(),
            });
        }
        let cl_indexed = lists.len() > 1;
        let cl_index = cl_indexed.then(|| urls.change_list(set));
        let list_loc = |no: u32| {
            if cl_indexed {
                urls.change_list_no(set, no)
            } else {
                urls.change_list(set)
            }
        };
        let new_lists: Vec<&ChangeListInfo> =
            lists.iter().filter(|l| l.no > state.lists_seen).collect();
        for l in &new_lists {
            // Rollover: the list before was closed (updated: it has its `until` now) and this
            // one created; the Resource List is a new snapshot as of the rollover.
            if let Some(prev) = lists.iter().find(|p| p.no + 1 == l.no) {
                out.push(FrameworkEntry {
                    loc: list_loc(prev.no),
                    change: ChangeType::Updated,
                    capability: "changelist",
                    datetime: prev.until.unwrap_or(now),
                    index: cl_index.clone(),
                });
            }
            out.push(FrameworkEntry {
                loc: list_loc(l.no),
                change: ChangeType::Created,
                capability: "changelist",
                datetime: l.from,
                index: cl_index.clone(),
            });
        }
        if new_lists.iter().any(|l| l.no > 1) {
            for p in &live {
                if p.no <= state.parts_seen {
                    out.push(FrameworkEntry {
                        loc: part_loc(p.no),
                        change: ChangeType::Updated,
                        capability: "resourcelist",
                        datetime: new_lists.last().map_or(now, |l| l.from),
                        index: rl_index.clone(),
                    });
                }
            }
        }
        out
    }
}
