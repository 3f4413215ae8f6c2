//! `/inbox`: the LDN inbox (POST a notification, GET the listing and each notification,
//! OPTIONS). The work is in [`crate::inbox`]; this maps it to HTTP.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{AppState, Peer};
use crate::inbox::InboxError;

const LD_JSON: &str = "application/ld+json";
const ACCEPTED: &str = "application/ld+json, application/json";

fn answer(e: InboxError) -> Response {
    let (status, why, wait) = match e {
        InboxError::MediaType(w) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, w, None),
        InboxError::TooLarge(w) => (StatusCode::PAYLOAD_TOO_LARGE, w, None),
        InboxError::Invalid(w) => (StatusCode::BAD_REQUEST, w, None),
        InboxError::Unauthorized(w) => (StatusCode::UNAUTHORIZED, w, None),
        InboxError::Forbidden(w) => (StatusCode::FORBIDDEN, w, None),
        InboxError::TooMany(w, s) => (StatusCode::TOO_MANY_REQUESTS, w, Some(s)),
        InboxError::NotFound(w) => (StatusCode::NOT_FOUND, w, None),
        InboxError::Store(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store: {}", crate::cause::chain(&e)),
            Some(1),
        ),
    };
    let mut r = (status, axum::Json(serde_json::json!({"error": why}))).into_response();
    if let Some(s) = wait {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        r.headers_mut()
            .insert("accept-post", HeaderValue::from_static(ACCEPTED));
    }
    r
}

fn no_inbox() -> Response {
    answer(InboxError::NotFound(
        "this server has no inbox (inbox.enabled = false)".into(),
    ))
}

/// The client's address: the connection's, or behind a proxy on this host (a loopback
/// connection), the client the proxy names.
fn client(peer: &Peer, headers: &HeaderMap) -> std::net::IpAddr {
    let ip = peer.0.ip().to_canonical();
    if ip.is_loopback() {
        if let Some(named) = super::ingest::forwarded_client(headers) {
            return named;
        }
    }
    ip
}

/// `POST /inbox`: 201 with the notification's URL in `Location`.
pub async fn post(
    State(st): State<AppState>,
    peer: Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(inbox) = &st.inbox else {
        return no_inbox();
    };
    // One byte past the bound tells a body that is too large from one that fits exactly.
    let bytes = match axum::body::to_bytes(body, inbox.max_bytes() + 1).await {
        Ok(b) => b,
        Err(_) => {
            return answer(InboxError::TooLarge(format!(
                "the notification is larger than inbox.max_notification_bytes ({})",
                inbox.max_bytes()
            )))
        }
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    match inbox
        .receive(
            ct,
            super::bearer_token(&headers),
            Some(client(&peer, &headers)),
            &bytes,
        )
        .await
    {
        Ok(seq) => {
            let url = inbox.item_url(seq);
            let mut r = StatusCode::CREATED.into_response();
            if let Ok(v) = HeaderValue::from_str(&url) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Err(e) => answer(e),
    }
}

#[derive(serde::Deserialize)]
pub struct PageQuery {
    #[serde(default)]
    page: Option<u64>,
}

/// `GET /inbox[?page=N]`: the notifications kept, newest first, as an LDP container.
pub async fn list(State(st): State<AppState>, Query(q): Query<PageQuery>) -> Response {
    let Some(inbox) = &st.inbox else {
        return no_inbox();
    };
    let page = q.page.unwrap_or(1).max(1);
    match inbox.listing(page).await {
        Ok((doc, next)) => {
            let mut r = (
                [(header::CONTENT_TYPE, LD_JSON)],
                serde_json::to_string(&doc).unwrap_or_default(),
            )
                .into_response();
            let h = r.headers_mut();
            h.insert("accept-post", HeaderValue::from_static(ACCEPTED));
            if let Some(n) = next {
                if let Ok(v) =
                    HeaderValue::from_str(&format!("<{}?page={n}>; rel=\"next\"", inbox.url()))
                {
                    h.insert(header::LINK, v);
                }
            }
            r
        }
        Err(e) => answer(e),
    }
}

/// `GET /inbox/{n}`: a notification as it was posted.
pub async fn item(State(st): State<AppState>, Path(n): Path<String>) -> Response {
    let Some(inbox) = &st.inbox else {
        return no_inbox();
    };
    let Ok(seq) = n.parse::<u64>() else {
        return answer(InboxError::NotFound(format!(
            "{} is not a notification's number",
            crate::cause::outsider(&n)
        )));
    };
    match inbox.get(seq).await {
        Ok(k) => (
            [(header::CONTENT_TYPE, LD_JSON)],
            serde_json::to_string(&k.notification).unwrap_or_default(),
        )
            .into_response(),
        Err(e) => answer(e),
    }
}

/// `OPTIONS /inbox`: what it accepts.
pub async fn options(State(st): State<AppState>) -> Response {
    if st.inbox.is_none() {
        return no_inbox();
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert("accept-post", HeaderValue::from_static(ACCEPTED));
    h.insert(
        header::ALLOW,
        HeaderValue::from_static("GET, HEAD, POST, OPTIONS"),
    );
    r
}

/// The Link header advertising the inbox, when there is one.
pub fn link(st: &AppState) -> Option<HeaderValue> {
    let inbox = st.inbox.as_ref()?;
    HeaderValue::from_str(&format!(
        "<{}>; rel=\"{}\"",
        inbox.url(),
        crate::inbox::INBOX_REL
    ))
    .ok()
}
