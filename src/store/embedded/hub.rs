//! The hub's tables in the embedded store: intents, subscriptions (with their queue cursor and
//! retry state), topics, the message log, and failed deliveries. Publishing appends one
//! message, whatever the number of subscribers; a subscription's queue is the topic's messages
//! after its cursor, so a crash after the publisher got its answer can only lead to a delivery
//! made twice, never to one not made.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::EmbeddedStore;
use crate::model::websub::SignatureAlg;
use crate::model::websub::{
    Callback, Hold, HoldReason, HubTotals, Intent, IntentMode, Message, MessageId, Outcome,
    Resolution, SubState, Subscription, SubscriptionChange, SubscriptionFilter, SubscriptionId,
    SubscriptionStats, Topic, TopicInfo, TopicSummary,
};
use crate::model::Timestamp;
use crate::store::{HubStore, NotifyState, StoreError};

const SUB_COLS: &str =
    "id, topic, callback, secret, alg, lease_secs, lease_start, expires_at, verified_at, \
     created_at, cursor, attempts, next_attempt_at, topic_given, callback_given, \
     previous_secret, previous_until, failing_since, held_reason, held_at, max_per_sec, delivery_auth";

/// How many columns [`SUB_COLS`] has (a listing's own columns follow).
const SUB_N: usize = 22;

fn alg_from(s: String) -> rusqlite::Result<SignatureAlg> {
    SignatureAlg::parse(&s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("bad alg {s}").into(),
        )
    })
}

fn sub_from_row(r: &Row) -> rusqlite::Result<Subscription> {
    Ok(Subscription {
        id: r.get(0)?,
        topic: Topic::from_stored_given(r.get(1)?, r.get(13)?),
        callback: Callback::from_stored_given(r.get(2)?, r.get(14)?),
        secret: r.get(3)?,
        previous_secret: match (
            r.get::<_, Option<String>>(15)?,
            r.get::<_, Option<i64>>(16)?,
        ) {
            (Some(s), Some(until)) => Some((s, Timestamp(until))),
            _ => None,
        },
        alg: alg_from(r.get(4)?)?,
        lease_secs: r.get::<_, i64>(5)? as u64,
        lease_start: Timestamp(r.get(6)?),
        expires_at: Timestamp(r.get(7)?),
        verified_at: Timestamp(r.get(8)?),
        created_at: Timestamp(r.get(9)?),
        cursor: r.get(10)?,
        attempts: r.get::<_, i64>(11)? as u32,
        next_attempt_at: r.get::<_, Option<i64>>(12)?.map(Timestamp),
        failing_since: r.get::<_, Option<i64>>(17)?.map(Timestamp),
        held: match (
            r.get::<_, Option<String>>(18)?,
            r.get::<_, Option<i64>>(19)?,
        ) {
            (Some(reason), Some(since)) => Some(Hold {
                reason: HoldReason::parse(&reason).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(
                        18,
                        rusqlite::types::Type::Text,
                        format!("bad held_reason {reason}").into(),
                    )
                })?,
                since: Timestamp(since),
            }),
            _ => None,
        },
        max_per_sec: r.get(20)?,
        auth: match r.get::<_, Option<String>>(21)? {
            Some(json) => Some(serde_json::from_str(&json).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(21, rusqlite::types::Type::Text, e.into())
            })?),
            None => None,
        },
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

fn delete_subscription(tx: &rusqlite::Transaction, sub: SubscriptionId) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM hub_subscriptions WHERE id = ?1", [sub])?;
    tx.execute("DELETE FROM hub_failures WHERE subscription_id = ?1", [sub])?;
    Ok(())
}

