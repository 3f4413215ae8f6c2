//! Adoption of documents written straight into the indices by a harvester following the
//! DIT-ES protocol (a resource document per resource, a change document per event, no fields
//! of ours). The process holding the leader lease runs a round before each notifier sweep:
//!
//! 1. Under the set's claim (the lock ingest takes), the oldest unstamped change documents
//!    (`seq` missing) are numbered in (`datetime`, `timestamp`) order and given `key`,
//!    `datetime_us` and their resource's `part`, with the Change List bookkeeping updated as
//!    ingest does. A document that became visible late (refresh, a skewed clock) is dated no
//!    earlier than what was already notified or the open Change List's start, so it is never
//!    missed, only recorded late (logged). The stamps are conditional writes
//!    (`if_seq_no`/`if_primary_term`): a document the writer changed meanwhile is left for
//!    the next round.
//! 2. Commit: the bookkeeping with `next_seq` past them (readers hide `seq >= next_seq`).
//! 3. Unstamped resource documents get `key` and `part`: the part they had (from a stamped
//!    resource or change document of the same key) or the last part with room. Part counts
//!    are then recounted from the index, since external writers delete resource documents
//!    themselves.
//!
//! A round that dies between 1 and 2 leaves stamped change documents at or past `next_seq`
//! marked `adopted`; the next claim strips them so they are adopted again.

use std::collections::HashMap;

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::contract::{PartState, SetState};
use super::ElasticStore;
use crate::model::{Location, ResourceKey, SetName, Timestamp};
use crate::store::{Adoption, ListPolicy, SetRules, StoreError};

/// Change documents adopted per round and set.
const ROUND: usize = 2000;

/// A document waiting this long to be adopted is logged.
const STUCK: std::time::Duration = std::time::Duration::from_secs(30);

/// What the adopter remembers between rounds (for the lag and for logging once a minute).
#[derive(Debug)]
pub struct AdoptionWatch {
    oldest: Option<String>,
    first_seen: std::time::Instant,
    warned: Option<std::time::Instant>,
    said: HashMap<String, std::time::Instant>,
}

impl Default for AdoptionWatch {
    fn default() -> Self {
        AdoptionWatch {
            oldest: None,
            first_seen: std::time::Instant::now(),
            warned: None,
            said: HashMap::new(),
        }
    }
}

fn unstamped(field: &str, set: Option<&str>) -> Value {
    let mut filter = vec![];
    if let Some(s) = set {
        filter.push(json!({"term": {"resource_set": s}}));
    }
    json!({"bool": {"filter": filter, "must_not": [{"exists": {"field": field}}]}})
}

/// A document's date field as a timestamp (ISO 8601, the seed's format, or epoch millis).
fn date(v: &Value) -> Option<Timestamp> {
    match v {
        Value::String(s) => Timestamp::parse(s).ok(),
        Value::Number(n) => n.as_i64().map(|ms| Timestamp(ms * 1000)),
        _ => None,
    }
}

impl ElasticStore {
    /// Sets with unstamped documents.
    async fn sets_to_adopt(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for (index, field) in [(&self.changes, "seq"), (&self.resources, "part")] {
            let body = json!({"size": 0, "query": unstamped(field, None),
                              "aggs": {"sets": {"terms": {"field": "resource_set", "size": 10000}}}});
            let v = self
                .es
                .ok(Method::Post, &format!("/{index}/_search"), Some(body))
                .await?;
            for b in v["aggregations"]["sets"]["buckets"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let Some(s) = b["key"].as_str() {
                    if !out.iter().any(|o| o == s) {
                        out.push(s.to_string());
                    }
                }
            }
        }
        Ok(out)
    }

    /// Up to `limit` hits (with versions) of `query`, sorted by `sort`.
    async fn hits(
        &self,
        index: &str,
        query: Value,
        sort: Value,
        limit: usize,
    ) -> Result<Vec<Value>, StoreError> {
        let body = json!({"size": limit, "query": query, "sort": sort, "seq_no_primary_term": true, "track_total_hits": false});
        let v = self
            .es
            .ok(Method::Post, &format!("/{index}/_search"), Some(body))
            .await?;
        Ok(v["hits"]["hits"].as_array().cloned().unwrap_or_default())
    }

