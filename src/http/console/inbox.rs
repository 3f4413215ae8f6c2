//! The inbox in the console: each COAR Notify notification kept (newest first), what became of
//! the record it names, and the answers sent to its sender with their state. Everything shown
//! came from outside: the templates escape it, and the page runs no script of a sender's.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{render, session, ConsoleError, LIVE_SECS};
use crate::http::AppState;
use crate::inbox::{Kept, Outcome};

#[derive(Deserialize)]
pub(super) struct PageQuery {
    #[serde(default)]
    page: Option<u64>,
}

/// A notification as a row: its facts and its outcome in words.
fn row(k: &Kept) -> serde_json::Value {
    let (words, failing) = match &k.outcome {
        Outcome::Received => ("being collected".to_string(), false),
        Outcome::Collected {
            identifier,
            changed: true,
        } => (
            format!("{identifier} collected: a change recorded and pushed"),
            false,
        ),
        Outcome::Collected {
            identifier,
            changed: false,
        } => (format!("{identifier} collected: already current"), false),
        Outcome::NotCollected { why } => (format!("not collected: {why}"), true),
    };
    let answers: Vec<serde_json::Value> = k
        .replies
        .iter()
        .map(|r| json!({"kind": r.kind, "state": r.state, "attempts": r.attempts, "last": r.last}))
        .collect();
    json!({
        "seq": k.seq,
        "received": crate::model::Timestamp(k.received_us).to_string(),
        "sender": k.sender,
        "pattern": k.pattern.as_str(),
        "id": k.notification["id"].as_str().unwrap_or_default(),
        "words": words,
        "failing": failing || k.replies.iter().any(|r| r.state == "given_up"),
        "answers": answers,
    })
}

pub(super) async fn list(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let page = q.page.unwrap_or(1).max(1);
    let (rows, next): (Vec<serde_json::Value>, Option<u64>) = match &st.inbox {
        None => (Vec::new(), None),
        Some(inbox) => {
            let (kept, next) = inbox.page(page).await.map_err(|e| {
                ConsoleError::Page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the inbox cannot be read now: {}", crate::cause::chain(&e)),
                )
            })?;
            (kept.iter().map(row).collect(), next)
        }
    };
    Ok(render(
        "inbox.html",
        json!({
            "title": "Inbox", "nav": "inbox", "signed_in": true, "csrf": s.csrf,
            "live": LIVE_SECS, "enabled": st.inbox.is_some(), "notifications": rows,
            "page": page, "next": next,
            "senders": st.config.inbox.senders.iter().map(|(n, s)| json!({"name": n, "id": s.id, "collect": s.collect})).collect::<Vec<_>>(),
        }),
    ))
}
