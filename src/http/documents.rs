//! GET handlers for the ResourceSync documents: served from the page cache (memory, or the
//! page's file), with ETag / Last-Modified, 304s, gzip negotiation and single byte ranges.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::AppError;
use crate::model::{SetName, Timestamp};
use crate::source::{DocKind, Opened};

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
    let mut r = serve(&st, DocKind::CapabilityList(set_name(&set)?), &h).await?;
    if let Some(l) = super::inbox::link(&st) {
        r.headers_mut().append(axum::http::header::LINK, l);
    }
    Ok(r)
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

pub async fn activity(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    serve(&st, DocKind::Activity(set_name(&set)?), &h).await
}

pub async fn activity_page(
    State(st): State<AppState>,
    Path((set, no)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    let no = no
        .strip_suffix(".json")
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| AppError::NotFound(format!("{no:?} is not a page name like 1.json")))?;
    serve(&st, DocKind::ActivityPage(set_name(&set)?, no), &h).await
}

/// The dump file a request names, or a 404 that says why there is none.
async fn dump(
    st: &AppState,
    set: &str,
    f: crate::dump::DumpFile<'_>,
    what: &str,
    h: &HeaderMap,
) -> Result<Response, AppError> {
    let Some(dumps) = &st.dumps else {
        return Err(AppError::NotFound(
            "this server offers no dumps (dumps.enabled = false)".into(),
        ));
    };
    let set = set_name(set)?;
    match dumps.file(&set, f) {
        Some(path) => dump_file(st, path, h).await,
        None => Err(AppError::NotFound(format!(
            "set {set} has no {what}: dumps are built in the background (see the Capability List)"
        ))),
    }
}

pub async fn resource_dump(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    dump(
        &st,
        &set,
        crate::dump::DumpFile::ResourceDump,
        "Resource Dump",
        &h,
    )
    .await
}

