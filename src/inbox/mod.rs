//! The LDN inbox (W3C Linked Data Notifications, receiver side) taking COAR Notify
//! announcements from the services an operator declares (`[inbox.senders.NAME]`), each tied
//! to the collector of its repository: an `Offer` to ingest a record, or an `Announce` about
//! one, makes that collector fetch the record at once, so its change reaches subscribers in
//! seconds instead of at the next run.
//!
//! Everything a sender posts is untrusted: bounded in size (`inbox.max_notification_bytes`)
//! and nesting (serde_json's recursion limit), checked against the COAR Notify patterns
//! ([`crate::model::coar`]), refused unless its `origin.id` is a declared sender posting from
//! its networks and/or with its token, and limited per sender and per address. No JSON-LD
//! context is ever fetched, and nothing a notification names is contacted except through the
//! collector of the sender's repository (its `GetRecord`).
//!
//! Notifications are kept in the store (both backends) as a ring of `inbox.keep` slots over
//! the components' versioned documents: the storage a flood can take is bounded by the ring,
//! and each notification stays readable at its URL until its slot is reused or it is older
//! than `inbox.keep_days`.

mod reply;
mod ring;

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::collect::Collectors;
use crate::config::{InboxConfig, SenderConfig};
use crate::context::Context;
use crate::hub::RateLimiter;
use crate::model::coar::{self, Notification};
use crate::model::Timestamp;
use crate::store::StoreError;

pub use ring::{Kept, Reply};

/// The `rel` of the Link header that advertises the inbox.
pub const INBOX_REL: &str = "http://www.w3.org/ns/ldp#inbox";

/// Why a notification was not taken, each with the status it is answered with.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// 415: not `application/ld+json` (or `application/json`).
    #[error("{0}")]
    MediaType(String),
    /// 413.
    #[error("{0}")]
    TooLarge(String),
    /// 400: not JSON, or not a pattern this inbox takes.
    #[error("{0}")]
    Invalid(String),
    /// 401: the sender's token is missing or wrong.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: an undeclared origin, or a declared one posting from elsewhere.
    #[error("{0}")]
    Forbidden(String),
    /// 429 with the seconds to wait.
    #[error("{0}")]
    TooMany(String, u64),
    /// 404: no such notification (never, or no longer, kept).
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A declared sender, its token read from the environment at start.
struct Sender {
    name: String,
    cfg: SenderConfig,
    token: Option<String>,
}

/// What became of a notification: kept, then the record it names collected (or why not).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Outcome {
    /// Taken; the record is being fetched.
    Received,
    /// The record was fetched; `changed` whether that recorded a change.
    Collected { identifier: String, changed: bool },
    /// Nothing was collected, and why.
    NotCollected { why: String },
}

/// The inbox of one server.
pub struct Inbox {
    ctx: Arc<Context>,
    /// The hub's guarded client and its address policy: answers go through them.
    client: reqwest::Client,
    policy: Arc<crate::hub::AddressPolicy>,
    cfg: InboxConfig,
    senders: Vec<Sender>,
    collectors: Collectors,
    ring: ring::Ring,
    per_sender: RateLimiter,
    per_address: RateLimiter,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

/// An address's budget, in senders' budgets (`inbox.per_sender_per_minute`): every post from
/// it counts, refused ones too.
const PER_ADDRESS: u32 = 4;

impl Inbox {
    /// The inbox `[inbox]` configures; each sender's `token_env` must be set.
    pub fn new(
        ctx: Arc<Context>,
        clients: &crate::hub::Clients,
        collectors: Collectors,
        tasks: TaskTracker,
        cancel: CancellationToken,
    ) -> anyhow::Result<Inbox> {
        let cfg = ctx.config().inbox.clone();
        let mut senders = Vec::new();
        for (name, s) in &cfg.senders {
            let token = if s.token_env.is_empty() {
                None
            } else {
                let t = std::env::var(&s.token_env).map_err(|_| {
                    anyhow::Error::msg(format!(
                        "inbox.senders.{name}.token_env names {}, which is not set",
                        s.token_env
                    ))
                })?;
                Some(t)
            };
            senders.push(Sender {
                name: name.clone(),
                cfg: s.clone(),
                token,
            });
        }
        let n = cfg.per_sender_per_minute;
        Ok(Inbox {
            ring: ring::Ring::new(ctx.store().clone(), cfg.keep),
            client: clients.client().clone(),
            policy: clients.policy().clone(),
            ctx,
            cfg,
            senders,
            collectors,
            per_sender: RateLimiter::new(n),
            // Every post counts here, refused ones too: a budget of four senders' worth.
            per_address: RateLimiter::new(n.saturating_mul(PER_ADDRESS)),
            tasks,
            cancel,
        })
    }

