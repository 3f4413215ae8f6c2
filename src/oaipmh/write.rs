//! The repository's answers as XML. Small answers are strings; a list or a record is a stream:
//! its headers come from the store, each record's metadata is its file read as the answer is
//! written (a page is never held whole in memory), without the file's XML declaration.

use std::fmt::Write as _;

use bytes::Bytes;

use super::{Item, ListPage, OaiError, OaiSet, Provenance, Request, Verb};
use crate::config::{OaiConfig, OaiFormat};
use crate::model::Timestamp;

pub use crate::model::is_xml_char as xml_char;

/// Text escaped for an element or attribute, any character XML 1.0 cannot carry replaced by
/// U+FFFD: whatever a harvester sent or a store holds, an answer stays XML.
fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().all(xml_char) {
        return quick_xml::escape::escape(s);
    }
    let clean: String = s
        .chars()
        .map(|c| if xml_char(c) { c } else { '\u{FFFD}' })
        .collect();
    std::borrow::Cow::Owned(quick_xml::escape::escape(&clean).into_owned())
}

/// A streamed answer.
pub type Body = futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>>;

/// The largest resource file embedded as a record's metadata.
const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;

fn date(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_micros(t.0)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The answer's start: declaration, root, `responseDate`, `request` (with the arguments when
/// they were valid).
fn start(base: &str, req: Option<&Request>) -> String {
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
         xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/ http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd\">\n\
         <responseDate>{}</responseDate>\n<request",
        date(Timestamp::now())
    );
    if let Some(r) = req {
        let _ = write!(s, " verb=\"{}\"", r.verb.as_str());
        let mut args: Vec<_> = r.args.iter().collect();
        args.sort();
        for (k, v) in args {
            let _ = write!(s, " {k}=\"{}\"", escape(v.as_str()));
        }
    }
    let _ = writeln!(s, ">{}</request>", escape(base));
    s
}

const END: &str = "</OAI-PMH>\n";

pub fn error(base: &str, req: Option<&Request>, e: &OaiError) -> String {
    // badVerb and badArgument answers echo no arguments (the protocol's rule).
    let req = req.filter(|_| e.code != "badVerb" && e.code != "badArgument");
    format!(
        "{}<error code=\"{}\">{}</error>\n{END}",
        start(base, req),
        e.code,
        escape(e.message.as_str())
    )
}

pub fn identify(base: &str, req: &Request, cfg: &OaiConfig, earliest: Timestamp) -> String {
    format!(
        "{}<Identify><repositoryName>{}</repositoryName><baseURL>{}</baseURL><protocolVersion>2.0</protocolVersion>\
         <adminEmail>{}</adminEmail><earliestDatestamp>{}</earliestDatestamp><deletedRecord>persistent</deletedRecord>\
         <granularity>YYYY-MM-DDThh:mm:ssZ</granularity></Identify>\n{END}",
        start(base, Some(req)),
        escape(cfg.repository_name.as_str()),
        escape(base),
        escape(cfg.admin_email.as_str()),
        date(earliest)
    )
}

pub fn list_metadata_formats(base: &str, req: &Request, formats: &[OaiFormat]) -> String {
    let mut s = start(base, Some(req));
    s.push_str("<ListMetadataFormats>");
    for f in formats {
        let _ = write!(
            s,
            "<metadataFormat><metadataPrefix>{}</metadataPrefix><schema>{}</schema><metadataNamespace>{}</metadataNamespace></metadataFormat>",
            escape(f.metadata_prefix.as_str()),
            escape(f.schema.as_str()),
            escape(f.namespace.as_str())
        );
    }
    s.push_str("</ListMetadataFormats>\n");
    s.push_str(END);
    s
}

