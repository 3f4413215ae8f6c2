//! A record collected from an OAI-PMH repository, as the server keeps it, so that it keeps its
//! identity from the repository to the consumer: its file's path is made from its OAI
//! identifier and read back into it ([`record_path`], [`identifier_of`]); its change's links
//! say where it came from (`via`: the repository's `GetRecord` URL) and which of the
//! repository's OAI sets hold it (`collection`: the repository's listing of each set, whose
//! `set` argument is the set's spec, [`specs_of`]); what the collector learned of the
//! repository (base URL, granularity, its sets and their names) is kept in the store under
//! [`facts_key`], for `/oai` to serve.
//!
//! The path: every byte but ASCII letters, digits, `-`, `_`, `.` and `:` is written `~XX` (so
//! `/`, `\`, `%` and `~` itself never appear as themselves, and a plain identifier such as
//! `oai:example.org:rec-0001` reads as itself in file names and URLs, with no `%` to encode
//! twice); a `.` that would start a name is written `~2E` (no `.`, `..` or hidden names); the
//! name ends in `.xml`; records spread over 256 folders by the first byte of the identifier's
//! SHA-256. A name longer than file systems take is cut into folders of at most
//! [`MAX_SEGMENT`] bytes, each ending in `~` (which the encoding never writes last), so every
//! identifier has its own path and every path its one identifier.

use sha2::Digest as _;

use super::Link;

/// The longest folder or file name written (most file systems take 255 bytes).
pub const MAX_SEGMENT: usize = 200;

/// The relative path of the record `identifier`'s file, like `3f/oai:repo.example.org:123.xml`.
pub fn record_path(identifier: &str) -> String {
    let hash = sha2::Sha256::digest(identifier.as_bytes());
    let mut out = format!("{:02x}/", hash[0]);
    let mut segment = String::new();
    let bytes = identifier.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let token = if (b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            && !(b == b'.' && segment.is_empty())
        {
            (b as char).to_string()
        } else {
            format!("~{b:02X}")
        };
        // Room for this token and what must follow it: `~` for a folder, `.xml` for the file.
        let last = i + 1 == bytes.len();
        let tail = if last { 4 } else { 1 };
        if segment.len() + token.len() + tail > MAX_SEGMENT {
            out.push_str(&segment);
            out.push_str("~/");
            segment.clear();
            // The token again, as the first of a name (a `.` there is escaped).
            if b == b'.' {
                segment.push_str("~2E");
                continue;
            }
        }
        segment.push_str(&token);
    }
    if bytes.is_empty() {
        // Not a name a record has (its header needs an identifier), but never `.xml`.
        segment.push('~');
    }
    out.push_str(&segment);
    out.push_str(".xml");
    out
}

/// The identifier whose file is at `rel` (as [`record_path`] makes it); `None` for any other
/// path (another layout, or not a collected record's).
pub fn identifier_of(rel: &str) -> Option<String> {
    let (_, rest) = rel.split_once('/')?;
    let mut encoded = String::with_capacity(rest.len());
    let mut segments = rest.split('/').peekable();
    while let Some(s) = segments.next() {
        if segments.peek().is_some() {
            encoded.push_str(s.strip_suffix('~')?);
        } else {
            encoded.push_str(s.strip_suffix(".xml")?);
        }
    }
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut it = encoded.bytes();
    while let Some(b) = it.next() {
        if b == b'~' {
            let hex = [it.next()?, it.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            bytes.push(b);
        }
    }
    let id = String::from_utf8(bytes).ok()?;
    (record_path(&id) == rel).then_some(id)
}

/// The repository's OAI sets a record's links name (`collection` links whose URL has a `set`
/// argument), in their order, each once.
pub fn specs_of(links: &[Link]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in links.iter().filter(|l| l.rel == "collection") {
        let Ok(u) = url::Url::parse(&l.href.value) else {
            continue;
        };
        if let Some((_, spec)) = u.query_pairs().find(|(k, _)| k == "set") {
            if !out.iter().any(|s| *s == spec) {
                out.push(spec.into_owned());
            }
        }
    }
    out
}

/// Whether `spec` is a setSpec OAI-PMH.xsd accepts: names of `A-Z a-z 0-9 - _ . ! ~ * ' ( )`
/// joined by `:`.
pub fn is_set_spec(spec: &str) -> bool {
    !spec.is_empty()
        && spec.split(':').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b))
        })
}

