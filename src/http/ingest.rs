//! POST /api/v1/resource-sets/{set}/changes: bearer-token (or loopback-only) ingest.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::Json;
use subtle::ConstantTimeEq;

use super::{AppState, Peer};
use crate::error::AppError;
use crate::ingest::{self, Framing, IngestReport};
use crate::model::SetName;

pub async fn post_changes(
    State(st): State<AppState>,
    peer: Peer,
    Path(set): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<IngestReport>, AppError> {
    authorize(st.config.ingest.token.expose(), &headers, peer)?;
    let set = SetName::parse(&set).map_err(AppError::BadRequest)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let framing = Framing::from_content_type(ct).map_err(AppError::UnsupportedMediaType)?;
    let events = ingest::parse_body(&body, framing)?;
    let report = ingest::ingest(&st.ctx, &set, events).await?;
    if let Some(n) = &st.notifier {
        n.poke(report.applied);
    }
    Ok(Json(report))
}

/// With a token configured: `Authorization: Bearer <token>`, compared in constant time.
/// Without one: loopback clients only, and only when every client a proxy names in its
/// forwarding headers is loopback too: behind a proxy on this host (nginx in front) every
/// connection comes from loopback, whoever the client is.
pub fn authorize(token: &str, headers: &HeaderMap, peer: Peer) -> Result<(), AppError> {
    if token.is_empty() {
        if !peer.0.ip().to_canonical().is_loopback() {
            return Err(AppError::Forbidden(
                "ingest has no token configured and so answers only loopback clients; set ingest.token (RSHUB_INGEST_TOKEN)".into(),
            ));
        }
        if let Some(client) = forwarded_for_someone_else(headers) {
            return Err(AppError::Forbidden(format!(
                "ingest has no token configured and so answers only loopback clients; this request came through a proxy for {client}; set ingest.token (RSHUB_INGEST_TOKEN)"
            )));
        }
        return Ok(());
    }
    let given = super::bearer_token(headers).ok_or_else(|| {
        AppError::Unauthorized("ingest needs an Authorization: Bearer <token> header".into())
    })?;
    if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        Err(AppError::Forbidden("the ingest token is wrong".into()))
    }
}

/// The address a proxy's forwarding header names: `[::1]:4711`, `127.0.0.1:80`, `::1`,
/// `127.0.0.1` (quoted or not); `None` for anything else (`unknown`, an obfuscated name).
fn named_address(v: &str) -> Option<std::net::IpAddr> {
    let v = v.trim().trim_matches('"');
    let host = match v.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None if v.matches(':').count() == 1 => v.split(':').next().unwrap_or(""),
        None => v,
    };
    host.parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The client a proxy on this host names for a request (the first that is not loopback),
/// when it is an address.
pub(super) fn forwarded_client(headers: &HeaderMap) -> Option<std::net::IpAddr> {
    forwarded_for_someone_else(headers).and_then(|c| named_address(&c))
}

/// The first client named in `X-Forwarded-For`, `X-Real-IP` or `Forwarded` (RFC 7239 `for=`)
/// that is not a loopback address (anything that is not an address, such as `unknown` or an
/// obfuscated name, counts as someone else). Every entry is looked at: a client that sends
/// `X-Forwarded-For: 127.0.0.1` itself still has its own address appended by the proxy.
fn forwarded_for_someone_else(headers: &HeaderMap) -> Option<String> {
    let local = |v: &str| named_address(v).is_some_and(|ip| ip.is_loopback());
    let named = |name: &str| {
        headers
            .get_all(name)
            .into_iter()
            .map(|v| v.to_str().unwrap_or("?"))
    };
    let mut clients: Vec<String> = Vec::new();
    for v in named("x-forwarded-for").chain(named("x-real-ip")) {
        clients.extend(v.split(',').map(|c| c.trim().to_string()));
    }
    for v in named("forwarded") {
        for element in v.split(',') {
            for pair in element.split(';') {
                if let Some((k, val)) = pair.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("for") {
                        clients.push(val.trim().to_string());
                    }
                }
            }
        }
    }
    clients.into_iter().find(|c| !local(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::ConnectInfo;

    fn peer(ip: &str) -> Peer {
        ConnectInfo(crate::conn::Remote(format!("{ip}:5000").parse().unwrap()))
    }

    #[test]
    fn without_a_token_only_loopback_may_ingest() {
        let h = HeaderMap::new();
        assert!(authorize("", &h, peer("127.0.0.1")).is_ok());
        assert!(authorize("", &h, peer("[::1]")).is_ok());
        let e = authorize("", &h, peer("192.0.2.7")).unwrap_err();
        assert!(
            matches!(e, AppError::Forbidden(ref m) if m.contains("RSHUB_INGEST_TOKEN")),
            "{e}"
        );
    }

    /// Through a proxy on this host the peer is loopback: the clients it names decide.
    #[test]
    fn without_a_token_a_proxied_client_must_be_loopback_too() {
        let refused = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            authorize("", &h, peer("127.0.0.1")).is_err()
        };
        assert!(refused("x-forwarded-for", "203.0.113.5"));
        assert!(
            refused("x-forwarded-for", "127.0.0.1, 203.0.113.5"),
            "spoofed first entry"
        );
        assert!(refused("x-real-ip", "10.0.0.1"));
        assert!(refused(
            "forwarded",
            "for=192.0.2.60;proto=http;by=203.0.113.43"
        ));
        assert!(refused(
            "forwarded",
            r#"for="[::1]:4711", for=198.51.100.17"#
        ));
        assert!(refused("forwarded", "for=unknown"));
        assert!(refused("x-forwarded-for", "_hidden"));
        assert!(!refused("x-forwarded-for", "127.0.0.1"));
        assert!(!refused("x-forwarded-for", "127.0.0.1, ::1"));
        assert!(!refused("forwarded", r#"for="[::1]:4711";proto=http"#));
        assert!(!refused("forwarded", "for=127.0.0.1:8080"));
        assert!(
            !refused("x-forwarded-for", "::ffff:127.0.0.1"),
            "IPv4 loopback as IPv6"
        );
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.5".parse().unwrap());
        let e = authorize("", &h, peer("127.0.0.1")).unwrap_err();
        assert!(
            matches!(e, AppError::Forbidden(ref m) if m.contains("proxy for 203.0.113.5") && m.contains("RSHUB_INGEST_TOKEN")),
            "{e}"
        );
        h.insert(header::AUTHORIZATION, "Bearer t0k".parse().unwrap());
        assert!(
            authorize("t0k", &h, peer("127.0.0.1")).is_ok(),
            "a token is enough"
        );
    }

    #[test]
    fn with_a_token_every_peer_needs_it() {
        let mut h = HeaderMap::new();
        assert!(matches!(
            authorize("t0k", &h, peer("127.0.0.1")),
            Err(AppError::Unauthorized(_))
        ));
        h.insert(header::AUTHORIZATION, "Bearer t0k".parse().unwrap());
        assert!(authorize("t0k", &h, peer("192.0.2.7")).is_ok());
        h.insert(header::AUTHORIZATION, "Bearer t0".parse().unwrap());
        assert!(matches!(
            authorize("t0k", &h, peer("127.0.0.1")),
            Err(AppError::Forbidden(_))
        ));
    }
}