pub fn list_sets(base: &str, req: &Request, sets: &[OaiSet]) -> String {
    let mut s = start(base, Some(req));
    s.push_str("<ListSets>");
    for set in sets {
        let _ = write!(
            s,
            "<set><setSpec>{0}</setSpec><setName>{0}</setName></set>",
            escape(set.name.as_str())
        );
        let Some(c) = &set.collected else {
            continue;
        };
        // The repository's sets below the set, each parent of a hierarchical one listed too.
        let mut subs: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
        for (spec, name) in &c.facts.sets {
            subs.insert(spec, name);
        }
        for (spec, _) in &c.facts.sets {
            for (i, _) in spec.match_indices(':') {
                subs.entry(&spec[..i]).or_insert(&spec[..i]);
            }
        }
        for (spec, name) in subs {
            let _ = write!(
                s,
                "<set><setSpec>{}:{}</setSpec><setName>{}</setName></set>",
                escape(set.name.as_str()),
                escape(spec),
                escape(if name.is_empty() { spec } else { name })
            );
        }
    }
    s.push_str("</ListSets>\n");
    s.push_str(END);
    s
}

fn header(item: &Item, out: &mut String) {
    if item.deleted {
        out.push_str("<header status=\"deleted\">");
    } else {
        out.push_str("<header>");
    }
    let _ = write!(
        out,
        "<identifier>{}</identifier><datestamp>{}</datestamp><setSpec>{}</setSpec>",
        escape(item.identifier.as_str()),
        date(item.datestamp),
        escape(item.set.as_str())
    );
    for spec in &item.specs {
        let _ = write!(
            out,
            "<setSpec>{}:{}</setSpec>",
            escape(item.set.as_str()),
            escape(spec.as_str())
        );
    }
    out.push_str("</header>");
}

/// A collected record's `<about>`: where it came from, in the OAI-PMH provenance schema
/// (unaltered: its metadata are the repository's bytes).
fn about(p: &Provenance, out: &mut String) {
    let _ = write!(
        out,
        "<about><provenance xmlns=\"http://www.openarchives.org/OAI/2.0/provenance\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
         xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/provenance http://www.openarchives.org/OAI/2.0/provenance.xsd\">\
         <originDescription harvestDate=\"{}\" altered=\"false\"><baseURL>{}</baseURL><identifier>{}</identifier>\
         <datestamp>{}</datestamp><metadataNamespace>{}</metadataNamespace></originDescription></provenance></about>",
        date(p.harvest_date),
        escape(p.base_url.as_str()),
        escape(p.identifier.as_str()),
        escape(p.datestamp.as_str()),
        escape(p.metadata_namespace.as_str())
    );
}

/// Dublin Core made from what the store knows of a resource.
fn minimal_dc(item: &Item) -> String {
    let mut s = String::from(
        "<oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
         xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/oai_dc/ http://www.openarchives.org/OAI/2.0/oai_dc.xsd\">",
    );
    let _ = write!(
        s,
        "<dc:identifier>{}</dc:identifier>",
        escape(item.identifier.as_str())
    );
    if let Some(r) = &item.resource {
        if let Some(l) = r.meta.lastmod {
            let _ = write!(s, "<dc:date>{}</dc:date>", date(l));
        }
        if let Some(m) = &r.meta.mime {
            let _ = write!(s, "<dc:format>{}</dc:format>", escape(m.as_str()));
        }
        for l in &r.meta.ln {
            let _ = write!(
                s,
                "<dc:relation>{}</dc:relation>",
                escape(l.href.value.as_str())
            );
        }
    }
    s.push_str("</oai_dc:dc>");
    s
}

/// A file as embeddable metadata: its declaration and byte order mark taken off, then only
/// characters XML 1.0 can carry and one element, as [`crate::sitemap::element`] checks them
/// (a file that is not would make the whole answer unreadable). `Err` says why not.
fn embeddable(bytes: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut text = text.trim_start_matches('\u{feff}').trim_start();
    if text.starts_with("<?xml") {
        let end = text.find("?>").ok_or("an unfinished XML declaration")?;
        text = text[end + 2..].trim_start();
    }
    if let Some(why) = crate::sitemap::element::bad_character(text) {
        return Err(why);
    }
    crate::sitemap::element::check_element(text)?;
    // OAI-PMH.xsd takes metadata in a namespace of its own (`##other`): not in none, not in
    // the protocol's.
    match root_namespace(text).as_deref() {
        None => Err("its root element has no namespace".into()),
        Some(OAI_NS) => Err("its root element lies in the OAI-PMH namespace".into()),
        Some(_) => Ok(text),
    }
}

