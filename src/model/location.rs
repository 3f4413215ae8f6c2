//! Locations (`url` | `abs_path` | `rel_path`), links, and how they resolve to URLs (seed 003):
//! `url` as is, `rel_path` joined to the set's `url_prefix`, `abs_path` made relative to the
//! set's `resource_root_dir` and then joined. Paths that escape the root are refused.

use std::path::{Component, Path};

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use serde::{Deserialize, Serialize};

use super::SetConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocationType {
    Url,
    AbsPath,
    RelPath,
}

impl LocationType {
    pub fn as_str(self) -> &'static str {
        match self {
            LocationType::Url => "url",
            LocationType::AbsPath => "abs_path",
            LocationType::RelPath => "rel_path",
        }
    }

    pub fn parse(s: &str) -> Option<LocationType> {
        match s {
            "url" => Some(LocationType::Url),
            "abs_path" => Some(LocationType::AbsPath),
            "rel_path" => Some(LocationType::RelPath),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    #[serde(rename = "type")]
    pub kind: LocationType,
    pub value: String,
}

/// A resource's identity inside its set: `path:<relative path>` for file locations (so the
/// same file given as `abs_path` or `rel_path` is one resource) or `url:<url>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey(pub String);

/// Characters escaped in a path when it is joined to a URL prefix.
const PATH: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

impl Location {
    pub fn url(value: impl Into<String>) -> Location {
        Location {
            kind: LocationType::Url,
            value: value.into(),
        }
    }

    pub fn rel_path(value: impl Into<String>) -> Location {
        Location {
            kind: LocationType::RelPath,
            value: value.into(),
        }
    }

    /// Validates the location against the set's configuration and returns its identity.
    pub fn key(&self, set: &SetConfig) -> Result<ResourceKey, String> {
        check_xml_text(&format!("{} location", self.kind.as_str()), &self.value)?;
        match self.kind {
            LocationType::Url => {
                let u = url::Url::parse(&self.value).map_err(|e| {
                    format!(
                        "url location {} is not an absolute URL: {e}",
                        excerpt(&self.value)
                    )
                })?;
                if u.scheme() != "http" && u.scheme() != "https" {
                    return Err(format!(
                        "url location {} is not http(s)",
                        excerpt(&self.value)
                    ));
                }
                Ok(ResourceKey(format!("url:{}", self.value)))
            }
            LocationType::RelPath => {
                if self.value.starts_with('/') {
                    return Err(format!(
                        "rel_path {} starts with '/': give a path relative to the set's url_prefix",
                        excerpt(&self.value)
                    ));
                }
                let rel = normalize_rel(&self.value).ok_or_else(|| {
                    format!(
                        "rel_path {} climbs out of the set with '..'",
                        excerpt(&self.value)
                    )
                })?;
                Ok(ResourceKey(format!("path:{rel}")))
            }
            LocationType::AbsPath => {
                let root = set.root_dir().ok_or_else(|| {
                    format!(
                        "abs_path {} needs a resource_root_dir, and set {:?} has none configured",
                        excerpt(&self.value),
                        set.name
                    )
                })?;
                let rel = relative_to_root(Path::new(&self.value), root).ok_or_else(|| {
                    format!(
                        "abs_path {} lies outside the set's resource_root_dir {:?}",
                        excerpt(&self.value),
                        root
                    )
                })?;
                Ok(ResourceKey(format!("path:{rel}")))
            }
        }
    }
}

impl ResourceKey {
    /// The resource's URL under a set's `url_prefix` (which ends with '/').
    pub fn to_url(&self, url_prefix: &str, out: &mut String) {
        if let Some(path) = self.0.strip_prefix("path:") {
            out.push_str(url_prefix);
            out.extend(utf8_percent_encode(path, PATH));
        } else if let Some(u) = self.0.strip_prefix("url:") {
            out.push_str(u);
        }
    }

    pub fn url(&self, url_prefix: &str) -> String {
        let mut s = String::new();
        self.to_url(url_prefix, &mut s);
        s
    }
}

/// `a/./b/../c` -> `a/c`; `None` when `..` climbs above the start; empty paths refused too.
fn normalize_rel(p: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

fn relative_to_root(p: &Path, root: &Path) -> Option<String> {
    if !p.is_absolute() {
        return None;
    }
    let lexical = |p: &Path| -> Option<Vec<String>> {
        let mut v = Vec::new();
        for c in p.components() {
            match c {
                Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
                Component::ParentDir => {
                    v.pop()?;
                }
                Component::Normal(s) => v.push(s.to_str()?.to_string()),
            }
        }
        Some(v)
    };
    let p = lexical(p)?;
    let root = lexical(root)?;
    if p.len() <= root.len() || p[..root.len()] != root[..] {
        return None;
    }
    Some(p[root.len()..].join("/"))
}

/// A link of a resource (`rs:ln`): `rel`, an `href` location resolved like the resource's own,
/// and the linked resource's media type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub rel: String,
    pub href: Location,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

impl Link {
    /// Checks `rel` against RFC 8288 (a registered lower-case name or a URI), the href (it
    /// must resolve to a URL a sitemap can hold) and the media type.
    pub fn validate(&self, set: &SetConfig) -> Result<(), String> {
        check_xml_text("link rel", &self.rel)?;
        if self.rel.len() > MAX_URL_LEN || self.rel.contains(char::is_whitespace) {
            return Err(format!(
                "link rel {} is neither a registered relation nor a URI",
                excerpt(&self.rel)
            ));
        }
        if let Some(m) = &self.mime {
            check_media_type("link mime", m)?;
        }
        let registered = {
            let mut ch = self.rel.chars();
            matches!(ch.next(), Some('a'..='z'))
                && ch.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        };
        if !registered && url::Url::parse(&self.rel).is_err() {
            return Err(format!(
                "link rel {} is neither a registered relation (like \"describedby\") nor a URI",
                self.rel
            ));
        }
        let key = self.href.key(set).map_err(|e| format!("link href: {e}"))?;
        check_url("link href", &key.url(&set.url_prefix))
    }
}

/// A value quoted in an error message: at most 60 characters of it, so that a reason stays
/// readable whatever was sent.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(60) {
        None => format!("{s:?}"),
        Some((i, _)) => format!("{:?}… ({} characters)", &s[..i], s.chars().count()),
    }
}

