//! The Elasticsearch backend (Elasticsearch 8/9, OpenSearch): the client ([`Es`]), the
//! mappings ([`mapping`]), the source's store contract (`contract`), adoption of documents
//! written by external DIT-ES writers (`adopt`), and the hub's storage and leases (`hub`).
//!
//! - Engines cannot sort on `_id` or `_seq_no` (measured on osmem-server; Elasticsearch 8
//!   disables `_id` fielddata), and external documents carry no unique sortable field, so the
//!   server gives every change a `seq` and every resource its `key` and Resource List `part`.
//! - A per-set document in a meta index (`<index>-meta`) holds `next_seq`, `applied_seq`, the
//!   open Change List (`no`, `from`, count, bytes, newest datetime), closed lists, and per-part
//!   counts/validators — the embedded store's bookkeeping — and is only ever replaced with
//!   `if_seq_no`/`if_primary_term`, so it serialises writers across processes.
//! - Ingest and adoption claim that document, write change documents past `next_seq` (hidden
//!   from readers), commit by saving `next_seq`, then write resource documents; a committed
//!   batch whose writer died is replayed, an uncommitted adoption is undone.
//! - Reads: Change Lists and notifications by (`datetime_us`, `seq`) and part N by a term query
//!   on `part` sorted by `key`, all with `search_after` (inside a point in time for scans,
//!   [`Es::scan`]), never `from`.
//! - The hub: subscriptions as documents replaced conditionally, the message log as documents
//!   whose number is claimed by creating them, the notifier's state with an outbox, the leader
//!   lease that makes one process at a time notify, and the partition leases, heartbeats and
//!   epochs that spread delivery over the processes.

mod adopt;
mod contract;
mod hub;
pub mod mapping;

pub use crate::store::SetRules;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use elasticsearch::auth::Credentials;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::Method;
use elasticsearch::Elasticsearch;
use serde_json::Value;

use super::{SetStore, StoreError};
use crate::config::ElasticConfig;

/// Requests sent to the search server by this process (for benchmarks: round trips per page).
static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many requests this process has sent to the search server so far.
pub fn requests_sent() -> u64 {
    REQUESTS.load(std::sync::atomic::Ordering::Relaxed)
}

fn count_request() {
    REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Which engine answers: they differ in the point-in-time API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    Elasticsearch,
    OpenSearch,
}

/// The few calls the backend makes, over the `elasticsearch` crate's transport.
#[derive(Clone)]
pub struct Es {
    client: Elasticsearch,
    url: String,
    pub distribution: Distribution,
    pub version: String,
    /// The indices this store needs, with their mappings (see [`Es::check_indices`]).
    indices: Arc<Vec<(String, Value)>>,
    /// Whether every index is an alias of ours, so that writes can carry `require_alias`: a
    /// write into a lost index then fails instead of creating it with guessed mappings.
    guarded: Arc<AtomicBool>,
    /// Indices found missing and recreated that `/readyz` has not reported yet: whichever
    /// call meets a loss first (a write, a background worker, `/readyz` itself), the operator
    /// watching `/readyz` sees it once.
    unreported: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Es {
    /// Connects and identifies the server; a clear error when it cannot be reached.
    pub async fn connect(cfg: &ElasticConfig) -> Result<Es, StoreError> {
        let url = cfg.server_url();
        let parsed = url::Url::parse(&url).map_err(|e| {
            StoreError::Unavailable(format!("store.elasticsearch url {url:?}: {e}"))
        })?;
        let mut builder = TransportBuilder::new(SingleNodeConnectionPool::new(parsed))
            .timeout(Duration::from_secs(cfg.request_timeout_secs))
            .disable_proxy();
        if !cfg.username.is_empty() {
            builder = builder.auth(Credentials::Basic(
                cfg.username.clone(),
                cfg.password.clone(),
            ));
        }
        let transport = builder
            .build()
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch client: {e}")))?;
        let mut es = Es {
            client: Elasticsearch::new(transport),
            url,
            distribution: Distribution::Elasticsearch,
            version: String::new(),
            indices: Arc::new(Vec::new()),
            guarded: Arc::new(AtomicBool::new(false)),
            unreported: Default::default(),
        };
        let root = es.ok(Method::Get, "/", None).await?;
        es.version = root["version"]["number"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        if root["version"]["distribution"].as_str() == Some("opensearch") {
            es.distribution = Distribution::OpenSearch;
        }
        Ok(es)
    }

    /// One request: `(status, JSON body)`; transport failures are `Unavailable`.
    pub async fn call_text(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, String), StoreError> {
        count_request();
        let resp = match body {
            Some(b) => {
                self.client
                    .send(
                        method,
                        path,
                        HeaderMap::new(),
                        Option::<&()>::None,
                        Some(b.to_string()),
                        None,
                    )
                    .await
            }
            None => {
                self.client
                    .send::<String, ()>(method, path, HeaderMap::new(), None, None, None)
                    .await
            }
        }
        .map_err(|e| StoreError::Unavailable(format!("elasticsearch at {}: {e}", self.url)))?;
        let status = resp.status_code().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch at {}: {e}", self.url)))?;
        Ok((status, text))
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), StoreError> {
        let (status, text) = self.call_text(method, path, body).await?;
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, value))
    }

