//! The hub's part of the storage contract: subscriptions, intents awaiting verification,
//! topics, messages and per-subscription delivery queues, kept durable by every backend.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::{NotifyState, Store, StoreError};
use crate::model::websub::{
    Callback, HubTotals, Intent, Message, MessageId, Outcome, Resolution, SubState, Subscription,
    SubscriptionFilter, SubscriptionId, SubscriptionStats, Topic, TopicInfo, TopicSummary,
};
use crate::model::Timestamp;

impl Store {
    /// Whether several server processes may share this store (then one at a time delivers).
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Elasticsearch(_))
    }

    /// Takes or renews a lease for `owner`; always held on an unshared store.
    pub async fn lease(&self, name: &str, owner: &str, secs: u64) -> Result<bool, StoreError> {
        match self {
            Store::Embedded(_) => Ok(true),
            Store::Elasticsearch(s) => s.lease(name, owner, secs).await,
        }
    }

    pub async fn release(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        match self {
            Store::Embedded(_) => Ok(()),
            Store::Elasticsearch(s) => s.release(name, owner).await,
        }
    }

    /// Adopts documents external writers put straight into the store (Elasticsearch; the
    /// embedded store has none). Returns the change documents adopted.
    pub async fn adopt_external(
        &self,
        rules: &dyn super::elastic::SetRules,
    ) -> Result<usize, StoreError> {
        match self {
            Store::Embedded(_) => Ok(0),
            Store::Elasticsearch(s) => s.adopt(rules).await,
        }
    }

    /// Records a request awaiting verification (or a denial to send); returns its id.
    pub async fn hub_add_intent(&self, intent: Intent) -> Result<i64, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_add_intent(intent).await,
            Store::Elasticsearch(s) => s.hub_add_intent(intent).await,
        }
    }

    /// Intents not yet resolved (after a restart: verifications to redo).
    pub async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_intents().await,
            Store::Elasticsearch(s) => s.hub_intents().await,
        }
    }

    /// Ends an intent; returns the subscription created/updated or removed.
    pub async fn hub_resolve(
        &self,
        intent: Intent,
        res: Resolution,
    ) -> Result<Option<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_resolve(intent, res).await,
            Store::Elasticsearch(s) => s.hub_resolve(intent, res).await,
        }
    }

    pub async fn hub_remove_subscription(&self, id: SubscriptionId) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_remove_subscription(id).await,
            Store::Elasticsearch(s) => s.hub_remove_subscription(id).await,
        }
    }

    /// Every subscription, expired ones included.
    pub async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_subscriptions().await,
            Store::Elasticsearch(s) => s.hub_subscriptions().await,
        }
    }

    pub async fn hub_subscription(
        &self,
        topic: &Topic,
        callback: &Callback,
    ) -> Result<Option<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_subscription(topic, callback).await,
            Store::Elasticsearch(s) => s.hub_subscription(topic, callback).await,
        }
    }

    /// How many subscriptions have a callback starting with `prefix` (`scheme://host/` or
    /// `scheme://host:`: one host's).
    pub async fn hub_count_callbacks(&self, prefix: &str) -> Result<u64, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_count_callbacks(prefix).await,
            Store::Elasticsearch(s) => s.hub_count_callbacks(prefix).await,
        }
    }

    /// Appends messages to the log, each as its topic's latest (one write per message, whatever
    /// the number of subscribers: their queues are the messages after their cursors). With
    /// `state`, a set's notifier state moves from version `.0` to `.1` in the same transaction,
    /// or nothing is written and the answer is [`StoreError::Conflict`].
    pub async fn hub_publish(
        &self,
        messages: Vec<(Topic, String, Bytes)>,
        state: Option<(i64, NotifyState)>,
        now: Timestamp,
    ) -> Result<Vec<Message>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_publish(messages, state, now).await,
            Store::Elasticsearch(s) => s.hub_publish(messages, state, now).await,
        }
    }

    /// Up to `limit` messages after `after`, in number order: of one topic, or of every topic
    /// (`None`), and on the embedded store no more than `max_bytes` of bodies (at least one
    /// message). Lanes read their queues from here a bounded batch at a time.
    pub async fn hub_messages_after(
        &self,
        topic: Option<&Topic>,
        after: MessageId,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Message>>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_messages_after(topic, after, limit, max_bytes).await,
            Store::Elasticsearch(s) => s.hub_messages_after(topic, after, limit).await,
        }
    }

    /// The newest message's number (0 when none).
    pub async fn hub_last_message(&self) -> Result<MessageId, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_last_message().await,
            Store::Elasticsearch(s) => s.hub_max_seq().await,
        }
    }

    /// Records delivery outcomes: cursors, retry state, counters, failed deliveries.
    pub async fn hub_record(&self, outcomes: Vec<Outcome>) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_record(outcomes).await,
            Store::Elasticsearch(s) => s.hub_record(outcomes).await,
        }
    }

    pub async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_register_topic(topic, now).await,
            Store::Elasticsearch(s) => s.hub_register_topic(topic, now).await,
        }
    }

    pub async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_topic(topic).await,
            Store::Elasticsearch(s) => s.hub_topic(topic).await,
        }
    }

    /// Drops history older than `before` that nothing needs any more.
    pub async fn hub_prune(&self, before: Timestamp, now: Timestamp) -> Result<u64, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_prune(before, now).await,
            Store::Elasticsearch(s) => s.hub_prune(before, now).await,
        }
    }

    /// One page of subscriptions with their delivery record (admin).
    pub async fn hub_list(
        &self,
        filter: SubscriptionFilter,
        now: Timestamp,
    ) -> Result<Vec<(Subscription, SubscriptionStats)>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_list(filter, now).await,
            Store::Elasticsearch(s) => s.hub_list(filter, now).await,
        }
    }

    pub async fn hub_detail(
        &self,
        id: SubscriptionId,
        now: Timestamp,
    ) -> Result<Option<(Subscription, SubscriptionStats)>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_detail(id, now).await,
            Store::Elasticsearch(s) => s.hub_detail(id, now).await,
        }
    }

    /// Every topic known (published to, registered, or subscribed to).
    pub async fn hub_topics(&self) -> Result<Vec<TopicSummary>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_topics().await,
            Store::Elasticsearch(s) => s.hub_topics().await,
        }
    }

    /// Removes a subscription's failure records, returning their messages (to try again).
    pub async fn hub_take_failures(
        &self,
        id: SubscriptionId,
    ) -> Result<Vec<Arc<Message>>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_take_failures(id).await,
            Store::Elasticsearch(s) => s.hub_take_failures(id).await,
        }
    }

    pub async fn hub_totals(&self, now: Timestamp) -> Result<HubTotals, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_totals(now).await,
            Store::Elasticsearch(s) => s.hub_totals(now).await,
        }
    }
}