fn record_tx(
    c: &mut rusqlite::Connection,
    folds: &[(
        crate::model::websub::SubscriptionId,
        crate::store::rules::Fold,
    )],
) -> Result<(), StoreError> {
    {
        {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut up = tx.prepare_cached(
                    "UPDATE hub_subscriptions SET cursor = max(cursor, ?2), attempts = ?3, next_attempt_at = ?4,
                       delivered = delivered + ?5, failed = failed + ?6,
                       last_success_at = coalesce(?7, last_success_at),
                       last_success_status = coalesce(?8, last_success_status),
                       last_failure_at = coalesce(?9, last_failure_at),
                       last_failure_status = CASE WHEN ?9 IS NULL THEN last_failure_status ELSE ?10 END,
                       last_failure_error = coalesce(?11, last_failure_error),
                       failing_since = CASE WHEN ?12 THEN ?13 ELSE coalesce(failing_since, ?13) END
                     WHERE id = ?1",
                )?;
                let mut fail = tx.prepare_cached(
                    "INSERT INTO hub_failures (subscription_id, message_id, attempts, status, error, at)
                     SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM hub_subscriptions WHERE id = ?1)",
                )?;
                for (sub, f) in folds {
                    let (fat, fstatus, ferr) = match &f.failure {
                        Some((at, st, e)) => (Some(*at), *st, Some(e.as_str())),
                        None => (None, None, None),
                    };
                    up.execute(params![
                        sub,
                        f.cursor,
                        f.attempts,
                        f.next_at,
                        f.delivered,
                        f.failed,
                        f.success.map(|s| s.0),
                        f.success.map(|s| s.1),
                        fat,
                        fstatus,
                        ferr,
                        f.streak.reset,
                        f.streak.first_failure
                    ])?;
                    for (msg, attempts, status, error, at) in &f.failures {
                        fail.execute(params![sub, msg, attempts, status, error, at])?;
                    }
                }
            }
            tx.commit()?;
            Ok(())
        }
    }
}

/// A subscription's state; `?6` is now.
const STATE_SQL: &str = "(CASE WHEN s.expires_at <= ?6 THEN 'expired' \
     WHEN s.held_reason IS NOT NULL THEN s.held_reason \
     WHEN s.attempts > 0 OR coalesce(s.last_failure_at, 0) > coalesce(s.last_success_at, 0) THEN 'failing' \
     ELSE 'active' END)";

/// Columns SUB_N.. of a listing (after SUB_COLS): counters, last success/failure, queue depth,
/// state.
fn stats_cols() -> String {
    format!(
        "s.delivered, s.failed, s.last_success_at, s.last_success_status, s.last_failure_at, \
         s.last_failure_status, s.last_failure_error, \
         (SELECT count(*) FROM hub_messages m WHERE m.topic = s.topic AND m.id > s.cursor), {STATE_SQL}"
    )
}

fn stats_from_row(r: &Row) -> rusqlite::Result<SubscriptionStats> {
    let state: String = r.get(SUB_N + 8)?;
    Ok(SubscriptionStats {
        state: Some(match state.as_str() {
            "expired" => SubState::Expired,
            "failing" => SubState::Failing,
            "paused" => SubState::Paused,
            "disabled" => SubState::Disabled,
            _ => SubState::Active,
        }),
        delivered: r.get::<_, i64>(SUB_N)? as u64,
        failed: r.get::<_, i64>(SUB_N + 1)? as u64,
        last_success_at: r.get::<_, Option<i64>>(SUB_N + 2)?.map(Timestamp),
        last_success_status: r.get(SUB_N + 3)?,
        last_failure_at: r.get::<_, Option<i64>>(SUB_N + 4)?.map(Timestamp),
        last_failure_status: r.get(SUB_N + 5)?,
        last_failure_error: r.get(SUB_N + 6)?,
        pending: r.get::<_, i64>(SUB_N + 7)? as u64,
    })
}

