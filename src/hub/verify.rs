//! Verification of intent (WebSub §5.3) and denials (§5.2): a GET to the callback with the
//! hub's parameters appended to its own query string. A subscription changes only after the
//! callback echoed the single-use challenge with a 2xx.

use std::sync::Arc;

use tracing::Instrument;

use super::{challenge, Hub};
use crate::model::websub::{Intent, IntentMode, Resolution};
use crate::model::Timestamp;

/// The most of a verification answer that is read (a challenge is short).
const MAX_ANSWER: usize = 4096;

pub(super) async fn verify(hub: &Arc<Hub>, intent: Intent) {
    let span = tracing::info_span!("verify", mode = intent.mode.as_str(), topic = %intent.topic, callback = %intent.callback);
    async move {
        let resolution = match check(hub, &intent).await {
            Ok(r) => r,
            Err(why) => {
                tracing::info!(reason = %why, "verification failed; nothing changed");
                Resolution::Dropped
            }
        };
        // The lane map is not held across the store write: a lane reads its queue from the
        // log after the subscription's cursor, so a message published meanwhile is not missed.
        match hub.store.hub_resolve(intent.clone(), resolution.clone()).await {
            Ok(Some(sub)) => match resolution {
                Resolution::Subscribed { .. } => {
                    tracing::info!(subscription = sub.id, lease_secs = sub.lease_secs, "subscription verified");
                    hub.lane_update(sub, &mut hub.lanes());
                }
                _ => {
                    tracing::info!(subscription = sub.id, "unsubscribed");
                    hub.lanes().remove(&sub.id);
                }
            },
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "recording the verification failed; it is redone at the next start"),
        }
    }
    .instrument(span)
    .await
}

/// Sends the verification (or denial) request; `Err(reason)` when the intent is not confirmed.
async fn check(hub: &Hub, intent: &Intent) -> Result<Resolution, String> {
    let mut url = intent.callback.url();
    hub.clients
        .policy()
        .check_before_sending(&url, "callback")
        .await?;
    let token = challenge();
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("hub.mode", intent.mode.as_str());
        // The topic exactly as the subscriber gave it (WebSub §5.3).
        q.append_pair("hub.topic", intent.topic.given());
        match intent.mode {
            IntentMode::Denied => {
                if let Some(r) = &intent.reason {
                    q.append_pair("hub.reason", r);
                }
            }
            IntentMode::Subscribe | IntentMode::Unsubscribe => {
                q.append_pair("hub.challenge", &token);
                if intent.mode == IntentMode::Subscribe {
                    q.append_pair("hub.lease_seconds", &intent.lease_secs.to_string());
                }
                if let Some(vt) = &intent.verify_token {
                    q.append_pair("hub.verify_token", vt);
                }
            }
        }
    }
    // A receiver that requires the hub's client certificate gets it on the verifications of
    // its subscription too (renewals, an admin's verify).
    let client = match hub
        .store
        .hub_subscription(&intent.topic, &intent.callback)
        .await
    {
        Ok(Some(s)) if s.auth.is_some() => hub.clients.client_for(s.auth.as_ref())?,
        _ => hub.clients.client().clone(),
    };
    let sent_at = Timestamp::now();
    // Once more at once when the request failed short of a timeout: the usual cause is a
    // pooled keep-alive connection the callback's server had closed (after an earlier
    // delivery), and a verification GET may be repeated.
    let resp = match client.get(url.clone()).send().await {
        Err(e) if !e.is_timeout() => client.get(url).send().await,
        r => r,
    }
    .map_err(|e| format!("callback unreachable: {}", crate::cause::chain(&e)))
    .and_then(|r| hub.clients.policy().check_peer(&r).map(|_| r));
    if intent.mode == IntentMode::Denied {
        match resp {
            Ok(r) => {
                tracing::info!(
                    status = r.status().as_u16(),
                    reason = intent.reason.as_deref().unwrap_or(""),
                    "denial sent"
                )
            }
            Err(e) => tracing::info!(error = %e, "denial could not be sent"),
        }
        return Ok(Resolution::Dropped);
    }
    let mut resp = resp?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("callback answered {status}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| crate::cause::chain(&e))? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER {
            return Err("callback's answer is not the challenge (too long)".into());
        }
    }
    if body != token.as_bytes() {
        return Err("callback's answer is not the challenge".into());
    }
    Ok(match intent.mode {
        IntentMode::Subscribe => Resolution::Subscribed {
            verified_at: sent_at,
            keep_old_secret_until: sent_at.plus_secs(hub.settings.secret_grace.as_secs()),
        },
        _ => Resolution::Unsubscribed,
    })
}
