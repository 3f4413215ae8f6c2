//! Following a set after its baseline: the Change Lists read from the position, pushed
//! notifications, the queue drained in order, and the subscription kept.

use super::state::SubState;
use std::collections::{BTreeMap, HashSet};

use super::documents::{change_of, Part};
use super::scope::{self, short};
use super::state::{self, Change, ChangeType, Pending, State};
use super::{discover, follow, max_token, Followed, Harvester};
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

    /// Whether the Change Lists brought changes that push should have brought: the newest
    /// change they brought is more than a few seconds old and no delivery arrived after it.
    /// Then the subscription may be gone at the hub (removed, expired, its store rebuilt) and
    /// is asked for again.
    pub(super) async fn push_missed(
        &self,
        set: &Followed,
        found: (usize, Option<Timestamp>),
    ) -> bool {
        let newest = {
            let mut unconfirmed = self.unconfirmed.lock().expect("lock");
            if let (n, Some(newest)) = found {
                if n > 0 {
                    let e = unconfirmed.entry(set.row.id).or_insert(newest);
                    *e = (*e).max(newest);
                }
            }
            let Some(&newest) = unconfirmed.get(&set.row.id) else {
                return false;
            };
            if newest.0 > Timestamp::now().0 - 3_000_000 {
                return false; // push may still be on its way
            }
            unconfirmed.remove(&set.row.id);
            newest
        };
        // Compared by the changes' dates: a late push of older changes (delivered after these
        // were made) does not mean push brought these.
        let pushed = self
            .row(set.row.id)
            .await
            .ok()
            .and_then(|r| r.pushed_latest);
        let missed = pushed.is_none_or(|t| t < newest);
        if missed {
            tracing::info!(set = %set.info.name, "the Change Lists had changes push did not bring: subscribing again");
        }
        missed
    }

    /// Whether an entry without a `datetime` still has to be applied: a deletion of something
    /// held, or a creation/update whose length or md5 differ from what is held, or, when md5
    /// cannot tell (the list or the record has none), whose `lastmod` is newer. A URL refused
    /// before is not taken again.
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
        let due: Vec<Vec<Pending>> = by_uri
            .into_values()
            .filter(|queue| {
                queue
                    .last()
                    .is_none_or(|p| p.not_before.is_none_or(|t| t <= now))
            })
            .collect();
        let sem = self.parts().slots.clone();
        let w = self.work.clone();
        let mut tasks = tokio::task::JoinSet::new();
        for chunk in due.chunks(256) {
            // Claimed in queue order (what is fetched: not a deletion), a chunk in one read.
            let fetched: Vec<&str> = chunk
                .iter()
                .filter_map(|q| q.last())
                .filter(|p| p.change.change != ChangeType::Deleted)
                .map(|p| p.change.uri.as_str())
                .collect();
            let mut claims = w.claim_many(&fetched).await.into_iter();
            for queue in chunk {
                let claim = queue
                    .last()
                    .filter(|p| p.change.change != ChangeType::Deleted)
                    .and_then(|_| claims.next());
                let permit = sem.clone().acquire_owned().await?;
                let (w, queue) = (w.clone(), queue.clone());
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

    /// Keeps the push subscription alive: asks for one when there is none, when the last
    /// request was not verified within a minute, when two thirds of the lease have passed,
    /// when the callback changed, or when `force` (the Change Lists brought changes push did
    /// not).
    pub(super) async fn keep_subscribed(&self, set: &Followed, force: bool) {
        if !self.cfg.push.enabled {
            return;
        }
        let (Some(topic), Some(hub)) = (&set.info.topic, &set.info.hub) else {
            return;
        };
        let now = Timestamp::now();
        let ours = format!(
            "{}/cb/{}/",
            self.callback_base.trim_end_matches('/'),
            set.row.id
        );
        let id = set.row.id;
        let current = self
            .state()
            .run(move |s| s.subscription(id))
            .await
            .ok()
            .flatten();
        let due = match &current {
            Some(s) if s.topic == *topic && s.callback.starts_with(&ours) => match s.state {
                SubState::Active => {
                    let lease = s.lease_secs.unwrap_or(self.cfg.push.lease_secs);
                    force
                        || now
                            >= s.verified_at
                                .unwrap_or(s.requested_at)
                                .plus_secs(lease * 2 / 3)
                }
                SubState::Requested => now >= s.requested_at.plus_secs(60),
                SubState::Denied => {
                    now >= s
                        .requested_at
                        .plus_secs(self.cfg.follow.check_interval_secs.max(60))
                }
            },
            _ => true,
        };
        if !due {
            return;
        }
        if let Some(s) = current.as_ref().filter(|s| s.state == SubState::Requested) {
            self.subscription_problem(
                set,
                format!(
                    "the hub accepted the request but has not verified the callback {} within 60 s: the hub must be able to \
                     reach it (push.listen, push.callback_url), and a hub may refuse to call loopback or private addresses \
                     (resourcesync-hub: hub.allow_networks)",
                    short(&s.callback)
                ),
            )
            .await;
        }
        // The callback keeps its token across renewals; a new one for a new callback.
        let callback = match current.filter(|s| s.callback.starts_with(&ours)) {
            Some(s) => s.callback,
            None => match self
                .state()
                .run(|s| s.harvester_id())
                .await
                .map_err(anyhow::Error::from)
                .and_then(|id| follow::new_token(&id))
            {
                Ok(t) => follow::callback_url(&self.callback_base, set.row.id, &t),
                Err(e) => {
                    tracing::warn!(error = %e, "no callback token");
                    return;
                }
            },
        };
        if let Err(e) = follow::subscribe(
            self.fetcher(),
            self.state(),
            set.row.id,
            hub,
            topic,
            &callback,
            self.cfg.push.lease_secs,
        )
        .await
        {
            self.subscription_problem(set, format!("{e:#}")).await;
        }
    }

    /// Records why a set's subscription does not work, logged once per reason; shown by
    /// `harvest status`. Push is then replaced by reading Change Lists, and asked for again.
    pub(super) async fn subscription_problem(&self, set: &Followed, reason: String) {
        let reason = scope::cut(&reason, 800).into_owned();
        let (id, r) = (set.row.id, reason.clone());
        match self
            .state()
            .run(move |s| s.subscription_problem(id, &r))
            .await
        {
            Ok(true) => {
                tracing::warn!(set = %set.info.name, reason = %reason, "no push: the subscription does not work (Change Lists are read every follow.check_interval_secs; asked again)")
            }
            Ok(false) => {
                tracing::debug!(set = %set.info.name, reason = %reason, "the subscription still does not work")
            }
            Err(e) => tracing::warn!(error = %e, "cannot record the subscription's problem"),
        }
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
