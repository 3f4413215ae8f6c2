//! What admins see and steer: the recent delivery attempts, and deleting, re-verifying,
//! retrying and redelivering a window to a subscription.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Hub;
use crate::model::websub::{Intent, IntentMode, MessageId, SubscriptionId, Topic};
use crate::model::Timestamp;
use crate::store::StoreError;

/// Attempts kept in memory for the admin API.
pub const ATTEMPT_LOG: usize = 10_000;

/// One delivery attempt, as the admin API shows it.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub at: Timestamp,
    pub subscription_id: SubscriptionId,
    pub topic: Topic,
    pub message_id: MessageId,
    /// The message's `webhook-id` header.
    pub webhook_id: String,
    /// `delivered`, `retry`, `given_up` or `gone`.
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: f64,
}

/// Minutes of attempt counts kept (the console's chart of the last hour).
pub const MINUTES: usize = 60;

/// Delivery attempts in one minute (minutes since the epoch).
#[derive(Debug, Clone, Copy, Default)]
pub struct Minute {
    pub minute: i64,
    pub delivered: u64,
    /// Failed attempts: those that did not deliver (`retry`, `given_up`, `gone`).
    pub failed_attempts: u64,
}

/// Which attempts to show.
#[derive(Debug, Clone, Default)]
pub struct AttemptFilter {
    pub subscription_id: Option<SubscriptionId>,
    pub topic: Option<String>,
    pub outcome: Option<String>,
    pub limit: usize,
}

impl Hub {
    pub(super) fn log_attempt(&self, a: AttemptRecord) {
        let m = &self.metrics;
        m.deliveries
            .get_or_create(&crate::metrics::OutcomeLabel { outcome: a.outcome })
            .inc();
        m.delivery_seconds.observe(a.duration_ms / 1000.0);
        {
            let minute = a.at.micros().div_euclid(60_000_000);
            let mut m = self.minutes.lock().expect("minutes");
            if m.back().is_none_or(|b| b.minute < minute) {
                m.push_back(Minute {
                    minute,
                    ..Minute::default()
                });
            }
            while m
                .front()
                .is_some_and(|f| f.minute <= minute - MINUTES as i64)
            {
                m.pop_front();
            }
            if let Some(b) = m.iter_mut().rev().find(|b| b.minute == minute) {
                match a.outcome {
                    "delivered" => b.delivered += 1,
                    _ => b.failed_attempts += 1,
                }
            }
        }
        let mut log = self.attempts.lock().expect("attempt log");
        if log.len() == ATTEMPT_LOG {
            log.pop_front();
        }
        log.push_back(a);
    }

    /// This process's delivery attempts per minute over the last hour, oldest first, one
    /// entry per minute (those without attempts included), the current minute last.
    pub fn attempts_per_minute(&self, now: Timestamp) -> Vec<Minute> {
        let current = now.micros().div_euclid(60_000_000);
        let m = self.minutes.lock().expect("minutes");
        (current - MINUTES as i64 + 1..=current)
            .map(|minute| {
                m.iter()
                    .find(|b| b.minute == minute)
                    .copied()
                    .unwrap_or(Minute {
                        minute,
                        ..Minute::default()
                    })
            })
            .collect()
    }

    /// The most recent attempts matching `f`, newest first.
    pub fn attempts(&self, f: &AttemptFilter) -> Vec<AttemptRecord> {
        let log = self.attempts.lock().expect("attempt log");
        log.iter()
            .rev()
            .filter(|a| f.subscription_id.is_none_or(|id| a.subscription_id == id))
            .filter(|a| f.topic.as_deref().is_none_or(|t| a.topic.as_str() == t))
            .filter(|a| f.outcome.as_deref().is_none_or(|o| a.outcome == o))
            .take(f.limit)
            .cloned()
            .collect()
    }

    /// Attempts in the log by outcome.
    pub fn attempt_counts(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let mut out = std::collections::BTreeMap::new();
        for a in self.attempts.lock().expect("attempt log").iter() {
            *out.entry(a.outcome).or_insert(0) += 1;
        }
        out
    }

    /// Removes a subscription; with `deny`, tells the subscriber with a `hub.mode=denied` GET.
    /// `false` when there is no such subscription.
    pub async fn delete_subscription(
        self: &Arc<Self>,
        id: SubscriptionId,
        deny: Option<String>,
    ) -> Result<bool, StoreError> {
        let now = Timestamp::now();
        let Some((sub, _)) = self.store.hub_detail(id, now).await? else {
            return Ok(false);
        };
        self.store.hub_remove_subscription(id).await?;
        self.lanes().remove(&id);
        tracing::info!(subscription = id, topic = %sub.topic, callback = %sub.callback, denied = deny.is_some(), "subscription deleted by an admin");
        if let Some(reason) = deny {
            let mut intent = Intent {
                id: 0,
                mode: IntentMode::Denied,
                topic: sub.topic,
                callback: sub.callback,
                lease_secs: 0,
                secret: None,
                alg: sub.alg,
                reason: Some(reason),
                requested_at: now,
                verify_token: None,
            };
            intent.id = self.store.hub_add_intent(intent.clone()).await?;
            self.spawn_verification(intent);
        }
        Ok(true)
    }