    /// A request that must succeed, its answer decoded straight into `T` (no intermediate
    /// `Value` tree: the hot path of page builds).
    pub async fn ok_typed<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, StoreError> {
        let (status, text) = self.call_text(method, path, body).await?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| {
                StoreError::Corrupt(format!("elasticsearch {path}: unexpected answer: {e}"))
            });
        }
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let msg = format!("elasticsearch {path}: {status} {}", reason(&v));
        Err(if status >= 500 {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Corrupt(msg)
        })
    }

    /// A request that must succeed (2xx).
    pub async fn ok(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, StoreError> {
        let (status, v) = self.call(method, path, body).await?;
        if (200..300).contains(&status) {
            Ok(v)
        } else if status >= 500 {
            Err(StoreError::Unavailable(format!(
                "elasticsearch {path}: {status} {}",
                reason(&v)
            )))
        } else {
            Err(StoreError::Corrupt(format!(
                "elasticsearch {path}: {status} {}",
                reason(&v)
            )))
        }
    }

    /// Creates the index with `mapping` when missing, as the concrete index `<index>-v1`
    /// behind the alias `<index>` (writes can then require the alias); otherwise checks its
    /// mapping and adds what is missing, or fails naming the incompatible field.
    pub async fn ensure_index(
        &self,
        index: &str,
        mapping: &Value,
    ) -> Result<IndexState, StoreError> {
        let (status, existing) = self
            .call(Method::Get, &format!("/{index}/_mapping"), None)
            .await?;
        if status == 404 {
            let concrete = format!("{index}-v1");
            let body = serde_json::json!({"settings": {"number_of_shards": 1}, "mappings": mapping, "aliases": {index: {}}});
            let (status, v) = self
                .call(Method::Put, &format!("/{concrete}"), Some(body))
                .await?;
            if (200..300).contains(&status) {
                return Ok(IndexState::Created);
            }
            if v["error"]["type"] == "resource_already_exists_exception" {
                // Another process created it in between; or the alias alone was lost.
                let add =
                    serde_json::json!({"actions": [{"add": {"index": concrete, "alias": index}}]});
                self.ok(Method::Post, "/_aliases", Some(add)).await?;
                return Ok(IndexState::Aliased);
            }
            return Err(StoreError::Corrupt(format!(
                "cannot create index {index}: {status} {}",
                reason(&v)
            )));
        }
        if !(200..300).contains(&status) {
            return Err(StoreError::Unavailable(format!(
                "reading the mapping of {index}: {status} {}",
                reason(&existing)
            )));
        }
        // {"<index or its alias target>": {"mappings": {...}}}
        let (name, have) = existing
            .as_object()
            .and_then(|o| o.iter().next())
            .map(|(k, v)| (k.clone(), v["mappings"].clone()))
            .unwrap_or_default();
        if let Some(add) = mapping::reconcile(index, &have, mapping).map_err(StoreError::Corrupt)? {
            self.ok(Method::Put, &format!("/{index}/_mapping"), Some(add))
                .await?;
        }
        Ok(if name == index {
            IndexState::Concrete
        } else {
            IndexState::Aliased
        })
    }

    /// Makes sure every index exists with its mappings: creates what is missing (a cluster
    /// rebuilt empty, an index deleted by hand) and returns the names of the indices it had
    /// to recreate.
    pub async fn check_indices(&self) -> Result<Vec<String>, StoreError> {
        let recreated = self.ensure_indices().await?;
        if !recreated.is_empty() {
            tracing::error!(indices = %recreated.join(", "), "indices were missing (the cluster was rebuilt or they were deleted): \
                recreated with their mappings; what they held is gone");
            let mut unreported = self.unreported.lock().unwrap_or_else(|p| p.into_inner());
            for i in &recreated {
                if !unreported.contains(i) {
                    unreported.push(i.clone());
                }
            }
        }
        Ok(recreated)
    }

    /// The indices recreated since the last call (by whichever caller met the loss).
    pub fn take_unreported_losses(&self) -> Vec<String> {
        std::mem::take(&mut *self.unreported.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Creates what is missing; returns the indices created.
    async fn ensure_indices(&self) -> Result<Vec<String>, StoreError> {
        let mut recreated = Vec::new();
        let mut all_aliased = true;
        for (index, m) in self.indices.iter() {
            let state = self.ensure_index(index, m).await?;
            if state == IndexState::Created {
                recreated.push(index.clone());
            }
            all_aliased &= state != IndexState::Concrete;
        }
        self.guarded.store(all_aliased, Ordering::Relaxed);
        Ok(recreated)
    }

    /// After a write refused because an index is gone: recreate it, and fail the write so
    /// that its caller retries (nothing was written into a guessed mapping).
    async fn index_lost(&self, what: &str) -> StoreError {
        match self.check_indices().await {
            Ok(r) => StoreError::Unavailable(format!(
                "{what}: indices {r:?} were missing and have been recreated; retry"
            )),
            Err(e) => e,
        }
    }

    /// `&require_alias=true` when every index is ours.
    fn guard(&self) -> &'static str {
        if self.guarded.load(Ordering::Relaxed) {
            "&require_alias=true"
        } else {
            ""
        }
    }
}

/// What [`Es::ensure_index`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexState {
    /// It was missing and has been created (behind its alias).
    Created,
    /// An alias of ours over a concrete index.
    Aliased,
    /// A concrete index of that name (created by another writer or an older version).
    Concrete,
}