/// The sitemaps.org schema's bounds on a `<loc>` URL, in characters.
pub const MIN_URL_LEN: usize = 12;
pub const MAX_URL_LEN: usize = 2048;

/// Refuses characters that XML 1.0 cannot carry (C0 controls other than tab, newline and
/// carriage return; U+FFFE and U+FFFF): a field holding one would make every document that
/// shows it unreadable.
pub fn check_xml_text(what: &str, s: &str) -> Result<(), String> {
    match s.char_indices().find(|(_, c)| !is_xml_char(*c)) {
        Some((i, c)) => Err(format!(
            "{what} holds the control character U+{:04X} at byte {i}, which XML 1.0 cannot carry",
            c as u32
        )),
        None => Ok(()),
    }
}

/// Whether XML 1.0 can carry `c` (a Rust `char` is never a surrogate).
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// A resolved URL must be at most 2,048 characters and an RFC 3986 URI (see [`check_loc`]
/// for the lower bound of a `<loc>`).
pub fn check_url(what: &str, url: &str) -> Result<(), String> {
    let n = url.chars().count();
    if n > MAX_URL_LEN {
        return Err(format!(
            "{what} resolves to a URL of {n} characters; the sitemaps schema allows at most {MAX_URL_LEN}"
        ));
    }
    if let Some((i, c)) = uri_syntax_error(url) {
        return Err(format!(
            "{what} holds {c:?} at byte {i}, which a URI (RFC 3986) cannot hold there: percent-encode it"
        ));
    }
    Ok(())
}

/// The first character that keeps `url` from being an RFC 3986 URI (an IRI: non-ASCII
/// letters are allowed, as XML's `anyURI` allows them): whitespace and controls anywhere,
/// ASCII outside the URI alphabet, `%` not followed by two hex digits, `[` `]` outside the
/// authority, a second `#`.
fn uri_syntax_error(url: &str) -> Option<(usize, char)> {
    let authority_end = url
        .find("://")
        .map(|s| s + 3)
        .map(|a| a + url[a..].find(['/', '?', '#']).unwrap_or(url.len() - a))
        .unwrap_or(0);
    let bytes = url.as_bytes();
    let mut fragment = false;
    for (i, c) in url.char_indices() {
        let ok = match c {
            c if c.is_whitespace() || c.is_control() => false,
            'a'..='z' | 'A'..='Z' | '0'..='9' => true,
            '-' | '.' | '_' | '~' | ':' | '/' | '?' | '@' | '!' | '$' | '&' | '\'' | '(' | ')'
            | '*' | '+' | ',' | ';' | '=' => true,
            '[' | ']' => i < authority_end,
            '#' => !std::mem::replace(&mut fragment, true),
            '%' => bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)),
            c => !c.is_ascii() && !matches!(c, '\u{FEFF}' | '\u{FFFE}' | '\u{FFFF}'),
        };
        if !ok {
            return Some((i, c));
        }
    }
    None
}

