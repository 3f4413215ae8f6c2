//! One XML element checked on its own, before it is taken from a page (a harvested OAI-PMH
//! record) or put into one (a resource file embedded in an OAI-PMH answer): only characters
//! XML 1.0 can carry, references included; well-formed with end names checked and every text
//! readable (no entity but the five predefined ones), names, attributes, comments, processing
//! instructions and namespace bindings as a namespace-aware parser checks them; no DTD; exactly
//! one root element and no text beside it.

use quick_xml::events::Event;
use quick_xml::reader::Reader;

use crate::model::is_xml_char;

/// The first character (raw or referenced) XML 1.0 cannot carry, described.
pub fn bad_character(text: &str) -> Option<String> {
    if let Some(c) = first_raw_bad(text.as_bytes()).and_then(|i| text[i..].chars().next()) {
        debug_assert!(!is_xml_char(c));
        return Some(format!(
            "the character U+{:04X}, which XML 1.0 cannot carry",
            c as u32
        ));
    }
    let mut rest = text;
    while let Some(i) = rest.find("&#") {
        rest = &rest[i + 2..];
        let end = rest.find(';')?;
        let (digits, radix) = match rest[..end].strip_prefix(['x', 'X']) {
            Some(hex) => (hex, 16),
            None => (&rest[..end], 10),
        };
        let ok = u32::from_str_radix(digits, radix)
            .ok()
            .and_then(char::from_u32)
            .is_some_and(is_xml_char);
        if !ok {
            return Some(format!(
                "the character reference &#{};, which XML 1.0 cannot carry",
                &rest[..end]
            ));
        }
        rest = &rest[end..];
    }
    None
}

/// Where the first raw character XML 1.0 cannot carry begins. In a `str` those are the C0
/// controls but tab, newline and carriage return (single bytes), and U+FFFE and U+FFFF (`EF BF
/// BE`, `EF BF BF`). Every record of an OAI-PMH page passes here (taken in by the collector,
/// given out by the repository), so the bytes are looked at 32 at a time without a branch
/// (which the compiler vectorises) and only a block with a suspect byte is looked at closely.
fn first_raw_bad(bytes: &[u8]) -> Option<usize> {
    let suspect = |b: u8| (b < 0x20) & (b != b'\t') & (b != b'\n') & (b != b'\r') | (b == 0xEF);
    let mut at = 0;
    for block in bytes.chunks(32) {
        if block.iter().fold(false, |any, &b| any | suspect(b)) {
            for (j, &b) in block.iter().enumerate() {
                let i = at + j;
                if b != 0xEF {
                    if suspect(b) {
                        return Some(i);
                    }
                } else if bytes.get(i + 1) == Some(&0xBF)
                    && matches!(bytes.get(i + 2), Some(0xBE | 0xBF))
                {
                    return Some(i);
                }
            }
        }
        at += block.len();
    }
    None
}

/// `Err(why)` unless `xml` is one well-formed, namespace-well-formed element, as a
/// namespace-aware XML parser reads it (its characters are [`bad_character`]'s to check,
/// first): names are XML names (QNames), every prefix of an element or attribute is bound,
/// no attribute is repeated, attribute values hold no `<` and only defined references,
/// comments hold no `--`, no processing instruction is named `xml` (no declaration inside),
/// text holds no `]]>`, no DTD, one root and no text beside it.
pub fn check_element(xml: &str) -> Result<(), String> {
    check_element_in(xml, &[])
}

