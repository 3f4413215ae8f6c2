//! The hub's part of the storage contract: subscriptions, intents awaiting verification,
//! topics, messages and per-subscription delivery queues, kept durable by every backend.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::{NotifyState, StoreError};
use crate::model::websub::{
    Callback, Hold, HubTotals, Intent, Message, MessageId, Outcome, Resolution, Subscription,
    SubscriptionChange, SubscriptionFilter, SubscriptionId, SubscriptionStats, Topic, TopicInfo,
    TopicSummary,
};
use crate::model::Timestamp;

/// A delivery partition's lease as held by this process: the epoch it fences older owners
/// with, and the version of the lease record it was read at (to renew it only if no one
/// else wrote it since). Opaque outside the backend that issued it.
#[derive(Debug, Clone)]
pub struct PartitionLease {
    pub epoch: u64,
    pub(crate) version: LeaseVersion,
}

/// Where a lease record stood when read: a backend's optimistic-concurrency token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseVersion {
    pub seq_no: i64,
    pub primary_term: i64,
}

fn unshared() -> StoreError {
    StoreError::Unavailable("partitions exist on a shared store only".into())
}

/// The hub's part of the storage contract, which every backend fulfils. The calls about
/// sharing (leases, partitions, redelivery requests left for another process) answer for a
/// store no other process uses unless a shared backend overrides them.
#[async_trait::async_trait]
pub trait HubStore: Send + Sync {
    /// Whether several server processes may share this store (then they share delivery by
    /// partition, and one at a time notifies).
    fn is_shared(&self) -> bool {
        false
    }