/// A resource's own URL, its `<loc>`: [`check_url`] and at least 12 characters.
pub fn check_loc(what: &str, url: &str) -> Result<(), String> {
    check_url(what, url)?;
    if url.chars().count() < MIN_URL_LEN {
        return Err(format!(
            "{what} resolves to {url:?}, shorter than the {MIN_URL_LEN} characters the sitemaps schema requires"
        ));
    }
    Ok(())
}

/// RFC 6838 §4.2: a media type is `type/subtype`, each a restricted-name (a letter or digit,
/// then up to 126 of letters, digits and `!#$&-^_.+`), so at most 255 characters; parameters
/// (`; charset=…`) are allowed and dropped when documents are written.
pub fn check_media_type(what: &str, mime: &str) -> Result<(), String> {
    check_xml_text(what, mime)?;
    let bare = bare_media_type(mime);
    let restricted = |s: &str| {
        let mut b = s.bytes();
        s.len() <= 127
            && b.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && b.all(|c| c.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&c))
    };
    match bare.split_once('/') {
        Some((t, s)) if restricted(t) && restricted(s) => Ok(()),
        _ if bare.len() > 255 => Err(format!(
            "{what} is {} characters long; a media type has at most 255",
            bare.len()
        )),
        _ => Err(format!(
            "{what} {} is not a media type of the form type/subtype, like application/pdf",
            excerpt(mime)
        )),
    }
}

/// A media type without its parameters (`text/plain; charset=utf-8` -> `text/plain`).
pub fn bare_media_type(mime: &str) -> &str {
    mime.split(';').next().unwrap_or("").trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(root: Option<&str>) -> SetConfig {
        SetConfig {
            name: "s".into(),
            url_prefix: "http://h/files/s/".into(),
            resource_root_dir: root.map(Into::into),
            max_items_in_list: 10,
            changelist_rollover_secs: 0,
            describedby: vec![],
        }
    }

    fn url_of(loc: Location, s: &SetConfig) -> Result<String, String> {
        loc.key(s).map(|k| k.url(&s.url_prefix))
    }

    #[test]
    fn resolves_each_kind() {
        let s = set(Some("/srv/data"));
        assert_eq!(
            url_of(Location::url("https://x.org/a?b=1"), &s).unwrap(),
            "https://x.org/a?b=1"
        );
        assert_eq!(
            url_of(Location::rel_path("a/b c.pdf"), &s).unwrap(),
            "http://h/files/s/a/b%20c.pdf"
        );
        let abs = Location {
            kind: LocationType::AbsPath,
            value: "/srv/data/a/./x#1.txt".into(),
        };
        assert_eq!(
            url_of(abs.clone(), &s).unwrap(),
            "http://h/files/s/a/x%231.txt"
        );
        assert_eq!(
            abs.key(&s).unwrap(),
            Location::rel_path("a/x#1.txt").key(&s).unwrap(),
            "one identity"
        );
    }

    #[test]
    fn refuses_escapes() {
        let s = set(Some("/srv/data"));
        let e = Location::rel_path("a/../../etc/passwd")
            .key(&s)
            .unwrap_err();
        assert!(e.contains("climbs out"), "{e}");
        let abs = |v: &str| Location {
            kind: LocationType::AbsPath,
            value: v.into(),
        };
        assert!(abs("/srv/data/../secret")
            .key(&s)
            .unwrap_err()
            .contains("outside"));
        assert!(
            abs("/srv/database/x").key(&s).is_err(),
            "prefix match is per component"
        );
        assert!(abs("/srv/data").key(&s).is_err());
        assert!(abs("/srv/data/x")
            .key(&set(None))
            .unwrap_err()
            .contains("resource_root_dir"));
        assert!(Location::rel_path("/etc/passwd").key(&s).is_err());
        assert!(Location::url("file:///etc/passwd").key(&s).is_err());
    }

    #[test]
    fn link_rel_must_be_a_relation() {
        let s = set(None);
        let l = |rel: &str| Link {
            rel: rel.into(),
            href: Location::rel_path("m.xml"),
            mime: None,
        };
        assert!(l("describedby").validate(&s).is_ok());
        assert!(l("http://example.org/rel/x").validate(&s).is_ok());
        assert!(l("described by").validate(&s).is_err());
        assert_eq!(bare_media_type("text/plain; charset=utf-8"), "text/plain");
    }
}
