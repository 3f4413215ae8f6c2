//! The store contract on Elasticsearch, for changes that come through this server (adoption of
//! external writers' documents is the next step). A set's bookkeeping document is the lock:
//! a writer claims it (conditional replace with a lease), writes the batch's change documents,
//! commits by saving the bookkeeping with `next_seq` past them, writes the resource documents,
//! and releases the claim with `applied_seq` advanced. Readers ignore change documents at or
//! past `next_seq` (a batch that died before its commit; the next batch overwrites them). A
//! claim found expired means a writer died after its commit: its changes past `applied_seq`
//! are replayed onto the resources before anything else.

use std::collections::HashMap;
use std::time::Duration;

use elasticsearch::http::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::hub::{corrupt, notify_source, NotifyDoc};
use super::{ElasticStore, Versioned};
use crate::model::{Change, ChangeType, NewChange, Resource, ResourceKey, SetName, Timestamp};
use crate::store::plan;
use crate::store::{
    Adoption, ApplyError, ApplyOutcome, ChangeListInfo, Counts, Cursor, ListPolicy, NotifyState,
    OpenTotals, Page, PartInfo, SetInfo, SetRules, SetStore, StoreError,
};

/// How long a writer's claim on a set lasts before others treat it as dead.
const CLAIM: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct ListState {
    no: u32,
    from: i64,
    until: Option<i64>,
    count: u64,
    bytes: u64,
    last_seq: i64,
    max_dt: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct PartState {
    pub no: u32,
    pub count: u64,
    pub bytes: u64,
    pub last_seq: i64,
    pub last_change: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct SetState {
    pub next_seq: i64,
    pub applied_seq: i64,
    /// Closed lists, then the open one (last).
    pub lists: Vec<ListState>,
    pub parts: Vec<PartState>,
    /// A writer's claim: until when (µs).
    pub claimed_until: Option<i64>,
}

impl SetState {
    fn fresh(now: Timestamp) -> SetState {
        SetState {
            next_seq: 1,
            applied_seq: 0,
            lists: vec![ListState {
                no: 1,
                from: now.0,
                ..Default::default()
            }],
            parts: vec![],
            claimed_until: None,
        }
    }
    pub(super) fn open(&mut self) -> &mut ListState {
        self.lists
            .last_mut()
            .expect("a set always has an open list")
    }

    /// Closes the open list and opens the next; returns the closed list's number and `until`.
    pub(super) fn close_open(&mut self, now: Timestamp) -> (u32, i64) {
        let open = self.open();
        let until = open.totals().close_time(now);
        open.until = Some(until);
        let (no, last_seq) = (open.no, open.last_seq);
        self.lists.push(ListState {
            no: no + 1,
            from: until,
            last_seq,
            ..Default::default()
        });
        (no, until)
    }
}

impl ListState {
    /// Counts entry `seq` of `bytes` dated `datetime` into the list.
    pub(super) fn record(&mut self, seq: i64, bytes: u64, datetime: Timestamp) {
        self.count += 1;
        self.bytes += bytes;
        self.last_seq = seq;
        self.max_dt = Some(self.max_dt.map_or(datetime.0, |m| m.max(datetime.0)));
    }

    pub(super) fn totals(&self) -> OpenTotals {
        OpenTotals {
            from: self.from,
            count: self.count,
            bytes: self.bytes,
            max_dt: self.max_dt,
        }
    }
}

/// The bookkeeping of a new set, as stored in its meta document.
pub(super) fn fresh_state(now: Timestamp) -> Value {
    serde_json::to_value(SetState::fresh(now)).expect("serialisable")
}

fn store_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

fn set_doc_id(set: &SetName) -> String {
    format!("set:{set}")
}

/// Document id of a resource: the set and its key.
fn resource_id(set: &SetName, key: &ResourceKey) -> String {
    format!("{set}:{}", key.0)
}

fn iso(t: Timestamp) -> String {
    t.to_string()
}

fn change_doc(
    set: &SetName,
    c: &NewChange,
    seq: i64,
    datetime: Timestamp,
    now: Timestamp,
) -> Value {
    json!({
        "resource_set": set.as_str(), "location": c.location, "change": c.change.as_str(),
        "datetime": iso(datetime), "datetime_us": datetime.0, "lastmod": c.meta.lastmod.map(iso),
        "length": c.meta.length, "md5": c.meta.md5, "mime": c.meta.mime, "ln": c.meta.ln,
        "timestamp": iso(now), "key": c.key.0, "seq": seq
    })
}

fn resource_doc(set: &SetName, c: &NewChange, part: u32, seq: i64, now: Timestamp) -> Value {
    json!({
        "resource_set": set.as_str(), "location": c.location, "length": c.meta.length, "md5": c.meta.md5,
        "mime": c.meta.mime, "lastmod": c.meta.lastmod.map(iso), "ln": c.meta.ln,
        "timestamp": iso(now), "key": c.key.0, "part": part, "seq": seq
    })
}

fn change_from(s: &Value) -> Result<Change, StoreError> {
    use serde::Deserialize;
    typed::ChangeSource::deserialize(s)
        .map_err(store_err)
        .and_then(Change::try_from)
}

fn resource_from(s: &Value) -> Result<Resource, StoreError> {
    use serde::Deserialize;
    typed::ResourceSource::deserialize(s)
        .map(Resource::from)
        .map_err(store_err)
}

impl ElasticStore {
    async fn load(&self, set: &SetName) -> Result<Option<(SetState, Versioned)>, StoreError> {
        match self.es.get_doc(&self.meta, &set_doc_id(set)).await? {
            None => Ok(None),
            Some(v) => {
                let st: SetState =
                    serde_json::from_value(v.source["state"].clone()).map_err(store_err)?;
                Ok(Some((st, v)))
            }
        }
    }

    async fn save(
        &self,
        set: &SetName,
        st: &SetState,
        prev: &Versioned,
    ) -> Result<bool, StoreError> {
        let mut doc = prev.source.clone();
        doc["state"] = serde_json::to_value(st).map_err(store_err)?;
        self.es
            .put_doc_if(&self.meta, &set_doc_id(set), &doc, Some(prev))
            .await
    }

    /// Claims the set for writing: waits for a live claim, recovers from a dead one.
    /// Claims the set for a writer (creating it, its first list from `start`, if new).
    pub(super) async fn claim(
        &self,
        set: &SetName,
        now: Timestamp,
        start: Timestamp,
    ) -> Result<(SetState, bool), StoreError> {
        // The claim's expiry doubles as its owner's token.
        let mut created = false;
        for _ in 0..3000 {
            let Some((mut st, v)) = self.load(set).await? else {
                created |= self.ensure_set_from(set, now, start).await?;
                continue;
            };
            let t = Timestamp::now();
            if st.claimed_until.is_some_and(|u| u > t.0) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let died = st.claimed_until.is_some();
            st.claimed_until = Some(t.0 + CLAIM.as_micros() as i64);
            if self.save(set, &st, &v).await? {
                if died {
                    self.unstamp_uncommitted(set, st.next_seq).await?;
                }
                if st.applied_seq + 1 < st.next_seq {
                    self.replay(set, st.applied_seq, st.next_seq).await?;
                    st.applied_seq = st.next_seq - 1;
                }
                return Ok((st, created));
            }
        }
        Err(StoreError::Unavailable(format!(
            "set {set} stayed claimed by another writer"
        )))
    }

    /// Re-applies changes (applied_seq, next_seq) onto the resources after a writer died.
    async fn replay(&self, set: &SetName, applied: i64, next: i64) -> Result<(), StoreError> {
        tracing::warn!(set = %set, from = applied + 1, to = next - 1, "replaying changes of a writer that stopped mid-batch");
        let q = json!({"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, {"range": {"seq": {"gt": applied, "lt": next}}}]}});
        let mut hits = Vec::new();
        let mut after = None;
        loop {
            let (docs, next_page) = self
                .page(
                    &self.changes,
                    q.clone(),
                    json!([{"seq": "asc"}]),
                    after,
                    5000,
                )
                .await?;
            hits.extend(docs);
            match next_page {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        let mut ops = String::new();
        for src in &hits {
            let c = change_from(src)?;
            let id = resource_id(set, &c.key);
            if c.change == ChangeType::Deleted {
                ops.push_str(&json!({"delete": {"_index": self.resources, "_id": id}}).to_string());
                ops.push('\n');
            } else {
                let mut doc = json!({"resource_set": set.as_str(), "key": c.key.0, "timestamp": src["timestamp"]});
                for f in [
                    "location", "length", "md5", "mime", "lastmod", "ln", "part", "bytes",
                ] {
                    doc[f] = src[f].clone();
                }
                doc["seq"] = json!(c.id);
                ops.push_str(&json!({"index": {"_index": self.resources, "_id": id}}).to_string());
                ops.push('\n');
                ops.push_str(&doc.to_string());
                ops.push('\n');
            }
        }
        self.bulk(ops).await
    }

    pub(super) async fn bulk(&self, ops: String) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        let v = self.es.bulk(ops).await?;
        if v["errors"] == json!(true) {
            let first = v["items"].as_array().into_iter().flatten().find_map(|i| {
                let r = i.as_object()?.values().next()?;
                r.get("error").map(|e| e.to_string())
            });
            return Err(StoreError::Unavailable(format!(
                "bulk write failed: {}",
                first.unwrap_or_default()
            )));
        }
        Ok(())
    }

    async fn apply_claimed(
        &self,
        set: &SetName,
        st: &mut SetState,
        changes: Vec<NewChange>,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<ApplyOutcome, ApplyError> {
        let mut out = ApplyOutcome::default();
        let notified = self.notified_until(set).await?.map(|t| t.0);
        // Existing resources: part and bytes, by key (later changes in the batch see earlier ones).
        let ids: Vec<String> = changes.iter().map(|c| resource_id(set, &c.key)).collect();
        let mut known: HashMap<String, Option<(u32, u64)>> = self
            .resource_sources(&ids)
            .await?
            .into_iter()
            .map(|(id, src)| {
                let entry = (
                    src["part"].as_u64().unwrap_or(1) as u32,
                    src["bytes"].as_u64().unwrap_or(0),
                );
                (id, Some(entry))
            })
            .collect();
        // Each resource's newest recorded change (committed batches are refreshed), then as this
        // batch records more; needed only for changes that come with their datetime (one dated
        // on arrival is after everything the set holds).
        let dated: Vec<crate::model::ResourceKey> = changes
            .iter()
            .filter(|c| c.datetime.is_some())
            .map(|c| c.key.clone())
            .collect();
        let mut newest: HashMap<crate::model::ResourceKey, i64> = if dated.is_empty() {
            HashMap::new()
        } else {
            self.latest_changes(set, &dated, Timestamp(i64::MAX))
                .await?
                .into_iter()
                .map(|(k, (dt, _))| (k, dt.0))
                .collect()
        };
        let (mut change_ops, mut ops) = (String::new(), String::new());
        for (index, mut c) in changes.into_iter().enumerate() {
            let id = resource_id(set, &c.key);
            let existing = known.get(&id).cloned().flatten();
            let newest_of = newest.get(&c.key).copied();
            let last = st.parts.last().map(|p| plan::LastPart {
                no: p.no,
                count: p.count,
                bytes: p.bytes,
            });
            let Some(planned) = plan::plan_into(
                &mut out,
                index,
                &mut c,
                existing,
                newest_of,
                &st.open().totals(),
                last,
                notified,
                &policy,
                now,
            )?
            else {
                continue;
            };
            if planned.roll {
                let (closed, _) = st.close_open(now);
                out.closed_lists.push(closed);
            }
            let (datetime, eb) = (planned.datetime, planned.entry_bytes);
            newest.insert(c.key.clone(), datetime.0);
            let seq = st.next_seq;
            st.next_seq += 1;
            st.open().record(seq, eb, datetime);
            out.applied.push((index, seq));
            change_ops.push_str(
                &json!({"index": {"_index": self.changes, "_id": format!("{set}:{seq}")}})
                    .to_string(),
            );
            change_ops.push('\n');
            let mut cdoc = change_doc(set, &c, seq, datetime, now);

            let touch = |st: &mut SetState, part: u32, dcount: i64, dbytes: i64| {
                if let Some(p) = st.parts.iter_mut().find(|p| p.no == part) {
                    p.count = (p.count as i64 + dcount).max(0) as u64;
                    p.bytes = (p.bytes as i64 + dbytes).max(0) as u64;
                }
                st.touch(part, seq, datetime.0);
            };
            let (part, dcount, dbytes) = match planned.effect {
                plan::Effect::Delete { part, bytes } => {
                    ops.push_str(
                        &json!({"delete": {"_index": self.resources, "_id": id}}).to_string(),
                    );
                    ops.push('\n');
                    touch(st, part, -1, -(bytes as i64));
                    known.insert(id, None);
                    change_ops.push_str(&cdoc.to_string());
                    change_ops.push('\n');
                    continue;
                }
                plan::Effect::Update { part, dbytes } => (part, 0, dbytes),
                plan::Effect::Create { part, new_part } => {
                    if new_part {
                        st.parts.push(PartState {
                            no: part,
                            ..Default::default()
                        });
                    }
                    (part, 1, eb as i64)
                }
            };
            let mut doc = resource_doc(set, &c, part, seq, now);
            doc["bytes"] = json!(eb);
            ops.push_str(&json!({"index": {"_index": self.resources, "_id": id}}).to_string());
            ops.push('\n');
            ops.push_str(&doc.to_string());
            ops.push('\n');
            touch(st, part, dcount, dbytes);
            known.insert(id, Some((part, eb)));
            // Replay after a crash recreates the resource in its part.
            (cdoc["part"], cdoc["bytes"]) = (json!(part), json!(eb));
            change_ops.push_str(&cdoc.to_string());
            change_ops.push('\n');
        }
        // 1. The change documents. Until the state below is saved they lie at or past
        //    `next_seq`, which readers ignore and the next batch overwrites.
        self.bulk(change_ops).await?;
        // 2. The commit point: the new bookkeeping with `next_seq` past this batch.
        self.commit(set, st, false).await?;
        // 3. The resource documents; a crash here is replayed from the change documents.
        self.bulk(ops).await?;
        st.applied_seq = st.next_seq - 1;
        Ok(out)
    }

    /// Releases the claim taken with `token`, saving `st` (the work done) when given, else
    /// leaving the bookkeeping as it is.
    pub(super) async fn release_claim(
        &self,
        set: &SetName,
        token: Option<i64>,
        st: Option<SetState>,
    ) -> Result<(), StoreError> {
        let Some((current, v)) = self.load(set).await? else {
            return Err(StoreError::Corrupt(format!("set {set} vanished")));
        };
        if current.claimed_until != token {
            return Err(StoreError::Corrupt(format!(
                "set {set}: the claim was taken over while writing"
            )));
        }
        let mut release = st.unwrap_or(current);
        release.claimed_until = None;
        if !self.save(set, &release, &v).await? {
            return Err(StoreError::Corrupt(format!(
                "set {set}: the claim was taken over while writing"
            )));
        }
        Ok(())
    }

    /// Saves the bookkeeping while holding the claim (the commit point of a batch). With
    /// `applied`, the resources are already what the changes say (adoption: the writer wrote
    /// them); otherwise `applied_seq` stays behind until the resource documents are written.
    pub(super) async fn commit(
        &self,
        set: &SetName,
        st: &mut SetState,
        applied: bool,
    ) -> Result<(), StoreError> {
        let Some((current, v)) = self.load(set).await? else {
            return Err(StoreError::Corrupt(format!("set {set} vanished")));
        };
        if applied {
            st.applied_seq = st.next_seq - 1;
        }
        let mut commit = st.clone();
        commit.claimed_until = current.claimed_until;
        if !applied {
            commit.applied_seq = current.applied_seq;
        }
        if !self.save(set, &commit, &v).await? {
            return Err(StoreError::Corrupt(format!(
                "set {set}: the claim was taken over while writing"
            )));
        }
        Ok(())
    }

    /// One page of a search sorted by `sort`, after the cursor (JSON sort values).
    pub(super) async fn page(
        &self,
        index: &str,
        query: Value,
        sort: Value,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<Value>, Option<Cursor>), StoreError> {
        self.typed_page::<Value>(index, query, sort, after, limit)
            .await
    }

    /// One page of a search, its hits' sources decoded straight into `S` (no `Value` tree
    /// for typed sources); [`Self::page`] is this with `Value`.
    async fn typed_page<S: serde::de::DeserializeOwned>(
        &self,
        index: &str,
        query: Value,
        sort: Value,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<S>, Option<Cursor>), StoreError> {
        let mut body =
            json!({"size": limit, "query": query, "sort": sort, "track_total_hits": false});
        if let Some(Cursor(c)) = after {
            body["search_after"] = serde_json::from_str(&c)
                .map_err(|_| StoreError::Corrupt(format!("bad cursor {c:?}")))?;
        }
        let r: typed::Search<S> = self
            .es
            .ok_typed(Method::Post, &format!("/{index}/_search"), Some(body))
            .await?;
        let hits = r.hits.hits;
        let next = (hits.len() == limit)
            .then(|| {
                hits.last()
                    .map(|h| Cursor(Value::from(h.sort.clone()).to_string()))
            })
            .flatten();
        Ok((hits.into_iter().map(|h| h.source).collect(), next))
    }

    /// The resource documents of these ids that exist, by id (one `_mget`).
    async fn resource_sources(&self, ids: &[String]) -> Result<HashMap<String, Value>, StoreError> {
        let mut out = HashMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let v = self
            .es
            .ok(
                Method::Post,
                &format!("/{}/_mget", self.resources),
                Some(json!({"ids": ids})),
            )
            .await?;
        for d in v["docs"].as_array().into_iter().flatten() {
            if d["found"] == json!(true) {
                let id = d["_id"].as_str().unwrap_or_default().to_string();
                out.insert(id, d["_source"].clone());
            }
        }
        Ok(out)
    }

    /// The filter that hides change documents of a batch not (yet) committed.
    /// How many of the set's changes with `after < seq <= through` search sees.
    async fn changes_between(
        &self,
        set: &SetName,
        after: i64,
        through: i64,
    ) -> Result<i64, StoreError> {
        let q = json!({"query": {"bool": {"filter": [
            {"term": {"resource_set": set.as_str()}},
            {"range": {"seq": {"gt": after, "lte": through}}},
        ]}}});
        Ok(self
            .es
            .ok(Method::Post, &format!("/{}/_count", self.changes), Some(q))
            .await?["count"]
            .as_i64()
            .unwrap_or(0))
    }

    async fn committed(&self, set: &SetName) -> Result<Value, StoreError> {
        let next = self.load(set).await?.map_or(1, |(s, _)| s.next_seq);
        Ok(json!({"range": {"seq": {"lt": next}}}))
    }
}

/// Search answers decoded into structs: a page build reads thousands of hits, and building a
/// `serde_json::Value` tree for each (then picking it apart) was most of its CPU.
mod typed {
    use serde::{Deserialize, Deserializer};

    use crate::model::{
        Change, ChangeType, Link, Location, Resource, ResourceKey, ResourceMeta, Timestamp,
    };
    use crate::store::StoreError;

    #[derive(Deserialize)]
    pub struct Search<S> {
        pub hits: Hits<S>,
    }

    #[derive(Deserialize)]
    pub struct Hits<S> {
        pub hits: Vec<Hit<S>>,
    }

    #[derive(Deserialize)]
    pub struct Hit<S> {
        #[serde(rename = "_source")]
        pub source: S,
        #[serde(default)]
        pub sort: Vec<serde_json::Value>,
    }

    /// A field of the wrong JSON type reads as absent, as the untyped decoding did.
    fn lenient<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(serde_json::from_value(v).ok())
    }

    #[derive(Deserialize)]
    pub struct ResourceSource {
        #[serde(default)]
        key: String,
        location: Location,
        #[serde(default, deserialize_with = "lenient")]
        length: Option<u64>,
        #[serde(default, deserialize_with = "lenient")]
        md5: Option<String>,
        #[serde(default, deserialize_with = "lenient")]
        mime: Option<String>,
        #[serde(default, deserialize_with = "lenient")]
        lastmod: Option<String>,
        #[serde(default)]
        ln: Option<Vec<Link>>,
        #[serde(default, deserialize_with = "lenient")]
        timestamp: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct ChangeSource {
        #[serde(flatten)]
        resource: ResourceSource,
        #[serde(default, deserialize_with = "lenient")]
        seq: Option<i64>,
        #[serde(default, deserialize_with = "lenient")]
        change: Option<String>,
        #[serde(default, deserialize_with = "lenient")]
        datetime_us: Option<i64>,
    }

    fn ts(s: Option<String>) -> Option<Timestamp> {
        s.and_then(|s| Timestamp::parse(&s).ok())
    }

    impl From<ResourceSource> for Resource {
        fn from(s: ResourceSource) -> Resource {
            Resource {
                key: ResourceKey(s.key),
                location: s.location,
                meta: ResourceMeta {
                    length: s.length,
                    md5: s.md5,
                    mime: s.mime,
                    lastmod: ts(s.lastmod),
                    ln: s.ln.unwrap_or_default(),
                },
                timestamp: ts(s.timestamp).unwrap_or(Timestamp(0)),
            }
        }
    }

    impl TryFrom<ChangeSource> for Change {
        type Error = StoreError;

        fn try_from(s: ChangeSource) -> Result<Change, StoreError> {
            let change = match s.change.as_deref() {
                Some("created") => ChangeType::Created,
                Some("updated") => ChangeType::Updated,
                Some("deleted") => ChangeType::Deleted,
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "change document with change {other:?}"
                    )))
                }
            };
            let r = Resource::from(s.resource);
            Ok(Change {
                id: s.seq.unwrap_or(0),
                key: r.key,
                location: r.location,
                change,
                datetime: Timestamp(s.datetime_us.unwrap_or(0)),
                meta: r.meta,
                timestamp: r.timestamp,
            })
        }
    }
}

#[async_trait::async_trait]
impl SetStore for ElasticStore {
    async fn apply(
        &self,
        set: &SetName,
        changes: Vec<NewChange>,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<ApplyOutcome, ApplyError> {
        let start = crate::store::batch_start(&changes, now);
        let (mut st, set_created) = self.claim(set, now, start).await?;
        let token = st.claimed_until;
        let result = self.apply_claimed(set, &mut st, changes, policy, now).await;
        self.release_claim(set, token, result.is_ok().then_some(st))
            .await?;
        let mut out = result?;
        out.set_created = set_created;
        Ok(out)
    }

    async fn recover_writes(&self, set: &SetName) -> Result<(), StoreError> {
        // Only a claim left behind needs settling: taking the set's claim replays it.
        let left = self
            .load(set)
            .await?
            .is_some_and(|(st, _)| st.claimed_until.is_some());
        if !left {
            return Ok(());
        }
        let now = Timestamp::now();
        let (st, _) = self.claim(set, now, now).await?;
        let token = st.claimed_until;
        self.release_claim(set, token, Some(st)).await
    }

    async fn rollover_if_due(
        &self,
        set: &SetName,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<Option<u32>, StoreError> {
        let Some((mut st, v)) = self.load(set).await? else {
            return Ok(None);
        };
        let claimed = st.claimed_until.is_some_and(|u| u > Timestamp::now().0);
        if claimed || !policy.period_over(&st.open().totals(), now) {
            return Ok(None);
        }
        let (closed, _) = st.close_open(now);
        Ok(self.save(set, &st, &v).await?.then_some(closed))
    }

    async fn parts(&self, set: &SetName) -> Result<Vec<PartInfo>, StoreError> {
        let st = self.load(set).await?.map(|(s, _)| s).unwrap_or_default();
        Ok(st
            .parts
            .iter()
            .map(|p| PartInfo {
                no: p.no,
                count: p.count,
                last_seq: p.last_seq,
                last_change: Timestamp(p.last_change),
            })
            .collect())
    }

    async fn resources(
        &self,
        set: &SetName,
        part: Option<u32>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Resource>, StoreError> {
        let mut filter = vec![json!({"term": {"resource_set": set.as_str()}})];
        if let Some(p) = part {
            filter.push(json!({"term": {"part": p}}));
        }
        let (docs, next) = self
            .typed_page::<typed::ResourceSource>(
                &self.resources,
                json!({"bool": {"filter": filter}}),
                json!([{"part": "asc"}, {"key": "asc"}]),
                after,
                limit,
            )
            .await?;
        Ok(Page {
            items: docs.into_iter().map(Resource::from).collect(),
            next,
        })
    }

    async fn resource(
        &self,
        set: &SetName,
        key: &ResourceKey,
    ) -> Result<Option<Resource>, StoreError> {
        match self
            .es
            .get_doc(&self.resources, &resource_id(set, key))
            .await?
        {
            Some(v) => Ok(Some(resource_from(&v.source)?)),
            None => Ok(None),
        }
    }

    async fn resources_by_key(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
    ) -> Result<Vec<Option<Resource>>, StoreError> {
        let ids: Vec<String> = keys.iter().map(|k| resource_id(set, k)).collect();
        let mut found = self.resource_sources(&ids).await?;
        ids.iter()
            .map(|id| found.remove(id).map(|src| resource_from(&src)).transpose())
            .collect()
    }

    async fn changelists(&self, set: &SetName) -> Result<Vec<ChangeListInfo>, StoreError> {
        let st = self.load(set).await?.map(|(s, _)| s).unwrap_or_default();
        Ok(st
            .lists
            .iter()
            .map(|l| ChangeListInfo {
                no: l.no,
                from: Timestamp(l.from),
                until: l.until.map(Timestamp),
                count: l.count,
                last_seq: l.last_seq,
                last_change: l.max_dt.map(Timestamp),
            })
            .collect())
    }

    async fn changes(
        &self,
        set: &SetName,
        from: Timestamp,
        until: Option<Timestamp>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Change>, StoreError> {
        let mut range = json!({"gte": from.0});
        if let Some(u) = until {
            range["lt"] = json!(u.0);
        }
        let q = json!({"bool": {"filter": [
            {"term": {"resource_set": set.as_str()}}, {"range": {"datetime_us": range}}, self.committed(set).await?
        ]}});
        let (docs, next) = self
            .typed_page::<typed::ChangeSource>(
                &self.changes,
                q,
                json!([{"datetime_us": "asc"}, {"seq": "asc"}]),
                after,
                limit,
            )
            .await?;
        Ok(Page {
            items: docs
                .into_iter()
                .map(Change::try_from)
                .collect::<Result<_, _>>()?,
            next,
        })
    }

    fn change_cursor(&self, datetime: Timestamp, id: i64) -> Cursor {
        Cursor(json!([datetime.0, id]).to_string())
    }

    async fn latest_changes(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
        until: Timestamp,
    ) -> Result<HashMap<ResourceKey, (Timestamp, i64)>, StoreError> {
        let mut out: HashMap<ResourceKey, (Timestamp, i64)> = HashMap::new();
        if keys.is_empty() {
            return Ok(out);
        }
        let terms: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
        let q = json!({"bool": {"filter": [
            {"term": {"resource_set": set.as_str()}},
            {"terms": {"key": terms}},
            {"range": {"datetime_us": {"lt": until.0}}},
            self.committed(set).await?
        ]}});
        // Every change of these keys before `until`, newest first; the first seen per key wins.
        let mut after = None;
        loop {
            let (docs, next) = self
                .typed_page::<typed::ChangeSource>(
                    &self.changes,
                    q.clone(),
                    json!([{"datetime_us": "desc"}, {"seq": "desc"}]),
                    after,
                    2_000,
                )
                .await?;
            for d in docs {
                let c = Change::try_from(d)?;
                out.entry(c.key).or_insert((c.datetime, c.id));
            }
            match next {
                Some(n) if out.len() < keys.len() => after = Some(n),
                _ => return Ok(out),
            }
        }
    }

    async fn counts(&self, set: &SetName) -> Result<Counts, StoreError> {
        let q = json!({"query": {"term": {"resource_set": set.as_str()}}});
        let r = self
            .es
            .ok(
                Method::Post,
                &format!("/{}/_count", self.resources),
                Some(q),
            )
            .await?;
        let q = json!({"query": {"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, self.committed(set).await?]}}});
        let c = self
            .es
            .ok(Method::Post, &format!("/{}/_count", self.changes), Some(q))
            .await?;
        Ok(Counts {
            resources: r["count"].as_u64().unwrap_or(0),
            changes: c["count"].as_u64().unwrap_or(0),
        })
    }

    async fn latest_change(&self, set: &SetName) -> Result<Option<Change>, StoreError> {
        let q = json!({"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, self.committed(set).await?]}});
        let (docs, _) = self
            .page(
                &self.changes,
                q,
                json!([{"datetime_us": "desc"}, {"seq": "desc"}]),
                None,
                1,
            )
            .await?;
        docs.first().map(change_from).transpose()
    }

    /// The set's last committed `seq` (its bookkeeping document, read in real time), when
    /// search sees every change up to it: committed seqs start at 1 and have no gaps, so it
    /// does when it counts that many.
    async fn recorded_through(&self, set: &SetName) -> Result<Option<i64>, StoreError> {
        let through = self.load(set).await?.map_or(0, |(s, _)| s.next_seq - 1);
        let seen = self.changes_between(set, 0, through).await?;
        Ok((seen >= through).then_some(through))
    }

    /// The changes past `mark` are all visible to search when it counts `through - mark` of
    /// them; until then the worst is assumed.
    async fn earliest_recorded_after(
        &self,
        set: &SetName,
        mark: i64,
        until: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let through = self.load(set).await?.map_or(0, |(s, _)| s.next_seq - 1);
        if through <= mark {
            return Ok(None);
        }
        if self.changes_between(set, mark, through).await? < through - mark {
            return Ok(Some(Timestamp(i64::MIN)));
        }
        let q = json!({"bool": {"filter": [
            {"term": {"resource_set": set.as_str()}},
            {"range": {"seq": {"gt": mark, "lte": through}}},
            {"range": {"datetime_us": {"lt": until.0}}},
        ]}});
        let (docs, _) = self
            .page(
                &self.changes,
                q,
                json!([{"datetime_us": "asc"}, {"seq": "asc"}]),
                None,
                1,
            )
            .await?;
        docs.first()
            .map(|d| change_from(d).map(|c| c.datetime))
            .transpose()
    }

    /// Readiness: the cluster answers and every index exists with its mappings. Indices found
    /// missing are recreated at once, and this check fails naming them (what they held is
    /// gone: an operator must know).
    /// Also reports, once, indices that any caller found missing and recreated since the
    /// last ping.
    async fn ping(&self) -> Result<(), StoreError> {
        self.es.check_indices().await?;
        let recreated = self.es.take_unreported_losses();
        if recreated.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "indices {recreated:?} were missing (cluster rebuilt or indices deleted) and have been recreated empty with their mappings"
            )))
        }
    }

    /// Registers a set if it is new; `true` for exactly one of several concurrent callers.
    async fn ensure_set(
        &self,
        set: &crate::model::SetName,
        now: crate::model::Timestamp,
    ) -> Result<bool, StoreError> {
        self.ensure_set_from(set, now, now).await
    }

    async fn sets(&self) -> Result<Vec<SetInfo>, StoreError> {
        let pit = self.es.open_pit(&self.meta, "1m").await?;
        let query = serde_json::json!({"term": {"kind": "set"}});
        let sort = serde_json::json!([{"set": "asc"}]);
        let mut out = Vec::new();
        let mut after = None;
        let res = loop {
            let page = match self
                .es
                .scan(&pit, &query, &sort, after.as_ref(), 1000)
                .await
            {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            for h in &page.hits {
                let s = &h["_source"];
                let name = s["set"].as_str().unwrap_or_default();
                let Ok(name) = crate::model::SetName::parse(name) else {
                    continue;
                };
                out.push(SetInfo {
                    name,
                    created_at: crate::model::Timestamp(s["created_at_us"].as_i64().unwrap_or(0)),
                });
            }
            match page.after {
                Some(a) => after = Some(a),
                None => break Ok(()),
            }
        };
        let _ = self.es.close_pit(&pit).await;
        res.map(|()| out)
    }

    /// The notifier's state of a set. A committed outbox left by a notifier that stopped is
    /// logged first: only the notifier (the process holding the leader lease) calls this.
    async fn notify_state(&self, set: &SetName) -> Result<Option<NotifyState>, StoreError> {
        let id = format!("notify:{set}");
        let Some(mut v) = self.es.get_doc(&self.hub, &id).await? else {
            return Ok(None);
        };
        if v.source["doc"]["outbox"]
            .as_array()
            .is_some_and(|o| !o.is_empty())
        {
            tracing::warn!(set = %set, "notifications committed by a process that stopped before logging them: logging them now");
            self.flush_outbox(set).await?;
            v = self
                .es
                .get_doc(&self.hub, &id)
                .await?
                .ok_or_else(|| corrupt(format!("notifier state of {set} vanished")))?;
        }
        let d: NotifyDoc = serde_json::from_value(v.source["doc"].clone()).map_err(corrupt)?;
        Ok(Some(NotifyState {
            set: set.clone(),
            watermark: Timestamp(d.watermark),
            parts_seen: d.parts_seen,
            lists_seen: d.lists_seen,
            announced: d.announced,
            version: d.version,
            covers: None,
        }))
    }

    async fn notify_init(&self, s: NotifyState) -> Result<(), StoreError> {
        let doc = NotifyDoc {
            watermark: s.watermark.0,
            parts_seen: s.parts_seen,
            lists_seen: s.lists_seen,
            announced: s.announced,
            version: 0,
            outbox: vec![],
        };
        self.es
            .put_doc_if(
                &self.hub,
                &format!("notify:{}", s.set),
                &notify_source(&s.set, &doc),
                None,
            )
            .await?;
        Ok(())
    }

    /// See the `adopt` module: documents written straight into the indices by a harvester.
    async fn adopt_external(&self, rules: &dyn SetRules) -> Result<Adoption, StoreError> {
        self.adopt(rules).await
    }
}
