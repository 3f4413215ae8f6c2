//! Keeping a source's sets subscribed: asking the hub for a subscription (again before its
//! lease ends, when it was not verified, when the callback changed), recording why push does
//! not work, and noticing when the Change Lists bring what push should have brought.

use std::collections::HashMap;
use std::sync::Mutex;

use super::config::PushSection;
use super::fetch::Fetcher;
use super::scope::{self, short};
use super::state::{Handle, SubState};
use super::{follow, Followed};
use crate::model::Timestamp;

/// The push side of one source.
pub(super) struct Push {
    cfg: PushSection,
    /// `follow.check_interval_secs`: how long a denied subscription waits to be asked again
    /// (at least a minute).
    check_interval_secs: u64,
    fetcher: Fetcher,
    state: Handle,
    /// Base of the callback URLs.
    callback_base: String,
    /// Per set, the newest change the Change Lists brought that no delivery has confirmed yet.
    unconfirmed: Mutex<HashMap<i64, Timestamp>>,
}

impl Push {
    pub(super) fn new(
        cfg: PushSection,
        check_interval_secs: u64,
        fetcher: Fetcher,
        state: Handle,
        callback_base: String,
    ) -> Push {
        Push {
            cfg,
            check_interval_secs,
            fetcher,
            state,
            callback_base,
            unconfirmed: Default::default(),
        }
    }

    /// Whether the Change Lists brought changes that push should have brought: the newest
    /// change they brought is more than a few seconds old and no delivery arrived after it.
    /// Then the subscription may be gone at the hub (removed, expired, its store rebuilt) and
    /// is asked for again.
    pub(super) async fn missed(&self, set: &Followed, found: (usize, Option<Timestamp>)) -> bool {
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
        let id = set.row.id;
        // Compared by the changes' dates: a late push of older changes (delivered after these
        // were made) does not mean push brought these.
        let pushed = self
            .state
            .run(move |s| s.set_by_id(id))
            .await
            .ok()
            .flatten()
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
    /// Keeps the push subscription alive: asks for one when there is none, when the last
    /// request was not verified within a minute, when two thirds of the lease have passed,
    /// when the callback changed, or when `force` (the Change Lists brought changes push did
    /// not).
    pub(super) async fn keep_subscribed(&self, set: &Followed, force: bool) {
        if !self.cfg.enabled {
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
            .state
            .run(move |s| s.subscription(id))
            .await
            .ok()
            .flatten();
        let due = match &current {
            Some(s) if s.topic == *topic && s.callback.starts_with(&ours) => match s.state {
                SubState::Active => {
                    let lease = s.lease_secs.unwrap_or(self.cfg.lease_secs);
                    force
                        || now
                            >= s.verified_at
                                .unwrap_or(s.requested_at)
                                .plus_secs(lease * 2 / 3)
                }
                SubState::Requested => now >= s.requested_at.plus_secs(60),
                SubState::Denied => {
                    now >= s.requested_at.plus_secs(self.check_interval_secs.max(60))
                }
            },
            _ => true,
        };
        if !due {
            return;
        }
        if let Some(s) = current.as_ref().filter(|s| s.state == SubState::Requested) {
            self.problem(
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
                .state
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
            &self.fetcher,
            &self.state,
            set.row.id,
            hub,
            topic,
            &callback,
            self.cfg.lease_secs,
        )
        .await
        {
            self.problem(set, format!("{e:#}")).await;
        }
    }

    /// Records why a set's subscription does not work, logged once per reason; shown by
    /// `harvest status`. Push is then replaced by reading Change Lists, and asked for again.
    async fn problem(&self, set: &Followed, reason: String) {
        let reason = scope::cut(&reason, 800).into_owned();
        let (id, r) = (set.row.id, reason.clone());
        match self
            .state
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