/// The store's state key of what the collector of set `set` learned of its repository.
pub fn facts_key(set: &str) -> String {
    format!("oai-origin/{set}")
}

/// What the collector learned of its repository, kept for `/oai`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RepositoryFacts {
    /// The base URL records are collected from.
    pub base_url: String,
    /// Whether its datestamps are days (`YYYY-MM-DD`) rather than seconds.
    #[serde(default)]
    pub day_granularity: bool,
    /// Its OAI sets, `(setSpec, setName)`, as its `ListSets` gave them.
    #[serde(default)]
    pub sets: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Location, LocationType};

    #[test]
    fn plain_identifiers_read_as_themselves_and_every_path_reads_back() {
        let p = record_path("oai:example.org:rec-0001");
        assert_eq!(
            p.split_once('/').unwrap().1,
            "oai:example.org:rec-0001.xml",
            "no escape for a plain identifier"
        );
        assert_eq!(
            record_path("oai:arXiv.org:hep-th/9901001")
                .split_once('/')
                .unwrap()
                .1,
            "oai:arXiv.org:hep-th~2F9901001.xml"
        );
        for id in [
            "oai:example.org:rec-0001",
            "..",
            "../../etc/passwd",
            "/abs",
            "a/b",
            "a\\b",
            ".",
            ".hidden",
            "%2E%2E",
            "~2F",
            "é ∑ 𝄞",
            "a~",
        ] {
            let p = record_path(id);
            assert!(!p.contains('%'), "{p}");
            for seg in p.split('/') {
                assert!(
                    !seg.is_empty() && !seg.starts_with('.') && !seg.contains('\\'),
                    "{id:?} gave {p}"
                );
            }
            assert_eq!(identifier_of(&p).as_deref(), Some(id), "{p}");
        }
    }

    #[test]
    fn identifiers_never_share_a_path() {
        let ids = [
            "a/b", "a~2Fb", "a.b", "A", "a", "é", "~C3~A9", "a:b", "a~3Ab",
        ];
        let mut paths: Vec<String> = ids.iter().map(|i| record_path(i)).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), ids.len(), "{paths:?}");
    }

    #[test]
    fn a_long_identifier_is_cut_into_folders_and_reads_back() {
        for id in [
            "x".repeat(1000),
            format!("{}y", "x".repeat(999)),
            ":".repeat(300),
            "/".repeat(300),
            format!("{}.{}", "x".repeat(195), ".".repeat(200)),
            "x".repeat(196),
            "x".repeat(197),
        ] {
            let p = record_path(&id);
            for seg in p.split('/') {
                assert!(seg.len() <= MAX_SEGMENT, "{seg}");
                assert!(!seg.starts_with('.'), "{p}");
            }
            assert_eq!(identifier_of(&p).as_deref(), Some(id.as_str()));
        }
        assert_ne!(
            record_path(&"x".repeat(1000)),
            record_path(&"x".repeat(999))
        );
    }

    #[test]
    fn other_paths_are_no_identifiers() {
        for rel in [
            "3f/oai%3Arepo%2Eexample%2Eorg%3A123.xml",
            "oai:x.xml",
            "00/a.xml",
            "ab/a~zz.xml",
            "ab/a~",
            "",
        ] {
            assert_eq!(identifier_of(rel), None, "{rel}");
        }
    }

    #[test]
    fn specs_come_from_collection_links_with_a_set_argument() {
        let link = |rel: &str, u: &str| Link {
            rel: rel.into(),
            href: Location {
                kind: LocationType::Url,
                value: u.into(),
            },
            mime: None,
        };
        let links = [
            link("via", "https://r.org/oai?verb=GetRecord&set=no"),
            link(
                "collection",
                "https://r.org/oai?verb=ListIdentifiers&set=a%3Ab",
            ),
            link("collection", "https://r.org/oai?verb=ListIdentifiers&set=c"),
            link("collection", "https://r.org/oai?verb=ListIdentifiers&set=c"),
            link("collection", "https://r.org/elsewhere"),
        ];
        assert_eq!(specs_of(&links), ["a:b", "c"]);
        assert!(is_set_spec("a:b") && is_set_spec("x-y_z.(1)!~*'"));
        for bad in ["", "a:", ":a", "a b", "a/b", "é"] {
            assert!(!is_set_spec(bad), "{bad:?}");
        }
    }
}
