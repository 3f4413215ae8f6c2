//! GET handlers for the ResourceSync documents, with ETag / Last-Modified and 304s.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::AppError;
use crate::model::{SetName, Timestamp};
use crate::source::DocKind;

pub async fn source_description(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    serve(&st, DocKind::SourceDescription, &headers).await
}

pub async fn capability_list(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(&st, DocKind::CapabilityList(set_name(&set)?), &h).await
}

pub async fn resource_list(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(&st, DocKind::ResourceList(set_name(&set)?), &h).await
}

pub async fn resource_list_part(
    State(st): State<AppState>,
    Path((set, part)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(
        &st,
        DocKind::ResourceListPart(set_name(&set)?, number_xml(&part)?),
        &h,
    )
    .await
}

pub async fn change_list(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(&st, DocKind::ChangeList(set_name(&set)?), &h).await
}

pub async fn change_list_no(
    State(st): State<AppState>,
    Path((set, no)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(
        &st,
        DocKind::ChangeListNo(set_name(&set)?, number_xml(&no)?),
        &h,
    )
    .await
}

fn set_name(s: &str) -> Result<SetName, AppError> {
    SetName::parse(s).map_err(AppError::NotFound)
}

/// `"3.xml"` -> 3.
fn number_xml(s: &str) -> Result<u32, AppError> {
    s.strip_suffix(".xml")
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| AppError::NotFound(format!("{s:?} is not a document name like 1.xml")))
}

async fn serve(st: &AppState, kind: DocKind, headers: &HeaderMap) -> Result<Response, AppError> {
    let doc = st.source.document(&kind).await?;
    let gzip = accepts_gzip(headers);
    let etag = if gzip {
        doc.gzip_etag()
    } else {
        doc.etag.clone()
    };
    let last_modified = doc.last_modified.floor_secs();
    let validators = [
        (
            header::ETAG,
            HeaderValue::from_str(&etag).expect("etag is ascii"),
        ),
        (
            header::LAST_MODIFIED,
            HeaderValue::from_str(&last_modified.to_http_date()).expect("date is ascii"),
        ),
        (header::VARY, HeaderValue::from_static("accept-encoding")),
    ];
    if not_modified(headers, &etag, last_modified) {
        return Ok((StatusCode::NOT_MODIFIED, validators).into_response());
    }
    let ct = (
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    if !gzip {
        return Ok((StatusCode::OK, validators, [ct], doc.body.clone()).into_response());
    }
    let body = if doc.has_gzip() {
        doc.gzipped().clone()
    } else {
        let d = doc.clone();
        tokio::task::spawn_blocking(move || d.gzipped().clone())
            .await
            .map_err(|e| AppError::Unavailable(format!("compressing a document: {e}")))?
    };
    let ce = (header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    Ok((StatusCode::OK, validators, [ct, ce], body).into_response())
}

/// Whether the client takes gzip (`Accept-Encoding: gzip` or `*`, without `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|c| {
            let mut parts = c.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// RFC 9110 §13.1: If-None-Match wins over If-Modified-Since.
fn not_modified(headers: &HeaderMap, etag: &str, last_modified: Timestamp) -> bool {
    if let Some(inm) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    {
        return inm
            .split(',')
            .map(str::trim)
            .any(|t| t == "*" || t.trim_start_matches("W/") == etag);
    }
    headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(Timestamp::parse_http_date)
        .is_some_and(|since| last_modified <= since)
}
