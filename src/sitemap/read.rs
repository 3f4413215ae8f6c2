//! Reading ResourceSync documents with quick-xml's streaming, namespace-aware reader: a
//! document's header (root, top-level `rs:md` and `rs:ln`) and then its entries one at a time,
//! so that a 50 MB Resource List part is never held whole. Elements are matched by namespace,
//! not by prefix, so documents from any writer read alike.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::NsReader;

const SITEMAP_NS: &[u8] = b"http://www.sitemaps.org/schemas/sitemap/0.9";
const RS_NS: &[u8] = b"http://www.openarchives.org/rs/terms/";

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

impl ReadError {
    /// A reading error in words, at most about 300 bytes: the parser's messages can quote the
    /// document (a tag name, say), and documents come from untrusted peers.
    fn of(e: impl std::fmt::Display) -> ReadError {
        let mut m = e.to_string();
        if m.len() > 300 {
            let mut end = 300;
            while !m.is_char_boundary(end) {
                end -= 1;
            }
            m.truncate(end);
            m.push('…');
        }
        ReadError(m)
    }
}

impl Document {
    /// The `href` of the top-level link with this `rel`.
    pub fn link(&self, rel: &str) -> Option<&str> {
        self.links
            .iter()
            .find(|(r, _)| r == rel)
            .map(|(_, h)| h.as_str())
    }
}

/// Links kept per entry (and in the header); more are ignored.
const MAX_LINKS: usize = 64;

/// A reader that bounds what one XML token can cost a streaming parser, which otherwise
/// buffers a whole text node or tag however long: a text run (a `<loc>`'s URL, say) longer
/// than `max` bytes is cut at `max` (and a character boundary), the rest dropped up to the
/// next markup; a tag longer than `max` is an error. A reader of untrusted documents puts this
/// under its [`EntryReader`] so that one 200 MB `<loc>` costs `max` bytes, not 200 MB; the cut
/// text is then longer than any URL limit below `max` and refused as such.
pub struct Bounded<R> {
    inner: R,
    max: usize,
    run: usize,
    in_tag: bool,
    skipping: bool,
}

impl<R: Read> Bounded<R> {
    pub fn new(inner: R, max: usize) -> Bounded<R> {
        Bounded {
            inner,
            max,
            run: 0,
            in_tag: false,
            skipping: false,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.inner.read(out)?;
            if n == 0 {
                return Ok(0);
            }
            let mut w = 0;
            for r in 0..n {
                let b = out[r];
                if b == b'<' {
                    (self.in_tag, self.run, self.skipping) = (true, 0, false);
                } else if self.in_tag && b == b'>' {
                    (self.in_tag, self.run) = (false, 0);
                } else if self.skipping {
                    continue;
                } else {
                    self.run += 1;
                    // Past the limit, a character begun is finished (UTF-8 continuation bytes).
                    if self.run > self.max && b & 0xC0 != 0x80 {
                        if self.in_tag {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                format!("a tag longer than {} bytes", self.max),
                            ));
                        }
                        self.skipping = true;
                        continue;
                    }
                }
                out[w] = b;
                w += 1;
            }
            if w > 0 {
                return Ok(w);
            }
        }
    }
}

/// Parses a whole document (small documents: capability lists, indexes, notifications).
pub fn parse(xml: &[u8]) -> Result<Document, ReadError> {
    let mut r = EntryReader::new(xml)?;
    let mut doc = r.header().clone();
    while let Some(e) = r.next_entry()? {
        doc.entries.push(e);
    }
    Ok(doc)
}

/// Which element's text is being read.
#[derive(Clone, Copy)]
enum Text {
    Loc,
    Lastmod,
}

/// A document read entry by entry: the header first (available at once), then
/// [`EntryReader::next_entry`] until `None`.
pub struct EntryReader<R: BufRead> {
    reader: NsReader<R>,
    buf: Vec<u8>,
    header: Document,
    /// An entry whose `<url>`/`<sitemap>` start was read while looking for the header's end.
    started: Option<ParsedEntry>,
    done: bool,
}

