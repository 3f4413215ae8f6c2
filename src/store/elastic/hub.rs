//! The hub's storage and the notifier's state on Elasticsearch, in one index (`<index>-hub`),
//! shared by every server process on the store:
//!
//! - `msg:<n>`: the message log. A message's number is claimed by creating its document
//!   (`_create`, 409 → the number is taken, try the next), so numbers have no gaps and, with
//!   one shard and `refresh=true`, a reader that sees message n+1 also sees n.
//! - `sub:<sha256(topic, callback)>`: a subscription with its cursor, retry state and counters,
//!   changed only by read-modify-write with `if_seq_no`/`if_primary_term`.
//! - `intent:<id>`, `topic:<sha256>`, `fail:<sub>:<msg>`: verifications under way, topics,
//!   deliveries that failed for good.
//! - `notify:<set>`: a set's notifier state. Publishing with a state change first replaces
//!   the state conditionally *with the messages in an outbox* (the commit point), then appends
//!   them (each tagged with its origin, so a retry does not append twice) and empties the
//!   outbox. A process that dies in between leaves the outbox to whoever reads the state next.
//! - `lease:<name>`: leases (see [`ElasticStore::lease`]).
//! - `partitions`, `nodes`, `part:<p>`: sharded delivery (see [`ElasticStore::take_partition`]):
//!   the partition count fixed by the first process, the live processes' heartbeats, and one
//!   lease per partition carrying its epoch.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures_util::StreamExt;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use elasticsearch::http::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;

use super::{ElasticStore, Versioned};
use crate::model::websub::partition_of;
use crate::model::websub::SignatureAlg;
use crate::model::websub::{
    Callback, DeliveryAuth, Hold, HoldReason, HubTotals, Intent, IntentMode, Message, MessageId,
    Outcome, Resolution, Subscription, SubscriptionChange, SubscriptionFilter, SubscriptionId,
    SubscriptionStats, Topic, TopicInfo, TopicSummary,
};
use crate::model::{SetName, Timestamp};
use crate::store::hub::LeaseVersion;
use crate::store::{fold, sub_state};
use crate::store::{HubStore, NotifyState, PartitionLease, StoreError};

/// The hub index's mapping: what is searched is indexed, the rest is kept under `doc`.
pub fn hub_mapping() -> Value {
    json!({"properties": {
        "kind": {"type": "keyword"},
        "topic": {"type": "keyword"},
        "callback": {"type": "keyword"},
        "id": {"type": "long"},
        "seq": {"type": "long"},
        "sub": {"type": "long"},
        "at": {"type": "long"},
        "set": {"type": "keyword"},
        "origin": {"type": "keyword"},
        "doc": {"type": "object", "enabled": false}
    }})
}

pub(super) fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

fn digest(parts: &[&str]) -> String {
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn sub_doc_id(topic: &Topic, callback: &Callback) -> String {
    format!("sub:{}", digest(&[topic.as_str(), callback.as_str()]))
}

fn topic_doc_id(topic: &Topic) -> String {
    format!("topic:{}", digest(&[topic.as_str()]))
}

/// A positive id that fits a JSON number exactly.
fn random_id() -> i64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source works");
    (u64::from_le_bytes(b) >> 11).max(1) as i64
}

/// A subscription as stored: the subscription and its delivery record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SubDoc {
    id: i64,
    topic: String,
    callback: String,
    secret: Option<String>,
    /// The secret before the last one, and until when it signs too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_until: Option<i64>,
    alg: String,
    lease_secs: u64,
    lease_start: i64,
    expires_at: i64,
    verified_at: i64,
    created_at: i64,
    cursor: i64,
    attempts: u32,
    next_attempt_at: Option<i64>,
    delivered: u64,
    failed: u64,
    last_success_at: Option<i64>,
    last_success_status: Option<u16>,
    last_failure_at: Option<i64>,
    last_failure_status: Option<u16>,
    last_failure_error: Option<String>,
    /// Since when every attempt has failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failing_since: Option<i64>,
    /// `paused` or `disabled`, since `held_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held_at: Option<i64>,
    /// Deliveries a second at most (none: the hub's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_per_sec: Option<f64>,
    /// How the hub authenticates to the receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery_auth: Option<DeliveryAuth>,
    /// The topic and callback as given (`topic`/`callback` hold their normal form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_given: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    callback_given: Option<String>,
    /// The epoch of the partition lease under which the delivery record was last written: a
    /// writer holding an older epoch is refused (fencing; see [`ElasticStore::fence`]).
    #[serde(default)]
    epoch: u64,
}

impl SubDoc {
    fn subscription(&self) -> Result<Subscription, StoreError> {
        Ok(Subscription {
            id: self.id,
            topic: Topic::from_stored_given(self.topic.clone(), self.topic_given.clone()),
            callback: Callback::from_stored_given(
                self.callback.clone(),
                self.callback_given.clone(),
            ),
            secret: self.secret.clone(),
            previous_secret: self
                .previous_secret
                .clone()
                .zip(self.previous_until.map(Timestamp)),
            alg: SignatureAlg::parse(&self.alg)
                .ok_or_else(|| corrupt(format!("subscription {}: alg {}", self.id, self.alg)))?,
            lease_secs: self.lease_secs,
            lease_start: Timestamp(self.lease_start),
            expires_at: Timestamp(self.expires_at),
            verified_at: Timestamp(self.verified_at),
            created_at: Timestamp(self.created_at),
            cursor: self.cursor,
            attempts: self.attempts,
            next_attempt_at: self.next_attempt_at.map(Timestamp),
            failing_since: self.failing_since.map(Timestamp),
            held: self.hold()?,
            max_per_sec: self.max_per_sec,
            auth: self.delivery_auth.clone(),
        })
    }

    /// Takes `new` as the secret; a different one it replaces keeps signing until `until`.
    fn take_secret(&mut self, new: Option<String>, until: Timestamp) {
        if self.secret.is_some() && self.secret != new {
            self.previous_secret = self.secret.take();
            self.previous_until = Some(until.0);
        }
        self.secret = new;
    }

    fn hold(&self) -> Result<Option<Hold>, StoreError> {
        match (&self.held_reason, self.held_at) {
            (Some(r), Some(since)) => Ok(Some(Hold {
                reason: HoldReason::parse(r)
                    .ok_or_else(|| corrupt(format!("subscription {}: held_reason {r}", self.id)))?,
                since: Timestamp(since),
            })),
            _ => Ok(None),
        }
    }