/// [`check_element`] for an element cut out of a document, where `inherited` prefixes (the
/// declarations of its ancestors, as `xmlns:p` keys or bare prefixes) are bound already.
pub fn check_element_in(xml: &str, inherited: &[&[u8]]) -> Result<(), String> {
    let mut r = Reader::from_str(xml);
    r.config_mut().check_end_names = true;
    r.config_mut().check_comments = true;
    let (mut depth, mut roots) = (0i64, 0);
    // The prefixes bound, innermost last, and how many each open element added.
    let mut bound: Vec<Vec<u8>> = inherited
        .iter()
        .map(|k| k.strip_prefix(b"xmlns:").unwrap_or(k).to_vec())
        .collect();
    let mut added: Vec<usize> = Vec::new();
    loop {
        let at = r.buffer_position();
        let ev = r
            .read_event()
            .map_err(|e| format!("at byte {}: {e}", r.error_position()))?;
        let empty = matches!(ev, Event::Empty(_));
        match ev {
            Event::Start(e) | Event::Empty(e) => {
                roots += usize::from(depth == 0);
                let n = start_tag(&e, &mut bound).map_err(|why| format!("at byte {at}: {why}"))?;
                if empty {
                    bound.truncate(bound.len() - n);
                } else {
                    depth += 1;
                    added.push(n);
                }
            }
            Event::End(_) => {
                depth -= 1;
                let n = added.pop().unwrap_or(0);
                bound.truncate(bound.len() - n);
            }
            Event::DocType(_) => return Err("a DOCTYPE, which is not read".into()),
            Event::Decl(_) => return Err(format!("at byte {at}: an XML declaration inside")),
            Event::PI(p) => {
                let target = p.target();
                if target.eq_ignore_ascii_case(b"xml") {
                    return Err(format!("at byte {at}: an XML declaration inside"));
                }
                if !std::str::from_utf8(target).is_ok_and(is_name) {
                    return Err(format!(
                        "at byte {at}: a processing instruction without a name"
                    ));
                }
            }
            Event::Comment(c) if c.windows(2).any(|w| w == b"--") || c.ends_with(b"-") => {
                return Err(format!("at byte {at}: a comment holding \"--\""));
            }
            Event::Text(t) => {
                if depth == 0 && !t.iter().all(u8::is_ascii_whitespace) {
                    return Err("text outside the root element".into());
                }
                if t.windows(3).any(|w| w == b"]]>") {
                    return Err(format!("at byte {at}: \"]]>\" in text"));
                }
                t.unescape()
                    .map_err(|e| format!("at byte {}: {e}", r.buffer_position()))?;
            }
            Event::CData(_) if depth == 0 => return Err("text outside the root element".into()),
            Event::Eof if depth != 0 => return Err("an element is not closed".into()),
            Event::Eof if roots != 1 => return Err("not one root element".into()),
            Event::Eof => return Ok(()),
            _ => {}
        }
    }
}

/// Checks a start tag; binds its declarations onto `bound` and says how many it added.
fn start_tag(e: &quick_xml::events::BytesStart, bound: &mut Vec<Vec<u8>>) -> Result<usize, String> {
    let name = std::str::from_utf8(e.name().as_ref())
        .map_err(|_| "a name that is not UTF-8".to_string())?
        .to_string();
    if !is_qname(&name) {
        return Err(format!("<{name}> is not an XML name"));
    }
    // Declarations first: they bind for the element's own name and attributes.
    let mut attrs = Vec::new();
    let mut n = 0;
    for a in e.attributes().with_checks(true) {
        let a = a.map_err(|e| format!("<{name}>: {e}"))?;
        let key = std::str::from_utf8(a.key.as_ref())
            .map_err(|_| format!("<{name}>: an attribute name that is not UTF-8"))?;
        if !is_qname(key) {
            return Err(format!("<{name}>: {key:?} is not an attribute name"));
        }
        if a.value.contains(&b'<') {
            return Err(format!("<{name}>: the value of {key} holds \"<\""));
        }
        let value = a
            .unescape_value()
            .map_err(|e| format!("<{name}>: the value of {key}: {e}"))?;
        if let Some(prefix) = key.strip_prefix("xmlns:") {
            if prefix == "xmlns"
                || (prefix == "xml") != (value == "http://www.w3.org/XML/1998/namespace")
            {
                return Err(format!("<{name}>: {key} cannot be bound to {value:?}"));
            }
            if value.is_empty() {
                return Err(format!("<{name}>: {key} is bound to nothing (XML 1.0 namespaces cannot unbind a prefix)"));
            }
            bound.push(prefix.as_bytes().to_vec());
            n += 1;
        } else if key != "xmlns" {
            attrs.push(key.to_string());
        }
    }
    let is_bound = |q: &str| match q.split_once(':') {
        None => true,
        Some(("xml", _)) => true,
        Some((p, _)) => bound.iter().rev().any(|b| b == p.as_bytes()),
    };
    if !is_bound(&name) {
        return Err(format!("<{name}>: its prefix is not bound to a namespace"));
    }
    if let Some(a) = attrs.iter().find(|a| !is_bound(a)) {
        return Err(format!(
            "<{name}>: the prefix of the attribute {a} is not bound to a namespace"
        ));
    }
    Ok(n)
}

/// XML 1.0's `NameStartChar` (without the colon, which namespaces keep for prefixes).
fn is_name_start(c: char) -> bool {
    matches!(c, 'A'..='Z' | '_' | 'a'..='z' | '\u{C0}'..='\u{D6}' | '\u{D8}'..='\u{F6}'
        | '\u{F8}'..='\u{2FF}' | '\u{370}'..='\u{37D}' | '\u{37F}'..='\u{1FFF}'
        | '\u{200C}'..='\u{200D}' | '\u{2070}'..='\u{218F}' | '\u{2C00}'..='\u{2FEF}'
        | '\u{3001}'..='\u{D7FF}' | '\u{F900}'..='\u{FDCF}' | '\u{FDF0}'..='\u{FFFD}'
        | '\u{10000}'..='\u{EFFFF}')
}

/// XML 1.0's `NameChar` (without the colon).
fn is_name_char(c: char) -> bool {
    is_name_start(c)
        || matches!(c, '-' | '.' | '0'..='9' | '\u{B7}' | '\u{300}'..='\u{36F}' | '\u{203F}'..='\u{2040}')
}