impl<R: BufRead> EntryReader<R> {
    /// Reads up to the first entry; fails when the root is neither `urlset` nor `sitemapindex`
    /// of the sitemaps.org namespace.
    pub fn new(input: R) -> Result<EntryReader<R>, ReadError> {
        let mut reader = NsReader::from_reader(input);
        reader.config_mut().trim_text(true);
        let mut r = EntryReader {
            reader,
            buf: Vec::new(),
            header: Document::default(),
            started: None,
            done: false,
        };
        let mut saw_root = false;
        loop {
            let (ns, ev) = r
                .reader
                .read_resolved_event_into(&mut r.buf)
                .map_err(ReadError::of)?;
            let ns_sitemap = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == SITEMAP_NS);
            let ns_rs = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == RS_NS);
            match ev {
                Event::Start(ref e) | Event::Empty(ref e) => {
                    let local = e.local_name();
                    match local.as_ref() {
                        b"urlset" if ns_sitemap => saw_root = true,
                        b"sitemapindex" if ns_sitemap => {
                            saw_root = true;
                            r.header.is_index = true;
                        }
                        b"url" | b"sitemap" if ns_sitemap => {
                            r.started = Some(ParsedEntry::default());
                            if matches!(ev, Event::Empty(_)) {
                                r.started = None;
                            }
                            break;
                        }
                        b"md" if ns_rs => r.header.md = attrs(e)?,
                        b"ln" if ns_rs && r.header.links.len() < MAX_LINKS => {
                            let a = attrs(e)?;
                            r.header.links.push((
                                a.get("rel").cloned().unwrap_or_default(),
                                a.get("href").cloned().unwrap_or_default(),
                            ));
                        }
                        other if !saw_root => {
                            return Err(ReadError::of(format!(
                                "the root element is {}, not a sitemaps.org urlset or sitemapindex",
                                String::from_utf8_lossy(other)
                            )))
                        }
                        _ => {}
                    }
                }
                Event::Eof => {
                    r.done = true;
                    break;
                }
                _ => {}
            }
            r.buf.clear();
        }
        if !saw_root {
            return Err(ReadError("no urlset or sitemapindex element".into()));
        }
        r.buf.clear();
        Ok(r)
    }

    pub fn header(&self) -> &Document {
        &self.header
    }

    /// The next entry, or `None` at the end of the document.
    pub fn next_entry(&mut self) -> Result<Option<ParsedEntry>, ReadError> {
        if self.done {
            return Ok(None);
        }
        let mut entry = self.started.take();
        let mut text: Option<Text> = None;
        loop {
            let (ns, ev) = self
                .reader
                .read_resolved_event_into(&mut self.buf)
                .map_err(ReadError::of)?;
            let ns_sitemap = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == SITEMAP_NS);
            let ns_rs = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == RS_NS);
            match ev {
                Event::Start(ref e) | Event::Empty(ref e) => {
                    let empty = matches!(ev, Event::Empty(_));
                    match e.local_name().as_ref() {
                        b"url" | b"sitemap" if ns_sitemap && !empty => {
                            entry = Some(ParsedEntry::default())
                        }
                        b"loc" if ns_sitemap && !empty => text = Some(Text::Loc),
                        b"lastmod" if ns_sitemap && !empty => text = Some(Text::Lastmod),
                        b"md" if ns_rs => {
                            if let Some(en) = entry.as_mut() {
                                en.md = attrs(e)?;
                            }
                        }
                        b"ln" if ns_rs => {
                            if let Some(en) = entry.as_mut().filter(|en| en.links.len() < MAX_LINKS)
                            {
                                en.links.push(attrs(e)?);
                            }
                        }
                        _ => {}
                    }
                }
                Event::Text(t) => {
                    let s = t.unescape().map_err(ReadError::of)?.into_owned();
                    if let (Some(which), Some(en)) = (text, entry.as_mut()) {
                        match which {
                            Text::Loc => en.loc.push_str(&s),
                            Text::Lastmod => en.lastmod = Some(s),
                        }
                    }
                }
                Event::CData(t) => {
                    if let (Some(Text::Loc), Some(en)) = (text, entry.as_mut()) {
                        en.loc.push_str(&String::from_utf8_lossy(&t));
                    }
                }
                Event::End(ref e) => match e.local_name().as_ref() {
                    b"url" | b"sitemap" if ns_sitemap => {
                        if let Some(en) = entry.take() {
                            self.buf.clear();
                            return Ok(Some(en));
                        }
                    }
                    b"loc" | b"lastmod" => text = None,
                    _ => {}
                },
                Event::Eof => {
                    self.done = true;
                    return Ok(None);
                }
                _ => {}
            }
            self.buf.clear();
        }
    }
}

