//! Ingest, the harvester's side of the DIT protocol: change events as one JSON object (or a
//! JSON array) or as NDJSON, validated whole, then applied in one atomic store transaction.
//!
//! Batch policy: **all or nothing.** Every line is parsed and validated first; if any line is
//! bad the whole request is refused (422) with every bad line's number and reason, and nothing
//! is written. A harvester can fix the lines and resend the same batch without duplicates.
//! A `deleted` event for a resource the set does not hold is not an error: it records nothing
//! and is reported under `ignored` (so a resent batch stays harmless).

use serde::Serialize;

use crate::context::Context;
use crate::model::{ChangeEvent, NewChange, SetName, Timestamp};
use crate::store::{ApplyError, StoreError};

/// How the body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON value: an event object or an array of them (`application/json`).
    Json,
    /// One event per line (`application/x-ndjson`, `application/jsonl`, or no content type).
    Ndjson,
}

impl Framing {
    pub fn from_content_type(ct: Option<&str>) -> Result<Framing, String> {
        let Some(ct) = ct else {
            return Ok(Framing::Ndjson);
        };
        match crate::model::bare_media_type(ct).to_ascii_lowercase().as_str() {
            "application/json" => Ok(Framing::Json),
            "application/x-ndjson" | "application/ndjson" | "application/jsonl" | "application/x-jsonlines"
            | "text/plain" => Ok(Framing::Ndjson),
            other => Err(format!(
                "content type {other:?} is not accepted: send application/json (one event or an array) or application/x-ndjson (one event per line)"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineError {
    /// 1-based line number (NDJSON) or item number (JSON array; 1 for a single object).
    pub line: usize,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the batch was refused: {} bad line(s), nothing was applied", .0.len())]
    Invalid(Vec<LineError>),
    #[error("the request body is empty: send at least one change event")]
    Empty,
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub set: String,
    pub set_created: bool,
    pub applied: usize,
    /// Change ids (store order) of the first and last recorded change.
    pub first_id: Option<i64>,
    pub last_id: Option<i64>,
    pub ignored: Vec<LineError>,
    /// Change Lists closed by this batch.
    pub closed_change_lists: Vec<u32>,
}

/// One change event from a JSON value, which must be an object, as must its `location` and
/// each link and link `href`: serde would also take an array of the fields in order, a form
/// nobody documents and a new field would change.
fn event_of(v: serde_json::Value) -> Result<ChangeEvent, String> {
    use serde_json::Value;
    let kind = |v: &Value| match v {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    };
    let Some(fields) = v.as_object() else {
        return Err(format!(
            "a change is a JSON object like {{\"change\": \"created\", \"location\": {{…}}}}, not {}",
            kind(&v)
        ));
    };
    const LOCATION: &str = "{\"type\": \"url\", \"value\": \"…\"}";
    if let Some(l) = fields.get("location").filter(|l| !l.is_object()) {
        return Err(format!(
            "location is a JSON object like {LOCATION}, not {}",
            kind(l)
        ));
    }
    if let Some(Value::Array(links)) = fields.get("ln") {
        for (i, link) in links.iter().enumerate() {
            match link.get("href") {
                _ if !link.is_object() => {
                    return Err(format!(
                        "ln[{i}] is a JSON object like {{\"rel\": \"…\", \"href\": {LOCATION}}}, not {}",
                        kind(link)
                    ))
                }
                Some(h) if !h.is_object() => {
                    return Err(format!(
                        "ln[{i}].href is a JSON object like {LOCATION}, not {}",
                        kind(h)
                    ))
                }
                _ => {}
            }
        }
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Parses the body into events, numbering them by line (or item).
pub fn parse_body(body: &[u8], framing: Framing) -> Result<Vec<(usize, ChangeEvent)>, IngestError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        IngestError::Invalid(vec![LineError {
            line: 1,
            reason: format!("body is not UTF-8: {e}"),
        }])
    })?;
    let mut events = Vec::new();
    let mut errors = Vec::new();
    match framing {
        Framing::Json => {
            if text.trim().is_empty() {
                return Err(IngestError::Empty);
            }
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                IngestError::Invalid(vec![LineError {
                    line: e.line(),
                    reason: format!("not JSON: {e}"),
                }])
            })?;
            let items = match value {
                serde_json::Value::Array(items) => items,
                v => vec![v],
            };
            for (i, v) in items.into_iter().enumerate() {
                match event_of(v) {
                    Ok(e) => events.push((i + 1, e)),
                    Err(e) => errors.push(LineError {
                        line: i + 1,
                        reason: e.to_string(),
                    }),
                }
            }
        }
        Framing::Ndjson => {
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let parsed = serde_json::from_str::<serde_json::Value>(line)
                    .map_err(|e| e.to_string())
                    .and_then(event_of);
                match parsed {
                    Ok(e) => events.push((i + 1, e)),
                    Err(e) => errors.push(LineError {
                        line: i + 1,
                        reason: e.to_string(),
                    }),
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(IngestError::Invalid(errors));
    }
    if events.is_empty() {
        return Err(IngestError::Empty);
    }
    Ok(events)
}

/// Validates and applies a parsed batch to a set, creating the set on its first change.
pub async fn ingest(
    ctx: &Context,
    set: &SetName,
    events: Vec<(usize, ChangeEvent)>,
) -> Result<IngestReport, IngestError> {
    let sc = ctx.set_config(set);
    let mut lines = Vec::with_capacity(events.len());
    let mut changes: Vec<NewChange> = Vec::with_capacity(events.len());
    let mut errors = Vec::new();
    for (line, e) in events {
        match e.validate(&sc) {
            Ok(c) => {
                lines.push(line);
                changes.push(c);
            }
            Err(reason) => errors.push(LineError { line, reason }),
        }
    }
    if !errors.is_empty() {
        return Err(IngestError::Invalid(errors));
    }
    let outcome = match ctx
        .store()
        .apply(set, changes, ctx.list_policy(set), Timestamp::now())
        .await
    {
        Ok(o) => o,
        Err(ApplyError::Rejected { index, reason }) => {
            return Err(IngestError::Invalid(vec![LineError {
                line: lines[index],
                reason,
            }]))
        }
        Err(ApplyError::Store(e)) => return Err(e.into()),
    };
    if outcome.set_created {
        ctx.set_created();
        tracing::info!(set = %set, "resource set created by its first change");
    }
    Ok(IngestReport {
        set: set.to_string(),
        set_created: outcome.set_created,
        applied: outcome.applied.len(),
        first_id: outcome.applied.first().map(|a| a.1),
        last_id: outcome.applied.last().map(|a| a.1),
        ignored: outcome
            .ignored
            .into_iter()
            .map(|(i, reason)| LineError {
                line: lines[i],
                reason,
            })
            .collect(),
        closed_change_lists: outcome.closed_lists,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any ingest body is read or refused line by line in words, in both framings.
        #[test]
        fn any_body_is_read_or_refused_in_words(body in crate::fuzz::peer_input(&[
            "{\"change\":\"created\",\"location\":{\"type\":\"rel_path\",\"value\":\"a/b.xml\"},\"md5\":\"0cc175b9c0f1b6a831c399e269772661\",\"length\":1,\"datetime\":\"2026-01-01T00:00:00Z\"}\n{\"change\":\"deleted\",\"location\":{\"type\":\"url\",\"value\":\"http://h/x\"}}\n",
            "[{\"change\":\"updated\",\"location\":{\"type\":\"rel_path\",\"value\":\"c\"},\"mime\":\"text/xml\",\"ln\":[{\"rel\":\"describedby\",\"href\":\"http://h/m\"}]}]",
        ])) {
            for framing in [Framing::Json, Framing::Ndjson] {
                match parse_body(&body, framing) {
                    Ok(events) => proptest::prop_assert!(events.len() <= body.len()),
                    Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
                }
            }
        }
    }

    #[test]
    fn every_bad_line_is_numbered() {
        let body = b"{\"change\":\"created\",\"location\":{\"type\":\"rel_path\",\"value\":\"a\"}}\n\n{oops\n{\"change\":\"gone\",\"location\":{\"type\":\"rel_path\",\"value\":\"a\"}}\n";
        let IngestError::Invalid(errs) = parse_body(body, Framing::Ndjson).unwrap_err() else {
            panic!()
        };
        assert_eq!(errs.iter().map(|e| e.line).collect::<Vec<_>>(), [3, 4]);
        assert!(errs[1].reason.contains("gone"), "{:?}", errs[1]);
    }

    #[test]
    fn a_change_given_as_an_array_of_its_fields_is_refused() {
        let line = br#"["created", {"type": "rel_path", "value": "a"}]"#;
        for framing in [Framing::Ndjson, Framing::Json] {
            let body = match framing {
                Framing::Json => [b"[".as_slice(), line, b"]"].concat(),
                Framing::Ndjson => line.to_vec(),
            };
            let IngestError::Invalid(errs) = parse_body(&body, framing).unwrap_err() else {
                panic!()
            };
            assert!(errs[0].reason.contains("not an array"), "{errs:?}");
        }
    }

    #[test]
    fn a_location_or_link_given_as_an_array_of_its_fields_is_refused() {
        let cases = [
            (
                r#"{"change":"created","location":["url","http://x/a"]}"#,
                "location is a JSON object",
            ),
            (
                r#"{"change":"created","location":{"type":"url","value":"http://x/a"},"ln":[["describedby",{"type":"url","value":"http://x/m"}]]}"#,
                "ln[0] is a JSON object",
            ),
            (
                r#"{"change":"created","location":{"type":"url","value":"http://x/a"},"ln":[{"rel":"describedby","href":["url","http://x/m"]}]}"#,
                "ln[0].href is a JSON object",
            ),
        ];
        for (line, reason) in cases {
            let IngestError::Invalid(errs) =
                parse_body(line.as_bytes(), Framing::Ndjson).unwrap_err()
            else {
                panic!("{line} was taken")
            };
            assert!(
                errs[0].reason.contains(reason) && errs[0].reason.contains("not an array"),
                "{errs:?}"
            );
        }
        // The same change written as objects is taken.
        let ok = r#"{"change":"created","location":{"type":"url","value":"http://x/a"},"ln":[{"rel":"describedby","href":{"type":"url","value":"http://x/m"}}]}"#;
        assert_eq!(parse_body(ok.as_bytes(), Framing::Ndjson).unwrap().len(), 1);
    }

    #[test]
    fn json_object_or_array() {
        let one = br#"{"change":"deleted","location":{"type":"url","value":"http://x/a"}}"#;
        assert_eq!(parse_body(one, Framing::Json).unwrap().len(), 1);
        let arr = br#"[{"change":"deleted","location":{"type":"url","value":"http://x/a"}},{"change":"deleted","location":{"type":"url","value":"http://x/b"}}]"#;
        assert_eq!(parse_body(arr, Framing::Json).unwrap()[1].0, 2);
        assert!(matches!(
            parse_body(b"  ", Framing::Json),
            Err(IngestError::Empty)
        ));
        assert!(Framing::from_content_type(Some("text/xml"))
            .unwrap_err()
            .contains("application/x-ndjson"));
    }
}
