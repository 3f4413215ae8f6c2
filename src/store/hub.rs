//! The hub's part of the storage contract: subscriptions, intents awaiting verification,
//! topics, messages and per-subscription delivery queues, kept durable by every backend.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::{NotifyState, Store, StoreError};
use crate::model::websub::{
    Callback, HubTotals, Intent, Message, MessageId, Outcome, Resolution, Subscription,
    SubscriptionFilter, SubscriptionId, SubscriptionStats, Topic, TopicInfo, TopicSummary,
};
use crate::model::Timestamp;
use crate::store::elastic::PartitionLease;

fn unshared() -> StoreError {
    StoreError::Unavailable("partitions exist on a shared store only".into())
}

impl Store {
    /// Whether several server processes may share this store (then they share delivery by
    /// partition, and one at a time notifies).
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
    /// embedded store has none): the change documents adopted, and how long the oldest
    /// document not yet adopted has waited.
    pub async fn adopt_external(
        &self,
        rules: &dyn super::SetRules,
    ) -> Result<crate::store::elastic::Adoption, StoreError> {
        match self {
            Store::Embedded(_) => Ok(Default::default()),
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

    /// The first and last message numbers of `topic` published in `[since, until)` and not
    /// after `through`, with their count (a redelivery window); `None` when there are none.
    pub async fn hub_window(
        &self,
        topic: &Topic,
        since: Timestamp,
        until: Timestamp,
        through: MessageId,
    ) -> Result<Option<(MessageId, MessageId, u64)>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_window(topic, since, until, through).await,
            Store::Elasticsearch(s) => s.hub_window(topic, since, until, through).await,
        }
    }

    /// The newest message's number (0 when none).
    pub async fn hub_last_message(&self) -> Result<MessageId, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_last_message().await,
            Store::Elasticsearch(s) => s.hub_max_seq().await,
        }
    }

    /// Records delivery outcomes: cursors, retry state, counters, failed deliveries. On a
    /// shared store a subscription's record is written only by a writer whose partition epoch
    /// (`epochs`) is not older than the stored one; the answer names those refused (fenced).
    pub async fn hub_record(
        &self,
        outcomes: Vec<Outcome>,
        epochs: &HashMap<SubscriptionId, u64>,
    ) -> Result<HashSet<SubscriptionId>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_record(outcomes).await.map(|()| HashSet::new()),
            Store::Elasticsearch(s) => s.hub_record(outcomes, epochs).await,
        }
    }

    /// Leaves a redelivery request in the store for the process that delivers the
    /// subscription (shared store only).
    pub async fn hub_leave_redelivery(
        &self,
        sub: SubscriptionId,
        after: MessageId,
        through: MessageId,
    ) -> Result<(), StoreError> {
        match self {
            Store::Embedded(_) => Err(unshared()),
            Store::Elasticsearch(s) => s.hub_leave_redelivery(sub, after, through).await,
        }
    }

    /// Redelivery requests left: (request, subscription, after, through).
    pub async fn hub_redeliveries(
        &self,
    ) -> Result<Vec<(i64, SubscriptionId, MessageId, MessageId)>, StoreError> {
        match self {
            Store::Embedded(_) => Ok(vec![]),
            Store::Elasticsearch(s) => s.hub_redeliveries().await,
        }
    }

    pub async fn hub_redelivery_taken(&self, request: i64) -> Result<(), StoreError> {
        match self {
            Store::Embedded(_) => Ok(()),
            Store::Elasticsearch(s) => s.hub_redelivery_taken(request).await,
        }
    }

    /// Sharded delivery (shared store only; see [`super::elastic`]): the partition count fixed
    /// in the store.
    pub async fn partition_count(&self, wanted: u32) -> Result<u32, StoreError> {
        match self {
            Store::Embedded(_) => Ok(1),
            Store::Elasticsearch(s) => s.partition_count(wanted).await,
        }
    }

    /// Announces this process alive; returns the processes alive (shared store only).
    pub async fn heartbeat(&self, owner: &str, secs: u64) -> Result<Vec<String>, StoreError> {
        match self {
            Store::Embedded(_) => Ok(vec![owner.to_string()]),
            Store::Elasticsearch(s) => s.heartbeat(owner, secs).await,
        }
    }

    /// Takes a delivery partition no one holds, with the next epoch.
    pub async fn take_partition(
        &self,
        p: u32,
        owner: &str,
        secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        match self {
            Store::Embedded(_) => Err(unshared()),
            Store::Elasticsearch(s) => s.take_partition(p, owner, secs).await,
        }
    }

    /// Renews a held partition; `None` when it was lost.
    pub async fn renew_partition(
        &self,
        p: u32,
        lease: &PartitionLease,
        owner: &str,
        secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        match self {
            Store::Embedded(_) => Err(unshared()),
            Store::Elasticsearch(s) => s.renew_partition(p, lease, owner, secs).await,
        }
    }

    pub async fn release_partition(
        &self,
        p: u32,
        lease: &PartitionLease,
    ) -> Result<(), StoreError> {
        match self {
            Store::Embedded(_) => Err(unshared()),
            Store::Elasticsearch(s) => s.release_partition(p, lease).await,
        }
    }

    /// Stamps new owners' epochs on partitions' subscriptions (fencing the old owners).
    pub async fn fence(&self, taken: &[(u32, u64)], count: u32) -> Result<(), StoreError> {
        match self {
            Store::Embedded(_) => Err(unshared()),
            Store::Elasticsearch(s) => s.fence(taken, count).await,
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