    /// The inbox's URL.
    pub fn url(&self) -> String {
        format!("{}/inbox", self.ctx.urls().base())
    }

    /// A notification's URL.
    pub fn item_url(&self, seq: u64) -> String {
        format!("{}/inbox/{seq}", self.ctx.urls().base())
    }

    /// The largest body read.
    pub fn max_bytes(&self) -> usize {
        self.cfg.max_notification_bytes
    }

    /// Takes a POSTed notification: `content_type` and `body` as received, `bearer` the
    /// request's token, `peer` the client's address. Returns its number; its record is
    /// collected on the inbox's tasks.
    pub async fn receive(
        self: &Arc<Self>,
        content_type: Option<&str>,
        bearer: Option<&str>,
        peer: Option<IpAddr>,
        body: &[u8],
    ) -> Result<u64, InboxError> {
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase());
        if !matches!(
            media.as_deref(),
            Some("application/ld+json" | "application/json")
        ) {
            return Err(InboxError::MediaType(format!(
                "a notification is application/ld+json (with or without a profile), not {}",
                content_type.unwrap_or("a body without Content-Type")
            )));
        }
        let address = peer.map(|a| a.to_canonical());
        let key = address.map(|a| a.to_string()).unwrap_or_default();
        self.per_address.check(&key).map_err(|wait| {
            InboxError::TooMany(
                format!("too many notifications from this address; try again in {wait} seconds"),
                wait,
            )
        })?;
        if body.len() > self.cfg.max_notification_bytes {
            return Err(InboxError::TooLarge(format!(
                "the notification is larger than inbox.max_notification_bytes ({})",
                self.cfg.max_notification_bytes
            )));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| InboxError::Invalid(format!("the notification is not JSON: {e}")))?;
        let n = coar::parse(&value).map_err(|e| InboxError::Invalid(e.0))?;
        let sender = self
            .senders
            .iter()
            .find(|s| s.cfg.id == n.origin.id)
            .ok_or_else(|| {
                InboxError::Forbidden(format!(
                    "origin.id {} is not a sender this inbox takes notifications from ([inbox.senders])",
                    crate::cause::outsider(&n.origin.id)
                ))
            })?;
        if !sender.cfg.networks.is_empty()
            && !address.is_some_and(|a| sender.cfg.networks.iter().any(|net| net.contains(&a)))
        {
            return Err(InboxError::Forbidden(format!(
                "sender {} posts from its networks only (inbox.senders.{}.networks)",
                sender.name, sender.name
            )));
        }
        if let Some(t) = &sender.token {
            let given = bearer.unwrap_or("");
            use subtle::ConstantTimeEq as _;
            if !bool::from(given.as_bytes().ct_eq(t.as_bytes())) {
                return Err(InboxError::Unauthorized(format!(
                    "sender {} sends its bearer token (inbox.senders.{}.token_env)",
                    sender.name, sender.name
                )));
            }
        }
        self.per_sender.check(&sender.name).map_err(|wait| {
            InboxError::TooMany(
                format!(
                    "too many notifications from {} (inbox.per_sender_per_minute); try again in {wait} seconds",
                    sender.name
                ),
                wait,
            )
        })?;
        let kept = Kept {
            seq: 0,
            received_us: Timestamp::now().0,
            sender: sender.name.clone(),
            pattern: n.pattern,
            notification: value,
            outcome: Outcome::Received,
            replies: Vec::new(),
        };
        let seq = self.ring.put(&kept).await?;
        tracing::info!(seq, sender = %sender.name, pattern = n.pattern.as_str(), id = %crate::cause::outsider(&n.id), "notification received");
        let offer = kept.notification;
        let (inbox, sender) = (self.clone(), sender.cfg.clone());
        self.tasks.spawn(async move {
            let outcome = tokio::select! {
                o = inbox.act(&sender.collect, &n) => o,
                _ = inbox.cancel.cancelled() => return,
            };
            let settled = outcome.clone();
            if let Err(e) = inbox.ring.update(seq, |k| k.outcome = settled).await {
                tracing::warn!(seq, error = %crate::cause::chain(&e), "the notification's outcome could not be kept");
            }
            if n.pattern.is_offer() {
                tokio::select! {
                    _ = inbox.answer(seq, &sender, &n, &offer, &outcome) => {}
                    _ = inbox.cancel.cancelled() => {}
                }
            }
        });
        Ok(seq)
    }

