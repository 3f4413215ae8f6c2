//! One XML element checked on its own, before it is taken from a page (a harvested OAI-PMH
//! record) or put into one (a resource file embedded in an OAI-PMH answer): only characters
//! XML 1.0 can carry, references included; well-formed with end names checked and every text
//! readable (no entity but the five predefined ones); no DTD; exactly one root element and no
//! text beside it.

use quick_xml::events::Event;
use quick_xml::reader::Reader;

use crate::model::is_xml_char;

/// The first character (raw or referenced) XML 1.0 cannot carry, described.
pub fn bad_character(text: &str) -> Option<String> {
    // A byte scan: in a `str` the characters XML 1.0 cannot carry are the C0 controls but
    // tab, newline and carriage return (single bytes), and U+FFFE and U+FFFF.
    let raw = text
        .bytes()
        .position(|b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r'))
        .or_else(|| text.find(['\u{FFFE}', '\u{FFFF}']));
    if let Some(c) = raw.and_then(|i| text[i..].chars().next()) {
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

/// `Err(why)` unless `xml` is one well-formed element (see the module; its characters are
/// [`bad_character`]'s to check, first).
pub fn check_element(xml: &str) -> Result<(), String> {
    let mut r = Reader::from_str(xml);
    r.config_mut().check_end_names = true;
    let (mut depth, mut roots) = (0i64, 0);
    loop {
        match r.read_event() {
            Ok(Event::Start(_)) => {
                roots += usize::from(depth == 0);
                depth += 1;
            }
            Ok(Event::Empty(_)) => roots += usize::from(depth == 0),
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::DocType(_)) => return Err("a DOCTYPE, which is not read".into()),
            Ok(Event::Text(t)) => {
                if depth == 0 && !t.iter().all(u8::is_ascii_whitespace) {
                    return Err("text outside the root element".into());
                }
                t.unescape()
                    .map_err(|e| format!("at byte {}: {e}", r.buffer_position()))?;
            }
            Ok(Event::Eof) if depth != 0 => return Err("an element is not closed".into()),
            Ok(Event::Eof) if roots != 1 => return Err("not one root element".into()),
            Ok(Event::Eof) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("at byte {}: {e}", r.error_position())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
