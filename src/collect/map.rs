//! What a harvested record becomes in its set: one resource per record, its file the record's
//! metadata as a standalone document at [`record_path`], `lastmod` its datestamp (a day means
//! its midnight, UTC), md5 and length of the file's bytes, and a `via` link to the record's
//! `GetRecord` URL at the repository. A record whose bytes are those the set holds records
//! nothing (overlapping windows and repeated runs are harmless), nor does the deletion of a
//! record the set never held.

use super::oai::Record;
use crate::model::origin::record_path;
use crate::model::{ChangeEvent, ChangeType, Link, Location, LocationType, Timestamp};

/// Other names of a record, from its metadata: each `identifier` element's (`dc:identifier`,
/// `dcterms:identifier`, …) value that is an http(s) URL, such as its landing page or its
/// persistent identifier's resolver URL. An announcement names the record by one of these.
/// At most 16, each at most 2,048 bytes; malformed metadata gives those read before the fault.
pub fn aliases(metadata: &str) -> Vec<String> {
    use quick_xml::events::Event;
    let mut r = quick_xml::Reader::from_str(metadata);
    let mut out: Vec<String> = Vec::new();
    let mut inside = false;
    loop {
        match r.read_event() {
            Ok(Event::Start(e)) => inside = e.local_name().as_ref() == b"identifier",
            Ok(Event::Text(t)) if inside => {
                if let Ok(v) = t.unescape() {
                    let v = v.trim();
                    let web = v.starts_with("https://") || v.starts_with("http://");
                    if web && v.len() <= 2048 && !out.iter().any(|o| o == v) {
                        out.push(v.to_string());
                        if out.len() == 16 {
                            break;
                        }
                    }
                }
            }
            Ok(Event::End(_)) => inside = false,
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    out
}

/// Where records come from: the repository's base URL and the metadata format harvested.
#[derive(Debug, Clone)]
pub struct Origin {
    pub base_url: String,
    pub metadata_prefix: String,
}

/// A record's change for the set, and the file to write first (none for a deletion).
#[derive(Debug, Clone)]
pub struct Harvested {
    pub event: ChangeEvent,
    pub file: Option<(String, Vec<u8>)>,
}

impl Origin {
    /// The record's `GetRecord` URL at the repository.
    pub fn get_record_url(&self, identifier: &str) -> String {
        let mut u = url::Url::parse(&self.base_url).expect("a validated base URL");
        u.query_pairs_mut()
            .append_pair("verb", "GetRecord")
            .append_pair("metadataPrefix", &self.metadata_prefix)
            .append_pair("identifier", identifier);
        u.to_string()
    }
}

/// An OAI-PMH datestamp as an instant: a day is its midnight, UTC; a date-time is read as
/// sent (repositories add fractions or offsets the protocol does not have; they mean what they
/// say). Real repositories' other forms are read too: a compact day (`20210311`, served by a
/// production endpoint DPLA harvests), a space for the `T`, a date-time without its `Z`, and
/// ISO 8601's basic form (`20210311T101500Z`).
pub fn datestamp(s: &str) -> Result<Timestamp, String> {
    let t = s.trim();
    let b = t.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let full = if b.len() == 10 && b[4] == b'-' && b[7] == b'-' {
        format!("{t}T00:00:00Z")
    } else if b.len() == 8 && digits(0..8) {
        format!("{}-{}-{}T00:00:00Z", &t[..4], &t[4..6], &t[6..8])
    } else if b.len() >= 15 && digits(0..8) && b[8] == b'T' && digits(9..15) {
        format!(
            "{}-{}-{}T{}:{}:{}{}",
            &t[..4],
            &t[4..6],
            &t[6..8],
            &t[9..11],
            &t[11..13],
            &t[13..15],
            &t[15..]
        )
    } else if b.len() > 10 && b[10] == b' ' {
        format!("{}T{}", &t[..10], &t[11..])
    } else {
        t.to_string()
    };
    Timestamp::parse(&full).map_err(|e| format!("datestamp {}: {e}", crate::cause::cut(t, 80)))
}

/// The change `rec` makes to a set whose resource for it has the md5 `held` (`None`: the set
/// has none); `Ok(None)` when it makes none. `Err` says why the record cannot be taken (a
/// datestamp that is not one).
pub fn change_for(
    rec: &Record,
    origin: &Origin,
    held: Option<&str>,
) -> Result<Option<Harvested>, String> {
    let path = record_path(&rec.header.identifier);
    let location = Location {
        kind: LocationType::RelPath,
        value: path.clone(),
    };
    let datestamp = datestamp(&rec.header.datestamp)?;
    let event = |change, bytes: Option<(&[u8], String)>| ChangeEvent {
        change,
        location: location.clone(),
        length: bytes.as_ref().map(|(b, _)| b.len() as u64),
        md5: bytes.as_ref().map(|(_, m)| m.clone()),
        mime: bytes.as_ref().map(|_| "application/xml".to_string()),
        lastmod: bytes.as_ref().map(|_| datestamp),
        // A deletion too: where it came from, and (with the sets the run adds) the sets a
        // harvester of one of them must hear of it in.
        ln: vec![Link {
            rel: "via".into(),
            href: Location {
                kind: LocationType::Url,
                value: origin.get_record_url(&rec.header.identifier),
            },
            mime: Some("text/xml".into()),
        }],
        // Recorded at the time of arrival: the datestamp is the record's, not this store's
        // (a datestamp in the past would precede what was already notified).
        datetime: None,
        resource_set: None,
        timestamp: None,
    };
    if rec.header.deleted {
        return Ok(held.map(|_| Harvested {
            event: event(ChangeType::Deleted, None),
            file: None,
        }));
    }
    let Some(metadata) = &rec.metadata else {
        return Err("a live record without metadata".into());
    };
    let bytes = metadata.as_bytes();
    let md5 = crate::digest::md5_hex(bytes);
    let change = match held {
        Some(h) if h == md5 => return Ok(None),
        Some(_) => ChangeType::Updated,
        None => ChangeType::Created,
    };
    Ok(Some(Harvested {
        event: event(change, Some((bytes, md5))),
        file: Some((path, bytes.to_vec())),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_records_web_identifiers_are_its_aliases() {
        let m = r#"<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/">
<dc:title>https://not.an/identifier</dc:title>
<dc:identifier>https://repo.example.edu/handle/1/2</dc:identifier>
<dc:identifier> https://hdl.handle.net/1/2 </dc:identifier>
<dc:identifier>urn:isbn:123</dc:identifier>
<dc:identifier>https://repo.example.edu/handle/1/2</dc:identifier>
<dc:identifier>http://a.org/?x=1&amp;y=2</dc:identifier>
</oai_dc:dc>"#;
        assert_eq!(
            aliases(m),
            [
                "https://repo.example.edu/handle/1/2",
                "https://hdl.handle.net/1/2",
                "http://a.org/?x=1&y=2"
            ]
        );
        assert!(aliases("<not closed").is_empty());
        let many: String = (0..40)
            .map(|i| format!("<identifier>https://a.org/{i}</identifier>"))
            .collect();
        assert_eq!(aliases(&format!("<r>{many}</r>")).len(), 16);
    }

    use super::super::oai::Header;
    use super::*;

    fn record(id: &str, datestamp: &str, meta: Option<&str>) -> Record {
        Record {
            header: Header {
                identifier: id.into(),
                datestamp: datestamp.into(),
                sets: vec!["s".into()],
                deleted: meta.is_none(),
            },
            metadata: meta.map(str::to_string),
        }
    }

    fn origin() -> Origin {
        Origin {
            base_url: "https://repo.example.org/oai".into(),
            metadata_prefix: "oai_dc".into(),
        }
    }

    #[test]
    fn a_record_is_created_then_updated_only_when_its_bytes_change() {
        let r = record("oai:r:1", "2026-11-01", Some("<dc/>"));
        let h = change_for(&r, &origin(), None).unwrap().unwrap();
        assert_eq!(h.event.change, ChangeType::Created);
        let (path, bytes) = h.file.unwrap();
        assert_eq!(bytes, b"<dc/>");
        assert_eq!(h.event.location.value, path);
        assert_eq!(h.event.length, Some(5));
        assert_eq!(
            h.event.lastmod.unwrap().to_string(),
            "2026-11-01T00:00:00Z",
            "a day is its midnight"
        );
        assert_eq!(
            h.event.ln[0].href.value,
            "https://repo.example.org/oai?verb=GetRecord&metadataPrefix=oai_dc&identifier=oai%3Ar%3A1"
        );
        let md5 = h.event.md5.unwrap();
        assert!(
            change_for(&r, &origin(), Some(&md5)).unwrap().is_none(),
            "the same bytes: nothing"
        );
        let changed = record("oai:r:1", "2026-11-02T10:00:00Z", Some("<dc>x</dc>"));
        let h = change_for(&changed, &origin(), Some(&md5))
            .unwrap()
            .unwrap();
        assert_eq!(h.event.change, ChangeType::Updated);
    }

    /// The forms real repositories send, each the instant it means.
    #[test]
    fn datestamps_in_real_repositories_forms_are_read() {
        for (sent, meant) in [
            ("2021-03-11", "2021-03-11T00:00:00Z"),
            ("20210311", "2021-03-11T00:00:00Z"),
            ("2021-03-11T10:15:00Z", "2021-03-11T10:15:00Z"),
            ("2021-03-11T10:15:00.485Z", "2021-03-11T10:15:00.485Z"),
            ("2021-03-11T10:15:00+01:00", "2021-03-11T09:15:00Z"),
            ("2021-03-11T10:15:00", "2021-03-11T10:15:00Z"),
            ("2021-03-11 10:15:00", "2021-03-11T10:15:00Z"),
            ("20210311T101500Z", "2021-03-11T10:15:00Z"),
        ] {
            assert_eq!(
                datestamp(sent).unwrap(),
                Timestamp::parse(meant).unwrap(),
                "{sent}"
            );
        }
        for bad in [
            "2021031",
            "202103111",
            "2021-13-01",
            "11/03/2021",
            "",
            "20211311",
        ] {
            assert!(datestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_deletion_counts_only_for_a_record_the_set_holds() {
        let gone = record("oai:r:1", "2026-11-03", None);
        assert!(change_for(&gone, &origin(), None).unwrap().is_none());
        let h = change_for(&gone, &origin(), Some("x")).unwrap().unwrap();
        assert_eq!(h.event.change, ChangeType::Deleted);
        assert!(h.file.is_none() && h.event.md5.is_none());
        assert_eq!(
            h.event.ln[0].rel, "via",
            "a deletion says where it came from"
        );
        let bad = record("oai:r:2", "yesterday", Some("<dc/>"));
        assert!(change_for(&bad, &origin(), None)
            .unwrap_err()
            .contains("yesterday"));
    }
}
