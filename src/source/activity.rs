//! IIIF Change Discovery 1.0 over a set's change log: an Activity Streams 2.0
//! `OrderedCollection` per set whose pages are the set's Change Lists that hold changes (a
//! closed list never changes again, so neither does its page; the open list's page is the only
//! one that moves), each change a `Create`, `Update` or `Delete` activity with its `endTime`.
//!
//! Pages are written like the sitemaps: a head, entries taken as they accumulate, a tail.

use crate::model::{ChangeType, Timestamp};

/// The JSON-LD context of IIIF Change Discovery 1.0.
pub const CONTEXT: &str = "http://iiif.io/api/discovery/1/context.json";

/// The media type the specification gives its documents.
pub const MEDIA_TYPE: &str =
    "application/ld+json;profile=\"http://iiif.io/api/discovery/1/context.json\"";

/// The Activity Streams type of every object: a resource of a set is a document (a metadata
/// record, a paper, a file), not a IIIF Manifest.
pub const OBJECT_TYPE: &str = "Document";

/// A collection or one of its pages, written in pieces.
#[derive(Debug)]
pub struct ActivityWriter {
    head: String,
    body: String,
    tail: &'static str,
    entries: usize,
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `"name": {"id": …, "type": …},`
fn reference(out: &mut String, name: &str, id: &str, kind: &str) {
    out.push_str(&format!(
        "  \"{name}\": {{\"id\": {}, \"type\": \"{kind}\"}},\n",
        quote(id)
    ));
}

impl ActivityWriter {
    /// The collection: its `totalItems` and, when it has any, its `first` and `last` pages.
    pub fn collection(id: &str, total: u64, first: Option<&str>, last: Option<&str>) -> Self {
        let mut h = String::with_capacity(512);
        h.push_str(&format!(
            "{{\n  \"@context\": \"{CONTEXT}\",\n  \"id\": {},\n  \"type\": \"OrderedCollection\",\n",
            quote(id)
        ));
        if let Some(f) = first {
            reference(&mut h, "first", f, "OrderedCollectionPage");
        }
        if let Some(l) = last {
            reference(&mut h, "last", l, "OrderedCollectionPage");
        }
        h.push_str(&format!("  \"totalItems\": {total}\n}}\n"));
        ActivityWriter {
            head: h,
            body: String::new(),
            tail: "",
            entries: 0,
        }
    }

    /// A page: where it lies in the collection and its neighbours; activities follow.
    pub fn page(
        id: &str,
        collection: &str,
        start_index: u64,
        prev: Option<&str>,
        next: Option<&str>,
    ) -> Self {
        let mut h = String::with_capacity(1024);
        h.push_str(&format!(
            "{{\n  \"@context\": \"{CONTEXT}\",\n  \"id\": {},\n  \"type\": \"OrderedCollectionPage\",\n  \"startIndex\": {start_index},\n",
            quote(id)
        ));
        reference(&mut h, "partOf", collection, "OrderedCollection");
        if let Some(p) = prev {
            reference(&mut h, "prev", p, "OrderedCollectionPage");
        }
        if let Some(n) = next {
            reference(&mut h, "next", n, "OrderedCollectionPage");
        }
        h.push_str("  \"orderedItems\": [");
        ActivityWriter {
            head: h,
            body: String::with_capacity(64 * 1024),
            tail: "\n  ]\n}\n",
            entries: 0,
        }
    }

    /// One activity, in the change log's order (oldest first).
    pub fn activity(&mut self, change: ChangeType, object: &str, end_time: Timestamp) {
        let kind = match change {
            ChangeType::Created => "Create",
            ChangeType::Updated => "Update",
            ChangeType::Deleted => "Delete",
        };
        let b = &mut self.body;
        b.push_str(if self.entries == 0 {
            "\n    "
        } else {
            ",\n    "
        });
        b.push_str("{\"type\": \"");
        b.push_str(kind);
        b.push_str("\", \"object\": {\"id\": ");
        b.push_str(&quote(object));
        b.push_str(", \"type\": \"");
        b.push_str(OBJECT_TYPE);
        b.push_str("\"}, \"endTime\": \"");
        end_time.write_w3c(b);
        b.push_str("\"}");
        self.entries += 1;
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    pub fn take_entries(&mut self) -> String {
        std::mem::take(&mut self.body)
    }

    pub fn head(&self) -> &str {
        &self.head
    }

    pub fn tail(&self) -> String {
        self.tail.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(mut w: ActivityWriter) -> serde_json::Value {
        let body = w.take_entries();
        let text = format!("{}{}{}", w.head(), body, w.tail());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn a_page_is_json_with_its_activities_in_order() {
        let mut w = ActivityWriter::page(
            "http://h/sets/s/activity/2.json",
            "http://h/sets/s/activity.json",
            10,
            Some("http://h/sets/s/activity/1.json"),
            None,
        );
        w.activity(ChangeType::Created, "http://h/a\"b", Timestamp(1_000_000));
        w.activity(ChangeType::Deleted, "http://h/c", Timestamp(2_500_000));
        let v = whole(w);
        assert_eq!(v["type"], "OrderedCollectionPage");
        assert_eq!(v["startIndex"], 10);
        assert_eq!(v["prev"]["id"], "http://h/sets/s/activity/1.json");
        assert!(v.get("next").is_none());
        let items = v["orderedItems"].as_array().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["type"], "Create");
        assert_eq!(items[0]["object"]["id"], "http://h/a\"b");
        assert_eq!(items[1]["endTime"], "1970-01-01T00:00:02.500000Z");
    }

    #[test]
    fn a_collection_without_changes_has_no_pages() {
        let v = whole(ActivityWriter::collection("http://h/a.json", 0, None, None));
        assert_eq!(v["totalItems"], 0);
        assert!(v.get("last").is_none());
        let v = whole(ActivityWriter::collection(
            "http://h/a.json",
            3,
            Some("http://h/1"),
            Some("http://h/2"),
        ));
        assert_eq!(v["last"]["type"], "OrderedCollectionPage");
    }
}