    /// The OAI identifier of the record a notification names at `collector`: the first of its
    /// names that is an OAI identifier, else the first that is another name of a record the
    /// collector holds (its landing page, its persistent identifier's URL: see
    /// `collect::map::aliases`).
    async fn identify(&self, collector: &str, n: &Notification) -> Result<String, String> {
        if let Some(id) = n.names.iter().find(|s| s.starts_with("oai:")) {
            return Ok(id.clone());
        }
        for name in &n.names {
            match self.ctx.store().find_alias(name).await {
                Ok(Some((c, id))) if c == collector => return Ok(id),
                Ok(_) => {}
                Err(e) => return Err(crate::cause::chain(&e)),
            }
        }
        Err(format!(
            "none of {:?} is an OAI identifier or another name of a record collector {collector} holds",
            n.names
        ))
    }

    /// Collects the record the notification names, at the sender's collector.
    async fn act(&self, collector: &str, n: &Notification) -> Outcome {
        let identifier = match self.identify(collector, n).await {
            Ok(id) => id,
            Err(why) => return Outcome::NotCollected { why },
        };
        let identifier = &identifier;
        match self
            .collectors
            .collect_one(collector, identifier, &self.cancel)
            .await
        {
            Ok(c) => {
                let changed = c.created + c.updated + c.deleted > 0;
                tracing::info!(collector, identifier = %crate::cause::outsider(identifier), changed, "announced record collected");
                Outcome::Collected {
                    identifier: identifier.clone(),
                    changed,
                }
            }
            Err(why) => {
                tracing::warn!(collector, identifier = %crate::cause::outsider(identifier), %why, "announced record not collected");
                Outcome::NotCollected { why }
            }
        }
    }

    /// A notification kept at number `seq`, unless it is gone (its slot reused, or older than
    /// `inbox.keep_days`).
    pub async fn get(&self, seq: u64) -> Result<Kept, InboxError> {
        match self.ring.get(seq).await? {
            Some(k) if !self.expired(&k) => Ok(k),
            _ => Err(InboxError::NotFound(format!(
                "no notification {seq} is kept (inbox.keep: {}, inbox.keep_days: {})",
                self.cfg.keep, self.cfg.keep_days
            ))),
        }
    }

    fn expired(&self, k: &Kept) -> bool {
        let age = Timestamp::now().0 - k.received_us;
        age > self.cfg.keep_days as i64 * 86_400_000_000
    }

    /// Page `page` (from 1, newest first) of the notifications kept, and the next page's
    /// number when there is one. Page N is the window of `inbox.page_size` numbers below the
    /// newest (N−1 windows down): pages never overlap, and a page may hold fewer when some of
    /// its numbers are gone. Numbers grow with time, so the first notification found too old
    /// ends the listing (no page reads more than its window).
    pub async fn page(&self, page: u64) -> Result<(Vec<Kept>, Option<u64>), InboxError> {
        let size = u64::from(self.cfg.page_size);
        let next = self.ring.next().await?;
        let oldest = next.saturating_sub(u64::from(self.cfg.keep)).max(1);
        let top = next.saturating_sub(1 + (page.max(1) - 1).saturating_mul(size));
        let bottom = top.saturating_sub(size - 1).max(oldest);
        let mut kept = Vec::new();
        let mut ended = top < oldest;
        let mut seq = top;
        while !ended && seq >= bottom && seq > 0 {
            if let Some(k) = self.ring.get(seq).await? {
                if self.expired(&k) {
                    ended = true;
                    break;
                }
                kept.push(k);
            }
            seq -= 1;
        }
        let more = !ended && bottom > oldest;
        Ok((kept, more.then_some(page.max(1) + 1)))
    }

    /// Page `page` of the inbox as an LDP container in JSON-LD: its notifications' URLs
    /// (`ldp:contains`), and the next page's number when there is one.
    pub async fn listing(&self, page: u64) -> Result<(Value, Option<u64>), InboxError> {
        let (kept, next) = self.page(page).await?;
        let contains: Vec<Value> = kept
            .iter()
            .map(|k| json!({"@id": self.item_url(k.seq)}))
            .collect();
        Ok((
            json!({
                "@context": {"ldp": "http://www.w3.org/ns/ldp#"},
                "@id": self.url(),
                "@type": ["ldp:Container", "ldp:BasicContainer"],
                "ldp:contains": contains,
            }),
            next,
        ))
    }
}
