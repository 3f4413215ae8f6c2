//! Following a set after its baseline: the Change Lists read from the position, pushed
//! notifications, the queue drained in order, and the subscription kept.

use std::collections::{BTreeMap, HashSet};

use super::documents::{change_of, Part};
use super::state::{self, Change, ChangeType, Pending, State};
use super::{discover, max_token, Followed, Harvester};
use crate::model::Timestamp;

impl Harvester {
    /// Applies the deliveries in the inbox, oldest first, each removed once handled (a
    /// notification that cannot be applied is left to the Change Lists, as before).
    pub(super) async fn apply_inbox(&self, sets: &[Followed]) -> anyhow::Result<()> {
        let ids: Vec<i64> = sets.iter().map(|s| s.row.id).collect();
        loop {
            let ids = ids.clone();
            let Some((id, set_id, body)) = self.state().run(move |s| s.inbox_next(&ids)).await?
            else {
                return Ok(());
            };
            if let Some(set) = sets.iter().find(|s| s.row.id == set_id) {
                if let Err(e) = self.on_push(set, &body).await {
                    tracing::warn!(set = %set.info.name, error = %format!("{e:#}"), "applying a notification failed; the next check catches up");
                }
            }
            self.state().run(move |s| s.inbox_done(id)).await?;
        }
    }

    /// Reads the Change Lists from the position on (following the index across closed lists),
    /// queues what is new, applies the queue, and moves the position. Returns how many changes
    /// were new and the newest datetime among them.
    pub(super) async fn catch_up(
        &self,
        set: &Followed,
    ) -> anyhow::Result<(usize, Option<Timestamp>)> {
        let r = self.read_changes(set).await;
        let error = r.as_ref().err().map(|e| format!("catching up: {e:#}"));
        let id = set.row.id;
        self.state()
            .run(move |s| s.set_error(id, error.as_deref()))
            .await?;
        r
    }

    pub(super) async fn read_changes(
        &self,
        set: &Followed,
    ) -> anyhow::Result<(usize, Option<Timestamp>)> {
        let Some(cl) = &set.info.changelist else {
            // No Change List: what the baseline could not fetch is still retried (and the
            // check is recorded, for `harvest status`).
            self.drain(set).await?;
            let id = set.row.id;
            self.state().run(move |s| s.checked(id, None)).await?;
            return Ok((0, None));
        };
        let row = self.row(set.row.id).await?;
        let Some(p) = row.position else {
            return Ok((0, None));
        };
        let (_, parts, mut docs) = self.list_parts(set, cl, "Change List").await?;
        // Closed lists that end at or before P are done; the rest in chronological order.
        let from = |p: &Part| match p {
            Part::There(e) => e.md.get("from").and_then(|f| Timestamp::parse(f).ok()),
            Part::Here(_) => None,
        };
        let mut parts: Vec<Part> = parts
            .into_iter()
            .filter(|part| match part {
                Part::There(e) => {
                    e.md.get("until")
                        .and_then(|u| Timestamp::parse(u).ok())
                        .is_none_or(|u| u > p)
                }
                Part::Here(_) => true,
            })
            .collect();
        parts.sort_by_key(from);
        let mut new = 0;
        let mut newest: Option<Timestamp> = None;
        let mut newest_new: Option<Timestamp> = None;
        for part in parts {
            let Some(mut doc) = self.open_part(set, part, "Change List", &mut docs).await? else {
                continue;
            };
            let r = &mut doc.reader;
            let mut batch = Vec::new();
            loop {
                let entry = r.next_entry()?;
                let end = entry.is_none();
                if let Some(e) = entry {
                    let Some(mut c) = change_of(&e) else { continue };
                    // A refused change is passed too: it never holds the position.
                    newest = newest.max(Some(c.datetime));
                    if !self.admit(set, &c.uri, &docs).await? {
                        continue;
                    }
                    if e.md.contains_key("datetime") {
                        if c.datetime >= p {
                            batch.push((c, true));
                        }
                    } else {
                        // A ResourceSync 1.0 style entry has only `lastmod` (a deletion's is the
                        // deleted resource's old one), so its date cannot place it: it is taken
                        // when what we hold does not reflect it yet (looked at with the
                        // batch), dated no earlier than P.
                        c.datetime = c.datetime.max(p);
                        batch.push((c, false));
                    }
                }
                if batch.len() >= 1000 || (end && !batch.is_empty()) {
                    let (b, id) = (std::mem::take(&mut batch), set.row.id);
                    // Off the async threads, a thousand at a time.
                    let (n, b) = self
                        .state()
                        .run(move |s| {
                            let mut keep = Vec::with_capacity(b.len());
                            for (c, dated) in b {
                                if dated || undated_is_new(s, id, &c)? {
                                    keep.push(c);
                                }
                            }
                            Ok((s.enqueue(id, &keep)?, keep))
                        })
                        .await?;
                    if n > 0 {
                        newest_new = newest_new.max(b.iter().map(|c| c.datetime).max());
                    }
                    new += n;
                }
                if end {
                    break;
                }
            }
        }
        let id = set.row.id;
        self.state().run(move |s| s.checked(id, newest)).await?;
        self.drain(set).await?;
        if let Some(n) = newest {
            self.advance(set.row.id, n).await?;
        }
        Ok((new, newest_new))
    }