    /// Verifies a subscription's intent again (as a renewal with its current lease and secret).
    pub async fn reverify(self: &Arc<Self>, id: SubscriptionId) -> Result<bool, StoreError> {
        let Some((sub, _)) = self.store.hub_detail(id, Timestamp::now()).await? else {
            return Ok(false);
        };
        let mut intent = Intent {
            id: 0,
            mode: IntentMode::Subscribe,
            topic: sub.topic,
            callback: sub.callback,
            lease_secs: sub.lease_secs,
            secret: sub.secret,
            alg: sub.alg,
            reason: None,
            requested_at: Timestamp::now(),
            verify_token: None,
        };
        intent.id = self.store.hub_add_intent(intent.clone()).await?;
        self.spawn_verification(intent);
        Ok(true)
    }

    /// Queues a subscription's given-up messages again and ends any wait before its next retry.
    /// Returns how many given-up messages were queued, or `None` for no such subscription.
    pub async fn retry_now(&self, id: SubscriptionId) -> Result<Option<usize>, StoreError> {
        if !self.lanes().contains_key(&id) {
            if self.store.is_shared()
                && self.store.hub_detail(id, Timestamp::now()).await?.is_some()
            {
                return Err(StoreError::Unavailable(
                    "another process delivers this subscription's partition: retry through that process (its log names the partitions it took)".into(),
                ));
            }
            return Ok(None);
        }
        let messages = self.store.hub_take_failures(id).await?;
        let n = messages.len();
        match self.lanes().get(&id) {
            Some(lane) => lane.retry_now(messages),
            // Removed meanwhile: nothing to retry for.
            None => return Ok(None),
        }
        Ok(Some(n))
    }
}

/// What a redelivery request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redelivery {
    /// This many messages queued again, next, in order.
    Queued(u64),
    NoSuchSubscription,
    /// The window starts before what the hub keeps (`hub.retention_hours`): the reason, naming
    /// the oldest message kept.
    BeforeRetention(String),
}

impl Hub {
    /// Hands redelivery requests other processes left in the store to this process's lanes
    /// (those of subscriptions it delivers; a request for one that is gone is dropped).
    /// `subscriptions`, the store's as just read, spares a lookup per request left for others.
    pub(super) async fn take_redeliveries(
        &self,
        subscriptions: &std::collections::HashSet<SubscriptionId>,
    ) -> Result<(), StoreError> {
        for (request, sub, after, through) in self.store.hub_redeliveries().await? {
            let handed = match self.lanes().get(&sub) {
                Some(lane) => {
                    lane.redeliver(after, through);
                    lane.retry_now(vec![]);
                    true
                }
                None => false,
            };
            let gone = !handed
                && !subscriptions.contains(&sub)
                && self
                    .store
                    .hub_detail(sub, Timestamp::now())
                    .await?
                    .is_none();
            if handed || gone {
                self.store.hub_redelivery_taken(request).await?;
            }
        }
        Ok(())
    }

    /// Queues the subscription's messages published in `[since, until)` (until now when
    /// `None`) again: the ones it was sent already (those after its cursor are on their way
    /// anyway), from when it subscribed, next and in order, with their `Webhook-Id`. Any wait
    /// before the next retry ends: the window is wanted now, its pending messages included.
    pub async fn redeliver(
        &self,
        id: SubscriptionId,
        since: Timestamp,
        until: Option<Timestamp>,
    ) -> Result<Redelivery, StoreError> {
        let now = Timestamp::now();
        let Some((sub, _)) = self.store.hub_detail(id, now).await? else {
            return Ok(Redelivery::NoSuchSubscription);
        };
        let kept_from = Timestamp(now.micros() - self.settings.retention.as_micros() as i64);
        if since < kept_from {
            let oldest = self
                .store
                .hub_messages_after(Some(&sub.topic), 0, 1, 1)
                .await?;
            let oldest = match oldest.first() {
                Some(m) => format!(
                    "the oldest message kept for this topic is number {} of {}",
                    m.id, m.published_at
                ),
                None => "no message of this topic is kept now".into(),
            };
            return Ok(Redelivery::BeforeRetention(format!(
                "messages are kept for {} hours (hub.retention_hours): a window may start at {} at the earliest; {oldest}",
                self.settings.retention.as_secs() / 3600,
                kept_from
            )));
        }
        if !self.lanes().contains_key(&id) && !self.store.is_shared() {
            return Ok(Redelivery::NoSuchSubscription);
        }
        if let Some(lane) = self.lanes().get(&id) {
            lane.retry_now(vec![]);
        }
        let since = since.max(sub.created_at);
        let until = until.unwrap_or(now).min(now);
        let Some((first, last, n)) = self
            .store
            .hub_window(&sub.topic, since, until, sub.cursor)
            .await?
        else {
            return Ok(Redelivery::Queued(0));
        };
        let handed = match self.lanes().get(&id) {
            Some(lane) => {
                lane.redeliver(first - 1, last);
                true
            }
            None => false,
        };
        if !handed {
            if !self.store.is_shared() {
                return Ok(Redelivery::NoSuchSubscription);
            }
            // Another process delivers it: the request waits in the store for that one.
            self.store.hub_leave_redelivery(id, first - 1, last).await?;
        }
        tracing::info!(
            subscription = id,
            messages = n,
            first,
            last,
            "redelivery queued"
        );
        Ok(Redelivery::Queued(n))
    }
}

/// The last [`ATTEMPT_LOG`] attempts, oldest first.
pub(super) type AttemptLog = std::sync::Mutex<VecDeque<AttemptRecord>>;
