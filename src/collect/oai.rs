//! Reading OAI-PMH 2.0 responses (pure functions over a response's bytes, already bounded by
//! the caller): `Identify`, a page of `ListRecords` / `ListIdentifiers` with its resumption
//! token, and the protocol's errors. A repository's bad input costs one record, never the page:
//! each `<record>` is cut out of the page and checked on its own (well-formed, only characters
//! XML 1.0 can carry, references included), and one that fails is quarantined with its reason
//! while the rest are read. A record's metadata comes out as a standalone XML document: its
//! element as sent, with the namespace declarations it inherited from the envelope added to its
//! start tag, so that it means the same outside it. No DTD or entity is ever expanded (quick-xml
//! knows none but the five predefined ones).

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

use crate::sitemap::element::{bad_character, check_element_in};

/// Why a response could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OaiError {
    /// The repository answered with an OAI-PMH error (`noRecordsMatch`, `badResumptionToken`, …).
    #[error("the repository answered {code}: {message}")]
    Protocol { code: String, message: String },
    /// Not an OAI-PMH response (an HTML error page, another root, a truncated body).
    #[error("not an OAI-PMH response: {0}")]
    NotOai(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    Day,
    Seconds,
}

/// How the repository keeps deletions (`Identify`'s `deletedRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletedRecord {
    No,
    Transient,
    Persistent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identify {
    pub repository_name: String,
    pub granularity: Granularity,
    pub earliest_datestamp: String,
    pub deleted_record: DeletedRecord,
    pub response_date: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub identifier: String,
    pub datestamp: String,
    pub sets: Vec<String>,
    /// `status="deleted"`.
    pub deleted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub header: Header,
    /// The metadata element as a standalone XML document (none for a deleted record or a
    /// `ListIdentifiers` page).
    pub metadata: Option<String>,
}

/// A record kept aside: its identifier when it could be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    pub identifier: Option<String>,
    pub reason: String,
}

/// A page's resumption token: an empty `value` ends the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub value: String,
    pub cursor: Option<u64>,
    pub complete_list_size: Option<u64>,
    pub expiration_date: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub response_date: String,
    pub records: Vec<Record>,
    pub quarantined: Vec<Quarantined>,
    pub token: Option<Token>,
}

fn not_oai(why: impl std::fmt::Display) -> OaiError {
    OaiError::NotOai(why.to_string())
}

fn local(name: &[u8]) -> &[u8] {
    name.iter()
        .rposition(|b| *b == b':')
        .map_or(name, |i| &name[i + 1..])
}

fn attr(e: &BytesStart, key: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == key)
        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
}

/// The `xmlns` and `xmlns:p` declarations of a start tag, as (attribute name, raw value).
fn declarations(e: &BytesStart) -> Vec<(Vec<u8>, Vec<u8>)> {
    e.attributes()
        .flatten()
        .filter(|a| a.key.as_ref() == b"xmlns" || a.key.as_ref().starts_with(b"xmlns:"))
        .map(|a| (a.key.as_ref().to_vec(), a.value.to_vec()))
        .collect()
}

/// What [`read_small`] hands its caller: a start tag (with the names of the elements above
/// it; `empty`: `<x/>`), an element's text (unescaped, with the names down to it), or an
/// element's end (with the names down to it).
enum Visit<'a> {
    Start {
        above: &'a [Vec<u8>],
        name: &'a [u8],
        empty: bool,
    },
    Text {
        path: &'a [Vec<u8>],
        text: &'a str,
    },
    End {
        path: &'a [Vec<u8>],
    },
}

