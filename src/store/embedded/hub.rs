//! The hub's tables in the embedded store: intents, subscriptions, topics, messages and the
//! per-subscription delivery queue. Publishing writes the message and one pending delivery per
//! live subscription in one transaction, so a crash after the publisher got its answer can
//! only lead to a delivery made twice, never to one not made.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::EmbeddedStore;
use crate::hub::model::{
    Callback, DeliveryId, Intent, IntentMode, Message, Outcome, PendingDelivery, Resolution, Subscription,
    SubscriptionId, Topic, TopicInfo,
};
use crate::hub::SignatureAlg;
use crate::model::Timestamp;
use crate::store::StoreError;

const SUB_COLS: &str =
    "id, topic, callback, secret, alg, lease_secs, lease_start, expires_at, verified_at, created_at";

fn alg_from(s: String) -> rusqlite::Result<SignatureAlg> {
    SignatureAlg::parse(&s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, format!("bad alg {s}").into())
    })
}

fn sub_from_row(r: &Row) -> rusqlite::Result<Subscription> {
    Ok(Subscription {
        id: r.get(0)?,
        topic: Topic::from_stored(r.get(1)?),
        callback: Callback::from_stored(r.get(2)?),
        secret: r.get(3)?,
        alg: alg_from(r.get(4)?)?,
        lease_secs: r.get::<_, i64>(5)? as u64,
        lease_start: Timestamp(r.get(6)?),
        expires_at: Timestamp(r.get(7)?),
        verified_at: Timestamp(r.get(8)?),
        created_at: Timestamp(r.get(9)?),
    })
}

fn message_from_row(r: &Row) -> rusqlite::Result<Message> {
    Ok(Message {
        id: r.get(0)?,
        topic: Topic::from_stored(r.get(1)?),
        content_type: r.get(2)?,
        body: Bytes::from(r.get::<_, Vec<u8>>(3)?),
        published_at: Timestamp(r.get(4)?),
    })
}

fn cancel_pending(tx: &rusqlite::Transaction, sub: SubscriptionId, now: Timestamp) -> rusqlite::Result<usize> {
    tx.execute(
        "UPDATE hub_deliveries SET state = 'cancelled', finished_at = ?2 WHERE subscription_id = ?1 AND state = 'pending'",
        params![sub, now.0],
    )
}