/// A document with the version it was read at (for a conditional replace).
#[derive(Debug, Clone)]
pub struct Versioned {
    pub source: Value,
    pub seq_no: i64,
    pub primary_term: i64,
}

impl Es {
    /// Reads a document; `None` when absent.
    pub async fn get_doc(&self, index: &str, id: &str) -> Result<Option<Versioned>, StoreError> {
        let path = format!("/{index}/_doc/{}", encode_id(id));
        let (status, v) = self.call(Method::Get, &path, None).await?;
        match status {
            404 => Ok(None),
            200..=299 if v["found"] == Value::Bool(false) => Ok(None),
            200..=299 => Ok(Some(Versioned {
                source: v["_source"].clone(),
                seq_no: v["_seq_no"].as_i64().unwrap_or(-1),
                primary_term: v["_primary_term"].as_i64().unwrap_or(-1),
            })),
            s if s >= 500 => Err(StoreError::Unavailable(format!(
                "GET {path}: {s} {}",
                reason(&v)
            ))),
            s => Err(StoreError::Corrupt(format!(
                "GET {path}: {s} {}",
                reason(&v)
            ))),
        }
    }

    /// Writes a document only if it is still at `version` (or, with `None`, does not exist
    /// yet). `false` when someone else wrote first (409). Visible to searches on return.
    pub async fn put_doc_if(
        &self,
        index: &str,
        id: &str,
        source: &Value,
        version: Option<&Versioned>,
    ) -> Result<bool, StoreError> {
        Ok(self
            .put_doc_versioned(index, id, source, version)
            .await?
            .is_some())
    }

