//! Push: the callback server a hub delivers to, and the subscription it serves. Verification
//! of intent is answered only for a subscription this destination asked for (topic and
//! callback as requested); deliveries are checked against `X-Hub-Signature` in constant time,
//! and an unsigned or wrongly signed one is acknowledged (WebSub §8) but ignored and counted.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use super::state::{State, Subscription};
use crate::model::websub::{signature, SignatureAlg};
use crate::model::Timestamp;

/// A verified delivery for a set.
#[derive(Debug)]
pub struct Push {
    pub set_id: i64,
    pub body: Bytes,
}

#[derive(Clone)]
struct Ctx {
    state: Arc<State>,
    tx: mpsc::Sender<Push>,
}

/// The callback routes: `GET` (verification) and `POST` (deliveries) on `/cb/{set id}`.
pub fn router(state: Arc<State>, tx: mpsc::Sender<Push>) -> Router {
    Router::new()
        .route("/cb/{id}", get(verify).post(deliver))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(Ctx { state, tx })
}

/// The callback URL of a set under the configured base.
pub fn callback_url(base: &str, set_id: i64) -> String {
    format!("{}/cb/{set_id}", base.trim_end_matches('/'))
}

async fn verify(
    AxState(ctx): AxState<Ctx>,
    Path(id): Path<i64>,
    Query(q): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let Ok(Some(sub)) = ctx.state.subscription(id) else {
        return (StatusCode::NOT_FOUND, String::new());
    };
    let mode = q.get("hub.mode").map(String::as_str);
    let topic_matches = q.get("hub.topic").is_some_and(|t| *t == sub.topic);
    match mode {
        Some("subscribe")
            if topic_matches && (sub.state == "requested" || sub.state == "active") =>
        {
            let Some(challenge) = q.get("hub.challenge") else {
                return (StatusCode::BAD_REQUEST, String::new());
            };
            let lease = q
                .get("hub.lease_seconds")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            if let Err(e) = ctx.state.verified(id, lease) {
                tracing::error!(error = %e, "recording a verification");
                return (StatusCode::SERVICE_UNAVAILABLE, String::new());
            }
            tracing::info!(topic = %sub.topic, lease_seconds = lease, "subscription verified");
            (StatusCode::OK, challenge.clone())
        }
        Some("denied") if topic_matches => {
            let reason = q.get("hub.reason").cloned().unwrap_or_default();
            tracing::warn!(topic = %sub.topic, reason = %reason, "the hub denied the subscription");
            let _ = ctx.state.denied(id, &reason);
            (StatusCode::OK, String::new())
        }
        // Not a request of ours (an unsubscribe we never asked for, another topic): refuse.
        _ => (StatusCode::NOT_FOUND, String::new()),
    }
}

/// Whether `header` (`alg=hex`) is the signature of `body` under `secret`, compared in
/// constant time.
pub fn signature_ok(header: &str, secret: &str, body: &[u8]) -> bool {
    let Some((alg, _)) = header.split_once('=') else {
        return false;
    };
    let Some(alg) = SignatureAlg::parse(alg.trim()) else {
        return false;
    };
    let expected = signature(alg, secret.as_bytes(), body);
    let given = header.trim().to_ascii_lowercase();
    given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

async fn deliver(
    AxState(ctx): AxState<Ctx>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let sub = match ctx.state.subscription(id) {
        Ok(Some(s)) => s,
        // Not subscribed here (any more): 410 tells the hub to stop.
        Ok(None) => return StatusCode::GONE,
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
    };
    let sig = headers.get("x-hub-signature").and_then(|v| v.to_str().ok());
    match sig {
        Some(h) if signature_ok(h, &sub.secret, &body) => {}
        other => {
            let what = if other.is_some() {
                "bad_signature"
            } else {
                "unsigned"
            };
            tracing::warn!(topic = %sub.topic, kind = what, bytes = body.len(), "delivery ignored: not signed with our secret");
            let _ = ctx.state.bump(what);
            return StatusCode::ACCEPTED;
        }
    }
    if ctx.tx.send(Push { set_id: id, body }).await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    StatusCode::ACCEPTED
}

/// Asks the hub for a subscription (or its renewal, keeping the secret). The answer to come
/// is the hub's verification request to the callback.
pub async fn subscribe(
    client: &reqwest::Client,
    state: &State,
    set_id: i64,
    hub: &str,
    topic: &str,
    callback: &str,
    lease_secs: u64,
) -> anyhow::Result<()> {
    let secret = match state.subscription(set_id)? {
        Some(s) if s.topic == topic && s.hub == hub => s.secret,
        _ => {
            let mut b = [0u8; 24];
            getrandom::fill(&mut b)
                .map_err(|e| anyhow::anyhow!("no randomness for hub.secret: {e}"))?;
            crate::digest::hex_digest(b)
        }
    };
    state.requested(&Subscription {
        set_id,
        hub: hub.into(),
        topic: topic.into(),
        callback: callback.into(),
        secret: secret.clone(),
        state: "requested".into(),
        requested_at: Timestamp::now(),
        verified_at: None,
        lease_secs: None,
        reason: None,
    })?;
    let lease = lease_secs.to_string();
    let r = client
        .post(hub)
        .form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
            ("hub.secret", secret.as_str()),
            ("hub.lease_seconds", lease.as_str()),
        ])
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("subscribing at {hub}: {e}"))?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        anyhow::bail!(
            "the hub {hub} refused the subscription to {topic}: {status} {}",
            text.trim()
        );
    }
    tracing::info!(hub, topic, callback, "subscription requested");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_of_every_algorithm() {
        for alg in [
            SignatureAlg::Sha1,
            SignatureAlg::Sha256,
            SignatureAlg::Sha384,
            SignatureAlg::Sha512,
        ] {
            let h = signature(alg, b"s3cret", b"<x/>");
            assert!(signature_ok(&h, "s3cret", b"<x/>"), "{h}");
            assert!(!signature_ok(&h, "other", b"<x/>"));
            assert!(!signature_ok(&h, "s3cret", b"<y/>"));
        }
        assert!(!signature_ok("md5=00", "s3cret", b"<x/>"));
        assert!(!signature_ok("garbage", "s3cret", b"<x/>"));
    }
}
