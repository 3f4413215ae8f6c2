//! The seed's DIT-ES mappings translated for Elasticsearch 8/9 and OpenSearch: one index per
//! document type (modern engines have no mapping types), `keyword` for the seed's
//! `not_analyzed` strings, `nested` location and ln (and ln.href), `long` for length, and dates
//! that accept the seed's `yyyy-MM-dd'T'HH:mm:ssZ` as well as ISO 8601 and epoch milliseconds.
//! Our own bookkeeping fields (`key`, `seq`, `part`) are added; documents written by other
//! writers simply lack them until the server adopts them.

use serde_json::{json, Map, Value};

/// The date format of every date field.
pub const DATE_FORMAT: &str = "yyyy-MM-dd'T'HH:mm:ssZ||strict_date_optional_time||epoch_millis";

fn location() -> Value {
    json!({"type": "nested", "properties": {"value": {"type": "keyword"}, "type": {"type": "keyword"}}})
}

fn date() -> Value {
    json!({"type": "date", "format": DATE_FORMAT})
}

/// The `resource` document type.
pub fn resource_mapping() -> Value {
    json!({"properties": {
        "resource_set": {"type": "keyword"},
        "location": location(),
        "length": {"type": "long"},
        "md5": {"type": "keyword"},
        "mime": {"type": "keyword"},
        "lastmod": date(),
        "ln": {"type": "nested", "properties": {
            "href": location(),
            "rel": {"type": "keyword"},
            "mime": {"type": "keyword"}
        }},
        "timestamp": date(),
        "key": {"type": "keyword"},
        "part": {"type": "integer"},
        "seq": {"type": "long"},
        "bytes": {"type": "long"},
        "adopted": {"type": "boolean"}
    }})
}

/// The `change` document type.
pub fn change_mapping() -> Value {
    json!({"properties": {
        "resource_set": {"type": "keyword"},
        "location": location(),
        "change": {"type": "keyword"},
        "lastmod": date(),
        "datetime": date(),
        "timestamp": date(),
        "length": {"type": "long"},
        "md5": {"type": "keyword"},
        "mime": {"type": "keyword"},
        "ln": {"type": "nested", "properties": {
            "href": location(),
            "rel": {"type": "keyword"},
            "mime": {"type": "keyword"}
        }},
        "key": {"type": "keyword"},
        "seq": {"type": "long"},
        "datetime_us": {"type": "long"},
        "part": {"type": "integer"},
        "bytes": {"type": "long"},
        "adopted": {"type": "boolean"}
    }})
}

/// The server's own bookkeeping (sets, Change Lists, parts, counters): searched by `kind` and
/// `set`, the rest is stored, not indexed.
pub fn meta_mapping() -> Value {
    json!({"properties": {
        "kind": {"type": "keyword"},
        "set": {"type": "keyword"},
        "created_at": date(),
        "created_at_us": {"type": "long"},
        "state": {"type": "object", "enabled": false}
    }})
}

/// Compares an index's existing mapping (`properties` level) with the wanted one. Returns the
/// fields to add (a mapping fragment) when compatible, or a message naming the first field
/// whose type differs.
pub fn reconcile(index: &str, existing: &Value, wanted: &Value) -> Result<Option<Value>, String> {
    let mut add = Map::new();
    compare(index, "", existing, wanted, &mut add)?;
    Ok((!add.is_empty()).then(|| json!({"properties": Value::Object(add)})))
}

fn compare(
    index: &str,
    prefix: &str,
    existing: &Value,
    wanted: &Value,
    add: &mut Map<String, Value>,
) -> Result<(), String> {
    let empty = Map::new();
    let have = existing
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let want = wanted
        .get("properties")
        .and_then(Value::as_object)
        .expect("wanted mappings have properties");
    for (name, w) in want {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let Some(h) = have.get(name) else {
            if prefix.is_empty() {
                add.insert(name.clone(), w.clone());
                continue;
            }
            return Err(format!(
                "index {index}: field {path} is missing from the existing mapping"
            ));
        };
        // An object field has no "type" (or "object").
        let kind = |v: &Value| {
            v.get("type")
                .and_then(Value::as_str)
                .unwrap_or("object")
                .to_string()
        };
        let (hk, wk) = (kind(h), kind(w));
        let compatible =
            hk == wk || (wk == "long" && hk == "integer") || (wk == "integer" && hk == "long");
        if !compatible {
            return Err(format!(
                "index {index}: field {path} is mapped as {hk}, but the server needs {wk}{}",
                if wk == "keyword" && hk == "text" {
                    " (the seed's not_analyzed string)"
                } else {
                    ""
                }
            ));
        }
        if wk == "date" {
            let fmt = h
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or("strict_date_optional_time||epoch_millis");
            if !fmt.contains("strict_date_optional_time") && !fmt.contains("date_optional_time") {
                return Err(format!(
                    "index {index}: date field {path} has format {fmt:?}, which does not accept ISO 8601; the server needs {DATE_FORMAT:?}"
                ));
            }
        }
        if w.get("properties").is_some() {
            let mut nested_add = Map::new();
            compare(index, &path, h, w, &mut nested_add)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identical_mapping_needs_nothing_and_a_dit_index_gains_our_fields() {
        assert_eq!(
            reconcile("r", &resource_mapping(), &resource_mapping()).unwrap(),
            None
        );
        let mut dit = resource_mapping();
        for f in ["key", "part", "seq", "bytes"] {
            dit["properties"].as_object_mut().unwrap().remove(f);
        }
        let add = reconcile("r", &dit, &resource_mapping()).unwrap().unwrap();
        let added: Vec<&String> = add["properties"].as_object().unwrap().keys().collect();
        assert_eq!(added, ["bytes", "key", "part", "seq"]);
    }

    #[test]
    fn an_incompatible_field_is_named() {
        let mut m = resource_mapping();
        m["properties"]["md5"] = json!({"type": "text"});
        let e = reconcile("omtd-resource", &m, &resource_mapping()).unwrap_err();
        assert!(
            e.contains("field md5 is mapped as text, but the server needs keyword"),
            "{e}"
        );
        let mut m = change_mapping();
        m["properties"]["location"] =
            json!({"properties": {"value": {"type": "keyword"}, "type": {"type": "keyword"}}});
        let e = reconcile("c", &m, &change_mapping()).unwrap_err();
        assert!(
            e.contains("field location is mapped as object, but the server needs nested"),
            "{e}"
        );
        let mut m = change_mapping();
        m["properties"]["ln"]["properties"]["href"]["properties"]["value"] =
            json!({"type": "text"});
        assert!(reconcile("c", &m, &change_mapping())
            .unwrap_err()
            .contains("field ln.href.value"));
        let mut m = change_mapping();
        m["properties"]["datetime"] = json!({"type": "date", "format": "yyyy-MM-dd'T'HH:mm:ssZ"});
        assert!(reconcile("c", &m, &change_mapping())
            .unwrap_err()
            .contains("date field datetime"));
    }
}
