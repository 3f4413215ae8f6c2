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