const OAI_NS: &str = "http://www.openarchives.org/OAI/2.0/";

/// The namespace of a standalone document's root element (declared on it: nothing is above).
fn root_namespace(text: &str) -> Option<String> {
    let mut r = quick_xml::Reader::from_str(text);
    loop {
        match r.read_event().ok()? {
            quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e) => {
                let qname = e.name();
                let key = match qname.as_ref().iter().position(|b| *b == b':') {
                    Some(i) => [b"xmlns:".as_slice(), &qname.as_ref()[..i]].concat(),
                    None => b"xmlns".to_vec(),
                };
                return e
                    .attributes()
                    .flatten()
                    .find(|a| a.key.as_ref() == key.as_slice())
                    .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
                    .filter(|v| !v.is_empty());
            }
            quick_xml::events::Event::Eof => return None,
            _ => {}
        }
    }
}

/// Writes a record (read on a blocking thread: its file); `false` when it is left out.
fn record(item: &Item, prefix: &str, native: &OaiFormat, out: &mut String) -> bool {
    if item.deleted {
        out.push_str("<record>");
        header(item, out);
        out.push_str("</record>");
        return true;
    }
    let file;
    let minimal;
    let metadata: &str = if prefix == native.metadata_prefix {
        let Some(path) = &item.file else {
            tracing::warn!(identifier = %item.identifier, "OAI-PMH: a record without a file in the set's resource_root_dir is left out");
            return false;
        };
        let read = || {
            use std::io::Read as _;
            let mut f = std::fs::File::open(path)?;
            let len = f.metadata()?.len();
            if len > MAX_RECORD_BYTES {
                return Err(std::io::Error::other(format!(
                    "larger than {MAX_RECORD_BYTES} bytes"
                )));
            }
            let mut bytes = Vec::with_capacity(len as usize + 1);
            f.read_to_end(&mut bytes)?;
            Ok(bytes)
        };
        file = match read() {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(identifier = %item.identifier, file = %path.display(), error = %e, "OAI-PMH: a record whose file cannot be read is left out");
                return false;
            }
        };
        match embeddable(&file) {
            Ok(t) => t,
            Err(why) => {
                tracing::warn!(identifier = %item.identifier, file = %path.display(), %why, "OAI-PMH: a record whose file is not embeddable XML is left out");
                return false;
            }
        }
    } else {
        minimal = minimal_dc(item);
        &minimal
    };
    out.push_str("<record>");
    header(item, out);
    out.push_str("<metadata>");
    out.push_str(metadata);
    out.push_str("</metadata>");
    if let Some(p) = item
        .provenance
        .as_ref()
        .filter(|_| prefix == native.metadata_prefix)
    {
        about(p, out);
    }
    out.push_str("</record>");
    true
}

/// Records written a blocking task at a time.
const RECORDS_PER_TASK: usize = 64;

fn stream(parts: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    use futures_util::StreamExt as _;
    // Fused: a body may be polled again after its end (the compression layer does).
    Box::pin(
        futures_util::stream::unfold(parts, |mut rx| async move {
            rx.recv().await.map(|b| (Ok(b), rx))
        })
        .fuse(),
    )
}