    /// As [`Es::put_doc_if`], answering the document as written with its new version (for
    /// the next conditional write), or `None` when someone else wrote first.
    pub async fn put_doc_versioned(
        &self,
        index: &str,
        id: &str,
        source: &Value,
        version: Option<&Versioned>,
    ) -> Result<Option<Versioned>, StoreError> {
        let path = match version {
            Some(v) => format!(
                "/{index}/_doc/{}?if_seq_no={}&if_primary_term={}&refresh=true{}",
                encode_id(id),
                v.seq_no,
                v.primary_term,
                self.guard()
            ),
            None => format!(
                "/{index}/_create/{}?refresh=true{}",
                encode_id(id),
                self.guard()
            ),
        };
        let (status, v) = self.call(Method::Put, &path, Some(source.clone())).await?;
        match status {
            200..=299 => Ok(Some(Versioned {
                source: source.clone(),
                seq_no: v["_seq_no"].as_i64().unwrap_or(-1),
                primary_term: v["_primary_term"].as_i64().unwrap_or(-1),
            })),
            409 => Ok(None),
            404 if v["error"]["type"] == "index_not_found_exception" => {
                Err(self.index_lost(&format!("PUT {path}")).await)
            }
            s if s >= 500 => Err(StoreError::Unavailable(format!(
                "PUT {path}: {s} {}",
                reason(&v)
            ))),
            s => Err(StoreError::Corrupt(format!(
                "PUT {path}: {s} {}",
                reason(&v)
            ))),
        }
    }
}

/// Document ids go into the URL path.
pub(super) fn encode_id(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// One page of a point-in-time scan.
#[derive(Debug, Clone)]
pub struct ScanPage {
    pub hits: Vec<Value>,
    /// The sort values of the last hit: where the next page starts.
    pub after: Option<Value>,
}

impl Es {
    /// Opens a point in time on `index` (Elasticsearch `/_pit`, OpenSearch
    /// `/_search/point_in_time`); returns its id.
    pub async fn open_pit(&self, index: &str, keep_alive: &str) -> Result<String, StoreError> {
        let (path, field) = match self.distribution {
            Distribution::Elasticsearch => (format!("/{index}/_pit?keep_alive={keep_alive}"), "id"),
            Distribution::OpenSearch => (
                format!("/{index}/_search/point_in_time?keep_alive={keep_alive}"),
                "pit_id",
            ),
        };
        let v = self.ok(Method::Post, &path, None).await?;
        v[field]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Corrupt(format!("{path}: no point-in-time id in {v}")))
    }

    pub async fn close_pit(&self, id: &str) -> Result<(), StoreError> {
        let (path, body) = match self.distribution {
            Distribution::Elasticsearch => ("/_pit", serde_json::json!({"id": id})),
            Distribution::OpenSearch => (
                "/_search/point_in_time",
                serde_json::json!({"pit_id": [id]}),
            ),
        };
        self.ok(Method::Delete, path, Some(body)).await.map(|_| ())
    }

    /// A page of `query` sorted by `sort` (which must end in a unique field) inside the point
    /// in time `pit`, after the sort values `after`. Never `from`: any depth costs the same.
    pub async fn scan(
        &self,
        pit: &str,
        query: &Value,
        sort: &Value,
        after: Option<&Value>,
        size: usize,
    ) -> Result<ScanPage, StoreError> {
        let mut body = serde_json::json!({
            "size": size,
            "query": query,
            "sort": sort,
            "pit": {"id": pit, "keep_alive": "1m"},
            "track_total_hits": false
        });
        if let Some(a) = after {
            body["search_after"] = a.clone();
        }
        let v = self.ok(Method::Post, "/_search", Some(body)).await?;
        let hits = v["hits"]["hits"].as_array().cloned().unwrap_or_default();
        let after = if hits.len() == size {
            hits.last().map(|h| h["sort"].clone())
        } else {
            None
        };
        Ok(ScanPage { hits, after })
    }
}

