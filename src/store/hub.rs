//! The hub's part of the storage contract: subscriptions, intents awaiting verification,
//! topics, messages and per-subscription delivery queues, kept durable by every backend.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::{elastic, NotifyState, Store, StoreError};
use crate::hub::model::{
    Callback, HubTotals, Intent, Message, Outcome, Resolution, Subscription, SubscriptionFilter, SubscriptionId,
    SubscriptionStats, Topic, TopicInfo, TopicSummary,
};
use crate::model::Timestamp;

impl Store {
    /// Records a request awaiting verification (or a denial to send); returns its id.
    pub async fn hub_add_intent(&self, intent: Intent) -> Result<i64, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_add_intent(intent).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_add_intent")),
        }
    }

    /// Intents not yet resolved (after a restart: verifications to redo).
    pub async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_intents().await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_intents")),
        }
    }

    /// Ends an intent; returns the subscription created/updated or removed.
    pub async fn hub_resolve(&self, intent: Intent, res: Resolution) -> Result<Option<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_resolve(intent, res).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_resolve")),
        }
    }

    pub async fn hub_remove_subscription(&self, id: SubscriptionId) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_remove_subscription(id).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_remove_subscription")),
        }
    }

    /// Every subscription, expired ones included.
    pub async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_subscriptions().await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_subscriptions")),
        }
    }

    pub async fn hub_subscription(&self, topic: &Topic, callback: &Callback) -> Result<Option<Subscription>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_subscription(topic, callback).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_subscription")),
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
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_publish")),
        }
    }

    /// Every subscription's queue: its topic's messages after its cursor, in order.
    pub async fn hub_backlog(&self) -> Result<HashMap<SubscriptionId, Vec<Arc<Message>>>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_backlog().await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_backlog")),
        }
    }

    /// Records delivery outcomes: cursors, retry state, counters, failed deliveries.
    pub async fn hub_record(&self, outcomes: Vec<Outcome>) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_record(outcomes).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_record")),
        }
    }

    pub async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.hub_register_topic(topic, now).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_register_topic")),
        }
    }

    pub async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_topic(topic).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_topic")),
        }
    }

    /// Drops history older than `before` that nothing needs any more.
    pub async fn hub_prune(&self, before: Timestamp, now: Timestamp) -> Result<u64, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_prune(before, now).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_prune")),
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
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_list")),
        }
    }

    pub async fn hub_detail(
        &self,
        id: SubscriptionId,
        now: Timestamp,
    ) -> Result<Option<(Subscription, SubscriptionStats)>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_detail(id, now).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_detail")),
        }
    }

    /// Every topic known (published to, registered, or subscribed to).
    pub async fn hub_topics(&self) -> Result<Vec<TopicSummary>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_topics().await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_topics")),
        }
    }

    /// Removes a subscription's failure records, returning their messages (to try again).
    pub async fn hub_take_failures(&self, id: SubscriptionId) -> Result<Vec<Arc<Message>>, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_take_failures(id).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_take_failures")),
        }
    }

    pub async fn hub_totals(&self, now: Timestamp) -> Result<HubTotals, StoreError> {
        match self {
            Store::Embedded(s) => s.hub_totals(now).await,
            Store::Elasticsearch(_) => Err(elastic::not_built("hub_totals")),
        }
    }
}