/// A `ListIdentifiers` or `ListRecords` page, streamed.
pub fn list(
    base: String,
    req: Request,
    page: ListPage,
    formats: Vec<(String, OaiFormat)>,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _slot = slot;
        let verb = req.verb;
        let prefix = page.prefix.clone();
        let mut s = start(&base, Some(&req));
        let _ = write!(s, "<{}>", verb.as_str());
        let _ = tx.send(Bytes::from(s)).await;
        let mut buf = String::new();
        if let Some((entry, file)) = page.kept {
            // The kept records, a chunk at a time.
            let tx2 = tx.clone();
            let sent = tokio::task::spawn_blocking(move || {
                use std::io::Read as _;
                let mut left = entry.records_len;
                let mut file = file;
                while left > 0 {
                    let mut chunk = vec![0u8; left.min(KEPT_CHUNK) as usize];
                    if let Err(e) = file.read_exact(&mut chunk) {
                        // The page was checked when opened: a short read is a disk gone bad.
                        tracing::error!(file = %entry.path.display(), error = %e, "OAI-PMH: a kept list page cannot be read; the answer is cut short");
                        return false;
                    }
                    left -= chunk.len() as u64;
                    if tx2.blocking_send(Bytes::from(chunk)).is_err() {
                        return false;
                    }
                }
                true
            })
            .await
            .unwrap_or(false);
            if !sent {
                return;
            }
        }
        let formats = std::sync::Arc::new(formats);
        let prefix = std::sync::Arc::new(prefix);
        let mut fill = page.fill.and_then(|(lists, fill)| match lists.writer() {
            Ok(w) => Some((lists, fill, w)),
            Err(e) => {
                tracing::warn!(error = %e, "OAI-PMH: cannot keep a list page");
                None
            }
        });
        let mut items = page.items.into_iter().peekable();
        while items.peek().is_some() {
            let chunk: Vec<Item> = items.by_ref().take(RECORDS_PER_TASK).collect();
            let (formats, prefix) = (formats.clone(), prefix.clone());
            let mut writer = fill.take();
            let part = tokio::task::spawn_blocking(move || {
                let mut out = String::new();
                for item in &chunk {
                    if verb == Verb::ListIdentifiers {
                        header(item, &mut out);
                    } else {
                        let native = formats
                            .iter()
                            .find(|(set, _)| set == item.set.as_str())
                            .map(|(_, f)| f.clone())
                            .unwrap_or_else(OaiFormat::oai_dc);
                        record(item, &prefix, &native, &mut out);
                    }
                }
                if let Some((_, _, w)) = &mut writer {
                    if let Err(e) = w.write(out.as_bytes()) {
                        tracing::warn!(error = %e, "OAI-PMH: cannot keep a list page");
                        writer = None;
                    }
                }
                (out, writer)
            })
            .await;
            let Ok((part, writer)) = part else {
                return;
            };
            fill = writer;
            buf.push_str(&part);
            if buf.len() > 64 * 1024
                && tx
                    .send(Bytes::from(std::mem::take(&mut buf)))
                    .await
                    .is_err()
            {
                return;
            }
        }
        match &page.token {
            Some(t) if t.is_empty() => {
                let _ = write!(buf, "<resumptionToken cursor=\"{}\"/>", page.cursor);
            }
            Some(t) => {
                let _ = write!(
                    buf,
                    "<resumptionToken cursor=\"{}\">{}</resumptionToken>",
                    page.cursor,
                    escape(t.as_str())
                );
            }
            None => {}
        }
        let _ = write!(buf, "</{}>\n{END}", verb.as_str());
        let _ = tx.send(Bytes::from(buf)).await;
        if let Some((lists, fill, w)) = fill {
            let kept = tokio::task::spawn_blocking(move || lists.put(w, fill)).await;
            if let Ok(Err(e)) = kept {
                tracing::warn!(error = %e, "OAI-PMH: cannot keep a list page");
            }
        }
    });
    stream(rx)
}

/// Bytes of a kept page sent at a time.
const KEPT_CHUNK: u64 = 128 * 1024;

/// A `GetRecord` answer.
pub async fn get_record(
    base: &str,
    req: &Request,
    item: &Item,
    prefix: &str,
    native: &OaiFormat,
) -> Result<String, OaiError> {
    let (item2, prefix2, native2) = (item.clone(), prefix.to_string(), native.clone());
    let body = tokio::task::spawn_blocking(move || {
        let mut body = String::new();
        record(&item2, &prefix2, &native2, &mut body).then_some(body)
    })
    .await
    .unwrap_or(None);
    let Some(body) = body else {
        return Err(OaiError {
            code: "cannotDisseminateFormat",
            message: format!("the record is not available as {prefix:?} now"),
        });
    };
    Ok(format!(
        "{}<GetRecord>{body}</GetRecord>\n{END}",
        start(base, Some(req))
    ))
}

