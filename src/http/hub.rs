//! The hub URL (`POST /hub`: subscribe, unsubscribe, publish, fat pings) and the topic URIs the
//! hub serves (`GET`/`HEAD`, latest payload). Errors are plain text, as WebSub §5.1.2 asks.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::error::{AppError, PlainText};
use crate::hub::{link_targets, parse_form, HubRequest};
use crate::model::websub::{IntentMode, Topic};

pub async fn post_hub(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PlainText> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/x-www-form-urlencoded" {
        let hub = &st.hub;
        return match parse_form(&body)? {
            HubRequest::Subscribe(r) => {
                hub.request(IntentMode::Subscribe, r).await?;
                Ok(accepted(
                    "subscription request accepted; verification of intent follows\n",
                ))
            }
            HubRequest::Unsubscribe(r) => {
                hub.request(IntentMode::Unsubscribe, r).await?;
                Ok(accepted(
                    "unsubscription request accepted; verification of intent follows\n",
                ))
            }
            HubRequest::Publish(topics) => {
                let n = topics.len();
                hub.ping(topics)?;
                Ok(accepted(&format!("publish accepted for {n} topic(s)\n")))
            }
        };
    }
    // Not a form: a fat ping (a payload with Link rel="self"), or a form sent with the wrong
    // Content-Type, which a subscriber's developer needs told plainly.
    let self_link = !link_targets(
        headers
            .get_all(header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok()),
        "self",
    )
    .is_empty();
    let looks_like_form = body.windows(9).any(|w| w == b"hub.mode=");
    let authorized = headers.contains_key(header::AUTHORIZATION);
    if looks_like_form || !(self_link || authorized) {
        return Err(PlainText(AppError::UnsupportedMediaType(format!(
            "subscribe, unsubscribe and publish requests must be sent as Content-Type application/x-www-form-urlencoded{}; \
             a payload to distribute (fat ping) needs a Link header with rel=\"self\" and the publisher token",
            if ct.is_empty() { String::new() } else { format!(" (got {ct:?})") }
        ))));
    }
    fat_ping(&st, &headers, ct, body).await
}

fn accepted(msg: &str) -> Response {
    (StatusCode::ACCEPTED, msg.to_string()).into_response()
}

/// ResourceSync change-notification §4.1: the notification is the body, the topic is the
/// `rel="self"` link. Needs the publisher token.
/// The payload is distributed with its Content-Type exactly as given.
async fn fat_ping(
    st: &AppState,
    headers: &HeaderMap,
    content_type: &str,
    body: Bytes,
) -> Result<Response, PlainText> {
    let token = &st.config.hub.publisher_token;
    if token.is_empty() {
        return Err(PlainText(AppError::Forbidden(
            "fat pings are disabled on this hub: set hub.publisher_token (RSHUB_HUB_PUBLISHER_TOKEN); subscribe/unsubscribe/publish forms need Content-Type application/x-www-form-urlencoded".into(),
        )));
    }
    let given = super::bearer_token(headers).ok_or_else(|| {
        AppError::Unauthorized(
            "publishing a payload needs Authorization: Bearer <publisher token>".into(),
        )
    })?;
    if !bool::from(given.as_bytes().ct_eq(token.expose().as_bytes())) {
        return Err(PlainText(AppError::Forbidden(
            "the publisher token is wrong".into(),
        )));
    }
    let links = headers
        .get_all(header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>();
    let selfs = link_targets(links, "self");
    let [topic] = selfs.as_slice() else {
        return Err(PlainText(AppError::BadRequest(format!(
            "a published payload needs exactly one Link header target with rel=\"self\" (the topic); found {}",
            selfs.len()
        ))));
    };
    let topic = Topic::parse(topic).map_err(AppError::BadRequest)?;
    if body.is_empty() {
        return Err(PlainText(AppError::BadRequest(
            "the published payload is empty".into(),
        )));
    }
    if content_type.trim().is_empty() {
        return Err(PlainText(AppError::BadRequest(
            "a published payload needs a Content-Type (application/xml)".into(),
        )));
    }
    let n = st
        .hub
        .publish(topic, content_type.to_string(), body)
        .await?;
    Ok((StatusCode::OK, format!("published to {n} subscriber(s)\n")).into_response())
}

/// GET/HEAD of a topic URI: 200, the latest payload (empty before the first), Link self + hub.
pub async fn get_topic(
    State(st): State<AppState>,
    Path(rest): Path<String>,
) -> Result<Response, PlainText> {
    let hub = &st.hub;
    let raw = format!("{}/{rest}", hub.settings().topic_base);
    let topic = Topic::parse(&raw).map_err(|_| AppError::NotFound(format!("no topic at {raw}")))?;
    let info = hub
        .topic(&topic)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no topic at {topic}")))?;
    let (ct, body) = match &info.latest {
        Some(m) => (m.content_type.clone(), m.body.clone()),
        None => ("application/xml".to_string(), Bytes::new()),
    };
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&ct).unwrap_or(HeaderValue::from_static("application/xml")),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "<{topic}>; rel=\"self\", <{}>; rel=\"hub\"",
        hub.settings().hub_url
    )) {
        h.insert(header::LINK, v);
    }
    Ok(resp)
}
