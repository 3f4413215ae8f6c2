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
    authorize(&st.config.ingest.token, &headers, peer)?;
    let set = SetName::parse(&set).map_err(AppError::BadRequest)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let framing = Framing::from_content_type(ct).map_err(AppError::UnsupportedMediaType)?;
    let events = ingest::parse_body(&body, framing)?;
    let report = ingest::ingest(&st.source, &set, events).await?;
    if let Some(n) = &st.notifier {
        n.poke(report.applied);
    }
    Ok(Json(report))
}

/// With a token configured: `Authorization: Bearer <token>`, compared in constant time.
/// Without one: loopback clients only.
pub fn authorize(token: &str, headers: &HeaderMap, peer: Peer) -> Result<(), AppError> {
    if token.is_empty() {
        if peer.0.ip().is_loopback() {
            return Ok(());
        }
        return Err(AppError::Forbidden(
            "ingest has no token configured and so answers only loopback clients; set ingest.token (RSHUB_INGEST_TOKEN)".into(),
        ));
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