    /// Runs `warn` at most once a minute per `what`.
    fn say_stuck(&self, what: &str, warn: impl FnOnce()) {
        let mut w = self.adoption.lock().expect("adoption watch");
        let due = w
            .said
            .get(what)
            .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60));
        if due {
            if w.said.len() > 1000 {
                w.said.clear();
            }
            w.said.insert(what.to_string(), std::time::Instant::now());
            warn();
        }
    }

    /// The oldest document not yet adopted (change or resource): its id, its set and when
    /// its writer says it wrote it.
    async fn oldest_unadopted(
        &self,
    ) -> Result<Option<(String, String, Option<Timestamp>)>, StoreError> {
        let mut oldest: Option<(String, String, Option<Timestamp>)> = None;
        for (index, field) in [(&self.changes, "seq"), (&self.resources, "part")] {
            let hit = self
                .hits(
                    index,
                    unstamped(field, None),
                    json!([{"timestamp": {"order": "asc", "unmapped_type": "date"}}]),
                    1,
                )
                .await?;
            if let Some(h) = hit.first() {
                let t = date(&h["_source"]["timestamp"]);
                let this = (
                    h["_id"].as_str().unwrap_or_default().to_string(),
                    h["_source"]["resource_set"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    t,
                );
                oldest = match oldest {
                    Some(o) if o.2.is_some() && (t.is_none() || o.2 <= t) => Some(o),
                    _ => Some(this),
                };
            }
        }
        Ok(oldest)
    }

    /// Adopts one round of a set: (documents read, change documents stamped).
    async fn adopt_set(
        &self,
        set: &SetName,
        rules: &dyn SetRules,
    ) -> Result<(usize, usize), StoreError> {
        let now = Timestamp::now();
        let (mut st, _) = self.claim(set, now, now).await?;
        let token = st.claimed_until;
        let result = self.adopt_claimed(set, &mut st, rules, now).await;
        self.release_claim(set, token, result.is_ok().then_some(st))
            .await?;
        result
    }

    async fn adopt_claimed(
        &self,
        set: &SetName,
        st: &mut SetState,
        rules: &dyn SetRules,
        now: Timestamp,
    ) -> Result<(usize, usize), StoreError> {
        let policy = rules.policy(set);
        let sort = json!([{"datetime": {"order": "asc", "unmapped_type": "date"}}, {"timestamp": {"order": "asc", "unmapped_type": "date"}}]);
        let changes = self
            .hits(
                &self.changes,
                unstamped("seq", Some(set.as_str())),
                sort,
                ROUND,
            )
            .await?;
        let resources = self
            .hits(
                &self.resources,
                unstamped("part", Some(set.as_str())),
                json!([{"timestamp": {"order": "asc", "unmapped_type": "date"}}]),
                ROUND,
            )
            .await?;

        // Each document's key (documents whose location is not valid for the set are skipped).
        let key_of = |h: &Value| -> Option<ResourceKey> {
            let loc: Location = serde_json::from_value(h["_source"]["location"].clone()).ok()?;
            match rules.key(set, &loc) {
                Ok(k) => Some(k),
                Err(why) => {
                    let id = h["_id"].as_str().unwrap_or_default();
                    self.say_stuck(id, || {
                        tracing::warn!(set = %set, id = %id, %why, "external document with an unusable location: ignored (it stays unadopted)");
                    });
                    None
                }
            }
        };
        let change_keys: Vec<Option<ResourceKey>> = changes.iter().map(key_of).collect();
        let resource_keys: Vec<Option<ResourceKey>> = resources.iter().map(key_of).collect();
        let mut all: Vec<&str> = change_keys
            .iter()
            .chain(&resource_keys)
            .flatten()
            .map(|k| k.0.as_str())
            .collect();
        all.sort_unstable();
        all.dedup();
        let mut parts = self.known_parts(set, &all).await?;

        let notified = self.notified_until(set).await?.map(|t| t.0);
        let mut ops = String::new();
        let (mut count, mut late) = (0, 0);
        let mut latest_late = None;
        for (h, key) in changes.iter().zip(&change_keys) {
            let Some(key) = key else { continue };
            let src = &h["_source"];
            let given = date(&src["datetime"])
                .or_else(|| date(&src["timestamp"]))
                .unwrap_or(now);
            let open = st.open().totals();
            let floor = open.from.max(notified.unwrap_or(i64::MIN));
            // Recorded late: after everything recorded so far, in adoption order (like a change
            // ingested without a datetime), not all at one instant.
            let mut datetime = if given.0 >= floor {
                given
            } else {
                Timestamp(floor.max(open.max_dt.map_or(i64::MIN, |m| m + 1)))
            };
            if datetime != given {
                late += 1;
                latest_late = Some((given, datetime));
            }
            let eb = 400 + 2 * key.0.len() as u64;
            if policy.must_roll(&open, eb, now) {
                let (_, until) = st.close_open(now);
                datetime = Timestamp(datetime.0.max(until));
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            st.open().record(seq, eb, datetime);
            let part = match parts.get(&key.0) {
                Some(p) => *p,
                None => {
                    let p = st.part_with_room(&policy, foreign_entry_bytes(key, src));
                    parts.insert(key.0.clone(), p);
                    p
                }
            };
            st.touch(part, seq, datetime.0);
            let mut doc = src.clone();
            for (f, v) in [
                ("seq", json!(seq)),
                ("key", json!(key.0)),
                ("datetime_us", json!(datetime.0)),
                ("part", json!(part)),
                ("adopted", json!(true)),
            ] {
                doc[f] = v;
            }
            if doc["datetime"].is_null() {
                doc["datetime"] = json!(datetime.to_string());
            }
            push_conditional(&mut ops, &self.changes, h, &doc);
            count += 1;
        }
        if let Some((given, recorded)) = latest_late {
            tracing::warn!(set = %set, documents = late, last_datetime = %given, recorded_at = %recorded,
                "change documents dated before what was already notified or before the open Change List: recorded late \
                 (notify.hold_back_secs gives late writers time)");
        }
        // 1. Stamp the change documents (hidden until the commit below).
        let skipped = self.bulk_conditional(ops).await?;
        if skipped > 0 {
            tracing::info!(set = %set, skipped, "change documents changed while being adopted: left for the next round");
        }
        // 2. Commit.
        self.commit(set, st, true).await?;
        // 3. Resource documents. Each part they join changes now: its Last-Modified (and so
        // the cached page's version) moves, even when their change documents were adopted in
        // an earlier round or a page was built between step 2 and here (a page built then
        // lacked them and, its version unchanged, was served without them for good).
        let mut ops = String::new();
        let mut touched = std::collections::BTreeSet::new();
        for (h, key) in resources.iter().zip(&resource_keys) {
            let Some(key) = key else { continue };
            let part = match parts.get(&key.0) {
                Some(p) => *p,
                None => {
                    let p = st.part_with_room(&policy, foreign_entry_bytes(key, &h["_source"]));
                    parts.insert(key.0.clone(), p);
                    p
                }
            };
            touched.insert(part);
            let mut doc = h["_source"].clone();
            for (f, v) in [
                ("key", json!(key.0)),
                ("part", json!(part)),
                ("adopted", json!(true)),
            ] {
                doc[f] = v;
            }
            if doc["seq"].is_null() {
                doc["seq"] = json!(st.next_seq - 1);
            }
            push_conditional(&mut ops, &self.resources, h, &doc);
        }
        self.bulk_conditional(ops).await?;
        let stamped_at = Timestamp::now().0;
        for p in st.parts.iter_mut().filter(|p| touched.contains(&p.no)) {
            p.last_change = p.last_change.max(stamped_at);
        }
        if !resources.is_empty() || count > 0 {
            self.recount_parts(set, st).await?;
            self.commit(set, st, true).await?;
            tracing::debug!(set = %set, changes = count, resources = resources.len(), "external documents adopted");
        }
        Ok((changes.len(), count - skipped))
    }

    /// The part each key already has: from its stamped resource document, else from its
    /// newest stamped change document (a writer may have replaced the resource document).
    async fn known_parts(
        &self,
        set: &SetName,
        keys: &[&str],
    ) -> Result<HashMap<String, u32>, StoreError> {
        let mut out = HashMap::new();
        if keys.is_empty() {
            return Ok(out);
        }
        let q = json!({"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, {"terms": {"key": keys}}, {"exists": {"field": "part"}}]}});
        for h in self
            .hits(&self.resources, q, json!([{"key": "asc"}]), keys.len())
            .await?
        {
            if let (Some(k), Some(p)) =
                (h["_source"]["key"].as_str(), h["_source"]["part"].as_u64())
            {
                out.insert(k.to_string(), p as u32);
            }
        }
        let missing: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| !out.contains_key(*k))
            .collect();
        if !missing.is_empty() {
            let q = json!({"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, {"terms": {"key": missing}}, {"exists": {"field": "part"}}]}});
            // Oldest first, so the newest wins.
            for h in self
                .hits(&self.changes, q, json!([{"seq": "asc"}]), 10_000)
                .await?
            {
                if let (Some(k), Some(p)) =
                    (h["_source"]["key"].as_str(), h["_source"]["part"].as_u64())
                {
                    out.insert(k.to_string(), p as u32);
                }
            }
        }
        Ok(out)
    }

    /// Sets each part's count from the resource documents stamped with it.
    async fn recount_parts(&self, set: &SetName, st: &mut SetState) -> Result<(), StoreError> {
        let body = json!({"size": 0, "query": {"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, {"exists": {"field": "part"}}]}},
                          "aggs": {"parts": {"terms": {"field": "part", "size": 100000}}}});
        let v = self
            .es
            .ok(
                Method::Post,
                &format!("/{}/_search", self.resources),
                Some(body),
            )
            .await?;
        let counts: HashMap<u64, u64> = v["aggregations"]["parts"]["buckets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| Some((b["key"].as_u64()?, b["doc_count"].as_u64()?)))
            .collect();
        for p in &mut st.parts {
            p.count = counts.get(&(p.no as u64)).copied().unwrap_or(0);
        }
        Ok(())
    }

    /// A `_bulk` of conditional writes; returns how many lost to a concurrent writer (409).
    async fn bulk_conditional(&self, ops: String) -> Result<usize, StoreError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let v = self.es.bulk(ops).await?;
        let mut lost = 0;
        for item in v["items"].as_array().into_iter().flatten() {
            let Some(r) = item.as_object().and_then(|o| o.values().next()) else {
                continue;
            };
            match r["status"].as_u64() {
                Some(409) => lost += 1,
                Some(s) if s >= 300 => {
                    return Err(StoreError::Unavailable(format!(
                        "bulk write failed: {}",
                        r["error"]
                    )))
                }
                _ => {}
            }
        }
        Ok(lost)
    }

    /// After a writer died mid-round: change documents it stamped but never committed are
    /// unstamped, to be adopted again.
    pub(super) async fn unstamp_uncommitted(
        &self,
        set: &SetName,
        next_seq: i64,
    ) -> Result<(), StoreError> {
        let q = json!({"bool": {"filter": [{"term": {"resource_set": set.as_str()}}, {"term": {"adopted": true}}, {"range": {"seq": {"gte": next_seq}}}]}});
        let hits = self
            .hits(&self.changes, q, json!([{"seq": "asc"}]), 10_000)
            .await?;
        if hits.is_empty() {
            return Ok(());
        }
        tracing::warn!(set = %set, documents = hits.len(), "adoption round of a stopped process undone; adopting again");
        let mut ops = String::new();
        for h in &hits {
            let mut doc = h["_source"].clone();
            if let Some(o) = doc.as_object_mut() {
                for f in ["seq", "key", "datetime_us", "part", "adopted"] {
                    o.remove(f);
                }
            }
            push_conditional(&mut ops, &self.changes, h, &doc);
        }
        self.bulk_conditional(ops).await?;
        Ok(())
    }
}

/// The sitemap size estimate of a foreign document's resource (its `mime` and `ln`, when it
/// has readable ones).
fn foreign_entry_bytes(key: &crate::model::ResourceKey, doc: &Value) -> u64 {
    let ln: Vec<crate::model::Link> = serde_json::from_value(doc["ln"].clone()).unwrap_or_default();
    crate::store::entry_bytes(key, doc["mime"].as_str(), &ln)
}

fn push_conditional(ops: &mut String, index: &str, hit: &Value, doc: &Value) {
    let action = json!({"index": {"_index": index, "_id": hit["_id"], "if_seq_no": hit["_seq_no"], "if_primary_term": hit["_primary_term"]}});
    ops.push_str(&action.to_string());
    ops.push('\n');
    ops.push_str(&doc.to_string());
    ops.push('\n');
}

impl SetState {
    /// The last part if it has room for one more resource of `entry_bytes`, else a new one.
    pub(super) fn part_with_room(&mut self, policy: &ListPolicy, entry_bytes: u64) -> u32 {
        let fits = self
            .parts
            .last()
            .is_some_and(|p| policy.part_has_room(p.count, p.bytes, entry_bytes));
        if !fits {
            let no = self.parts.last().map_or(1, |p| p.no + 1);
            self.parts.push(PartState {
                no,
                ..Default::default()
            });
        }
        let last = self.parts.last_mut().expect("a part");
        last.count += 1;
        last.bytes += entry_bytes;
        last.no
    }

    /// Marks a part changed by change `seq` at `datetime` (its validators).
    pub(super) fn touch(&mut self, part: u32, seq: i64, datetime: i64) {
        if let Some(p) = self.parts.iter_mut().find(|p| p.no == part) {
            p.last_seq = seq;
            p.last_change = datetime;
        }
    }
}

impl ElasticStore {
    /// One adoption round over every set: the change documents adopted, and the age of the
    /// oldest document still waiting (none when every one is adopted). A document that has
    /// waited over [`STUCK`] is logged (once a minute) with its id and set.
    pub(super) async fn adopt(&self, rules: &dyn SetRules) -> Result<Adoption, StoreError> {
        let mut adopted = 0;
        let sets = self.sets_to_adopt().await?;
        if sets.is_empty() {
            // Nothing waits (the common round): no search for the oldest.
            self.adoption.lock().expect("adoption watch").oldest = None;
            return Ok(Adoption { adopted, lag: None });
        }
        for name in sets {
            let Ok(set) = SetName::parse(&name) else {
                self.say_stuck(&format!("resource_set {name:?}"), || {
                    tracing::warn!(resource_set = %name, "documents with an invalid resource_set are ignored");
                });
                continue;
            };
            loop {
                let (seen, stamped) = self.adopt_set(&set, rules).await?;
                adopted += stamped;
                // A full round goes on, unless it stamped nothing (documents it cannot use
                // would otherwise be read again and again).
                if seen < ROUND || stamped == 0 {
                    break;
                }
            }
        }
        let waiting = self.oldest_unadopted().await?;
        let now = Timestamp::now();
        let lag = waiting.map(|(id, set, written)| {
            let mut w = self.adoption.lock().expect("adoption watch");
            if w.oldest.as_deref() != Some(id.as_str()) {
                w.oldest = Some(id.clone());
                w.first_seen = std::time::Instant::now();
            }
            let by_writer = written
                .map(|t| std::time::Duration::from_micros((now.0 - t.0).max(0) as u64))
                .unwrap_or_default();
            let age = by_writer.max(w.first_seen.elapsed());
            if age >= STUCK && w.warned.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                w.warned = Some(std::time::Instant::now());
                tracing::warn!(set = %set, id = %id, waited_secs = age.as_secs(),
                    "an external document is still not adopted: it is not served or notified (see rshub_adoption_lag_seconds)");
            }
            age
        });
        if lag.is_none() {
            let mut w = self.adoption.lock().expect("adoption watch");
            w.oldest = None;
        }
        Ok(Adoption { adopted, lag })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adoption_cuts_parts_by_bytes_as_well_as_count() {
        let policy = ListPolicy {
            max_items: 10,
            max_bytes: 1_000,
            rollover_secs: 0,
            max_future_skew_secs: 0,
        };
        let mut st = SetState::default();
        // 400-byte entries: two fit under 1,000 bytes, the third opens part 2 long before
        // the count limit of 10 is reached.
        let parts: Vec<u32> = (0..5).map(|_| st.part_with_room(&policy, 400)).collect();
        assert_eq!(parts, [1, 1, 2, 2, 3]);
        // One entry larger than the whole budget still gets a part (of its own).
        assert_eq!(st.part_with_room(&policy, 5_000), 4);
        assert_eq!(st.part_with_room(&policy, 1), 5);
    }
}