#[cfg(test)]
mod tests {
    use super::{embeddable, error, escape};
    use crate::oaipmh::parse_request;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any query a harvester sends gets a request or an error whose answer is XML.
        #[test]
        fn any_query_is_a_request_or_an_xml_error(q in crate::fuzz::peer_input(&[
            "verb=ListRecords&metadataPrefix=oai_dc&from=2026-01-01&until=2026-02-01T00:00:00Z&set=papers",
            "verb=GetRecord&identifier=oai%3Ax%3A1&metadataPrefix=oai_dc",
            "verb=ListIdentifiers&resumptionToken=abc.def",
        ])) {
            let pairs: Vec<(String, String)> = url::form_urlencoded::parse(&q).into_owned().collect();
            if let Err(e) = parse_request(&pairs) {
                let doc = error("http://h/oai", None, &e);
                proptest::prop_assert!(doc.chars().all(super::xml_char));
                proptest::prop_assert!(crate::sitemap::element::check_element(doc.split_once('\n').unwrap().1).is_ok(), "{}", doc);
            }
            // Anything stored as a record is embedded only when it is one element.
            if let Ok(t) = embeddable(&q) {
                proptest::prop_assert!(crate::sitemap::element::check_element(t).is_ok());
            }
        }
    }

    #[test]
    fn nothing_xml_cannot_carry_is_written() {
        assert_eq!(
            escape("a\u{1}<\u{FFFE}\u{1B}"),
            "a\u{FFFD}&lt;\u{FFFD}\u{FFFD}"
        );
        assert_eq!(escape("plain & simple"), "plain &amp; simple");
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for (query, code) in [
            (
                &[
                    ("verb", "GetRecord"),
                    ("identifier", "\u{1}"),
                    ("metadataPrefix", "oai_dc"),
                ][..],
                "badArgument",
            ),
            (
                &[("verb", "ListRecords"), ("resumptionToken", "\u{1}")][..],
                "badArgument",
            ),
            (
                &[
                    ("verb", "ListRecords"),
                    ("metadataPrefix", "oai_dc"),
                    ("set", "\u{1B}"),
                ][..],
                "badArgument",
            ),
            (
                &[
                    ("verb", "GetRecord"),
                    ("identifier", "\u{FFFE}"),
                    ("metadataPrefix", "oai_dc"),
                ][..],
                "badArgument",
            ),
            (&[("verb", "Identify"), ("verb", "Identify")][..], "badVerb"),
            (&[("verb", "Identify\u{1}")][..], "badVerb"),
            (&[("verb", "\u{1}")][..], "badVerb"),
        ] {
            let e = parse_request(&pairs(query)).unwrap_err();
            assert_eq!(e.code, code, "{query:?}");
            let doc = error("http://h/oai", None, &e);
            assert!(doc.chars().all(super::xml_char), "{doc:?}");
        }
    }

    #[test]
    fn only_one_well_formed_element_is_embedded() {
        assert_eq!(
            embeddable(b"<?xml version=\"1.0\"?>\n<a xmlns=\"urn:a\" x=\"1\"><b/></a>\n").unwrap(),
            "<a xmlns=\"urn:a\" x=\"1\"><b/></a>\n"
        );
        assert!(embeddable(b"<p:a xmlns:p=\"urn:a\"/>").is_ok());
        // What OAI-PMH.xsd would refuse inside <metadata>.
        assert!(embeddable(b"<a x=\"1\"/>")
            .unwrap_err()
            .contains("no namespace"));
        assert!(embeddable(b"<p:a xmlns=\"urn:a\" xmlns:p=\"\"/>").is_err());
        assert!(
            embeddable(b"<a xmlns=\"http://www.openarchives.org/OAI/2.0/\"/>")
                .unwrap_err()
                .contains("OAI-PMH namespace")
        );
        assert!(embeddable(b"<!DOCTYPE a [<!ENTITY e \"x\">]><a>&e;</a>").is_err());
        assert!(embeddable(b"<a><b></a>").is_err());
        assert!(embeddable(b"<a/><b/>").is_err());
        assert!(embeddable(b"text").is_err());
        assert!(embeddable("<a>\u{1}</a>".as_bytes())
            .unwrap_err()
            .contains("U+0001"));
        assert!(embeddable(b"<a>&undefined;</a>").is_err());
    }
}