    /// Takes or renews a lease for `owner`; always held on an unshared store.
    async fn lease(&self, _name: &str, _owner: &str, _secs: u64) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Gives a lease up.
    async fn release(&self, _name: &str, _owner: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// A component's saved state under `key` (JSON text the component owns, such as a
    /// collector's window and counters) with its version; `None` before its first save.
    async fn state(&self, key: &str) -> Result<Option<(String, i64)>, StoreError>;

    /// Saves `json` under `key` if its version is still `expected` (`None`: never saved);
    /// returns the new version, or `None` when another process moved it first.
    async fn save_state(
        &self,
        key: &str,
        json: &str,
        expected: Option<i64>,
    ) -> Result<Option<i64>, StoreError>;

    /// Keeps the other names of collected records (landing pages, persistent identifiers):
    /// each `(alias, identifier)` for collector `collector`, a later write of an alias
    /// replacing an earlier one. One write for the lot.
    async fn put_aliases(
        &self,
        collector: &str,
        aliases: &[(String, String)],
    ) -> Result<(), StoreError>;

    /// The `(collector, OAI identifier)` of the record known as `alias`.
    async fn find_alias(&self, alias: &str) -> Result<Option<(String, String)>, StoreError>;

    /// Records a request awaiting verification (or a denial to send); returns its id.
    async fn hub_add_intent(&self, intent: Intent) -> Result<i64, StoreError>;

    /// Intents not yet resolved (after a restart: verifications to redo).
    async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError>;

    /// Ends an intent; returns the subscription created/updated or removed.
    async fn hub_resolve(
        &self,
        intent: Intent,
        res: Resolution,
    ) -> Result<Option<Subscription>, StoreError>;

    /// Removes a subscription with its queue position and records.
    async fn hub_remove_subscription(&self, id: SubscriptionId) -> Result<(), StoreError>;

    /// Every subscription, expired ones included.
    async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError>;

    /// The subscription of `callback` to `topic`, if any.
    async fn hub_subscription(
        &self,
        topic: &Topic,
        callback: &Callback,
    ) -> Result<Option<Subscription>, StoreError>;

    /// How many subscriptions have a callback starting with `prefix` (`scheme://host/` or
    /// `scheme://host:`: one host's).
    async fn hub_count_callbacks(&self, prefix: &str) -> Result<u64, StoreError>;

    /// Appends messages to the log, each as its topic's latest (one write per message, whatever
    /// the number of subscribers: their queues are the messages after their cursors). With
    /// `state`, a set's notifier state moves from version `.0` to `.1` in the same transaction,
    /// or nothing is written and the answer is [`StoreError::Conflict`].
    async fn hub_publish(
        &self,
        messages: Vec<(Topic, String, Bytes)>,
        state: Option<(i64, NotifyState)>,
        now: Timestamp,
    ) -> Result<Vec<Message>, StoreError>;

    /// Up to `limit` messages after `after`, in number order: of one topic, or of every topic
    /// (`None`), and on the embedded store no more than `max_bytes` of bodies (at least one
    /// message). Lanes read their queues from here a bounded batch at a time.
    async fn hub_messages_after(
        &self,
        topic: Option<&Topic>,
        after: MessageId,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Message>>, StoreError>;

    /// The first and last message numbers of `topic` published in `[since, until)` and not
    /// after `through`, with their count (a redelivery window); `None` when there are none.
    async fn hub_window(
        &self,
        topic: &Topic,
        since: Timestamp,
        until: Timestamp,
        through: MessageId,
    ) -> Result<Option<(MessageId, MessageId, u64)>, StoreError>;

    /// The newest message's number (0 when none).
    async fn hub_last_message(&self) -> Result<MessageId, StoreError>;

    /// Records delivery outcomes: cursors, retry state, counters, failed deliveries. On a
    /// shared store a subscription's record is written only by a writer whose partition epoch
    /// (`epochs`) is not older than the stored one; the answer names those refused (fenced).
    async fn hub_record(
        &self,
        outcomes: Vec<Outcome>,
        epochs: &HashMap<SubscriptionId, u64>,
    ) -> Result<HashSet<SubscriptionId>, StoreError>;

    /// Leaves a redelivery request in the store for the process that delivers the
    /// subscription (shared store only).
    async fn hub_leave_redelivery(
        &self,
        _sub: SubscriptionId,
        _after: MessageId,
        _through: MessageId,
    ) -> Result<(), StoreError> {
        Err(unshared())
    }

    /// Redelivery requests left: (request, subscription, after, through).
    async fn hub_redeliveries(
        &self,
    ) -> Result<Vec<(i64, SubscriptionId, MessageId, MessageId)>, StoreError> {
        Ok(vec![])
    }

    /// Marks a redelivery request taken (it is not left for anyone else).
    async fn hub_redelivery_taken(&self, _request: i64) -> Result<(), StoreError> {
        Ok(())
    }

    /// Sharded delivery (shared store only; see [`super::elastic`]): the partition count fixed
    /// in the store.
    async fn partition_count(&self, _wanted: u32) -> Result<u32, StoreError> {
        Ok(1)
    }

    /// Announces this process alive; returns the processes alive (shared store only).
    async fn heartbeat(&self, owner: &str, _secs: u64) -> Result<Vec<String>, StoreError> {
        Ok(vec![owner.to_string()])
    }

    /// Takes a delivery partition no one holds, with the next epoch.
    async fn take_partition(
        &self,
        _p: u32,
        _owner: &str,
        _secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        Err(unshared())
    }

    /// Renews a held partition; `None` when it was lost.
    async fn renew_partition(
        &self,
        _p: u32,
        _lease: &PartitionLease,
        _owner: &str,
        _secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        Err(unshared())
    }

    /// Gives a partition up at once (its lanes have stopped and their outcomes are written).
    async fn release_partition(&self, _p: u32, _lease: &PartitionLease) -> Result<(), StoreError> {
        Err(unshared())
    }

    /// Stamps new owners' epochs on partitions' subscriptions (fencing the old owners).
    async fn fence(&self, _taken: &[(u32, u64)], _count: u32) -> Result<(), StoreError> {
        Err(unshared())
    }

    /// Makes a topic known before anything is published to it.
    async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError>;

    /// What is known of one topic; `None` when nothing is.
    async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError>;

    /// Drops history older than `before` that nothing needs any more.
    async fn hub_prune(&self, before: Timestamp, now: Timestamp) -> Result<u64, StoreError>;

    /// One page of subscriptions with their delivery record (admin).
    async fn hub_list(
        &self,
        filter: SubscriptionFilter,
        now: Timestamp,
    ) -> Result<Vec<(Subscription, SubscriptionStats)>, StoreError>;

    /// One subscription with its delivery record (admin).
    async fn hub_detail(
        &self,
        id: SubscriptionId,
        now: Timestamp,
    ) -> Result<Option<(Subscription, SubscriptionStats)>, StoreError>;

    /// Every topic known (published to, registered, or subscribed to).
    async fn hub_topics(&self) -> Result<Vec<TopicSummary>, StoreError>;

    /// Holds a subscription's deliveries (`Some`) or lets them go on (`None`, which also starts
    /// its run of failures afresh, so an enabled subscription gets a whole disable period).
    /// With `only_if_unheld`, a held subscription is left as it is (a disable never overrides a
    /// pause). Returns the subscription as it now stands; `None` when there is none.
    async fn hub_hold(
        &self,
        id: SubscriptionId,
        hold: Option<Hold>,
        only_if_unheld: bool,
    ) -> Result<Option<Subscription>, StoreError>;

    /// Changes an admin's settings of a subscription (its rate limit, its delivery auth).
    /// Returns the subscription as it now stands; `None` when there is none.
    async fn hub_change(
        &self,
        id: SubscriptionId,
        change: SubscriptionChange,
    ) -> Result<Option<Subscription>, StoreError>;

    /// Removes a subscription's failure records, returning their messages (to try again).
    async fn hub_take_failures(&self, id: SubscriptionId) -> Result<Vec<Arc<Message>>, StoreError>;

    /// Counts over every subscription and message (metrics, admin).
    async fn hub_totals(&self, now: Timestamp) -> Result<HubTotals, StoreError>;
}