    /// Moves the position to `to`, or to the oldest change still queued if that is earlier.
    pub(super) async fn advance(&self, set_id: i64, to: Timestamp) -> anyhow::Result<()> {
        Ok(self
            .state()
            .run(move |s| {
                let to = match s.oldest_pending(set_id)? {
                    Some(p) => p.min(to),
                    None => to,
                };
                s.advance(set_id, to)
            })
            .await?)
    }

    /// Applies a notification: a gap before it is filled from the Change Lists first. Its
    /// entries outside the source's scope are refused (a signed notification is trusted as
    /// the hub's, not for what it names).
    pub(super) async fn on_push(&self, set: &Followed, body: &[u8]) -> anyhow::Result<()> {
        let doc = discover::parse(body, max_token(&self.cfg))?;
        if doc.md.get("capability").map(String::as_str) != Some("change-notification") {
            tracing::warn!(set = %set.info.name, "a delivery that is not a change notification: ignored");
            return Ok(());
        }
        let from = doc.md.get("from").and_then(|f| Timestamp::parse(f).ok());
        let until = doc.md.get("until").and_then(|u| Timestamp::parse(u).ok());
        let mut changes: Vec<Change> = Vec::new();
        for c in doc.entries.iter().filter_map(change_of) {
            if self.admit(set, &c.uri, &HashSet::new()).await? {
                changes.push(c);
            }
        }
        let (id, newest) = (set.row.id, changes.iter().map(|c| c.datetime).max());
        self.state().run(move |s| s.pushed(id, newest)).await?;
        let row = self.row(set.row.id).await?;
        let Some(p) = row.position else {
            return Ok(()); // baseline still running: the Change Lists will bring it
        };
        if from.is_none_or(|f| f > p) {
            tracing::info!(set = %set.info.name, position = %p, from = %from.map_or("-".to_string(), |f| f.to_string()), "gap before a notification: filling it from the Change Lists");
            self.catch_up(set).await?;
        }
        let p = self.row(set.row.id).await?.position.unwrap_or(p);
        let fresh: Vec<Change> = changes.into_iter().filter(|c| c.datetime >= p).collect();
        let newest = fresh.iter().map(|c| c.datetime).max();
        self.state().run(move |s| s.enqueue(id, &fresh)).await?;
        self.drain(set).await?;
        if let Some(u) = until.or(newest) {
            self.advance(set.row.id, u).await?;
        }
        Ok(())
    }

    /// Applies the queue: per resource in order (a later change of a resource collapses onto
    /// the earlier ones: its content is what is fetched and checked), resources concurrently.
    /// A resource still in its backoff after a failed try waits for a later pass (or for a
    /// newer change of it).
    pub(super) async fn drain(&self, set: &Followed) -> anyhow::Result<()> {
        let id = set.row.id;
        let pending = self.state().run(move |s| s.pending(id)).await?;
        if pending.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        let mut by_uri: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for p in pending {
            by_uri.entry(p.change.uri.clone()).or_default().push(p);
        }
        // In its backoff, unless a newer change of it came meanwhile.
        let mut due = by_uri
            .into_values()
            .filter(|queue| {
                queue
                    .last()
                    .is_none_or(|p| p.not_before.is_none_or(|t| t <= now))
            })
            .peekable();
        /// The change of a queue that is fetched: its last, unless a deletion.
        fn fetched(queue: &[Pending]) -> Option<&Pending> {
            queue
                .last()
                .filter(|p| p.change.change != ChangeType::Deleted)
        }
        let sem = self.parts().slots.clone();
        let mut tasks = tokio::task::JoinSet::new();
        while due.peek().is_some() {
            let chunk: Vec<Vec<Pending>> = due.by_ref().take(256).collect();
            // Claimed in queue order, a chunk in one read of the state.
            let uris: Vec<&str> = chunk
                .iter()
                .filter_map(|q| fetched(q))
                .map(|p| p.change.uri.as_str())
                .collect();
            let mut claims = self.work.claim_many(&uris).await.into_iter();
            for queue in chunk {
                let claim = fetched(&queue).and_then(|_| claims.next());
                let permit = sem.clone().acquire_owned().await?;
                let w = self.work.clone();
                let (name, id) = (set.info.name.clone(), set.row.id);
                let (max_tries, skip) = (self.cfg.fetch.max_tries, self.cfg.fetch.skip_failed);
                tasks.spawn(async move {
                    let _permit = permit;
                    w.apply_queue(&name, id, queue, claim, max_tries, skip)
                        .await
                });
            }
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok(())
    }
}

/// Whether an entry without a `datetime` still has to be applied: a deletion of something
/// held, or a creation/update whose length or md5 differ from what is held, or, when md5
/// cannot tell (the list or the record has none), whose `lastmod` is newer. A URL refused
/// before is not taken again.
fn undated_is_new(state: &State, set_id: i64, c: &Change) -> Result<bool, state::StateError> {
    if state.is_refused(set_id, &c.uri)? {
        return Ok(false);
    }
    let held = state.held(set_id, &c.uri)?;
    Ok(match (c.change, held) {
        (ChangeType::Deleted, held) => held.is_some(),
        (_, None) => true,
        (_, Some(h)) => {
            c.length.is_some_and(|l| Some(l) != h.length)
                || match (&c.md5, &h.md5) {
                    (Some(m), Some(held_md5)) => m != held_md5,
                    _ => c.newer_than(&h),
                }
        }
    })
}