/// Reads a small OAI-PMH answer (`Identify`, `ListSets`) whole: it must be UTF-8 with an
/// `<OAI-PMH>` root (and, with `closed`, every element closed: not truncated); an `<error>`
/// is the protocol error it is, its code and words. Everything else goes to `visit`.
fn read_small(xml: &[u8], closed: bool, mut visit: impl FnMut(Visit<'_>)) -> Result<(), OaiError> {
    let text = std::str::from_utf8(xml).map_err(|e| not_oai(format!("not UTF-8: {e}")))?;
    let mut r = Reader::from_str(text);
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut error: Option<(String, String)> = None;
    let mut root_seen = false;
    loop {
        match r
            .read_event()
            .map_err(|e| not_oai(format!("at byte {}: {e}", r.error_position())))?
        {
            Event::Start(e) => {
                let name = local(e.name().as_ref()).to_vec();
                if path.is_empty() {
                    if name != b"OAI-PMH" {
                        return Err(not_oai(format!(
                            "its root is <{}>",
                            String::from_utf8_lossy(e.name().as_ref())
                        )));
                    }
                    root_seen = true;
                }
                if name == b"error" {
                    error = Some((attr(&e, b"code").unwrap_or_default(), String::new()));
                }
                visit(Visit::Start {
                    above: &path,
                    name: &name,
                    empty: false,
                });
                path.push(name);
            }
            Event::Empty(e) => {
                let qname = e.name();
                let name = local(qname.as_ref());
                if name == b"error" {
                    error = Some((attr(&e, b"code").unwrap_or_default(), String::new()));
                }
                visit(Visit::Start {
                    above: &path,
                    name,
                    empty: true,
                });
            }
            Event::Text(t) => {
                let v = t.unescape().map_err(|e| not_oai(e.to_string()))?;
                let v = v.trim();
                if path.last().map(Vec::as_slice) == Some(b"error") {
                    if let Some(err) = &mut error {
                        err.1.push_str(v);
                    }
                    continue;
                }
                visit(Visit::Text {
                    path: &path,
                    text: v,
                });
            }
            Event::End(_) => {
                visit(Visit::End { path: &path });
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !root_seen {
        return Err(not_oai("no <OAI-PMH> element"));
    }
    if closed && !path.is_empty() {
        return Err(not_oai(
            "it ends before its elements are closed (truncated)",
        ));
    }
    if let Some((code, message)) = error {
        return Err(OaiError::Protocol { code, message });
    }
    Ok(())
}

/// Reads an `Identify` response.
pub fn parse_identify(xml: &[u8]) -> Result<Identify, OaiError> {
    let mut f = std::collections::HashMap::<&'static str, String>::new();
    read_small(xml, false, |v| {
        let Visit::Text { path, text } = v else {
            return;
        };
        let key = match path.last().map(Vec::as_slice) {
            Some(b"responseDate") => "responseDate",
            Some(b"repositoryName") => "repositoryName",
            Some(b"granularity") => "granularity",
            Some(b"earliestDatestamp") => "earliestDatestamp",
            Some(b"deletedRecord") => "deletedRecord",
            _ => return,
        };
        f.entry(key).or_default().push_str(text);
    })?;
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    Ok(Identify {
        repository_name: get("repositoryName"),
        granularity: match get("granularity").as_str() {
            "YYYY-MM-DD" => Granularity::Day,
            "YYYY-MM-DDThh:mm:ssZ" => Granularity::Seconds,
            g => return Err(not_oai(format!("granularity {g:?}"))),
        },
        earliest_datestamp: get("earliestDatestamp"),
        deleted_record: match get("deletedRecord").as_str() {
            "no" => DeletedRecord::No,
            "transient" => DeletedRecord::Transient,
            "persistent" => DeletedRecord::Persistent,
            d => return Err(not_oai(format!("deletedRecord {d:?}"))),
        },
        response_date: get("responseDate"),
    })
}

/// A page of `ListSets`: each set as (setSpec, setName), those whose spec OAI-PMH does not
/// allow (or that is longer than [`MAX_SET_NAME`]) left out (no record can be listed in them either), and the token of the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetsPage {
    pub sets: Vec<(String, String)>,
    pub token: Option<String>,
}

/// The longest setName kept (a peer's text).
const MAX_SET_NAME: usize = 400;

/// Reads a `ListSets` response (`noSetHierarchy` is the protocol error it is).
pub fn parse_sets(xml: &[u8]) -> Result<SetsPage, OaiError> {
    let mut page = SetsPage::default();
    let mut current: Option<(String, String)> = None;
    read_small(xml, true, |v| match v {
        Visit::Start { above, name, empty } => match name {
            b"set" if !empty && above.len() == 2 => current = Some(Default::default()),
            b"resumptionToken" => page.token = Some(String::new()),
            _ => {}
        },
        Visit::Text { path, text } => match (path.last().map(Vec::as_slice), &mut current) {
            (Some(b"setSpec"), Some((spec, _))) if path.len() == 4 => spec.push_str(text),
            (Some(b"setName"), Some((_, name))) if path.len() == 4 => name.push_str(text),
            (Some(b"resumptionToken"), _) => {
                if let Some(t) = &mut page.token {
                    t.push_str(text)
                }
            }
            _ => {}
        },
        Visit::End { path } => {
            if path.len() == 3 && path.last().map(Vec::as_slice) == Some(b"set") {
                if let Some((spec, name)) = current.take() {
                    if spec.len() <= MAX_SET_NAME && crate::model::origin::is_set_spec(&spec) {
                        let mut end = name.len().min(MAX_SET_NAME);
                        while !name.is_char_boundary(end) {
                            end -= 1;
                        }
                        page.sets.push((spec, name[..end].to_string()));
                    }
                }
            }
        }
    })?;
    page.token = page.token.filter(|t| !t.is_empty());
    Ok(page)
}

/// `xml` as text with every byte of an invalid UTF-8 sequence replaced by U+0001 (so offsets
/// stay those of the bytes), and where those bytes were.
fn marked_utf8(xml: &[u8]) -> (std::borrow::Cow<'_, str>, Vec<usize>) {
    let mut bad = Vec::new();
    let mut rest = match std::str::from_utf8(xml) {
        Ok(t) => return (std::borrow::Cow::Borrowed(t), bad),
        Err(_) => xml,
    };
    let mut out = String::with_capacity(xml.len());
    let mut at = 0;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(t) => {
                out.push_str(t);
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                out.push_str(std::str::from_utf8(&rest[..good]).expect("checked"));
                let n = e.error_len().unwrap_or(rest.len() - good);
                for i in 0..n {
                    bad.push(at + good + i);
                    out.push('\u{1}');
                }
                at += good + n;
                rest = &rest[good + n..];
            }
        }
    }
    (std::borrow::Cow::Owned(out), bad)
}

/// Reads a page of `ListRecords` or `ListIdentifiers` (whose headers come outside records).
/// Bytes that are not UTF-8 cost the record holding them (quarantined), never the page; in
/// the envelope they make it no OAI-PMH response.
pub fn parse_list(xml: &[u8]) -> Result<Page, OaiError> {
    let (text, bad_bytes) = marked_utf8(xml);
    let text = text.as_ref();
    // Where records were cut out: bad bytes there cost their record only.
    let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
    // Bytes of the records' standalone metadata: at most about twice the page.
    let mut produced = 0usize;
    let mut r = Reader::from_str(text);
    // Records are cut out by name; a malformed one is found out on its own.
    r.config_mut().check_end_names = false;
    let mut page = Page {
        response_date: String::new(),
        records: Vec::new(),
        quarantined: Vec::new(),
        token: None,
    };
    let mut path: Vec<Vec<u8>> = Vec::new();
    // Namespace declarations in scope at the list (root and verb element).
    let mut inherited: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut error: Option<(String, String)> = None;
    let mut token: Option<Token> = None;
    loop {
        let before = r.buffer_position() as usize;
        let ev = r
            .read_event()
            .map_err(|e| not_oai(format!("at byte {}: {e}", r.error_position())))?;
        match ev {
            Event::Start(e) => {
                let name = local(e.name().as_ref()).to_vec();
                if path.is_empty() && name != b"OAI-PMH" {
                    return Err(not_oai(format!(
                        "its root is <{}>",
                        String::from_utf8_lossy(e.name().as_ref())
                    )));
                }
                match name.as_slice() {
                    b"record" | b"header" if path.len() == 2 => {
                        let end = e.to_end().into_owned();
                        r.read_to_end(end.name())
                            .map_err(|e| not_oai(format!("a <record> is not closed: {e}")))?;
                        let after = r.buffer_position() as usize;
                        let slice = &text[before..after];
                        let bad = bad_bytes
                            .iter()
                            .filter(|&&i| (before..after).contains(&i))
                            .count();
                        if !bad_bytes.is_empty() {
                            spans.push(before..after);
                        }
                        if bad > 0 {
                            let first = bad_bytes.iter().find(|&&i| i >= before).expect("one");
                            page.quarantined.push(Quarantined {
                                identifier: lenient_identifier(slice),
                                reason: format!(
                                    "not UTF-8: the byte 0x{:02X} at offset {} of its page",
                                    xml[*first],
                                    first - before
                                ),
                            });
                            continue;
                        }
                        match record(slice, &inherited, name == b"header") {
                            Ok(rec) => {
                                produced += rec.metadata.as_ref().map_or(0, String::len);
                                if produced > 2 * xml.len() + 65_536 {
                                    return Err(not_oai(format!(
                                        "its records would take over {produced} bytes once standalone, more than twice its own {} (namespace declarations copied into every record)",
                                        xml.len()
                                    )));
                                }
                                page.records.push(rec)
                            }
                            Err(q) => page.quarantined.push(q),
                        }
                        continue;
                    }
                    b"error" => {
                        error = Some((attr(&e, b"code").unwrap_or_default(), String::new()))
                    }
                    b"resumptionToken" => token = Some(token_of(&e)),
                    _ => {}
                }
                if path.len() < 2 {
                    // The envelope's declarations are copied into records: they must be sound.
                    for a in e.attributes().with_checks(true) {
                        let a = a.map_err(|e| not_oai(format!("its envelope: {e}")))?;
                        if a.value.contains(&b'<') || a.unescape_value().is_err() {
                            return Err(not_oai(format!(
                                "its envelope's attribute {} is not well-formed",
                                String::from_utf8_lossy(a.key.as_ref())
                            )));
                        }
                    }
                    inherited.extend(declarations(&e));
                }
                path.push(name);
            }
            Event::Empty(e) => match local(e.name().as_ref()) {
                b"resumptionToken" => token = Some(token_of(&e)),
                b"error" => error = Some((attr(&e, b"code").unwrap_or_default(), String::new())),
                _ => {}
            },
            Event::Text(t) => {
                let v = t.unescape().map_err(|e| not_oai(e.to_string()))?;
                match path.last().map(Vec::as_slice) {
                    Some(b"responseDate") => page.response_date.push_str(v.trim()),
                    Some(b"resumptionToken") => {
                        if let Some(t) = &mut token {
                            t.value.push_str(v.trim());
                        }
                    }
                    Some(b"error") => {
                        if let Some(err) = &mut error {
                            err.1.push_str(v.trim());
                        }
                    }
                    _ => {}
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if let Some(&i) = bad_bytes
        .iter()
        .find(|i| !spans.iter().any(|s| s.contains(i)))
    {
        return Err(not_oai(format!(
            "not UTF-8 outside its records (the byte 0x{:02X} at offset {i})",
            xml[i]
        )));
    }
    if page.response_date.is_empty() && error.is_none() && page.records.is_empty() {
        return Err(not_oai("no <OAI-PMH> response (no responseDate)"));
    }
    if !path.is_empty() {
        return Err(not_oai(
            "it ends before its elements are closed (truncated)",
        ));
    }
    if let Some((code, message)) = error {
        return Err(OaiError::Protocol { code, message });
    }
    page.token = token;
    Ok(page)
}

fn token_of(e: &BytesStart) -> Token {
    Token {
        value: String::new(),
        cursor: attr(e, b"cursor").and_then(|v| v.parse().ok()),
        complete_list_size: attr(e, b"completeListSize").and_then(|v| v.parse().ok()),
        expiration_date: attr(e, b"expirationDate"),
    }
}

/// A record's identifier read leniently, so that a bad record can still be named (cut to a
/// few hundred bytes: a hostile one can be as long as its page).
fn lenient_identifier(slice: &str) -> Option<String> {
    slice
        .split_once("identifier>")
        .and_then(|(_, rest)| rest.split_once('<'))
        .map(|(id, _)| crate::cause::outsider(id.trim()))
}

/// One `<record>` (or, in `ListIdentifiers`, one `<header>`) cut out of a page.
fn record(
    slice: &str,
    inherited: &[(Vec<u8>, Vec<u8>)],
    header_only: bool,
) -> Result<Record, Quarantined> {
    let quarantine =
        |identifier: Option<String>, reason: String| Quarantined { identifier, reason };
    let identifier = lenient_identifier(slice);
    if let Some(why) = bad_character(slice) {
        return Err(quarantine(identifier, why));
    }
    let bound: Vec<&[u8]> = inherited.iter().map(|(k, _)| k.as_slice()).collect();
    check_element_in(slice, &bound)
        .map_err(|why| quarantine(identifier.clone(), format!("not well-formed XML: {why}")))?;
    let mut r = Reader::from_str(slice);
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut header = Header {
        identifier: String::new(),
        datestamp: String::new(),
        sets: Vec::new(),
        deleted: false,
    };
    let mut metadata = None;
    // The namespace of the metadata's root element (`None`: it has none).
    let mut root_ns: Option<Option<Vec<u8>>> = None;
    let mut scope: Vec<(Vec<u8>, Vec<u8>)> = inherited.to_vec();
    loop {
        let before = r.buffer_position() as usize;
        let ev = r
            .read_event()
            .map_err(|e| quarantine(identifier.clone(), e.to_string()))?;
        match ev {
            Event::Start(e) => {
                let name = local(e.name().as_ref()).to_vec();
                if name == b"header" && attr(&e, b"status").as_deref() == Some("deleted") {
                    header.deleted = true;
                }
                let in_metadata = path.last().map(Vec::as_slice) == Some(b"metadata");
                if in_metadata {
                    let end = e.to_end().into_owned();
                    r.read_to_end(end.name())
                        .map_err(|e| quarantine(identifier.clone(), e.to_string()))?;
                    let after = r.buffer_position() as usize;
                    root_ns = Some(namespace_of(&e, &scope));
                    metadata = Some(standalone(&slice[before..after], &e, &scope));
                    continue;
                }
                scope.extend(declarations(&e));
                path.push(name);
            }
            Event::Empty(e) => {
                let qname = e.name();
                let name = local(qname.as_ref());
                if name == b"header" && attr(&e, b"status").as_deref() == Some("deleted") {
                    header.deleted = true;
                }
                if path.last().map(Vec::as_slice) == Some(b"metadata") {
                    let raw = &slice[before..r.buffer_position() as usize];
                    root_ns = Some(namespace_of(&e, &scope));
                    metadata = Some(standalone(raw, &e, &scope));
                }
            }
            Event::Text(t) => {
                let v = t
                    .unescape()
                    .map_err(|e| quarantine(identifier.clone(), e.to_string()))?;
                match path.last().map(Vec::as_slice) {
                    Some(b"identifier") => header.identifier.push_str(v.trim()),
                    Some(b"datestamp") => header.datestamp.push_str(v.trim()),
                    Some(b"setSpec") => header.sets.push(v.trim().to_string()),
                    _ => {}
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if header.identifier.is_empty() || header.datestamp.is_empty() {
        return Err(quarantine(
            identifier,
            "its header has no identifier or no datestamp".into(),
        ));
    }
    if !header.deleted && !header_only && metadata.is_none() {
        return Err(quarantine(
            Some(crate::cause::outsider(&header.identifier)),
            "it has no metadata".into(),
        ));
    }
    if header.deleted {
        metadata = None;
    }
    let named = || Some(crate::cause::outsider(&header.identifier));
    if !header_only {
        if let Some(bad) = header
            .sets
            .iter()
            .find(|s| !crate::model::origin::is_set_spec(s))
        {
            return Err(quarantine(
                named(),
                format!(
                    "its setSpec {:?} is not one OAI-PMH allows (names of A-Z a-z 0-9 - _ . ! ~ * ' ( ) joined by ':'), so /oai could not list it in that set",
                    crate::cause::outsider(bad)
                ),
            ));
        }
    }
    if metadata.is_some() {
        match root_ns.flatten() {
            None => {
                return Err(quarantine(
                    named(),
                    "its metadata's root element has no namespace; OAI-PMH carries metadata in a namespace of its own, so /oai could not serve it".into(),
                ))
            }
            Some(ns) if ns == OAI_NS.as_bytes() => {
                return Err(quarantine(
                    named(),
                    "its metadata's root element lies in the OAI-PMH namespace, where OAI-PMH.xsd takes no metadata, so /oai could not serve it".into(),
                ))
            }
            Some(_) => {}
        }
    }
    // What is stored is the standalone document: checked as it will be stored.
    if let Some(m) = &metadata {
        let body = m.split_once('\n').map_or(m.as_str(), |(_, b)| b);
        if let Err(why) = check_element_in(body, &[]) {
            return Err(quarantine(
                Some(crate::cause::outsider(&header.identifier)),
                format!("not well-formed XML once standalone: {why}"),
            ));
        }
    }
    Ok(Record { header, metadata })
}

/// The OAI-PMH namespace.
const OAI_NS: &str = "http://www.openarchives.org/OAI/2.0/";

/// The namespace of the element `e`, its prefix looked up in its own declarations and then in
/// `scope` (innermost last); `None` when it has none (or `xmlns=""` took it away).
fn namespace_of(e: &BytesStart, scope: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u8>> {
    let qname = e.name();
    let key = match qname.as_ref().iter().position(|b| *b == b':') {
        Some(i) => [b"xmlns:".as_slice(), &qname.as_ref()[..i]].concat(),
        None => b"xmlns".to_vec(),
    };
    declarations(e)
        .into_iter()
        .rev()
        .chain(scope.iter().rev().cloned())
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// The metadata element `raw` (whose start tag is `start`) as a standalone document: the
/// declarations in `scope` it does not make itself are added to its start tag, the default
/// namespace and each prefix its text names (`p:`, in a name or in a QName-valued attribute
/// such as `xsi:type`); a prefix it never names is left out, so that a page whose envelope
/// declares many namespaces does not copy them into every record.
fn standalone(raw: &str, start: &BytesStart, scope: &[(Vec<u8>, Vec<u8>)]) -> String {
    let own: Vec<Vec<u8>> = declarations(start).into_iter().map(|(k, _)| k).collect();
    let mut added = String::new();
    let mut seen: Vec<&[u8]> = Vec::new();
    let names = |k: &[u8]| match k.strip_prefix(b"xmlns:") {
        None => true,
        Some(p) => {
            let p = String::from_utf8_lossy(p);
            raw.match_indices(&*p).any(|(i, _)| {
                raw[i + p.len()..].starts_with(':')
                    && !raw[..i]
                        .ends_with(|c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
            })
        }
    };
    // Innermost declarations win: walk the scope from the end.
    for (k, v) in scope.iter().rev() {
        if own.contains(k) || seen.contains(&k.as_slice()) || !names(k) {
            continue;
        }
        seen.push(k);
        added.push(' ');
        added.push_str(&String::from_utf8_lossy(k));
        added.push_str("=\"");
        added.push_str(&String::from_utf8_lossy(v));
        added.push('"');
    }
    let name_end = 1 + start.name().as_ref().len();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}{}{}",
        &raw[..name_end],
        added,
        &raw[name_end..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any answer a repository sends is read or refused in words: no panic; what is read
        /// is well-formed and at most about twice the page; what is quarantined is named
        /// briefly.
        #[test]
        fn any_answer_is_read_or_refused_in_words(xml in crate::fuzz::peer_input(&[
            &format!("{HEAD}{}{}<resumptionToken cursor=\"0\">t1</resumptionToken>{TAIL}", rec("oai:x:1", DC), rec("oai:x:2", "<m:r xmlns:m=\"urn:m\"><m:c/></m:r>")),
            "<?xml version=\"1.0\"?><OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\"><responseDate>2026-01-01T00:00:00Z</responseDate><request>h</request><Identify><repositoryName>r</repositoryName><baseURL>http://h/oai</baseURL><protocolVersion>2.0</protocolVersion><adminEmail>a@h</adminEmail><earliestDatestamp>2001-01-01</earliestDatestamp><deletedRecord>no</deletedRecord><granularity>YYYY-MM-DD</granularity></Identify></OAI-PMH>",
            "<OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\"><responseDate>2026-01-01T00:00:00Z</responseDate><error code=\"badArgument\">no</error></OAI-PMH>",
            "<OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\"><responseDate>2026-01-01T00:00:00Z</responseDate><ListSets><set><setSpec>a:b</setSpec><setName>A &amp; B</setName></set><resumptionToken>t</resumptionToken></ListSets></OAI-PMH>",
        ])) {
            match parse_list(&xml) {
                Ok(p) => {
                    let out: usize = p.records.iter().map(|r| r.metadata.as_ref().map_or(0, String::len)).sum();
                    proptest::prop_assert!(out <= 2 * xml.len() + 65_536);
                    for m in p.records.iter().filter_map(|r| r.metadata.as_deref()) {
                        let body = m.split_once('\n').map_or(m, |(_, b)| b);
                        proptest::prop_assert!(crate::sitemap::element::check_element(body).is_ok(), "{}", m);
                    }
                    for q in &p.quarantined {
                        proptest::prop_assert!(!q.reason.is_empty());
                        proptest::prop_assert!(q.identifier.as_ref().map_or(0, String::len) < 400);
                    }
                }
                Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
            }
            let _ = parse_identify(&xml);
            if let Ok(p) = parse_sets(&xml) {
                for (spec, name) in &p.sets {
                    proptest::prop_assert!(crate::model::origin::is_set_spec(spec));
                    proptest::prop_assert!(name.len() <= MAX_SET_NAME);
                }
            }
        }
    }

    /// Found by the property above: an envelope attribute that is not well-formed was copied
    /// into every record's standalone document.
    #[test]
    fn an_envelope_that_is_not_well_formed_is_no_response() {
        let xml = format!(
            "{}{}{TAIL}",
            HEAD.replacen("xmlns=\"", "xmlns=\"&undefined;", 1),
            rec("oai:x:1", DC)
        );
        assert!(
            matches!(parse_list(xml.as_bytes()), Err(OaiError::NotOai(m)) if m.contains("envelope"))
        );
    }

    /// An envelope declaring many namespaces costs its records nothing they do not name (it
    /// copied every declaration into every record: a page could grow a hundredfold).
    #[test]
    fn only_the_namespaces_a_record_names_are_copied_into_it() {
        let decls: String = (0..200)
            .map(|i| format!(" xmlns:n{i}=\"urn:{}\"", "u".repeat(50)))
            .collect();
        let head = HEAD.replacen("<OAI-PMH ", &format!("<OAI-PMH{decls} "), 1);
        let recs: String = (0..100)
            .map(|i| rec(&format!("oai:x:{i}"), "<n7:r><n7:c/></n7:r>"))
            .collect();
        let xml = format!("{head}{recs}{TAIL}");
        let p = parse_list(xml.as_bytes()).unwrap();
        assert_eq!(p.records.len(), 100);
        let m = p.records[0].metadata.as_deref().unwrap();
        assert!(m.contains("xmlns:n7=") && !m.contains("xmlns:n8="), "{m}");
        let out: usize = p
            .records
            .iter()
            .map(|r| r.metadata.as_ref().map_or(0, String::len))
            .sum();
        assert!(out < xml.len(), "{out} bytes from a page of {}", xml.len());
    }

    const HEAD: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<responseDate>2026-11-26T10:00:00Z</responseDate>
<request verb="ListRecords" metadataPrefix="oai_dc">http://repo.example.org/oai</request>
<ListRecords>"#;
    const TAIL: &str = "</ListRecords></OAI-PMH>";

    fn rec(id: &str, meta: &str) -> String {
        format!(
            "<record><header><identifier>{id}</identifier><datestamp>2026-11-01</datestamp>\
             <setSpec>a</setSpec><setSpec>b:c</setSpec></header><metadata>{meta}</metadata></record>"
        )
    }

    const DC: &str = r#"<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>T &amp; U</dc:title></oai_dc:dc>"#;

    #[test]
    fn a_page_gives_its_records_headers_deletions_and_token() {
        let xml = format!(
            "{HEAD}{}<record><header status=\"deleted\"><identifier>oai:x:2</identifier>\
             <datestamp>2026-11-02T01:02:03Z</datestamp></header></record>\
             <resumptionToken cursor=\"0\" completeListSize=\"3\" expirationDate=\"2026-11-27T00:00:00Z\">tok&amp;1</resumptionToken>{TAIL}",
            rec("oai:x:1", DC)
        );
        let p = parse_list(xml.as_bytes()).unwrap();
        assert_eq!(p.response_date, "2026-11-26T10:00:00Z");
        assert_eq!(p.records.len(), 2);
        let r = &p.records[0];
        assert_eq!(r.header.identifier, "oai:x:1");
        assert_eq!(r.header.sets, ["a", "b:c"]);
        let m = r.metadata.as_deref().unwrap();
        assert!(
            m.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<oai_dc:dc"),
            "{m}"
        );
        assert!(m.contains("<dc:title>T &amp; U</dc:title>"), "as sent: {m}");
        assert!(
            m.contains("xmlns=\"http://www.openarchives.org/OAI/2.0/\""),
            "inherited: {m}"
        );
        crate::sitemap::element::check_element(m.split_once('\n').unwrap().1).unwrap();
        assert!(p.records[1].header.deleted && p.records[1].metadata.is_none());
        assert_eq!(
            p.token,
            Some(Token {
                value: "tok&1".into(),
                cursor: Some(0),
                complete_list_size: Some(3),
                expiration_date: Some("2026-11-27T00:00:00Z".into())
            })
        );
        assert!(p.quarantined.is_empty());
    }

    #[test]
    fn a_bad_record_is_quarantined_and_the_rest_of_its_page_read() {
        let xml = format!(
            "{HEAD}{}{}{}{}{}<resumptionToken/>{TAIL}",
            rec("oai:x:1", DC),
            rec("oai:x:2", "<dc>bad \u{1} char</dc>"),
            rec("oai:x:3", "<dc>a reference &#x1; to one</dc>"),
            rec("oai:x:4", "<dc><unclosed></dc>"),
            rec(
                "oai:x:5",
                "<record xmlns=\"http://www.loc.gov/MARC21/slim\"><leader>x</leader></record>"
            ),
        );
        let p = parse_list(xml.as_bytes()).unwrap();
        let ids: Vec<&str> = p
            .records
            .iter()
            .map(|r| r.header.identifier.as_str())
            .collect();
        assert_eq!(
            ids,
            ["oai:x:1", "oai:x:5"],
            "a MARC <record> inside metadata is fine"
        );
        let q: Vec<(Option<&str>, &str)> = p
            .quarantined
            .iter()
            .map(|q| (q.identifier.as_deref(), q.reason.as_str()))
            .collect();
        assert_eq!(q.len(), 3, "{q:?}");
        assert_eq!(q[0].0, Some("oai:x:2"));
        assert!(q[0].1.contains("U+0001"), "{q:?}");
        assert!(q[1].1.contains("&#x1;"), "{q:?}");
        assert!(q[2].1.contains("not well-formed"), "{q:?}");
        assert_eq!(p.token.unwrap().value, "", "an empty token ends the list");
    }

    #[test]
    fn list_sets_gives_specs_names_and_token() {
        let xml = r#"<?xml version="1.0"?><OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">
<responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListSets">http://r/oai</request>
<ListSets><set><setSpec>a</setSpec><setName>Alpha &amp; co</setName></set>
<set><setSpec>a:b</setSpec><setName>Beta</setName><setDescription><x>no</x></setDescription></set>
<set><setSpec>bad spec</setSpec><setName>Bad</setName></set>
<set><setSpec>{long}</setSpec><setName>Long</setName></set>
<resumptionToken cursor="0">t1</resumptionToken></ListSets></OAI-PMH>"#;
        let xml = xml.replace("{long}", &"x".repeat(MAX_SET_NAME + 1));
        let p = parse_sets(xml.as_bytes()).unwrap();
        assert_eq!(
            p.sets,
            [
                ("a".into(), "Alpha & co".into()),
                ("a:b".into(), "Beta".into())
            ]
        );
        assert_eq!(p.token.as_deref(), Some("t1"));
        let none = r#"<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>x</responseDate>
<error code="noSetHierarchy">no sets</error></OAI-PMH>"#;
        assert!(
            matches!(parse_sets(none.as_bytes()), Err(OaiError::Protocol { code, .. }) if code == "noSetHierarchy")
        );
        assert!(parse_sets(b"<html>busy</html>").is_err());
    }

    /// What would make an `/oai` answer holding the record invalid is quarantined in words:
    /// a metadata root in the OAI-PMH namespace (an old Zenodo `oai_datacite` record's, which
    /// takes the envelope's default namespace), one in no namespace, a malformed setSpec.
    #[test]
    fn what_oai_pmh_xsd_would_refuse_is_quarantined() {
        let zenodo = "<oai_datacite xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
            xsi:schemaLocation=\"http://schema.datacite.org/oai/oai-1.0/ http://schema.datacite.org/oai/oai-1.0/oai.xsd\">\
            <isReferenceQuality>true</isReferenceQuality><schemaVersion>3</schemaVersion>\
            <datacentreSymbol>CERN.ZENODO</datacentreSymbol><payload>\
            <resource xmlns=\"http://datacite.org/schema/kernel-3\"><identifier identifierType=\"DOI\">10.5281/zenodo.1</identifier></resource>\
            </payload></oai_datacite>";
        let xml = format!(
            "{HEAD}{}{}{}{}{}{TAIL}",
            rec("oai:zenodo.org:1", zenodo),
            rec("oai:x:2", "<dc xmlns=\"\"><title>none</title></dc>"),
            rec("oai:x:3", DC),
            "<record><header><identifier>oai:x:4</identifier><datestamp>2026-11-01</datestamp>\
             <setSpec>a b</setSpec></header><metadata><x:y xmlns:x=\"urn:x\"/></metadata></record>",
            rec("oai:x:5", "<oai:dc xmlns:oai=\"urn:not-oai\"/>"),
        );
        let p = parse_list(xml.as_bytes()).unwrap();
        let ids: Vec<&str> = p
            .records
            .iter()
            .map(|r| r.header.identifier.as_str())
            .collect();
        assert_eq!(ids, ["oai:x:3", "oai:x:5"], "{:?}", p.quarantined);
        let reasons: Vec<&str> = p.quarantined.iter().map(|q| q.reason.as_str()).collect();
        assert!(reasons[0].contains("OAI-PMH namespace"), "{reasons:?}");
        assert!(reasons[1].contains("no namespace"), "{reasons:?}");
        assert!(reasons[2].contains("setSpec \"a b\""), "{reasons:?}");
        assert_eq!(
            p.quarantined[0].identifier.as_deref(),
            Some("oai:zenodo.org:1")
        );
    }

    #[test]
    fn one_bad_byte_or_malformed_record_costs_that_record_only() {
        let bad = [
            r#"<a k="&undefined;"/>"#,
            r#"<a k="a & b"/>"#,
            r#"<a k="a<b"/>"#,
            r#"<a k="1" k="2"/>"#,
            r#"<p:a/>"#,
            r#"<1t/>"#,
            r#"<a><!-- a -- b --></a>"#,
            r#"<a><?xml version="1.0"?></a>"#,
            r#"<a xmlns:p=""/>"#,
        ];
        let mut xml = HEAD.as_bytes().to_vec();
        xml.extend(rec("oai:x:good", DC).as_bytes());
        for (i, m) in bad.iter().enumerate() {
            xml.extend(rec(&format!("oai:x:bad{i}"), m).as_bytes());
        }
        xml.extend(
            rec("oai:x:latin1", "<dc>caf\u{0}</dc>")
                .replace('\u{0}', "\u{FF}")
                .as_bytes(),
        );
        let cut = xml
            .iter()
            .rposition(|&b| b == 0xC3)
            .expect("the ÿ's lead byte");
        xml.remove(cut); // a lone continuation byte: not UTF-8
        xml.extend(rec("oai:x:after", DC).as_bytes());
        xml.extend(format!("<resumptionToken>t1</resumptionToken>{TAIL}").as_bytes());
        let p = parse_list(&xml).unwrap();
        let kept: Vec<&str> = p
            .records
            .iter()
            .map(|r| r.header.identifier.as_str())
            .collect();
        assert_eq!(kept, ["oai:x:good", "oai:x:after"]);
        assert_eq!(p.quarantined.len(), bad.len() + 1, "{:?}", p.quarantined);
        let last = p.quarantined.last().unwrap();
        assert_eq!(last.identifier.as_deref(), Some("oai:x:latin1"));
        assert!(last.reason.contains("not UTF-8: the byte 0xBF"), "{last:?}");
        assert_eq!(p.token.unwrap().value, "t1", "the page goes on");
        // In the envelope, a bad byte makes it no response.
        let mut env = format!(
            "{HEAD}{}<resumptionToken>t\u{0}</resumptionToken>{TAIL}",
            rec("oai:x:1", DC)
        )
        .into_bytes();
        let z = env.iter().position(|&b| b == 0).unwrap();
        env[z] = 0xFF;
        assert!(
            matches!(parse_list(&env), Err(OaiError::NotOai(m)) if m.contains("not UTF-8 outside its records"))
        );
    }

    #[test]
    fn errors_html_pages_and_truncated_bodies_are_told_apart() {
        let err = format!(
            "{}<error code=\"noRecordsMatch\">nothing in this window</error></OAI-PMH>",
            HEAD.split("<ListRecords>").next().unwrap()
        );
        assert_eq!(
            parse_list(err.as_bytes()),
            Err(OaiError::Protocol {
                code: "noRecordsMatch".into(),
                message: "nothing in this window".into()
            })
        );
        let html = "<html><body><h1>502 Bad Gateway</h1></body></html>";
        assert!(
            matches!(parse_list(html.as_bytes()), Err(OaiError::NotOai(m)) if m.contains("<html>"))
        );
        let truncated = format!("{HEAD}{}", rec("oai:x:1", DC));
        assert!(matches!(
            parse_list(truncated.as_bytes()),
            Err(OaiError::NotOai(_))
        ));
        assert!(matches!(parse_list(b"\xff\xfe"), Err(OaiError::NotOai(m)) if m.contains("UTF-8")));
    }

    #[test]
    fn identify_says_granularity_earliest_datestamp_and_deletions() {
        let xml = r#"<?xml version="1.0"?><OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">
<responseDate>2026-11-26T10:00:00Z</responseDate><request verb="Identify">http://r/oai</request>
<Identify><repositoryName>R &amp; D</repositoryName><baseURL>http://r/oai</baseURL>
<protocolVersion>2.0</protocolVersion><adminEmail>a@r</adminEmail>
<earliestDatestamp>2001-01-01</earliestDatestamp><deletedRecord>transient</deletedRecord>
<granularity>YYYY-MM-DD</granularity></Identify></OAI-PMH>"#;
        let i = parse_identify(xml.as_bytes()).unwrap();
        assert_eq!(i.repository_name, "R & D");
        assert_eq!(i.granularity, Granularity::Day);
        assert_eq!(i.deleted_record, DeletedRecord::Transient);
        assert_eq!(i.earliest_datestamp, "2001-01-01");
        assert!(matches!(
            parse_identify(b"<html/>"),
            Err(OaiError::NotOai(_))
        ));
    }
}