    fn stats(&self, pending: u64, now: Timestamp) -> SubscriptionStats {
        SubscriptionStats {
            state: Some(sub_state(
                self.expires_at,
                self.held_reason.as_deref().and_then(HoldReason::parse),
                self.attempts,
                self.last_failure_at,
                self.last_success_at,
                now,
            )),
            delivered: self.delivered,
            failed: self.failed,
            last_success_at: self.last_success_at.map(Timestamp),
            last_success_status: self.last_success_status,
            last_failure_at: self.last_failure_at.map(Timestamp),
            last_failure_status: self.last_failure_status,
            last_failure_error: self.last_failure_error.clone(),
            pending,
        }
    }

    fn source(&self) -> Value {
        json!({"kind": "sub", "id": self.id, "topic": self.topic, "callback": self.callback, "doc": self})
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct IntentDoc {
    id: i64,
    mode: String,
    topic: String,
    callback: String,
    lease_secs: u64,
    secret: Option<String>,
    alg: String,
    reason: Option<String>,
    requested_at: i64,
    verify_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_given: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    callback_given: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct OutboxEntry {
    topic: String,
    content_type: String,
    body: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct NotifyDoc {
    pub(super) watermark: i64,
    pub(super) parts_seen: u32,
    pub(super) lists_seen: u32,
    pub(super) announced: bool,
    pub(super) version: i64,
    /// Messages committed with this version and not yet known to be in the log.
    #[serde(default)]
    pub(super) outbox: Vec<OutboxEntry>,
}

/// The stored form of a set's notifier state.
pub(super) fn notify_source(set: &SetName, doc: &NotifyDoc) -> Value {
    json!({"kind": "notify", "set": set.as_str(), "doc": doc})
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn message_from(src: &Value) -> Result<Message, StoreError> {
    let d = &src["doc"];
    let body = base64::engine::general_purpose::STANDARD
        .decode(d["body"].as_str().unwrap_or_default())
        .map_err(|e| corrupt(format!("message {}: {e}", src["seq"])))?;
    Ok(Message {
        id: src["seq"]
            .as_i64()
            .ok_or_else(|| corrupt("message without seq"))?,
        topic: Topic::from_stored(src["topic"].as_str().unwrap_or_default().to_string()),
        content_type: d["content_type"].as_str().unwrap_or_default().to_string(),
        body: Bytes::from(body),
        published_at: Timestamp(src["at"].as_i64().unwrap_or(0)),
    })
}

impl ElasticStore {
    /// Every document of a query, sorted by `sort` (unique), paged with `search_after`.
    async fn all(&self, query: Value, sort: Value) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let (docs, next) = self
                .page(&self.hub, query.clone(), sort.clone(), after, 2000)
                .await?;
            out.extend(docs);
            match next {
                Some(c) => after = Some(c),
                None => return Ok(out),
            }
        }
    }

    async fn subs(&self, query: Value) -> Result<Vec<(SubDoc, Value)>, StoreError> {
        let docs = self
            .all(
                json!({"bool": {"filter": [{"term": {"kind": "sub"}}, query]}}),
                json!([{"id": "asc"}]),
            )
            .await?;
        docs.into_iter()
            .map(|d| {
                Ok((
                    serde_json::from_value(d["doc"].clone()).map_err(corrupt)?,
                    d,
                ))
            })
            .collect()
    }

    async fn sub_by_id(&self, id: SubscriptionId) -> Result<Option<SubDoc>, StoreError> {
        Ok(self
            .subs(json!({"term": {"id": id}}))
            .await?
            .into_iter()
            .next()
            .map(|(s, _)| s))
    }

    async fn get_sub(&self, doc_id: &str) -> Result<Option<(SubDoc, Versioned)>, StoreError> {
        match self.es.get_doc(&self.hub, doc_id).await? {
            Some(v) => Ok(Some((
                serde_json::from_value(v.source["doc"].clone()).map_err(corrupt)?,
                v,
            ))),
            None => Ok(None),
        }
    }

    /// Changes a subscription by read-modify-write until no one else wrote in between.
    /// `f` returns `false` to leave it alone; the answer is the subscription as written.
    async fn update_sub(
        &self,
        doc_id: &str,
        mut f: impl FnMut(&mut SubDoc) -> bool,
    ) -> Result<Option<SubDoc>, StoreError> {
        for _ in 0..100 {
            let Some((mut s, v)) = self.get_sub(doc_id).await? else {
                return Ok(None);
            };
            if !f(&mut s) {
                return Ok(Some(s));
            }
            if self
                .es
                .put_doc_if(&self.hub, doc_id, &s.source(), Some(&v))
                .await?
            {
                return Ok(Some(s));
            }
        }
        Err(StoreError::Unavailable(format!(
            "subscription {doc_id} kept changing under us"
        )))
    }

    /// [`ElasticStore::update_sub`] of the subscription numbered `id`, as it then stands;
    /// `None` when there is none.
    async fn update_sub_by_id(
        &self,
        id: SubscriptionId,
        f: impl FnMut(&mut SubDoc) -> bool,
    ) -> Result<Option<Subscription>, StoreError> {
        let doc_ids = self.sub_doc_ids([id].into_iter()).await?;
        let Some(doc_id) = doc_ids.get(&id) else {
            return Ok(None);
        };
        self.update_sub(doc_id, f)
            .await?
            .map(|s| s.subscription())
            .transpose()
    }

    async fn delete_query(&self, query: Value) -> Result<u64, StoreError> {
        let v = self
            .es
            .ok(
                Method::Post,
                &format!(
                    "/{}/_delete_by_query?refresh=true&conflicts=proceed",
                    self.hub
                ),
                Some(json!({"query": query})),
            )
            .await?;
        Ok(v["deleted"].as_u64().unwrap_or(0))
    }

    async fn delete_doc(&self, id: &str) -> Result<(), StoreError> {
        let path = format!("/{}/_doc/{}?refresh=true", self.hub, super::encode_id(id));
        let (status, v) = self.es.call(Method::Delete, &path, None).await?;
        match status {
            200..=299 | 404 => Ok(()),
            s => Err(StoreError::Unavailable(format!("DELETE {path}: {s} {v}"))),
        }
    }

    /// Appends one message, claiming the next free number.
    async fn append(
        &self,
        topic: &Topic,
        content_type: &str,
        body: &Bytes,
        origin: Option<String>,
        now: Timestamp,
    ) -> Result<Message, StoreError> {
        let mut n = self.hub_last_message().await? + 1;
        let src = |n: i64| {
            json!({"kind": "msg", "seq": n, "topic": topic.as_str(), "at": now.0, "origin": origin,
                   "doc": {"content_type": content_type, "body": b64(body)}})
        };
        for _ in 0..1000 {
            if self
                .es
                .put_doc_if(&self.hub, &format!("msg:{n}"), &src(n), None)
                .await?
            {
                let message = Message {
                    id: n,
                    topic: topic.clone(),
                    content_type: content_type.to_string(),
                    body: body.clone(),
                    published_at: now,
                };
                self.note_topic(topic, Some(n), now).await?;
                return Ok(message);
            }
            n += 1;
        }
        Err(StoreError::Unavailable(
            "could not claim a message number (1000 tries)".into(),
        ))
    }

    /// Creates the topic's document, or moves its latest message forward.
    async fn note_topic(
        &self,
        topic: &Topic,
        message: Option<MessageId>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let id = topic_doc_id(topic);
        for _ in 0..100 {
            match self.es.get_doc(&self.hub, &id).await? {
                None => {
                    let doc = json!({"kind": "topic", "topic": topic.as_str(), "seq": message, "at": message.map(|_| now.0),
                                     "doc": {"created_at": now.0}});
                    if self.es.put_doc_if(&self.hub, &id, &doc, None).await? {
                        return Ok(());
                    }
                }
                Some(v) => {
                    let Some(m) = message else { return Ok(()) };
                    if v.source["seq"].as_i64().is_some_and(|s| s >= m) {
                        return Ok(());
                    }
                    let mut doc = v.source.clone();
                    doc["seq"] = json!(m);
                    doc["at"] = json!(now.0);
                    if self.es.put_doc_if(&self.hub, &id, &doc, Some(&v)).await? {
                        return Ok(());
                    }
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "topic {topic} kept changing under us"
        )))
    }

    /// Message numbers of a topic after `after`, ascending (for queue depths).
    async fn topic_seqs(
        &self,
        topic: &str,
        after: MessageId,
    ) -> Result<Vec<MessageId>, StoreError> {
        let q = json!({"bool": {"filter": [{"term": {"kind": "msg"}}, {"term": {"topic": topic}}, {"range": {"seq": {"gt": after}}}]}});
        Ok(self
            .all(q, json!([{"seq": "asc"}]))
            .await?
            .iter()
            .filter_map(|d| d["seq"].as_i64())
            .collect())
    }

    /// Queue depth per subscription: its topic's messages after its cursor.
    async fn pending(&self, subs: &[&SubDoc]) -> Result<HashMap<SubscriptionId, u64>, StoreError> {
        let mut low: BTreeMap<&str, i64> = BTreeMap::new();
        for s in subs {
            let e = low.entry(s.topic.as_str()).or_insert(s.cursor);
            *e = (*e).min(s.cursor);
        }
        let mut seqs = HashMap::new();
        for (topic, after) in low {
            seqs.insert(topic, self.topic_seqs(topic, after).await?);
        }
        Ok(subs
            .iter()
            .map(|s| {
                let list = &seqs[s.topic.as_str()];
                (
                    s.id,
                    (list.len() - list.partition_point(|&m| m <= s.cursor)) as u64,
                )
            })
            .collect())
    }

    /// A new subscription's id: random, in the partition next in turn (the subscriptions
    /// there are so far, modulo the partition count), so that subscriptions spread evenly over
    /// partitions and so over the processes delivering them (random ids left one of three
    /// processes 14% of 60 subscriptions).
    async fn new_sub_id(&self) -> Result<i64, StoreError> {
        let id = random_id();
        let Some(v) = self.es.get_doc(&self.hub, "partitions").await? else {
            return Ok(id);
        };
        let count = v.source["doc"]["count"].as_i64().unwrap_or(1).max(1);
        let q = json!({"query": {"term": {"kind": "sub"}}});
        let n = self
            .es
            .ok(Method::Post, &format!("/{}/_count", self.hub), Some(q))
            .await?["count"]
            .as_i64()
            .unwrap_or(0);
        let id = id - id % count + n % count;
        Ok(if id < 1 { id + count } else { id })
    }

    async fn remove_sub(&self, doc_id: &str, id: SubscriptionId) -> Result<(), StoreError> {
        self.delete_doc(doc_id).await?;
        self.delete_query(
            json!({"bool": {"filter": [{"term": {"kind": "fail"}}, {"term": {"sub": id}}]}}),
        )
        .await?;
        Ok(())
    }

    /// Appends a committed outbox to the log (skipping what an earlier attempt appended) and
    /// empties it. Returns the messages appended now.
    pub(super) async fn flush_outbox(&self, set: &SetName) -> Result<Vec<Message>, StoreError> {
        let id = format!("notify:{set}");
        let Some(v) = self.es.get_doc(&self.hub, &id).await? else {
            return Ok(vec![]);
        };
        let mut doc: NotifyDoc =
            serde_json::from_value(v.source["doc"].clone()).map_err(corrupt)?;
        if doc.outbox.is_empty() {
            return Ok(vec![]);
        }
        let now = Timestamp::now();
        let mut out = Vec::new();
        for (i, e) in doc.outbox.iter().enumerate() {
            let origin = format!("{set}#{}#{i}", doc.version);
            let q = json!({"bool": {"filter": [{"term": {"kind": "msg"}}, {"term": {"origin": origin}}]}});
            if !self
                .page(&self.hub, q, json!([{"seq": "asc"}]), None, 1)
                .await?
                .0
                .is_empty()
            {
                continue;
            }
            let body = base64::engine::general_purpose::STANDARD
                .decode(&e.body)
                .map_err(corrupt)?;
            out.push(
                self.append(
                    &Topic::from_stored(e.topic.clone()),
                    &e.content_type,
                    &Bytes::from(body),
                    Some(origin),
                    now,
                )
                .await?,
            );
        }
        doc.outbox.clear();
        // Losing this race means another process emptied it: the messages are in the log.
        self.es
            .put_doc_if(&self.hub, &id, &notify_source(set, &doc), Some(&v))
            .await?;
        Ok(out)
    }

    /// Up to when a set's changes have been notified, without touching the state (for
    /// writers, which must not date changes before it).
    pub(super) async fn notified_until(
        &self,
        set: &SetName,
    ) -> Result<Option<Timestamp>, StoreError> {
        let v = self.es.get_doc(&self.hub, &format!("notify:{set}")).await?;
        Ok(v.and_then(|v| v.source["doc"]["watermark"].as_i64())
            .map(Timestamp))
    }

    /// The document ids of subscriptions (kept once read: a subscription's id and document
    /// never change); those not found are left out.
    async fn sub_doc_ids(
        &self,
        ids: impl Iterator<Item = SubscriptionId>,
    ) -> Result<HashMap<SubscriptionId, String>, StoreError> {
        let ids: Vec<SubscriptionId> = ids.collect();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let known = self.sub_docs.lock().expect("sub doc ids");
            for id in &ids {
                match known.get(id) {
                    Some(d) => {
                        out.insert(*id, d.clone());
                    }
                    None => missing.push(*id),
                }
            }
        }
        if !missing.is_empty() {
            for (s, _) in self.subs(json!({"terms": {"id": missing}})).await? {
                let d = sub_doc_id(
                    &Topic::from_stored(s.topic),
                    &Callback::from_stored(s.callback),
                );
                self.sub_docs
                    .lock()
                    .expect("sub doc ids")
                    .insert(s.id, d.clone());
                out.insert(s.id, d);
            }
        }
        Ok(out)
    }

    async fn message(&self, id: MessageId) -> Result<Option<Message>, StoreError> {
        match self.es.get_doc(&self.hub, &format!("msg:{id}")).await? {
            Some(v) => Ok(Some(message_from(&v.source)?)),
            None => Ok(None),
        }
    }

    async fn listing(
        &self,
        query: Value,
        now: Timestamp,
    ) -> Result<Vec<(Subscription, SubscriptionStats)>, StoreError> {
        let subs = self.subs(query).await?;
        let refs: Vec<&SubDoc> = subs.iter().map(|(s, _)| s).collect();
        let pending = self.pending(&refs).await?;
        subs.iter()
            .map(|(s, _)| Ok((s.subscription()?, s.stats(pending[&s.id], now))))
            .collect()
    }
}

#[async_trait::async_trait]
impl HubStore for ElasticStore {
    fn is_shared(&self) -> bool {
        true
    }

    /// Takes or renews the lease `name` for `owner` for `secs` seconds; `true` while held.
    /// A lease is one document replaced conditionally, so at most one owner holds it at a time.
    async fn lease(&self, name: &str, owner: &str, secs: u64) -> Result<bool, StoreError> {
        let id = format!("lease:{name}");
        let now = Timestamp::now();
        let doc = json!({"kind": "lease", "doc": {"owner": owner, "until": now.plus_secs(secs).0}});
        match self.es.get_doc(&self.hub, &id).await? {
            None => self.es.put_doc_if(&self.hub, &id, &doc, None).await,
            Some(v) => {
                let held_by_other = v.source["doc"]["owner"].as_str() != Some(owner)
                    && v.source["doc"]["until"].as_i64().is_some_and(|u| u > now.0);
                if held_by_other {
                    return Ok(false);
                }
                self.es.put_doc_if(&self.hub, &id, &doc, Some(&v)).await
            }
        }
    }

    /// Gives the lease up at once (a clean stop), if `owner` holds it.
    async fn release(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let id = format!("lease:{name}");
        if let Some(v) = self.es.get_doc(&self.hub, &id).await? {
            if v.source["doc"]["owner"].as_str() == Some(owner) {
                let doc = json!({"kind": "lease", "doc": {"owner": "", "until": 0}});
                self.es.put_doc_if(&self.hub, &id, &doc, Some(&v)).await?;
            }
        }
        Ok(())
    }

    async fn state(&self, key: &str) -> Result<Option<(String, i64)>, StoreError> {
        let Some(v) = self.es.get_doc(&self.hub, &format!("state:{key}")).await? else {
            return Ok(None);
        };
        let json = v.source["doc"]["json"]
            .as_str()
            .ok_or_else(|| corrupt(format!("state {key} has no json")))?;
        let version = v.source["doc"]["version"]
            .as_i64()
            .ok_or_else(|| corrupt(format!("state {key} has no version")))?;
        Ok(Some((json.to_string(), version)))
    }

    async fn save_state(
        &self,
        key: &str,
        json: &str,
        expected: Option<i64>,
    ) -> Result<Option<i64>, StoreError> {
        let id = format!("state:{key}");
        let current = self.es.get_doc(&self.hub, &id).await?;
        let held = current
            .as_ref()
            .and_then(|v| v.source["doc"]["version"].as_i64());
        if held != expected {
            return Ok(None);
        }
        let version = expected.map_or(1, |v| v + 1);
        let doc = json!({"kind": "state", "doc": {"json": json, "version": version}});
        Ok(self
            .es
            .put_doc_if(&self.hub, &id, &doc, current.as_ref())
            .await?
            .then_some(version))
    }

    async fn put_aliases(
        &self,
        collector: &str,
        aliases: &[(String, String)],
    ) -> Result<(), StoreError> {
        if aliases.is_empty() {
            return Ok(());
        }
        let mut ops = String::new();
        for (alias, identifier) in aliases {
            let head = json!({"index": {"_index": self.hub, "_id": format!("alias:{}", digest(&[alias]))}});
            let doc = json!({"kind": "alias", "doc": {"alias": alias, "collector": collector, "identifier": identifier}});
            ops.push_str(&format!("{head}\n{doc}\n"));
        }
        let answer = self.es.bulk(ops).await?;
        if answer["errors"].as_bool() == Some(true) {
            return Err(StoreError::Unavailable(
                "Elasticsearch refused some of the records' aliases".into(),
            ));
        }
        Ok(())
    }

    async fn find_alias(&self, alias: &str) -> Result<Option<(String, String)>, StoreError> {
        let Some(v) = self
            .es
            .get_doc(&self.hub, &format!("alias:{}", digest(&[alias])))
            .await?
        else {
            return Ok(None);
        };
        let d = &v.source["doc"];
        Ok((d["alias"].as_str() == Some(alias))
            .then(|| {
                Some((
                    d["collector"].as_str()?.to_string(),
                    d["identifier"].as_str()?.to_string(),
                ))
            })
            .flatten())
    }

    async fn hub_add_intent(&self, i: Intent) -> Result<i64, StoreError> {
        let doc = IntentDoc {
            id: random_id(),
            mode: i.mode.as_str().into(),
            topic: i.topic.as_str().into(),
            callback: i.callback.as_str().into(),
            lease_secs: i.lease_secs,
            secret: i.secret,
            alg: i.alg.as_str().into(),
            reason: i.reason,
            requested_at: i.requested_at.0,
            verify_token: i.verify_token,
            topic_given: Some(i.topic.given().into()),
            callback_given: Some(i.callback.given().into()),
        };
        let src = json!({"kind": "intent", "id": doc.id, "doc": doc});
        if !self
            .es
            .put_doc_if(&self.hub, &format!("intent:{}", doc.id), &src, None)
            .await?
        {
            return Err(StoreError::Conflict(format!("intent id {} taken", doc.id)));
        }
        Ok(doc.id)
    }

    async fn hub_intents(&self) -> Result<Vec<Intent>, StoreError> {
        let docs = self
            .all(json!({"term": {"kind": "intent"}}), json!([{"id": "asc"}]))
            .await?;
        docs.iter()
            .map(|d| {
                let i: IntentDoc = serde_json::from_value(d["doc"].clone()).map_err(corrupt)?;
                Ok(Intent {
                    id: i.id,
                    mode: IntentMode::parse(&i.mode).unwrap_or(IntentMode::Denied),
                    topic: Topic::from_stored_given(i.topic, i.topic_given),
                    callback: Callback::from_stored_given(i.callback, i.callback_given),
                    lease_secs: i.lease_secs,
                    secret: i.secret,
                    alg: SignatureAlg::parse(&i.alg)
                        .ok_or_else(|| corrupt(format!("intent {}: alg {}", i.id, i.alg)))?,
                    reason: i.reason,
                    requested_at: Timestamp(i.requested_at),
                    verify_token: i.verify_token,
                })
            })
            .collect()
    }

    async fn hub_resolve(
        &self,
        intent: Intent,
        res: Resolution,
    ) -> Result<Option<Subscription>, StoreError> {
        let doc_id = sub_doc_id(&intent.topic, &intent.callback);
        let out = match res {
            Resolution::Dropped => None,
            Resolution::Subscribed {
                verified_at,
                keep_old_secret_until,
            } => {
                let expires = verified_at.plus_secs(intent.lease_secs);
                let newest = self.hub_last_message().await?;
                let mut written = None;
                for _ in 0..100 {
                    match self.get_sub(&doc_id).await? {
                        None => {
                            let s = SubDoc {
                                id: self.new_sub_id().await?,
                                topic: intent.topic.as_str().into(),
                                callback: intent.callback.as_str().into(),
                                secret: intent.secret.clone(),
                                previous_secret: None,
                                previous_until: None,
                                alg: intent.alg.as_str().into(),
                                lease_secs: intent.lease_secs,
                                lease_start: verified_at.0,
                                expires_at: expires.0,
                                verified_at: verified_at.0,
                                created_at: verified_at.0,
                                cursor: newest,
                                attempts: 0,
                                next_attempt_at: None,
                                delivered: 0,
                                failed: 0,
                                last_success_at: None,
                                last_success_status: None,
                                last_failure_at: None,
                                last_failure_status: None,
                                last_failure_error: None,
                                failing_since: None,
                                held_reason: None,
                                held_at: None,
                                max_per_sec: None,
                                delivery_auth: None,
                                topic_given: Some(intent.topic.given().into()),
                                callback_given: Some(intent.callback.given().into()),
                                epoch: 0,
                            };
                            if self
                                .es
                                .put_doc_if(&self.hub, &doc_id, &s.source(), None)
                                .await?
                            {
                                written = Some(s);
                                break;
                            }
                        }
                        Some((mut s, v)) => {
                            // A renewal of a lapsed subscription skips what was published meanwhile.
                            if s.expires_at <= verified_at.0 {
                                s.cursor = s.cursor.max(newest);
                            }
                            s.take_secret(intent.secret.clone(), keep_old_secret_until);
                            s.topic_given = Some(intent.topic.given().into());
                            s.callback_given = Some(intent.callback.given().into());
                            s.alg = intent.alg.as_str().into();
                            s.lease_secs = intent.lease_secs;
                            s.lease_start = verified_at.0;
                            s.expires_at = expires.0;
                            s.verified_at = verified_at.0;
                            if self
                                .es
                                .put_doc_if(&self.hub, &doc_id, &s.source(), Some(&v))
                                .await?
                            {
                                written = Some(s);
                                break;
                            }
                        }
                    }
                }
                let s = written.ok_or_else(|| {
                    StoreError::Unavailable(format!("subscription {doc_id} kept changing under us"))
                })?;
                Some(s.subscription()?)
            }
            Resolution::Unsubscribed => match self.get_sub(&doc_id).await? {
                Some((s, _)) => {
                    self.remove_sub(&doc_id, s.id).await?;
                    Some(s.subscription()?)
                }
                None => None,
            },
        };
        self.delete_doc(&format!("intent:{}", intent.id)).await?;
        Ok(out)
    }

    async fn hub_remove_subscription(&self, id: SubscriptionId) -> Result<(), StoreError> {
        if let Some(s) = self.sub_by_id(id).await? {
            let doc_id = sub_doc_id(
                &Topic::from_stored(s.topic),
                &Callback::from_stored(s.callback),
            );
            self.remove_sub(&doc_id, id).await?;
        }
        Ok(())
    }

    async fn hub_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.subs(json!({"match_all": {}}))
            .await?
            .iter()
            .map(|(s, _)| s.subscription())
            .collect()
    }

    async fn hub_subscription(
        &self,
        topic: &Topic,
        callback: &Callback,
    ) -> Result<Option<Subscription>, StoreError> {
        self.get_sub(&sub_doc_id(topic, callback))
            .await?
            .map(|(s, _)| s.subscription())
            .transpose()
    }

    async fn hub_count_callbacks(&self, prefix: &str) -> Result<u64, StoreError> {
        let q = json!({"query": {"bool": {"filter": [{"term": {"kind": "sub"}}, {"prefix": {"callback": prefix}}]}}});
        Ok(self
            .es
            .ok(Method::Post, &format!("/{}/_count", self.hub), Some(q))
            .await?["count"]
            .as_u64()
            .unwrap_or(0))
    }

    /// Appends messages; with `state`, commits the set's notifier state and the messages
    /// together through the state document's outbox (see the module doc).
    async fn hub_publish(
        &self,
        messages: Vec<(Topic, String, Bytes)>,
        state: Option<(i64, NotifyState)>,
        now: Timestamp,
    ) -> Result<Vec<Message>, StoreError> {
        let Some((expected, new)) = state else {
            let mut out = Vec::with_capacity(messages.len());
            for (topic, ct, body) in messages {
                out.push(self.append(&topic, &ct, &body, None, now).await?);
            }
            return Ok(out);
        };
        let id = format!("notify:{}", new.set);
        let v = self.es.get_doc(&self.hub, &id).await?.ok_or_else(|| {
            StoreError::Conflict(format!("notifier state of set {} is missing", new.set))
        })?;
        let current: NotifyDoc =
            serde_json::from_value(v.source["doc"].clone()).map_err(corrupt)?;
        if current.version != expected || !current.outbox.is_empty() {
            return Err(StoreError::Conflict(format!(
                "notifier state of set {} moved",
                new.set
            )));
        }
        let doc = NotifyDoc {
            watermark: new.watermark.0,
            parts_seen: new.parts_seen,
            lists_seen: new.lists_seen,
            announced: new.announced,
            version: new.version,
            outbox: messages
                .iter()
                .map(|(t, ct, b)| OutboxEntry {
                    topic: t.as_str().into(),
                    content_type: ct.clone(),
                    body: b64(b),
                })
                .collect(),
        };
        if !self
            .es
            .put_doc_if(&self.hub, &id, &notify_source(&new.set, &doc), Some(&v))
            .await?
        {
            return Err(StoreError::Conflict(format!(
                "notifier state of set {} moved",
                new.set
            )));
        }
        self.flush_outbox(&new.set).await
    }

    /// The newest message number (0 when the log is empty).
    /// Up to `limit` messages after `after` (of one topic, or all), in number order.
    async fn hub_messages_after(
        &self,
        topic: Option<&Topic>,
        after: MessageId,
        limit: usize,
        _max_bytes: usize,
    ) -> Result<Vec<Arc<Message>>, StoreError> {
        let mut filter = vec![
            json!({"term": {"kind": "msg"}}),
            json!({"range": {"seq": {"gt": after}}}),
        ];
        if let Some(t) = topic {
            filter.push(json!({"term": {"topic": t.as_str()}}));
        }
        let (docs, _) = self
            .page(
                &self.hub,
                json!({"bool": {"filter": filter}}),
                json!([{"seq": "asc"}]),
                None,
                limit,
            )
            .await?;
        docs.iter().map(|d| message_from(d).map(Arc::new)).collect()
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
        let q = json!({"bool": {"filter": [
            {"term": {"kind": "msg"}}, {"term": {"topic": topic.as_str()}},
            {"range": {"seq": {"lte": through}}}, {"range": {"at": {"gte": since.0, "lt": until.0}}}]}});
        let ends = |order: &'static str| {
            let q = q.clone();
            async move {
                let (docs, _) = self
                    .page(&self.hub, q, json!([{"seq": order}]), None, 1)
                    .await?;
                Ok::<_, StoreError>(docs.first().and_then(|d| d["seq"].as_i64()))
            }
        };
        let (Some(first), Some(last)) = (ends("asc").await?, ends("desc").await?) else {
            return Ok(None);
        };
        let n = self
            .es
            .ok(
                Method::Post,
                &format!("/{}/_count", self.hub),
                Some(json!({"query": q})),
            )
            .await?["count"]
            .as_u64()
            .unwrap_or(0);
        Ok(Some((first, last, n)))
    }

