//! Answers to an offer, sent to the sender's declared inbox (never to an inbox a notification
//! names): `Accept` then `Announce` of the service result (the record's URL on this server)
//! once the record is collected, or `Reject` with the reason. Each is sent through the hub's
//! guarded client, tried again with growing pauses, and kept with its state beside the
//! notification (`pending`, `sent`, `given_up`).

use serde_json::{json, Value};

use super::{Inbox, Outcome, Reply};
use crate::backoff::Backoff;
use crate::config::SenderConfig;
use crate::model::coar::{Notification, AS_CONTEXT, COAR_CONTEXTS};
use crate::model::ResourceKey;

/// The longest pause between two tries of an answer.
const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(300);

/// A new notification id.
fn new_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).unwrap_or_default();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = crate::digest::hex_digest(b);
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl Inbox {
    /// The answers to offer `n` (kept at `seq`, `offer` as it was posted) after `outcome`,
    /// each sent in turn.
    pub(super) async fn answer(
        &self,
        seq: u64,
        sender: &SenderConfig,
        n: &Notification,
        offer: &Value,
        outcome: &Outcome,
    ) {
        let answers: Vec<(&str, Value)> = match outcome {
            Outcome::Collected { identifier, .. } => vec![
                (
                    "Accept",
                    self.accept_or_reject("Accept", sender, n, offer, None),
                ),
                ("Announce", self.service_result(sender, n, identifier)),
            ],
            Outcome::NotCollected { why } => vec![(
                "Reject",
                self.accept_or_reject("Reject", sender, n, offer, Some(why)),
            )],
            Outcome::Received => return,
        };
        // All kept as pending first: a stop before they are sent loses none (see `resume`).
        let replies: Vec<Reply> = answers
            .into_iter()
            .map(|(kind, doc)| Reply {
                kind: kind.into(),
                id: doc["id"].as_str().unwrap_or_default().to_string(),
                state: "pending".into(),
                attempts: 0,
                last: None,
                doc: Some(doc),
            })
            .collect();
        let keep = replies.clone();
        let _ = self.ring.update(seq, |k| k.replies.extend(keep)).await;
        for r in replies {
            if let Some(doc) = &r.doc {
                self.send(seq, &sender.inbox, &r.id, doc, 0).await;
            }
        }
    }

    /// After a start: the answers a stopped process left `pending` are sent, in order, to
    /// their sender's inbox as configured now (each with the tries it has left).
    pub async fn resume(&self) {
        let mut pending = Vec::new();
        let mut page = Some(1);
        while let Some(p) = page {
            let Ok((kept, next)) = self.page(p).await else {
                break;
            };
            for k in &kept {
                for r in &k.replies {
                    if let (true, Some(doc)) = (r.state == "pending", &r.doc) {
                        pending.push((
                            k.seq,
                            k.sender.clone(),
                            r.id.clone(),
                            doc.clone(),
                            r.attempts,
                        ));
                    }
                }
            }
            page = next;
        }
        // Oldest first, as they were due.
        pending.sort_by_key(|p| p.0);
        if !pending.is_empty() {
            tracing::info!(
                answers = pending.len(),
                "sending the answers a stopped process left pending"
            );
        }
        for (seq, sender, id, doc, tried) in pending {
            let Some(s) = self.ctx.config().inbox.senders.get(&sender) else {
                continue;
            };
            self.send(seq, &s.inbox, &id, &doc, tried).await;
        }
    }

    /// This server as a service of COAR Notify.
    fn us(&self) -> Value {
        json!({"id": self.ctx.urls().base(), "inbox": self.url(), "type": "Service"})
    }

    fn them(sender: &SenderConfig) -> Value {
        json!({"id": sender.id, "inbox": sender.inbox, "type": "Service"})
    }

    fn actor(&self) -> Value {
        json!({"id": self.ctx.urls().base(), "type": "Service", "name": "resourcesync-hub"})
    }

    /// `Accept` or `Reject` of the offer (the offer itself as the object, as COAR Notify
    /// asks: `inReplyTo` is its id).
    fn accept_or_reject(
        &self,
        kind: &str,
        sender: &SenderConfig,
        n: &Notification,
        offer: &Value,
        why: Option<&str>,
    ) -> Value {
        let mut doc = json!({
            "@context": [AS_CONTEXT, COAR_CONTEXTS[0]],
            "id": new_id(),
            "type": kind,
            "actor": self.actor(),
            "origin": self.us(),
            "target": Self::them(sender),
            "inReplyTo": n.id,
            "object": offer,
        });
        if let Some(w) = why {
            doc["summary"] = json!(w);
        }
        doc
    }

    /// `Announce` of the service result: the record as this server serves it now.
    fn service_result(&self, sender: &SenderConfig, n: &Notification, identifier: &str) -> Value {
        let sc = self.ctx.set_config(
            &crate::model::SetName::parse(&sender.collect)
                .unwrap_or_else(|_| crate::model::SetName::parse("unknown").expect("a valid name")),
        );
        let key = ResourceKey(format!(
            "path:{}",
            crate::model::origin::record_path(identifier)
        ));
        // The item at the origin: the first web address the offer gave, else the record's
        // GetRecord URL at the repository (COAR Notify asks an http(s) URL here).
        let item = n
            .names
            .iter()
            .find(|s| s.starts_with("https://") || s.starts_with("http://"))
            .cloned()
            .or_else(|| {
                let c = self.ctx.config().collect.get(&sender.collect)?;
                let mut u = url::Url::parse(&c.url).ok()?;
                u.query_pairs_mut()
                    .append_pair("verb", "GetRecord")
                    .append_pair("metadataPrefix", &c.metadata_prefix)
                    .append_pair("identifier", identifier);
                Some(u.to_string())
            })
            .unwrap_or_else(|| n.object.clone());
        json!({
            "@context": [AS_CONTEXT, COAR_CONTEXTS[0]],
            "id": new_id(),
            "type": ["Announce", "coar-notify:IngestAction"],
            "actor": self.actor(),
            "origin": self.us(),
            "target": Self::them(sender),
            "inReplyTo": n.id,
            "context": {"id": item},
            "object": {
                "id": key.url(&sc.url_prefix),
                "ietf:cite-as": identifier,
                "type": ["Page", "sorg:AboutPage"],
            },
        })
    }

    /// Sends `doc` to `inbox` until it is taken (2xx), tried `inbox.reply_attempts` times in
    /// all (`tried` of them already).
    async fn send(&self, seq: u64, inbox: &str, id: &str, doc: &Value, tried: u32) {
        let body = doc.to_string();
        let mut pauses = Backoff::new(std::time::Duration::from_secs(1), MAX_PAUSE);
        let attempts = self.cfg.reply_attempts.max(1);
        for attempt in (tried + 1)..=attempts.max(tried + 1) {
            let result = self.send_once(inbox, &body).await;
            let (state, last) = match &result {
                Ok(status) => ("sent", format!("answered {status}")),
                Err(e) if attempt >= attempts => ("given_up", e.clone()),
                Err(e) => ("pending", e.clone()),
            };
            let _ = self
                .ring
                .update(seq, |k| {
                    if let Some(r) = k.replies.iter_mut().find(|r| r.id == id) {
                        r.state = state.into();
                        r.attempts = attempt;
                        r.last = Some(last.clone());
                        if state != "pending" {
                            // Sent or given up: the answer itself is no longer needed.
                            r.doc = None;
                        }
                    }
                })
                .await;
            match state {
                "sent" => {
                    tracing::info!(seq, %inbox, reply = %id, "answer sent");
                    return;
                }
                "given_up" => {
                    tracing::warn!(seq, %inbox, reply = %id, reason = %last, "answer given up");
                    return;
                }
                _ => tokio::time::sleep(pauses.pause()).await,
            }
        }
    }

    /// One try: `Ok(status)` when the inbox took it.
    async fn send_once(&self, inbox: &str, body: &str) -> Result<u16, String> {
        let url = url::Url::parse(inbox).map_err(|e| format!("{inbox}: {e}"))?;
        self.policy.check_url(&url, "the sender's inbox")?;
        let resp = self
            .client
            .post(url)
            .header("content-type", "application/ld+json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| crate::cause::chain(&e.without_url()))?;
        self.policy.check_peer(&resp)?;
        let status = resp.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err(format!("answered {status}"))
        }
    }
}