/// An `NCName`: a name without a colon.
fn is_ncname(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(is_name_start) && cs.all(is_name_char)
}

/// A `Name` (what a processing instruction's target is).
fn is_name(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(|c| c == ':' || is_name_start(c))
        && cs.all(|c| c == ':' || is_name_char(c))
}

/// A `QName`: `local` or `prefix:local`.
fn is_qname(s: &str) -> bool {
    match s.split_once(':') {
        None => is_ncname(s),
        Some((p, l)) => is_ncname(p) && is_ncname(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any text is judged (never a panic), and what passes has one root element.
        #[test]
        fn any_text_is_judged(x in crate::fuzz::peer_input(&[
            r#"<a xmlns="urn:x" xmlns:p="urn:p" p:k="v"><p:b>t &amp; u</p:b><!-- c --><?pi x?><![CDATA[<]]></a>"#,
        ])) {
            let x = String::from_utf8_lossy(&x);
            let _ = bad_character(&x);
            if check_element(&x).is_ok() {
                proptest::prop_assert!(x.trim_start().starts_with('<'));
            }
        }
    }

    #[test]
    fn well_formed_as_a_namespace_aware_parser_reads_it() {
        let ok = [
            r#"<a xmlns="urn:x" xmlns:p="urn:p" p:k="v" xml:lang="en"><p:b/><!-- c - d --><?pi x?><![CDATA[<]]></a>"#,
            r#"<dc:t xmlns:dc="urn:dc">a &amp; b &lt; c &#233;</dc:t>"#,
        ];
        for x in ok {
            assert_eq!(check_element(x), Ok(()), "{x}");
        }
        // What a careless or hostile repository sends (the security issue's nine and more).
        for (x, why) in [
            (r#"<a k="&undefined;"/>"#, "the value of k"),
            (r#"<a k="a & b"/>"#, "the value of k"),
            (r#"<a k="a<b"/>"#, "holds \"<\""),
            (r#"<a k="1" k="2"/>"#, "<a>"),
            (r#"<p:a/>"#, "prefix is not bound"),
            (r#"<a q:k="1"/>"#, "the attribute q:k"),
            (r#"<1t/>"#, "not an XML name"),
            (r#"<a><!-- a -- b --></a>"#, "--"),
            (r#"<a><?xml version="1.0"?></a>"#, "declaration inside"),
            (r#"<a>]]></a>"#, "]]>"),
            (r#"<a xmlns:p=""><p:b/></a>"#, "unbind"),
            (r#"<a xmlns:xml="urn:other"/>"#, "cannot be bound"),
        ] {
            let e = check_element(x).expect_err(x);
            assert!(e.contains(why), "{x}: {e}");
        }
        // A record cut out of a page: the envelope's prefixes are bound already.
        assert_eq!(check_element_in("<oai_dc:dc/>", &[b"xmlns:oai_dc"]), Ok(()));
        assert!(check_element_in("<oai_dc:dc/>", &[b"xmlns:dc"]).is_err());
    }

    #[test]
    fn only_one_well_formed_element_passes() {
        assert!(check_element("<a x=\"1\"><b>&amp;</b></a>\n").is_ok());
        assert!(check_element("<!DOCTYPE a [<!ENTITY e \"x\">]><a>&e;</a>").is_err());
        assert!(check_element("<a>&e;</a>").is_err());
        assert!(check_element("<a><b></a>").is_err());
        assert!(check_element("<a/><b/>").is_err());
        assert!(check_element("text").is_err());
        assert!(bad_character("<a>\u{1}</a>").unwrap().contains("U+0001"));
        assert!(bad_character("<a>&#1;</a>").unwrap().contains("&#1;"));
        assert_eq!(bad_character("<a>&#x1F600;</a>"), None);
        assert!(bad_character("<a>\u{FFFE}</a>").unwrap().contains("U+FFFE"));
        assert_eq!(bad_character("<a>\u{7F}\u{FFFD}\u{10FFFF}\tx</a>"), None);
        // Past a block of 32 bytes, at a block's edge, and beside lead bytes EF of good
        // characters (U+F000, U+FFFD).
        let long = "x".repeat(31);
        for bad in ['\u{1}', '\u{1F}', '\u{FFFE}', '\u{FFFF}'] {
            for pad in [0, 1, 29, 30, 31, 32, 33, 100] {
                let text = format!("<a>\u{F000}{}\u{FFFD}{bad}{long}</a>", "y".repeat(pad));
                let why = bad_character(&text).expect("found");
                assert!(why.contains(&format!("U+{:04X}", bad as u32)), "{why}");
            }
        }
        assert_eq!(
            bad_character(&format!("<a>{}\u{FFFD}\u{F000}\r\n</a>", long)),
            None
        );
    }
}