pub async fn resource_dump_file(
    State(st): State<AppState>,
    Path((set, generation, name)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    let f = crate::dump::DumpFile::ResourceDumpFile {
        generation: &generation,
        name: &name,
    };
    dump(
        &st,
        &set,
        f,
        "such Resource Dump file (a replaced dump is kept for dumps.keep_replaced_secs)",
        &h,
    )
    .await
}

pub async fn change_dump_index(
    State(st): State<AppState>,
    Path(set): Path<String>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    dump(
        &st,
        &set,
        crate::dump::DumpFile::ChangeDumpIndex,
        "Change Dump yet",
        &h,
    )
    .await
}

pub async fn change_dump_no(
    State(st): State<AppState>,
    Path((set, no)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    let no = number_xml(&no)?;
    dump(
        &st,
        &set,
        crate::dump::DumpFile::ChangeDump(no),
        &format!("Change Dump {no}"),
        &h,
    )
    .await
}

pub async fn change_dump_file(
    State(st): State<AppState>,
    Path((set, no, name)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Result<Response, AppError> {
    let no: u32 = no
        .parse()
        .map_err(|_| AppError::NotFound(format!("{no:?} is not a Change Dump number")))?;
    let f = crate::dump::DumpFile::ChangeDumpFile { no, name: &name };
    dump(&st, &set, f, &format!("such file in Change Dump {no}"), &h).await
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
    let gzip = accepts_gzip(headers);
    let content_type = kind.media_type();
    let (doc, body) = if accel_wanted(st, headers) {
        // nginx sends the file: it is not opened here.
        let doc = st.source.document(&kind).await?;
        (doc, Body_::Unopened)
    } else {
        match st.source.open_document(&kind, gzip).await? {
            Opened::Memory(d, b) => (d, Body_::Memory(b)),
            Opened::File(d, f) => (d, Body_::File(f)),
        }
    };
    Ok(respond(
        st,
        headers,
        Representation {
            etag: doc.etag(gzip),
            last_modified: doc.last_modified().floor_secs(),
            len: doc.len(gzip),
            content_type,
            gzip,
            vary: true,
            file: Some(doc.path(gzip)),
        },
        body,
    ))
}

/// A dump's file (package, manifest copy, dump document), immutable once written: served
/// with a validator from its length and modification time, conditional requests and single
/// byte ranges, never compressed on the fly (a resumed download must get the same bytes).
pub async fn dump_file(
    st: &AppState,
    path: std::path::PathBuf,
    headers: &HeaderMap,
) -> Result<Response, AppError> {
    let file = std::fs::File::open(&path)
        .map_err(|_| AppError::NotFound("no such dump file (it may have been replaced)".into()))?;
    let meta = file
        .metadata()
        .map_err(|_| AppError::NotFound("no such dump file (it may have been replaced)".into()))?;
    let (etag, last_modified) = file_validators(&meta);
    let zip = path.extension().is_some_and(|e| e == "zip");
    Ok(respond(
        st,
        headers,
        Representation {
            etag: &etag,
            last_modified,
            len: meta.len(),
            content_type: if zip {
                "application/zip"
            } else {
                "application/xml"
            },
            gzip: false,
            vary: false,
            file: Some(&path),
        },
        Body_::File(file),
    ))
}

/// A served file's strong ETag (its modification time in ns and its length: a file replaced
/// or rewritten gets another) and its Last-Modified.
pub(super) fn file_validators(meta: &std::fs::Metadata) -> (String, Timestamp) {
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    (
        format!("\"{:x}-{:x}\"", modified.as_nanos(), meta.len()),
        Timestamp(modified.as_micros() as i64).floor_secs(),
    )
}

/// What a response describes.
pub(super) struct Representation<'a> {
    pub(super) etag: &'a str,
    pub(super) last_modified: Timestamp,
    pub(super) len: u64,
    pub(super) content_type: &'static str,
    /// The bytes are the gzip form (`Content-Encoding: gzip`).
    pub(super) gzip: bool,
    /// The representation depends on `Accept-Encoding`.
    pub(super) vary: bool,
    /// The file on disk holding exactly these bytes, when there is one: with
    /// `server.accel_redirect`, nginx is told to send it.
    pub(super) file: Option<&'a std::path::Path>,
}

/// The request header nginx sets when it falls back to us because the file it was sent to had
/// been replaced meanwhile (a page rebuilt): then the bytes come from here.
pub const ACCEL_FALLBACK: &str = "x-rshub-no-accel";

/// `X-Accel-Redirect` for `file` under the internal location `prefix`: its absolute path,
/// percent-encoded but for `/`.
fn accel_target(prefix: &str, file: &std::path::Path) -> Option<HeaderValue> {
    use std::os::unix::ffi::OsStrExt as _;
    const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    // The page cache's paths are absolute already (made so once); a set's files may not be.
    let abs = if file.is_absolute() {
        std::borrow::Cow::Borrowed(file)
    } else {
        std::borrow::Cow::Owned(std::path::absolute(file).ok()?)
    };
    let bytes = abs.as_os_str().as_bytes();
    let encoded = percent_encoding::percent_encode(bytes.strip_prefix(b"/")?, KEEP).to_string();
    HeaderValue::from_str(&format!("{prefix}{encoded}")).ok()
}

/// Where a response's bytes come from.
pub(super) enum Body_ {
    Memory(bytes::Bytes),
    File(std::fs::File),
    /// The representation's file, not opened: nginx is to send it ([`accel_wanted`]).
    Unopened,
}

/// Whether a whole file would be sent by nginx (`server.accel_redirect`): no `Range`, and
/// not nginx's own fallback request.
fn accel_wanted(st: &AppState, headers: &HeaderMap) -> bool {
    !st.config.server.accel_redirect.is_empty()
        && !headers.contains_key(header::RANGE)
        && !headers.contains_key(ACCEL_FALLBACK)
}

/// The one response logic of documents and dump files: validators, 304, `Range` /
/// `If-Range` (206, 416), and the body from memory or streamed from the open file.
pub(super) fn respond(
    st: &AppState,
    headers: &HeaderMap,
    r: Representation,
    body: Body_,
) -> Response {
    if !st.config.server.accel_redirect.is_empty() && headers.contains_key(ACCEL_FALLBACK) {
        st.hub.metrics().accel_fallbacks.inc();
    }
    let mut out = HeaderMap::new();
    out.insert(
        header::ETAG,
        HeaderValue::from_str(r.etag).expect("etag is ascii"),
    );
    out.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_str(&r.last_modified.to_http_date()).expect("date is ascii"),
    );
    if r.vary {
        out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    if not_modified(headers, r.etag, r.last_modified) {
        return (StatusCode::NOT_MODIFIED, out).into_response();
    }
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(r.content_type),
    );
    if r.gzip {
        out.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    let len = r.len;
    let range = match requested_range(headers, r.etag, r.last_modified, len) {
        Ok(r) => r,
        Err(()) => {
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
            );
            return (StatusCode::RANGE_NOT_SATISFIABLE, out).into_response();
        }
    };
    // Behind nginx: a whole file is sent by nginx (a range, and nginx's fallback after a page
    // was replaced, are still sent from here).
    if let (true, None, Some(file)) = (accel_wanted(st, headers), &range, r.file) {
        if let Some(target) = accel_target(&st.config.server.accel_redirect, file) {
            out.insert("x-accel-redirect", target);
            return (StatusCode::OK, out).into_response();
        }
    }
    let (status, start, n) = match &range {
        Some(r) => {
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {}-{}/{len}", r.start(), r.end()))
                    .expect("ascii"),
            );
            (
                StatusCode::PARTIAL_CONTENT,
                *r.start(),
                r.end() - r.start() + 1,
            )
        }
        None => (StatusCode::OK, 0, len),
    };
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    let body = match body {
        Body_::Memory(bytes) => Body::from(bytes.slice(start as usize..(start + n) as usize)),
        Body_::File(file) => {
            Body::from_stream(file_chunks(file, start, n, st.source.file_reads().clone()))
        }
        Body_::Unopened => match r.file.map(std::fs::File::open) {
            Some(Ok(file)) => {
                Body::from_stream(file_chunks(file, start, n, st.source.file_reads().clone()))
            }
            // Replaced since it was looked up (nginx's fallback asks again).
            _ => {
                return AppError::Unavailable("the page was replaced meanwhile; try again".into())
                    .into_response()
            }
        },
    };
    (status, out, body).into_response()
}

/// The one byte range to send (RFC 9110 §14): `None` for the whole representation (no
/// `Range`, one we do not parse, several ranges, or an `If-Range` that no longer matches),
/// `Err` when the range lies beyond the end (416).
fn requested_range(
    headers: &HeaderMap,
    etag: &str,
    last_modified: Timestamp,
    len: u64,
) -> Result<Option<std::ops::RangeInclusive<u64>>, ()> {
    let Some(range) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    if let Some(cond) = headers.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) {
        let cond = cond.trim();
        let current = if cond.starts_with('"') {
            cond == etag
        } else {
            Timestamp::parse_http_date(cond) == Some(last_modified)
        };
        if !current {
            return Ok(None);
        }
    }
    let Ok(parsed) = http_range_header::parse_range_header(range) else {
        return Ok(None);
    };
    match parsed.validate(len) {
        Ok(ranges) if ranges.len() == 1 => Ok(ranges.into_iter().next()),
        Ok(_) => Ok(None),
        Err(_) => Err(()),
    }
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
pub(super) fn not_modified(headers: &HeaderMap, etag: &str, last_modified: Timestamp) -> bool {
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

/// `n` bytes of `file` from `start`, in 256 KB chunks read on the blocking pool, at most
/// `source.file_reads` permits' worth at once server-wide: hundreds of readers streaming large
/// pages then keep a few threads busy, not hundreds, and the async threads (ingest, the
/// notifier, the hub) keep their share of the CPU.
fn file_chunks(
    file: std::fs::File,
    start: u64,
    n: u64,
    slots: std::sync::Arc<tokio::sync::Semaphore>,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    const CHUNK: u64 = 256 * 1024;
    futures_util::stream::try_unfold((Some(file), start, n), move |(file, pos, left)| {
        let slots = slots.clone();
        async move {
            let Some(file) = file.filter(|_| left > 0) else {
                return Ok(None);
            };
            let permit = slots
                .acquire_owned()
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let want = left.min(CHUNK);
            let (file, buf) = tokio::task::spawn_blocking(move || {
                use std::io::{Read, Seek};
                let _permit = permit;
                let mut file = file;
                // Read into a buffer that is not zeroed first (a 256 KB memset per chunk was
                // 4.6% of the server's CPU under bench_load).
                file.seek(std::io::SeekFrom::Start(pos))?;
                let mut buf = Vec::with_capacity(want as usize);
                (&mut file).take(want).read_to_end(&mut buf)?;
                if buf.len() as u64 != want {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                Ok::<_, std::io::Error>((file, buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(Some((
                bytes::Bytes::from(buf),
                (Some(file), pos + want, left - want),
            )))
        }
    })
}