    /// The newest message's number (0 when none).
    async fn hub_last_message(&self) -> Result<MessageId, StoreError> {
        let (docs, _) = self
            .page(
                &self.hub,
                json!({"term": {"kind": "msg"}}),
                json!([{"seq": "desc"}]),
                None,
                1,
            )
            .await?;
        Ok(docs.first().and_then(|d| d["seq"].as_i64()).unwrap_or(0))
    }

    /// Records outcomes; each subscription's record is written only by a writer whose epoch
    /// (in `epochs`) is at least the one stored with it. Returns the subscriptions refused so.
    async fn hub_record(
        &self,
        outcomes: Vec<Outcome>,
        epochs: &HashMap<SubscriptionId, u64>,
    ) -> Result<HashSet<SubscriptionId>, StoreError> {
        let folds = fold(outcomes);
        let mut fenced = HashSet::new();
        if folds.is_empty() {
            return Ok(fenced);
        }
        let doc_ids = self.sub_doc_ids(folds.iter().map(|(id, _)| *id)).await?;
        // The subscriptions' records are written side by side (one round trip, not one each).
        let writes = folds.iter().filter_map(|(id, f)| {
            let doc_id = doc_ids.get(id)?;
            let epoch = epochs.get(id).copied().unwrap_or(0);
            Some(async move {
                let mut refused = false;
                self.update_sub(doc_id, |s| {
                    if s.epoch > epoch {
                        refused = true;
                        return false;
                    }
                    s.epoch = epoch;
                    s.cursor = s.cursor.max(f.cursor);
                    s.attempts = f.attempts;
                    s.next_attempt_at = f.next_at;
                    s.delivered += f.delivered as u64;
                    s.failed += f.failed as u64;
                    s.failing_since = f.failing_since(s.failing_since);
                    if let Some((at, status)) = f.success {
                        (s.last_success_at, s.last_success_status) = (Some(at), Some(status));
                    }
                    if let Some((at, status, error)) = &f.failure {
                        (
                            s.last_failure_at,
                            s.last_failure_status,
                            s.last_failure_error,
                        ) = (Some(*at), *status, Some(error.clone()));
                    }
                    true
                })
                .await
                .map(|_| (*id, refused))
            })
        });
        let written: Vec<Result<(SubscriptionId, bool), StoreError>> =
            futures_util::stream::iter(writes.collect::<Vec<_>>())
                .buffer_unordered(16)
                .collect()
                .await;
        for w in written {
            let (id, refused) = w?;
            if refused {
                fenced.insert(id);
            }
        }
        let mut failures = String::new();
        for (id, f) in &folds {
            if fenced.contains(id) || !doc_ids.contains_key(id) {
                continue;
            }
            for (msg, attempts, status, error, at) in &f.failures {
                failures.push_str(
                    &json!({"index": {"_index": self.hub, "_id": format!("fail:{id}:{msg}")}})
                        .to_string(),
                );
                failures.push('\n');
                let doc = json!({"kind": "fail", "sub": id, "seq": msg, "at": at,
                                 "doc": {"attempts": attempts, "status": status, "error": error}});
                failures.push_str(&doc.to_string());
                failures.push('\n');
            }
        }
        self.bulk(failures).await?;
        Ok(fenced)
    }

