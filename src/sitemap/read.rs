//! Reading ResourceSync documents with quick-xml's streaming reader.

use std::collections::BTreeMap;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

/// A parsed `urlset` or `sitemapindex`.
#[derive(Debug, Clone, Default)]
pub struct Document {
    pub is_index: bool,
    /// Attributes of the top-level `rs:md`.
    pub md: BTreeMap<String, String>,
    /// Top-level `rs:ln` as (rel, href).
    pub links: Vec<(String, String)>,
    pub entries: Vec<ParsedEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedEntry {
    pub loc: String,
    pub lastmod: Option<String>,
    pub md: BTreeMap<String, String>,
    /// `rs:ln` attributes, one map per link.
    pub links: Vec<BTreeMap<String, String>>,
}

#[derive(Debug, thiserror::Error)]
#[error("not a ResourceSync document: {0}")]
pub struct ReadError(String);

impl Document {
    /// The `href` of the top-level link with this `rel`.
    pub fn link(&self, rel: &str) -> Option<&str> {
        self.links
            .iter()
            .find(|(r, _)| r == rel)
            .map(|(_, h)| h.as_str())
    }
}

/// Parses a document; namespaces are matched by the usual `rs:` prefix.
pub fn parse(xml: &[u8]) -> Result<Document, ReadError> {
    let mut r = Reader::from_reader(xml);
    r.config_mut().trim_text(true);
    let mut doc = Document::default();
    let mut entry: Option<ParsedEntry> = None;
    let mut text_of: Option<&'static str> = None;
    let mut saw_root = false;
    let mut buf = Vec::new();
    loop {
        let ev = r
            .read_event_into(&mut buf)
            .map_err(|e| ReadError(e.to_string()))?;
        match ev {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let name = e.name();
                match name.as_ref() {
                    b"urlset" => saw_root = true,
                    b"sitemapindex" => {
                        saw_root = true;
                        doc.is_index = true;
                    }
                    b"url" | b"sitemap" => entry = Some(ParsedEntry::default()),
                    b"loc" => text_of = Some("loc"),
                    b"lastmod" => text_of = Some("lastmod"),
                    b"rs:md" => {
                        let a = attrs(e)?;
                        match entry.as_mut() {
                            Some(en) => en.md = a,
                            None => doc.md = a,
                        }
                    }
                    b"rs:ln" => {
                        let a = attrs(e)?;
                        match entry.as_mut() {
                            Some(en) => en.links.push(a),
                            None => doc.links.push((
                                a.get("rel").cloned().unwrap_or_default(),
                                a.get("href").cloned().unwrap_or_default(),
                            )),
                        }
                    }
                    _ => {}
                }
            }
            Event::Text(t) => {
                let s = t
                    .unescape()
                    .map_err(|e| ReadError(e.to_string()))?
                    .into_owned();
                if let (Some(which), Some(en)) = (text_of, entry.as_mut()) {
                    match which {
                        "loc" => en.loc = s,
                        _ => en.lastmod = Some(s),
                    }
                }
            }
            Event::End(e) => match e.name().as_ref() {
                b"url" | b"sitemap" => doc.entries.extend(entry.take()),
                b"loc" | b"lastmod" => text_of = None,
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if !saw_root {
        return Err(ReadError("no urlset or sitemapindex element".into()));
    }
    Ok(doc)
}

fn attrs(e: &BytesStart) -> Result<BTreeMap<String, String>, ReadError> {
    let mut m = BTreeMap::new();
    for a in e.attributes() {
        let a = a.map_err(|e| ReadError(e.to_string()))?;
        let k = String::from_utf8_lossy(a.key.as_ref()).into_owned();
        let v = a
            .unescape_value()
            .map_err(|e| ReadError(e.to_string()))?
            .into_owned();
        m.insert(k, v);
    }
    Ok(m)
}