/// Attributes by local name (`rs:md`'s are unprefixed; a prefixed one keeps its local name).
fn attrs(e: &BytesStart) -> Result<BTreeMap<String, String>, ReadError> {
    let mut m = BTreeMap::new();
    for a in e.attributes() {
        let a = a.map_err(ReadError::of)?;
        if a.key.as_ref().starts_with(b"xmlns") {
            continue;
        }
        let k = String::from_utf8_lossy(a.key.local_name().as_ref()).into_owned();
        let v = a.unescape_value().map_err(ReadError::of)?.into_owned();
        m.insert(k, v);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any document a peer sends (a Resource or Change List, an index, a notification's
        /// payload) is read or refused in words: no panic, entries no larger than it.
        #[test]
        fn any_document_is_read_or_refused_in_words(xml in crate::fuzz::peer_input(&[
            r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:ln rel="up" href="http://h/cap.xml"/><rs:md capability="changelist" from="2024-01-01T00:00:00Z"/><url><loc>http://h/a</loc><lastmod>2024-01-01T00:00:00Z</lastmod><rs:md change="updated" datetime="2024-01-01T00:00:00Z" hash="md5:1B2M2Y8AsgTpgAmY7PhCfg==" length="0" type="text/plain"/><rs:ln rel="describedby" href="http://h/m"/></url></urlset>"#,
            r#"<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="resourcelist" at="2024-01-01T00:00:00Z"/><sitemap><loc>http://h/rl/1.xml</loc></sitemap></sitemapindex>"#,
        ])) {
            match parse(&xml) {
                Ok(doc) => {
                    let out: usize = doc.entries.iter().map(|e| e.loc.len()).sum();
                    proptest::prop_assert!(out <= xml.len());
                }
                Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
            }
            if let Ok(mut r) = EntryReader::new(&xml[..]) {
                while let Some(Ok(_)) = r.next_entry().transpose() {}
            }
        }
    }

    #[test]
    fn reads_by_namespace_whatever_the_prefix() {
        let xml = br#"<?xml version="1.0"?>
<s:urlset xmlns:s="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:x="http://www.openarchives.org/rs/terms/">
  <x:ln rel="up" href="http://h/cap.xml"/>
  <x:md capability="resourcelist" at="2024-01-01T00:00:00Z"/>
  <s:url><s:loc>http://h/a&amp;b</s:loc><s:lastmod>2024-01-01T00:00:00Z</s:lastmod><x:md hash="md5:00" length="3"/></s:url>
  <s:url><s:loc>http://h/c</s:loc><x:md change="deleted"/><x:ln rel="describedby" href="http://h/m"/></s:url>
</s:urlset>"#;
        let mut r = EntryReader::new(&xml[..]).unwrap();
        assert_eq!(r.header().md["at"], "2024-01-01T00:00:00Z");
        assert_eq!(r.header().link("up"), Some("http://h/cap.xml"));
        let a = r.next_entry().unwrap().unwrap();
        assert_eq!(
            (a.loc.as_str(), a.md["length"].as_str()),
            ("http://h/a&b", "3")
        );
        let c = r.next_entry().unwrap().unwrap();
        assert_eq!(c.md["change"], "deleted");
        assert_eq!(c.links[0]["rel"], "describedby");
        assert!(r.next_entry().unwrap().is_none());
        assert!(parse(b"<html/>").is_err());
        assert!(parse(br#"<urlset xmlns="http://example.org/other"/>"#).is_err());
        let empty = parse(br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><rs:md xmlns:rs="http://www.openarchives.org/rs/terms/" capability="changelist"/></urlset>"#).unwrap();
        assert_eq!(
            (empty.entries.len(), empty.md["capability"].as_str()),
            (0, "changelist")
        );
    }

    #[test]
    fn a_bounded_reader_cuts_long_text_and_refuses_long_tags() {
        let long = format!(
            r#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://h/{}é></loc></url><url><loc>http://h/b</loc></url></urlset>"#,
            "é".repeat(100_000)
        );
        let mut r =
            EntryReader::new(std::io::BufReader::new(Bounded::new(long.as_bytes(), 1000))).unwrap();
        let a = r.next_entry().unwrap().unwrap();
        assert!(
            a.loc.len() >= 1000 && a.loc.len() < 1010,
            "cut on a character boundary: {}",
            a.loc.len()
        );
        assert_eq!(r.next_entry().unwrap().unwrap().loc, "http://h/b");
        let tag = format!(
            r#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url a="{}"/></urlset>"#,
            "x".repeat(5000)
        );
        let mut r = EntryReader::new(std::io::BufReader::new(Bounded::new(tag.as_bytes(), 1000)))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            r.as_mut().is_err_and(|e| e.contains("longer than 1000")),
            "{r:?}"
        );
    }
}