    /// Leaves a redelivery request for whichever process delivers the subscription's partition.
    async fn hub_leave_redelivery(
        &self,
        sub: SubscriptionId,
        after: MessageId,
        through: MessageId,
    ) -> Result<(), StoreError> {
        let id = random_id();
        let doc = json!({"kind": "redeliver", "id": id, "sub": sub, "doc": {"after": after, "through": through}});
        if self
            .es
            .put_doc_if(&self.hub, &format!("redeliver:{id}"), &doc, None)
            .await?
        {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!("request id {id} taken")))
        }
    }

    /// Redelivery requests left (oldest first): (request, subscription, after, through).
    async fn hub_redeliveries(
        &self,
    ) -> Result<Vec<(i64, SubscriptionId, MessageId, MessageId)>, StoreError> {
        let docs = self
            .all(
                json!({"term": {"kind": "redeliver"}}),
                json!([{"id": "asc"}]),
            )
            .await?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                Some((
                    d["id"].as_i64()?,
                    d["sub"].as_i64()?,
                    d["doc"]["after"].as_i64()?,
                    d["doc"]["through"].as_i64()?,
                ))
            })
            .collect())
    }

    async fn hub_redelivery_taken(&self, request: i64) -> Result<(), StoreError> {
        self.delete_doc(&format!("redeliver:{request}")).await
    }

    /// The number of delivery partitions: the first process to ask fixes it (`wanted`), the
    /// others get what it fixed.
    async fn partition_count(&self, wanted: u32) -> Result<u32, StoreError> {
        let doc = json!({"kind": "partitions", "doc": {"count": wanted}});
        for _ in 0..10 {
            if let Some(v) = self.es.get_doc(&self.hub, "partitions").await? {
                return v.source["doc"]["count"]
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .map(|n| n as u32)
                    .ok_or_else(|| corrupt(format!("partitions document: {}", v.source)));
            }
            if self
                .es
                .put_doc_if(&self.hub, "partitions", &doc, None)
                .await?
            {
                return Ok(wanted);
            }
        }
        Err(StoreError::Unavailable(
            "the partitions document kept changing".into(),
        ))
    }

    /// Announces `owner` alive for `secs` seconds in the one heartbeat document (replaced
    /// conditionally) and returns the processes alive now, `owner` among them. Entries dead
    /// for a minute are dropped.
    async fn heartbeat(&self, owner: &str, secs: u64) -> Result<Vec<String>, StoreError> {
        for _ in 0..50 {
            let now = Timestamp::now();
            let v = self.es.get_doc(&self.hub, "nodes").await?;
            let mut nodes: BTreeMap<String, i64> = v
                .as_ref()
                .and_then(|v| serde_json::from_value(v.source["doc"]["nodes"].clone()).ok())
                .unwrap_or_default();
            nodes.retain(|_, until| *until > now.0 - 60_000_000);
            nodes.insert(owner.to_string(), now.plus_secs(secs).0);
            let doc = json!({"kind": "nodes", "doc": {"nodes": nodes}});
            if self
                .es
                .put_doc_if(&self.hub, "nodes", &doc, v.as_ref())
                .await?
            {
                return Ok(nodes
                    .into_iter()
                    .filter(|(_, until)| *until > now.0)
                    .map(|(n, _)| n)
                    .collect());
            }
        }
        Err(StoreError::Unavailable(
            "the heartbeat document kept changing under us".into(),
        ))
    }

    /// Takes partition `p` for `owner` when no one holds it (never taken, released, or its
    /// lease lapsed), with the next epoch. `None` while another process holds it.
    async fn take_partition(
        &self,
        p: u32,
        owner: &str,
        secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        let id = format!("part:{p}");
        let now = Timestamp::now();
        let current = self.es.get_doc(&self.hub, &id).await?;
        let epoch = match &current {
            None => 1,
            Some(v) => {
                let d = &v.source["doc"];
                let held = d["owner"]
                    .as_str()
                    .is_some_and(|o| !o.is_empty() && o != owner)
                    && d["until"].as_i64().is_some_and(|u| u > now.0);
                if held {
                    return Ok(None);
                }
                d["epoch"].as_u64().unwrap_or(0) + 1
            }
        };
        let doc = json!({"kind": "partition", "doc": {"owner": owner, "epoch": epoch, "until": now.plus_secs(secs).0}});
        Ok(self
            .es
            .put_doc_versioned(&self.hub, &id, &doc, current.as_ref())
            .await?
            .map(|v| PartitionLease {
                epoch,
                version: lease_version(&v),
            }))
    }

    /// Renews a partition's lease (`Some`, the new version) unless someone else wrote it since
    /// (`None`: the partition is lost).
    async fn renew_partition(
        &self,
        p: u32,
        lease: &PartitionLease,
        owner: &str,
        secs: u64,
    ) -> Result<Option<PartitionLease>, StoreError> {
        let doc = json!({"kind": "partition", "doc": {"owner": owner, "epoch": lease.epoch, "until": Timestamp::now().plus_secs(secs).0}});
        Ok(self
            .es
            .put_doc_versioned(
                &self.hub,
                &format!("part:{p}"),
                &doc,
                Some(&versioned(lease.version)),
            )
            .await?
            .map(|v| PartitionLease {
                epoch: lease.epoch,
                version: lease_version(&v),
            }))
    }

    /// Gives a partition up at once (its lanes have stopped and their outcomes are written).
    async fn release_partition(&self, p: u32, lease: &PartitionLease) -> Result<(), StoreError> {
        let doc =
            json!({"kind": "partition", "doc": {"owner": "", "epoch": lease.epoch, "until": 0}});
        self.es
            .put_doc_if(
                &self.hub,
                &format!("part:{p}"),
                &doc,
                Some(&versioned(lease.version)),
            )
            .await?;
        Ok(())
    }

    /// Stamps each partition's new epoch (`taken`: partition, epoch; of `count`) on the
    /// delivery records of its subscriptions, in one pass over them: from here on a writer
    /// with an older epoch (a paused ex-owner) is refused.
    async fn fence(&self, taken: &[(u32, u64)], count: u32) -> Result<(), StoreError> {
        let epochs: HashMap<u32, u64> = taken.iter().copied().collect();
        let subs = self.subs(json!({"match_all": {}})).await?;
        let stamps = subs.iter().filter_map(|(s, _)| {
            let epoch = *epochs.get(&partition_of(s.id, count))?;
            (s.epoch < epoch).then(|| {
                let doc = sub_doc_id(
                    &Topic::from_stored(s.topic.clone()),
                    &Callback::from_stored(s.callback.clone()),
                );
                async move {
                    self.update_sub(&doc, |s| {
                        if s.epoch >= epoch {
                            return false;
                        }
                        s.epoch = epoch;
                        true
                    })
                    .await
                }
            })
        });
        let done: Vec<Result<Option<SubDoc>, StoreError>> =
            futures_util::stream::iter(stamps.collect::<Vec<_>>())
                .buffer_unordered(16)
                .collect()
                .await;
        for d in done {
            d?;
        }
        Ok(())
    }

    async fn hub_register_topic(&self, topic: Topic, now: Timestamp) -> Result<(), StoreError> {
        self.note_topic(&topic, None, now).await
    }

    async fn hub_topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
        let t = self.es.get_doc(&self.hub, &topic_doc_id(topic)).await?;
        let q = json!({"query": {"bool": {"filter": [{"term": {"kind": "sub"}}, {"term": {"topic": topic.as_str()}}]}}});
        let subscribers = self
            .es
            .ok(Method::Post, &format!("/{}/_count", self.hub), Some(q))
            .await?["count"]
            .as_u64()
            .unwrap_or(0);
        if t.is_none() && subscribers == 0 {
            return Ok(None);
        }
        let latest = match t.as_ref().and_then(|t| t.source["seq"].as_i64()) {
            Some(id) => self.message(id).await?,
            None => None,
        };
        Ok(Some(TopicInfo {
            topic: topic.clone(),
            latest,
            subscribers,
        }))
    }

    async fn hub_prune(&self, before: Timestamp, now: Timestamp) -> Result<u64, StoreError> {
        self.delete_query(json!({"bool": {"filter": [{"term": {"kind": "fail"}}, {"range": {"at": {"lt": before.0}}}]}})).await?;
        let subs = self.subs(json!({"match_all": {}})).await?;
        let topics = self
            .all(
                json!({"term": {"kind": "topic"}}),
                json!([{"topic": "asc"}]),
            )
            .await?;
        let mut removed = 0;
        for t in topics {
            let (Some(name), Some(latest)) = (t["topic"].as_str(), t["seq"].as_i64()) else {
                continue;
            };
            // Keep the latest and whatever a live subscription has still to deliver.
            let keep_from = subs
                .iter()
                .filter(|(s, _)| s.topic == name && s.expires_at > now.0)
                .map(|(s, _)| s.cursor + 1)
                .min()
                .unwrap_or(latest)
                .min(latest);
            let q = json!({"bool": {"filter": [{"term": {"kind": "msg"}}, {"term": {"topic": name}},
                                               {"range": {"seq": {"lt": keep_from}}}, {"range": {"at": {"lt": before.0}}}]}});
            removed += self.delete_query(q).await?;
        }
        Ok(removed)
    }

    async fn hub_list(
        &self,
        f: SubscriptionFilter,
        now: Timestamp,
    ) -> Result<Vec<(Subscription, SubscriptionStats)>, StoreError> {
        let mut filter = vec![json!({"range": {"id": {"gt": f.after.unwrap_or(0)}}})];
        if let Some(t) = &f.topic {
            filter.push(json!({"term": {"topic": t}}));
        }
        let mut subs: Vec<SubDoc> = self
            .subs(json!({"bool": {"filter": filter}}))
            .await?
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        if let Some(c) = &f.callback_contains {
            subs.retain(|s| s.callback.contains(c.as_str()));
        }
        if let Some(state) = f.state {
            subs.retain(|s| {
                sub_state(
                    s.expires_at,
                    s.held_reason.as_deref().and_then(HoldReason::parse),
                    s.attempts,
                    s.last_failure_at,
                    s.last_success_at,
                    now,
                ) == state
            });
        }
        subs.truncate(f.limit);
        let refs: Vec<&SubDoc> = subs.iter().collect();
        let pending = self.pending(&refs).await?;
        subs.iter()
            .map(|s| Ok((s.subscription()?, s.stats(pending[&s.id], now))))
            .collect()
    }

    async fn hub_detail(
        &self,
        id: SubscriptionId,
        now: Timestamp,
    ) -> Result<Option<(Subscription, SubscriptionStats)>, StoreError> {
        Ok(self
            .listing(json!({"term": {"id": id}}), now)
            .await?
            .into_iter()
            .next())
    }

    async fn hub_topics(&self) -> Result<Vec<TopicSummary>, StoreError> {
        let mut out: BTreeMap<String, TopicSummary> = BTreeMap::new();
        for t in self
            .all(
                json!({"term": {"kind": "topic"}}),
                json!([{"topic": "asc"}]),
            )
            .await?
        {
            let name = t["topic"].as_str().unwrap_or_default().to_string();
            let last_publish = t["at"].as_i64().map(Timestamp);
            out.insert(
                name.clone(),
                TopicSummary {
                    topic: Topic::from_stored(name),
                    subscribers: 0,
                    last_publish,
                },
            );
        }
        for (s, _) in self.subs(json!({"match_all": {}})).await? {
            out.entry(s.topic.clone())
                .or_insert_with(|| TopicSummary {
                    topic: Topic::from_stored(s.topic.clone()),
                    subscribers: 0,
                    last_publish: None,
                })
                .subscribers += 1;
        }
        Ok(out.into_values().collect())
    }

    async fn hub_take_failures(&self, id: SubscriptionId) -> Result<Vec<Arc<Message>>, StoreError> {
        let q = json!({"bool": {"filter": [{"term": {"kind": "fail"}}, {"term": {"sub": id}}]}});
        let fails = self.all(q.clone(), json!([{"seq": "asc"}])).await?;
        let mut out = Vec::new();
        for f in &fails {
            if let Some(m) = self.message(f["seq"].as_i64().unwrap_or(0)).await? {
                out.push(Arc::new(m));
            }
        }
        self.delete_query(q).await?;
        Ok(out)
    }

    async fn hub_hold(
        &self,
        id: SubscriptionId,
        hold: Option<Hold>,
        only_if_unheld: bool,
    ) -> Result<Option<Subscription>, StoreError> {
        self.update_sub_by_id(id, |s| {
            if only_if_unheld && s.held_reason.is_some() {
                return false;
            }
            s.held_reason = hold.map(|h| h.reason.as_str().to_string());
            s.held_at = hold.map(|h| h.since.0);
            if hold.is_none() {
                s.failing_since = None;
            }
            true
        })
        .await
    }

    async fn hub_change(
        &self,
        id: SubscriptionId,
        change: SubscriptionChange,
    ) -> Result<Option<Subscription>, StoreError> {
        self.update_sub_by_id(id, |s| {
            if let Some(m) = change.max_per_sec {
                s.max_per_sec = m;
            }
            if let Some(a) = &change.auth {
                s.delivery_auth = a.clone();
            }
            if let Some((new, until)) = &change.secret {
                s.take_secret(Some(new.expose().to_string()), *until);
            }
            true
        })
        .await
    }

    async fn hub_totals(&self, now: Timestamp) -> Result<HubTotals, StoreError> {
        let mut t = HubTotals::default();
        for (_, s) in self.listing(json!({"match_all": {}}), now).await? {
            match s.state {
                Some(crate::model::websub::SubState::Expired) => t.expired += 1,
                Some(crate::model::websub::SubState::Failing) => {
                    t.failing += 1;
                    t.queue_depth += s.pending;
                }
                Some(crate::model::websub::SubState::Paused) => {
                    t.paused += 1;
                    t.queue_depth += s.pending;
                }
                Some(crate::model::websub::SubState::Disabled) => {
                    t.disabled += 1;
                    t.queue_depth += s.pending;
                }
                _ => {
                    t.active += 1;
                    t.queue_depth += s.pending;
                }
            }
            t.delivered += s.delivered;
            t.failed += s.failed;
        }
        let intents = self
            .all(json!({"term": {"kind": "intent"}}), json!([{"id": "asc"}]))
            .await?;
        t.pending_verification = intents
            .iter()
            .filter(|d| d["doc"]["mode"] != "denied")
            .count() as u64;
        Ok(t)
    }
}

fn lease_version(v: &Versioned) -> LeaseVersion {
    LeaseVersion {
        seq_no: v.seq_no,
        primary_term: v.primary_term,
    }
}

fn versioned(v: LeaseVersion) -> Versioned {
    Versioned {
        source: Value::Null,
        seq_no: v.seq_no,
        primary_term: v.primary_term,
    }
}
