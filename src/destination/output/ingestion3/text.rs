//! A record's bytes as the UTF-8 text the `document` field holds: XML in whatever encoding its
//! byte order mark, the HTTP `charset` or its XML declaration names (RFC 7303's order),
//! decoded, with the declaration then saying UTF-8; JSON and Turtle are UTF-8 by their
//! specifications (a byte order mark is dropped).

use encoding_rs::{Encoding, UTF_8};

/// The text of a record of media type `mime` (its `charset` parameter counts for XML), or
/// why it cannot be archived as text.
pub fn document_text(bytes: &[u8], mime: &str, xml: bool) -> Result<String, String> {
    let (encoding, bom) = match Encoding::for_bom(bytes) {
        Some((e, n)) => (e, n),
        None if xml => (
            charset(mime)
                .or_else(|| declared(bytes))
                .map(|label| {
                    Encoding::for_label(label.as_bytes()).ok_or_else(|| {
                        format!("the encoding {label:?} is not one this archive knows")
                    })
                })
                .transpose()?
                .unwrap_or(UTF_8),
            0,
        ),
        None => (UTF_8, 0),
    };
    if !xml && encoding != UTF_8 {
        return Err(format!(
            "a {} byte order mark (JSON and Turtle are UTF-8)",
            encoding.name()
        ));
    }
    let (text, had_errors) = encoding.decode_without_bom_handling(&bytes[bom..]);
    if had_errors {
        return Err(format!("bytes that are not {} text", encoding.name()));
    }
    let text = text.into_owned();
    Ok(if xml && encoding != UTF_8 {
        utf8_declaration(text)
    } else {
        text
    })
}

/// The `charset` parameter of a media type.
fn charset(mime: &str) -> Option<String> {
    mime.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The `encoding` of an XML declaration at the start of `bytes` (ASCII-compatible
/// encodings; the others carry a byte order mark).
fn declared(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(512)];
    let decl = head.strip_prefix(b"<?xml")?;
    let end = decl.windows(2).position(|w| w == b"?>")?;
    let decl = std::str::from_utf8(&decl[..end]).ok()?;
    let at = decl.find("encoding")?;
    let rest = decl[at + "encoding".len()..]
        .trim_start()
        .strip_prefix('=')?
        .trim_start();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &rest[1..];
    Some(value[..value.find(quote)?].to_string())
}

/// The text's XML declaration, if it names an encoding, naming UTF-8 instead (the text is
/// stored as UTF-8 now).
fn utf8_declaration(text: String) -> String {
    let Some(end) = text.strip_prefix("<?xml").and_then(|d| d.find("?>")) else {
        return text;
    };
    let decl = &text[..5 + end];
    let Some(at) = decl.find("encoding") else {
        return text;
    };
    let rest = &decl[at..];
    let Some(open) = rest.find(['"', '\'']) else {
        return text;
    };
    let quote = &rest[open..open + 1];
    let Some(close) = rest[open + 1..].find(quote) else {
        return text;
    };
    let (from, to) = (at + open + 1, at + open + 1 + close);
    format!("{}UTF-8{}", &text[..from], &text[to..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_xml_becomes_utf8_with_the_same_characters() {
        let mut bytes = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n<t>".to_vec();
        bytes.extend_from_slice(&[0x4d, 0xfc, 0x6e, 0x63, 0x68, 0x65, 0x6e, 0xe9]); // Münchené
        bytes.extend_from_slice(b"</t>");
        let t = document_text(&bytes, "application/xml", true).unwrap();
        assert_eq!(
            t,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<t>Münchené</t>"
        );
    }

    #[test]
    fn the_http_charset_comes_before_the_declaration() {
        let bytes = b"<?xml version='1.0' encoding='UTF-8'?><t>\xe9</t>";
        let t = document_text(bytes, "text/xml; charset=iso-8859-1", true).unwrap();
        assert_eq!(t, "<?xml version='1.0' encoding='UTF-8'?><t>é</t>");
    }

    #[test]
    fn utf16_with_a_bom_and_plain_utf8() {
        let utf16: Vec<u8> = [0xfeff_u16]
            .into_iter()
            .chain("<t>ü</t>".encode_utf16())
            .flat_map(|u| u.to_le_bytes())
            .collect();
        assert_eq!(
            document_text(&utf16, "application/xml", true).unwrap(),
            "<t>ü</t>"
        );
        assert_eq!(
            document_text("{\"a\":\"ü\"}".as_bytes(), "application/json", false).unwrap(),
            "{\"a\":\"ü\"}"
        );
    }

    #[test]
    fn what_cannot_be_text_says_why() {
        assert!(
            document_text(b"{\"a\":\"\xff\"}", "application/json", false)
                .unwrap_err()
                .contains("not UTF-8")
        );
        assert!(document_text(
            b"<?xml version='1.0' encoding='klingon'?><t/>",
            "application/xml",
            true
        )
        .unwrap_err()
        .contains("klingon"));
    }
}