#[async_trait::async_trait]
impl HubStore for EmbeddedStore {
    async fn state(&self, key: &str) -> Result<Option<(String, i64)>, StoreError> {
        let key = key.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT json, version FROM saved_state WHERE key = ?1",
                [key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn save_state(
        &self,
        key: &str,
        json: &str,
        expected: Option<i64>,
    ) -> Result<Option<i64>, StoreError> {
        let (key, json) = (key.to_string(), json.to_string());
        self.write(move |c| {
            let n = match expected {
                None => c.execute(
                    "INSERT OR IGNORE INTO saved_state (key, json, version) VALUES (?1, ?2, 1)",
                    params![key, json],
                )?,
                Some(v) => c.execute(
                    "UPDATE saved_state SET json = ?2, version = version + 1 WHERE key = ?1 AND version = ?3",
                    params![key, json, v],
                )?,
            };
            Ok((n == 1).then(|| expected.map_or(1, |v| v + 1)))
        })
        .await
    }

    async fn put_aliases(
        &self,
        collector: &str,
        aliases: &[(String, String)],
    ) -> Result<(), StoreError> {
        if aliases.is_empty() {
            return Ok(());
        }
        let (collector, aliases) = (collector.to_string(), aliases.to_vec());
        self.write(move |c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT OR REPLACE INTO aliases (alias, collector, identifier) VALUES (?1, ?2, ?3)",
                )?;
                for (alias, identifier) in &aliases {
                    st.execute(params![alias, collector, identifier])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn find_alias(&self, alias: &str) -> Result<Option<(String, String)>, StoreError> {
        let alias = alias.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT collector, identifier FROM aliases WHERE alias = ?1",
                [alias],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn hub_add_intent(&self, i: Intent) -> Result<i64, StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT INTO hub_intents (mode, topic, callback, lease_secs, secret, alg, reason, requested_at, verify_token,
                                          topic_given, callback_given)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    i.mode.as_str(),
                    i.topic.as_str(),
                    i.callback.as_str(),
                    i.lease_secs as i64,
                    i.secret,
                    i.alg.as_str(),
                    i.reason,
                    i.requested_at.0,
                    i.verify_token,
                    i.topic.given(),
                    i.callback.given()
                ],
            )?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT id, mode, topic, callback, lease_secs, secret, alg, reason, requested_at, verify_token,
                        topic_given, callback_given
                 FROM hub_intents ORDER BY id",
            )?;
            let rows = st.query_map([], |r| {
                let mode: String = r.get(1)?;
                Ok(Intent {
                    id: r.get(0)?,
                    mode: IntentMode::parse(&mode).unwrap_or(IntentMode::Denied),
                    topic: Topic::from_stored_given(r.get(2)?, r.get(10)?),
                    callback: Callback::from_stored_given(r.get(3)?, r.get(11)?),
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
    async fn hub_resolve(
        &self,
        intent: Intent,
        res: Resolution,
    ) -> Result<Option<Subscription>, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM hub_intents WHERE id = ?1", [intent.id])?;
            let out = match res {
                Resolution::Dropped => None,
                Resolution::Subscribed {
                    verified_at,
                    keep_old_secret_until,
                } => {
                    let expires = verified_at.plus_secs(intent.lease_secs);
                    // A new subscription starts after the newest message; a renewal of one whose
                    // lease had ended skips what was published meanwhile.
                    let sub = tx.query_row(
                        &format!(
                            "INSERT INTO hub_subscriptions
                               (topic, callback, secret, alg, lease_secs, lease_start, expires_at, verified_at, created_at, cursor,
                                topic_given, callback_given)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6, ?6, (SELECT coalesce(max(id), 0) FROM hub_messages), ?8, ?9)
                             ON CONFLICT (topic, callback) DO UPDATE SET
                               topic_given = excluded.topic_given, callback_given = excluded.callback_given,
                               previous_secret = CASE
                                 WHEN hub_subscriptions.secret IS NOT NULL AND hub_subscriptions.secret IS NOT excluded.secret
                                 THEN hub_subscriptions.secret ELSE hub_subscriptions.previous_secret END,
                               previous_until = CASE
                                 WHEN hub_subscriptions.secret IS NOT NULL AND hub_subscriptions.secret IS NOT excluded.secret
                                 THEN ?10 ELSE hub_subscriptions.previous_until END,
                               secret = excluded.secret, alg = excluded.alg, lease_secs = excluded.lease_secs,
                               lease_start = excluded.lease_start, expires_at = excluded.expires_at,
                               verified_at = excluded.verified_at,
                               cursor = CASE WHEN hub_subscriptions.expires_at <= excluded.verified_at
                                        THEN max(hub_subscriptions.cursor, excluded.cursor)
                                        ELSE hub_subscriptions.cursor END
                             RETURNING {SUB_COLS}"
                        ),
                        params![
                            intent.topic.as_str(),
                            intent.callback.as_str(),
                            intent.secret,
                            intent.alg.as_str(),
                            intent.lease_secs as i64,
                            verified_at.0,
                            expires.0,
                            intent.topic.given(),
                            intent.callback.given(),
                            keep_old_secret_until.0
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
                        delete_subscription(&tx, s.id)?;
                    }
                    sub
                }
            };
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    /// Removes a subscription (the subscriber answered 410 Gone) and its failure records.
    async fn hub_remove_subscription(&self, id: SubscriptionId) -> Result<(), StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            delete_subscription(&tx, id)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {SUB_COLS} FROM hub_subscriptions ORDER BY id"
            ))?;
            let rows = st.query_map([], sub_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn hub_subscription(
        &self,
        topic: &Topic,
        callback: &Callback,
    ) -> Result<Option<Subscription>, StoreError> {
        let (t, cb) = (topic.as_str().to_string(), callback.as_str().to_string());
        self.read(move |c| {
            Ok(c.query_row(
                &format!(
                    "SELECT {SUB_COLS} FROM hub_subscriptions WHERE topic = ?1 AND callback = ?2"
                ),
                params![t, cb],
                sub_from_row,
            )
            .optional()?)
        })
        .await
    }

    async fn hub_count_callbacks(&self, prefix: &str) -> Result<u64, StoreError> {
        let prefix = prefix.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT count(*) FROM hub_subscriptions WHERE substr(callback, 1, length(?1)) = ?1",
                [prefix],
                |r| r.get::<_, i64>(0),
            )? as u64)
        })
        .await
    }

    /// Appends messages to the log (each its topic's latest), and, when given, moves a set's
    /// notifier state from version `expected` to `state` in the same transaction.
    async fn hub_publish(
        &self,
        messages: Vec<(Topic, String, Bytes)>,
        state: Option<(i64, NotifyState)>,
        now: Timestamp,
    ) -> Result<Vec<Message>, StoreError> {
        self.write_with(super::Durability::AfterRelease, move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some((expected, new)) = &state {
                if !super::notify::swap_state(&tx, *expected, new)? {
                    return Err(StoreError::Conflict(format!("notifier state of set {} moved", new.set)));
                }
            }
            let mut out = Vec::with_capacity(messages.len());
            for (topic, content_type, body) in messages {
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
                out.push(Message { id, topic, content_type, body, published_at: now });
            }
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn hub_messages_after(
        &self,
        topic: Option<&Topic>,
        after: MessageId,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Message>>, StoreError> {
        let topic = topic.map(|t| t.as_str().to_string());
        self.read(move |c| {
            // Sizes first (length() of a blob does not read it), so that a backlog of large
            // notifications is never read whole into memory.
            let mut sizes = c.prepare_cached(
                "SELECT id, length(body) FROM hub_messages
                 WHERE id > ?1 AND (?2 IS NULL OR topic = ?2) ORDER BY id LIMIT ?3",
            )?;
            let mut through = after;
            let mut bytes = 0usize;
            let mut rows = sizes.query(params![after, topic, limit as i64])?;
            while let Some(r) = rows.next()? {
                let (id, len): (i64, i64) = (r.get(0)?, r.get(1)?);
                if through > after && bytes + len as usize > max_bytes {
                    break;
                }
                bytes += len as usize;
                through = id;
            }
            drop(rows);
            let mut st = c.prepare_cached(
                "SELECT id, topic, content_type, body, published_at FROM hub_messages
                 WHERE id > ?1 AND id <= ?4 AND (?2 IS NULL OR topic = ?2) ORDER BY id LIMIT ?3",
            )?;
            let rows = st.query_map(
                params![after, topic, limit as i64, through],
                message_from_row,
            )?;
            Ok(rows
                .map(|r| r.map(Arc::new))
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The first and last message numbers of `topic` published in `[since, until)` and not
    /// after `through`, with their count; `None` when there are none.
    async fn hub_window(
        &self,
        topic: &Topic,
        since: Timestamp,
        until: Timestamp,
        through: MessageId,
    ) -> Result<Option<(MessageId, MessageId, u64)>, StoreError> {
        let topic = topic.as_str().to_string();
        self.read(move |c| {
            let (first, last, n): (Option<i64>, Option<i64>, i64) = c.query_row(
                "SELECT min(id), max(id), count(*) FROM hub_messages
                 WHERE topic = ?1 AND id <= ?2 AND published_at >= ?3 AND published_at < ?4",
                params![topic, through, since.0, until.0],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(first.zip(last).map(|(f, l)| (f, l, n as u64)))
        })
        .await
    }

    async fn hub_last_message(&self) -> Result<MessageId, StoreError> {
        self.read(|c| {
            Ok(
                c.query_row("SELECT coalesce(max(id), 0) FROM hub_messages", [], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
    }

    /// Records a batch of outcomes in one transaction (one update per subscription, plus a
    /// row per delivery that failed for good), written to the log but not synced to the disk:
    /// a killed process loses none of them (they are in the operating system's hands), a power
    /// cut may lose those since the last synced commit, which are then delivered again (at
    /// least once still holds). Lanes wait for this write before sending their next message:
    /// a sync per message would halve the hub's throughput.
    async fn hub_record(
        &self,
        outcomes: Vec<Outcome>,
        _epochs: &HashMap<SubscriptionId, u64>,
    ) -> Result<HashSet<SubscriptionId>, StoreError> {
        let folds = crate::store::fold(outcomes);
        self.write_with(super::Durability::None, move |c| record_tx(c, &folds))
            .await?;
        // One process delivers from this store: no one is ever fenced.
        Ok(HashSet::new())
    }

    /// Makes a topic known (so its URI answers) without publishing to it.
    async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError> {
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
    async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
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

    /// Removes failure records older than `before`, and messages older than `before` that no
    /// live subscription still has to deliver (a topic's latest message is kept).
    async fn hub_prune(&self, before: Timestamp, now: Timestamp) -> Result<u64, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM hub_failures WHERE at < ?1", [before.0])?;
            let n = tx.execute(
                "DELETE FROM hub_messages WHERE published_at < ?1
                   AND id NOT IN (SELECT last_message FROM hub_topics WHERE last_message IS NOT NULL)
                   AND NOT EXISTS (SELECT 1 FROM hub_subscriptions s
                                   WHERE s.topic = hub_messages.topic AND s.cursor < hub_messages.id AND s.expires_at > ?2)",
                params![before.0, now.0],
            )?;
            tx.commit()?;
            Ok(n as u64)
        })
        .await
    }

    /// Subscriptions with their delivery record, filtered, in id order, one page.
    async fn hub_list(
        &self,
        f: SubscriptionFilter,
        now: Timestamp,
    ) -> Result<Vec<(Subscription, SubscriptionStats)>, StoreError> {
        self.read(move |c| {
            let sql = format!(
                "SELECT {SUB_COLS}, {} FROM hub_subscriptions s
                 WHERE id > ?1 AND (?2 IS NULL OR topic = ?2) AND (?3 IS NULL OR instr(callback, ?3) > 0)
                   AND (?4 IS NULL OR {STATE_SQL} = ?4)
                 ORDER BY id LIMIT ?5",
                stats_cols()
            );
            let mut st = c.prepare(&sql)?;
            let rows = st.query_map(
                params![f.after.unwrap_or(0), f.topic, f.callback_contains, f.state.map(SubState::as_str), f.limit as i64, now.0],
                |r| Ok((sub_from_row(r)?, stats_from_row(r)?)),
            )?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn hub_detail(
        &self,
        id: SubscriptionId,
        now: Timestamp,
    ) -> Result<Option<(Subscription, SubscriptionStats)>, StoreError> {
        self.read(move |c| {
            let sql = format!(
                "SELECT {SUB_COLS}, {} FROM hub_subscriptions s WHERE id = ?1 AND ?6 = ?6",
                stats_cols()
            );
            Ok(c.query_row(&sql, params![id, 0, 0, 0, 0, now.0], |r| {
                Ok((sub_from_row(r)?, stats_from_row(r)?))
            })
            .optional()?)
        })
        .await
    }

    async fn hub_topics(&self) -> Result<Vec<TopicSummary>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT t.topic, (SELECT count(*) FROM hub_subscriptions s WHERE s.topic = t.topic), t.published_at
                 FROM (SELECT topic, published_at FROM hub_topics
                       UNION SELECT DISTINCT topic, NULL FROM hub_subscriptions
                       WHERE topic NOT IN (SELECT topic FROM hub_topics)) t
                 ORDER BY t.topic",
            )?;
            let rows = st.query_map([], |r| {
                Ok(TopicSummary {
                    topic: Topic::from_stored(r.get(0)?),
                    subscribers: r.get::<_, i64>(1)? as u64,
                    last_publish: r.get::<_, Option<i64>>(2)?.map(Timestamp),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn hub_hold(
        &self,
        id: SubscriptionId,
        hold: Option<Hold>,
        only_if_unheld: bool,
    ) -> Result<Option<Subscription>, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE hub_subscriptions SET held_reason = ?2, held_at = ?3,
                   failing_since = CASE WHEN ?2 IS NULL THEN NULL ELSE failing_since END
                 WHERE id = ?1 AND (NOT ?4 OR held_reason IS NULL)",
                params![
                    id,
                    hold.map(|h| h.reason.as_str()),
                    hold.map(|h| h.since.0),
                    only_if_unheld
                ],
            )?;
            let sub = tx
                .query_row(
                    &format!("SELECT {SUB_COLS} FROM hub_subscriptions WHERE id = ?1"),
                    [id],
                    sub_from_row,
                )
                .optional()?;
            tx.commit()?;
            Ok(sub)
        })
        .await
    }

    async fn hub_change(
        &self,
        id: SubscriptionId,
        change: SubscriptionChange,
    ) -> Result<Option<Subscription>, StoreError> {
        let auth = match &change.auth {
            Some(Some(a)) => Some(serde_json::to_string(a).expect("auth serialises")),
            _ => None,
        };
        self.write(move |c| {
            Ok(c.query_row(
                &format!(
                    "UPDATE hub_subscriptions SET
                       max_per_sec = CASE WHEN ?2 THEN ?3 ELSE max_per_sec END,
                       delivery_auth = CASE WHEN ?4 THEN ?5 ELSE delivery_auth END,
                       previous_secret = CASE WHEN ?6 IS NOT NULL AND secret IS NOT NULL AND secret IS NOT ?6
                                         THEN secret ELSE previous_secret END,
                       previous_until = CASE WHEN ?6 IS NOT NULL AND secret IS NOT NULL AND secret IS NOT ?6
                                        THEN ?7 ELSE previous_until END,
                       secret = coalesce(?6, secret)
                     WHERE id = ?1 RETURNING {SUB_COLS}"
                ),
                params![
                    id,
                    change.max_per_sec.is_some(),
                    change.max_per_sec.flatten(),
                    change.auth.is_some(),
                    auth,
                    change.secret.as_ref().map(|(s, _)| s.expose()),
                    change.secret.as_ref().map(|(_, until)| until.0)
                ],
                sub_from_row,
            )
            .optional()?)
        })
        .await
    }

    /// Takes a subscription's failed deliveries (to try again): their messages, oldest first.
    async fn hub_take_failures(&self, id: SubscriptionId) -> Result<Vec<Arc<Message>>, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = {
                let mut st = tx.prepare(
                    "SELECT m.id, m.topic, m.content_type, m.body, m.published_at FROM hub_failures f
                     JOIN hub_messages m ON m.id = f.message_id WHERE f.subscription_id = ?1 ORDER BY m.id",
                )?;
                let rows = st.query_map([id], message_from_row)?;
                rows.map(|m| m.map(Arc::new)).collect::<Result<Vec<_>, _>>()?
            };
            tx.execute("DELETE FROM hub_failures WHERE subscription_id = ?1", [id])?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn hub_totals(&self, now: Timestamp) -> Result<HubTotals, StoreError> {
        self.read(move |c| {
            let mut t = HubTotals::default();
            let mut st = c.prepare(&format!(
                "SELECT {STATE_SQL}, count(*), sum(delivered), sum(failed),
                        sum((SELECT count(*) FROM hub_messages m WHERE m.topic = s.topic AND m.id > s.cursor))
                 FROM hub_subscriptions s WHERE ?6 = ?6 GROUP BY 1"
            ))?;
            let mut rows = st.query(params![0, 0, 0, 0, 0, now.0])?;
            while let Some(r) = rows.next()? {
                let (state, n): (String, i64) = (r.get(0)?, r.get(1)?);
                match state.as_str() {
                    "active" => t.active = n as u64,
                    "failing" => t.failing = n as u64,
                    "paused" => t.paused = n as u64,
                    "disabled" => t.disabled = n as u64,
                    _ => t.expired = n as u64,
                }
                t.delivered += r.get::<_, Option<i64>>(2)?.unwrap_or(0) as u64;
                t.failed += r.get::<_, Option<i64>>(3)?.unwrap_or(0) as u64;
                if state != "expired" {
                    t.queue_depth += r.get::<_, Option<i64>>(4)?.unwrap_or(0) as u64;
                }
            }
            t.pending_verification =
                c.query_row("SELECT count(*) FROM hub_intents WHERE mode <> 'denied'", [], |r| r.get::<_, i64>(0))? as u64;
            Ok(t)
        })
        .await
    }
}