/// A subscription's state after a batch of outcomes, folded in order (every backend writes
/// one update per subscription per batch from this).
#[derive(Default, Debug)]
pub(crate) struct Fold {
    pub cursor: MessageId,
    pub attempts: u32,
    pub next_at: Option<i64>,
    pub delivered: i64,
    pub failed: i64,
    pub success: Option<(i64, u16)>,
    pub failure: Option<(i64, Option<u16>, String)>,
    /// `(message, attempts, status, error, at)` of deliveries that failed for good.
    pub failures: Vec<(MessageId, u32, Option<u16>, String, i64)>,
}

/// Folds outcomes per subscription, in the order the subscriptions first appear.
pub(crate) fn fold(outcomes: Vec<Outcome>) -> Vec<(SubscriptionId, Fold)> {
    let mut folds: Vec<(SubscriptionId, Fold)> = Vec::new();
    let mut index: HashMap<SubscriptionId, usize> = HashMap::new();
    for o in outcomes {
        let sub = match &o {
            Outcome::Delivered { sub, .. }
            | Outcome::Retry { sub, .. }
            | Outcome::Failed { sub, .. }
            | Outcome::Skipped { sub, .. } => *sub,
        };
        let i = *index.entry(sub).or_insert_with(|| {
            folds.push((sub, Fold::default()));
            folds.len() - 1
        });
        let f = &mut folds[i].1;
        match o {
            Outcome::Delivered {
                message,
                at,
                status,
                ..
            } => {
                f.cursor = f.cursor.max(message);
                (f.attempts, f.next_at) = (0, None);
                f.delivered += 1;
                f.success = Some((at.0, status));
            }
            Outcome::Retry {
                attempts,
                at,
                next_at,
                status,
                error,
                ..
            } => {
                (f.attempts, f.next_at) = (attempts, Some(next_at.0));
                f.failure = Some((at.0, status, error));
            }
            Outcome::Failed {
                message,
                attempts,
                at,
                status,
                error,
                ..
            } => {
                f.cursor = f.cursor.max(message);
                (f.attempts, f.next_at) = (0, None);
                f.failed += 1;
                f.failures
                    .push((message, attempts, status, error.clone(), at.0));
                f.failure = Some((at.0, status, error));
            }
            Outcome::Skipped { through, .. } => {
                f.cursor = f.cursor.max(through);
                (f.attempts, f.next_at) = (0, None);
            }
        }
    }
    folds
}

/// A subscription's state as the admin API reports it: expired once the lease is over,
/// failing while the head is in retry or the last attempt failed, else active.
pub(crate) fn sub_state(
    expires_at: i64,
    attempts: u32,
    last_failure_at: Option<i64>,
    last_success_at: Option<i64>,
    now: Timestamp,
) -> SubState {
    if expires_at <= now.0 {
        SubState::Expired
    } else if attempts > 0 || last_failure_at.unwrap_or(0) > last_success_at.unwrap_or(0) {
        SubState::Failing
    } else {
        SubState::Active
    }
}