impl EmbeddedStore {
    pub async fn hub_add_intent(&self, i: Intent) -> Result<i64, StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT INTO hub_intents (mode, topic, callback, lease_secs, secret, alg, reason, requested_at, verify_token)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    i.mode.as_str(),
                    i.topic.as_str(),
                    i.callback.as_str(),
                    i.lease_secs as i64,
                    i.secret,
                    i.alg.as_str(),
                    i.reason,
                    i.requested_at.0,
                    i.verify_token
                ],
            )?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    pub async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT id, mode, topic, callback, lease_secs, secret, alg, reason, requested_at, verify_token
                 FROM hub_intents ORDER BY id",
            )?;
            let rows = st.query_map([], |r| {
                let mode: String = r.get(1)?;
                Ok(Intent {
                    id: r.get(0)?,
                    mode: IntentMode::parse(&mode).unwrap_or(IntentMode::Denied),
                    topic: Topic::from_stored(r.get(2)?),
                    callback: Callback::from_stored(r.get(3)?),
                    lease_secs: r.get::<_, i64>(4)? as u64,
                    secret: r.get(5)?,
                    alg: alg_from(r.get(6)?)?,
                    reason: r.get(7)?,
                    requested_at: Timestamp(r.get(8)?),
                    verify_token: r.get(9)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Ends an intent. Returns the subscription created or updated (subscribe) or removed
    /// (unsubscribe), if any.
    pub async fn hub_resolve(&self, intent: Intent, res: Resolution) -> Result<Option<Subscription>, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM hub_intents WHERE id = ?1", [intent.id])?;
            let out = match res {
                Resolution::Dropped => None,
                Resolution::Subscribed { verified_at } => {
                    let expires = verified_at.plus_secs(intent.lease_secs);
                    let sub = tx.query_row(
                        &format!(
                            "INSERT INTO hub_subscriptions
                               (topic, callback, secret, alg, lease_secs, lease_start, expires_at, verified_at, created_at)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6, ?6)
                             ON CONFLICT (topic, callback) DO UPDATE SET
                               secret = excluded.secret, alg = excluded.alg, lease_secs = excluded.lease_secs,
                               lease_start = excluded.lease_start, expires_at = excluded.expires_at,
                               verified_at = excluded.verified_at
                             RETURNING {SUB_COLS}"
                        ),
                        params![
                            intent.topic.as_str(),
                            intent.callback.as_str(),
                            intent.secret,
                            intent.alg.as_str(),
                            intent.lease_secs as i64,
                            verified_at.0,
                            expires.0
                        ],
                        sub_from_row,
                    )?;
                    Some(sub)
                }
                Resolution::Unsubscribed => {
                    let sub = tx
                        .query_row(
                            &format!("SELECT {SUB_COLS} FROM hub_subscriptions WHERE topic = ?1 AND callback = ?2"),
                            params![intent.topic.as_str(), intent.callback.as_str()],
                            sub_from_row,
                        )
                        .optional()?;
                    if let Some(s) = &sub {
                        tx.execute("DELETE FROM hub_subscriptions WHERE id = ?1", [s.id])?;
                        cancel_pending(&tx, s.id, Timestamp::now())?;
                    }
                    sub
                }
            };
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    /// Removes a subscription (the subscriber answered 410 Gone) and cancels its deliveries.
    pub async fn hub_remove_subscription(&self, id: SubscriptionId, now: Timestamp) -> Result<(), StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM hub_subscriptions WHERE id = ?1", [id])?;
            cancel_pending(&tx, id, now)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare(&format!("SELECT {SUB_COLS} FROM hub_subscriptions ORDER BY id"))?;
            let rows = st.query_map([], sub_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn hub_subscription(&self, topic: &Topic, callback: &Callback) -> Result<Option<Subscription>, StoreError> {
        let (t, cb) = (topic.as_str().to_string(), callback.as_str().to_string());
        self.read(move |c| {
            Ok(c.query_row(
                &format!("SELECT {SUB_COLS} FROM hub_subscriptions WHERE topic = ?1 AND callback = ?2"),
                params![t, cb],
                sub_from_row,
            )
            .optional()?)
        })
        .await
    }

    /// Stores a message as the topic's latest and queues it for every subscription whose
    /// lease has not ended. Returns the message and `(subscription, delivery)` pairs.
    pub async fn hub_publish(
        &self,
        topic: Topic,
        content_type: String,
        body: Bytes,
        now: Timestamp,
    ) -> Result<(Message, Vec<(SubscriptionId, DeliveryId)>), StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO hub_messages (topic, content_type, body, published_at) VALUES (?1, ?2, ?3, ?4)",
                params![topic.as_str(), content_type, &body[..], now.0],
            )?;
            let id = tx.last_insert_rowid();
            tx.execute(
                "INSERT INTO hub_topics (topic, last_message, published_at, created_at) VALUES (?1, ?2, ?3, ?3)
                 ON CONFLICT (topic) DO UPDATE SET last_message = excluded.last_message, published_at = excluded.published_at",
                params![topic.as_str(), id, now.0],
            )?;
            let deliveries = {
                let mut st = tx.prepare(
                    "INSERT INTO hub_deliveries (subscription_id, message_id, state, attempts, created_at)
                     SELECT id, ?1, 'pending', 0, ?2 FROM hub_subscriptions WHERE topic = ?3 AND expires_at > ?2
                     ORDER BY id
                     RETURNING subscription_id, id",
                )?;
                let rows = st.query_map(params![id, now.0, topic.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<Result<Vec<(i64, i64)>, _>>()?
            };
            tx.commit()?;
            Ok((Message { id, topic, content_type, body, published_at: now }, deliveries))
        })
        .await
    }

    /// Every pending delivery of an existing subscription, per subscription in queue order.
    pub async fn hub_pending(&self) -> Result<Vec<PendingDelivery>, StoreError> {
        self.read(|c| {
            let mut messages: HashMap<i64, Arc<Message>> = HashMap::new();
            let mut st = c.prepare(
                "SELECT id, topic, content_type, body, published_at FROM hub_messages
                 WHERE id IN (SELECT message_id FROM hub_deliveries WHERE state = 'pending')",
            )?;
            for m in st.query_map([], message_from_row)? {
                let m = m?;
                messages.insert(m.id, Arc::new(m));
            }
            let mut st = c.prepare(
                "SELECT d.id, d.subscription_id, d.message_id, d.attempts, d.next_attempt_at
                 FROM hub_deliveries d JOIN hub_subscriptions s ON s.id = d.subscription_id
                 WHERE d.state = 'pending' ORDER BY d.subscription_id, d.id",
            )?;
            let rows = st.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?, r.get::<_, Option<i64>>(4)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, sub, msg, attempts, next) = row?;
                let message = messages
                    .get(&msg)
                    .cloned()
                    .ok_or_else(|| StoreError::Corrupt(format!("delivery {id} refers to missing message {msg}")))?;
                out.push(PendingDelivery {
                    id,
                    subscription_id: sub,
                    message,
                    attempts: attempts as u32,
                    not_before: next.map(Timestamp),
                });
            }
            Ok(out)
        })
        .await
    }

    /// Records a batch of delivery outcomes in one transaction.
    pub async fn hub_record(&self, outcomes: Vec<Outcome>) -> Result<(), StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut done = tx.prepare(
                    "UPDATE hub_deliveries SET state = ?2, attempts = coalesce(?3, attempts), last_status = ?4,
                       last_error = ?5, finished_at = ?6, next_attempt_at = NULL
                     WHERE id = ?1 AND state = 'pending'",
                )?;
                let mut retry = tx.prepare(
                    "UPDATE hub_deliveries SET attempts = ?2, next_attempt_at = ?3, last_status = ?4, last_error = ?5
                     WHERE id = ?1 AND state = 'pending'",
                )?;
                for o in &outcomes {
                    match o {
                        Outcome::Delivered { id, attempts, at, status } => {
                            done.execute(params![id, "delivered", attempts, status, Option::<String>::None, at.0])?;
                        }
                        Outcome::Retry { id, attempts, next_at, status, error } => {
                            retry.execute(params![id, attempts, next_at.0, status, error])?;
                        }
                        Outcome::Failed { id, attempts, at, status, error } => {
                            done.execute(params![id, "failed", attempts, status, error, at.0])?;
                        }
                        Outcome::Expired { id, at } => {
                            done.execute(params![id, "expired", Option::<u32>::None, Option::<u16>::None, "lease expired", at.0])?;
                        }
                    }
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Makes a topic known (so its URI answers) without publishing to it.
    pub async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT INTO hub_topics (topic, created_at) VALUES (?1, ?2) ON CONFLICT (topic) DO NOTHING",
                params![topic.as_str(), now.0],
            )?;
            Ok(())
        })
        .await
    }

    /// A topic known to the hub (registered, published to, or subscribed to).
    pub async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
        let t = topic.clone();
        self.read(move |c| {
            let last: Option<Option<i64>> = c
                .query_row("SELECT last_message FROM hub_topics WHERE topic = ?1", [t.as_str()], |r| r.get(0))
                .optional()?;
            let subscribers: i64 =
                c.query_row("SELECT count(*) FROM hub_subscriptions WHERE topic = ?1", [t.as_str()], |r| r.get(0))?;
            if last.is_none() && subscribers == 0 {
                return Ok(None);
            }
            let latest = match last.flatten() {
                Some(id) => c
                    .query_row(
                        "SELECT id, topic, content_type, body, published_at FROM hub_messages WHERE id = ?1",
                        [id],
                        message_from_row,
                    )
                    .optional()?,
                None => None,
            };
            Ok(Some(TopicInfo { topic: t, latest, subscribers: subscribers as u64 }))
        })
        .await
    }

    /// Removes finished deliveries and unreferenced messages older than `before`.
    pub async fn hub_prune(&self, before: Timestamp) -> Result<u64, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "DELETE FROM hub_deliveries WHERE state <> 'pending' AND finished_at < ?1",
                [before.0],
            )?;
            tx.execute(
                "DELETE FROM hub_messages WHERE published_at < ?1
                   AND NOT EXISTS (SELECT 1 FROM hub_deliveries d WHERE d.message_id = hub_messages.id)
                   AND id NOT IN (SELECT last_message FROM hub_topics WHERE last_message IS NOT NULL)",
                [before.0],
            )?;
            tx.commit()?;
            Ok(n as u64)
        })
        .await
    }
}
