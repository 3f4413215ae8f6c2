//! The seeds' document model: resource sets, resources (current state), changes (the log),
//! and the change events a harvester sends, validated before they reach the store.

pub mod coar;
mod location;
pub mod origin;
mod secret;
mod set;
mod signature;
mod time;
pub mod websub;

use serde::{Deserialize, Serialize};

pub use location::{
    bare_media_type, check_loc, check_media_type, check_url, check_xml_text, is_xml_char, Link,
    Location, LocationType, ResourceKey, MAX_URL_LEN,
};
pub use secret::Secret;
pub use set::{DescribedBy, SetConfig, SetName};
pub use time::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeType {
    Created,
    Updated,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Created => "created",
            ChangeType::Updated => "updated",
            ChangeType::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<ChangeType> {
        match s {
            "created" => Some(ChangeType::Created),
            "updated" => Some(ChangeType::Updated),
            "deleted" => Some(ChangeType::Deleted),
            _ => None,
        }
    }
}

/// The descriptive metadata shared by a resource document and the change that produced it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceMeta {
    pub length: Option<u64>,
    pub md5: Option<String>,
    pub mime: Option<String>,
    pub lastmod: Option<Timestamp>,
    pub ln: Vec<Link>,
}

/// A resource document: the current state of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub key: ResourceKey,
    pub location: Location,
    pub meta: ResourceMeta,
    /// When the store last wrote this document.
    pub timestamp: Timestamp,
}

/// A change document: one entry of a set's change log. `id` orders changes that share a
/// `datetime`. Deletions carry no metadata but their links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: i64,
    pub key: ResourceKey,
    pub location: Location,
    pub change: ChangeType,
    pub datetime: Timestamp,
    pub meta: ResourceMeta,
    pub timestamp: Timestamp,
}

/// A change event as a harvester sends it (one JSON object, or one NDJSON line).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeEvent {
    pub change: ChangeType,
    pub location: Location,
    #[serde(default)]
    pub length: Option<u64>,
    #[serde(default)]
    pub md5: Option<String>,
    #[serde(default)]
    pub mime: Option<String>,
    #[serde(default, deserialize_with = "time::zoned::lastmod")]
    pub lastmod: Option<Timestamp>,
    #[serde(default)]
    pub ln: Vec<Link>,
    #[serde(default, deserialize_with = "time::zoned::datetime")]
    pub datetime: Option<Timestamp>,
    /// Accepted for DIT documents that carry it; must name the set of the URL if present.
    #[serde(default)]
    pub resource_set: Option<String>,
    /// Accepted and ignored: the store sets its own write timestamp.
    #[serde(default)]
    pub timestamp: Option<serde_json::Value>,
}

/// A validated change, ready for the store's atomic apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChange {
    pub key: ResourceKey,
    pub location: Location,
    pub change: ChangeType,
    /// `None`: the store records the time of applying.
    pub datetime: Option<Timestamp>,
    pub meta: ResourceMeta,
}

impl ChangeEvent {
    /// Checks the event against the set and turns it into a `NewChange`.
    pub fn validate(self, set: &SetConfig) -> Result<NewChange, String> {
        if let Some(rs) = &self.resource_set {
            if rs != &set.name {
                return Err(format!(
                    "resource_set {} does not match the set {:?} of the URL",
                    location::excerpt(rs),
                    set.name
                ));
            }
        }
        let key = self.location.key(set)?;
        check_loc("location", &key.url(&set.url_prefix))?;
        let md5 = match self.md5 {
            None => None,
            Some(h) => {
                let h = h.trim().to_ascii_lowercase();
                let h = h.strip_prefix("md5:").unwrap_or(&h).to_string();
                if h.len() != 32 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "md5 {} is not 32 hexadecimal digits",
                        location::excerpt(&h)
                    ));
                }
                Some(h)
            }
        };
        if let Some(m) = &self.mime {
            check_media_type("mime", m)?;
        }
        for l in &self.ln {
            l.validate(set)?;
        }
        let meta = if self.change == ChangeType::Deleted {
            // A deletion keeps its links (where it came from, which collections held it); the
            // rest describes bytes that are gone.
            ResourceMeta {
                ln: self.ln,
                ..ResourceMeta::default()
            }
        } else {
            ResourceMeta {
                length: self.length,
                md5,
                mime: self.mime,
                lastmod: self.lastmod,
                ln: self.ln,
            }
        };
        Ok(NewChange {
            key,
            location: self.location,
            change: self.change,
            datetime: self.datetime,
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> SetConfig {
        SetConfig {
            name: "s".into(),
            url_prefix: "http://127.0.0.1:8080/files/s/".into(),
            resource_root_dir: None,
            max_items_in_list: 50_000,
            changelist_rollover_secs: 0,
            describedby: vec![],
        }
    }

    fn event(json: &str) -> Result<NewChange, String> {
        let e: ChangeEvent = serde_json::from_str(json).map_err(|e| e.to_string())?;
        e.validate(&set())
    }

    #[test]
    fn valid_event() {
        let c = event(
            r#"{"change":"created","location":{"type":"rel_path","value":"a.pdf"},"length":3,
               "md5":"MD5:0CC175B9C0F1B6A831C399E269772661","mime":"application/pdf",
               "lastmod":"2016-01-01T00:00:00+0000","ln":[{"rel":"describedby","href":{"type":"url","value":"http://x/m"}}]}"#,
        )
        .unwrap();
        assert_eq!(c.key.0, "path:a.pdf");
        assert_eq!(
            c.meta.md5.as_deref(),
            Some("0cc175b9c0f1b6a831c399e269772661")
        );
        assert_eq!(c.meta.lastmod.unwrap().to_string(), "2016-01-01T00:00:00Z");
    }

    #[test]
    fn invalid_events_say_why() {
        assert!(
            event(r#"{"change":"moved","location":{"type":"url","value":"http://x/"}}"#)
                .unwrap_err()
                .contains("unknown variant `moved`")
        );
        assert!(event(
            r#"{"change":"created","location":{"type":"rel_path","value":"a"},"md5":"xyz"}"#
        )
        .unwrap_err()
        .contains("md5"));
        assert!(event(
            r#"{"change":"created","location":{"type":"rel_path","value":"a"},"lenght":1}"#
        )
        .unwrap_err()
        .contains("unknown field `lenght`"));
        assert!(event(
            r#"{"change":"created","location":{"type":"rel_path","value":"a"},"resource_set":"t"}"#
        )
        .unwrap_err()
        .contains("does not match"));
        assert!(SetName::parse("../x").is_err());
        assert!(SetName::parse("papers_2024.v1").is_ok());
    }
}