impl Es {
    /// A `_bulk` request (NDJSON), visible to searches on return.
    pub async fn bulk(&self, ndjson: String) -> Result<Value, StoreError> {
        count_request();
        let mut headers = HeaderMap::new();
        headers.insert(
            elasticsearch::http::headers::CONTENT_TYPE,
            elasticsearch::http::headers::HeaderValue::from_static("application/x-ndjson"),
        );
        let guarded = self.guarded.load(Ordering::Relaxed);
        let query: &[(&str, &str)] = if guarded {
            &[("refresh", "true"), ("require_alias", "true")]
        } else {
            &[("refresh", "true")]
        };
        let resp = self
            .client
            .send(
                Method::Post,
                "/_bulk",
                headers,
                Some(query),
                Some(ndjson),
                None,
            )
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch at {}: {e}", self.url)))?;
        let status = resp.status_code().as_u16();
        let v: Value = resp
            .json()
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch bulk: {e}")))?;
        if status >= 300 {
            return Err(StoreError::Unavailable(format!(
                "elasticsearch bulk: {status} {}",
                reason(&v)
            )));
        }
        let lost = v["items"].as_array().into_iter().flatten().any(|item| {
            item.as_object()
                .and_then(|o| o.values().next())
                .is_some_and(|r| r["error"]["type"] == "index_not_found_exception")
        });
        if lost {
            return Err(self.index_lost("elasticsearch bulk").await);
        }
        Ok(v)
    }
}

fn reason(v: &Value) -> String {
    v["error"]["reason"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Connects and makes sure the indices exist with compatible mappings.
pub async fn open(cfg: &ElasticConfig) -> Result<Es, StoreError> {
    let mut es = Es::connect(cfg).await?;
    es.indices = Arc::new(vec![
        (cfg.resource_index(), mapping::resource_mapping()),
        (cfg.change_index(), mapping::change_mapping()),
        (cfg.meta_index(), mapping::meta_mapping()),
        (cfg.hub_index(), hub::hub_mapping()),
    ]);
    for index in es.ensure_indices().await? {
        tracing::info!(index = %index, "index created");
    }
    if !es.guarded.load(Ordering::Relaxed) {
        tracing::info!(
            "some indices are concrete indices, not aliases of ours (created by another writer or an older version): \
             a write cannot detect that such an index was lost; /readyz checks them"
        );
    }
    Ok(es)
}

/// The backend's own view of sets: one bookkeeping document per set in the meta index.
#[derive(Clone)]
pub struct ElasticStore {
    pub es: Es,
    meta: String,
    resources: String,
    changes: String,
    hub: String,
    /// Subscription id -> document id, as read (neither ever changes).
    sub_docs: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<i64, String>>>,
    /// The adopter's memory between rounds.
    adoption: std::sync::Arc<std::sync::Mutex<adopt::AdoptionWatch>>,
}

impl ElasticStore {
    pub async fn open(cfg: &ElasticConfig) -> Result<ElasticStore, StoreError> {
        Ok(ElasticStore {
            es: open(cfg).await?,
            meta: cfg.meta_index(),
            resources: cfg.resource_index(),
            changes: cfg.change_index(),
            hub: cfg.hub_index(),
            sub_docs: Default::default(),
            adoption: Default::default(),
        })
    }

    /// Registers a set if it is new, its first Change List (and the notifier's watermark)
    /// starting at `start` (the earliest datetime of the batch that creates it).
    pub(super) async fn ensure_set_from(
        &self,
        set: &crate::model::SetName,
        now: crate::model::Timestamp,
        start: crate::model::Timestamp,
    ) -> Result<bool, StoreError> {
        let doc = serde_json::json!({
            "kind": "set",
            "set": set.as_str(),
            "created_at": now.micros() / 1000,
            "created_at_us": now.micros(),
            "state": contract::fresh_state(start)
        });
        if self
            .es
            .get_doc(&self.meta, &format!("set:{set}"))
            .await?
            .is_some()
        {
            return Ok(false);
        }
        // The notifier announces a new set and notifies its changes from its first one on:
        // its state exists before the set does.
        self.notify_init(super::NotifyState {
            set: set.clone(),
            watermark: start,
            parts_seen: 0,
            lists_seen: 1,
            announced: false,
            version: 0,
            covers: None,
        })
        .await?;
        self.es
            .put_doc_if(&self.meta, &format!("set:{set}"), &doc, None)
            .await
    }
}
