//! COAR Notify 1.0.1 notifications (Activity Streams 2.0 in JSON-LD), as the inbox receives
//! them: the patterns this server acts on, checked on arrival. Pure. A notification's
//! `@context` is read as written, never fetched (the two contexts the patterns need are known
//! by their URLs; an inline context object is allowed and ignored).

use serde_json::Value;

/// The Activity Streams 2.0 context.
pub const AS_CONTEXT: &str = "https://www.w3.org/ns/activitystreams";
/// The COAR Notify context, by either of its published URLs.
pub const COAR_CONTEXTS: [&str; 2] = ["https://coar-notify.net", "https://purl.org/coar/notify"];

/// The patterns the inbox takes: an offer to ingest a record, and announcements about one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// `Offer` + `coar-notify:IngestAction` (DSpace's "please harvest this item").
    OfferIngest,
    /// `Announce` + `coar-notify:IngestAction` (the item was ingested or changed).
    AnnounceIngest,
    /// `Announce` + `coar-notify:RelationshipAction`.
    AnnounceRelationship,
    /// `Announce` + `coar-notify:ReviewAction`.
    AnnounceReview,
    /// `Announce` + `coar-notify:EndorsementAction`.
    AnnounceEndorsement,
}

impl Pattern {
    pub fn as_str(&self) -> &'static str {
        match self {
            Pattern::OfferIngest => "Offer IngestAction",
            Pattern::AnnounceIngest => "Announce IngestAction",
            Pattern::AnnounceRelationship => "Announce RelationshipAction",
            Pattern::AnnounceReview => "Announce ReviewAction",
            Pattern::AnnounceEndorsement => "Announce EndorsementAction",
        }
    }

    /// Whether the sender expects an `Accept` or a `Reject` (an offer does).
    pub fn is_offer(&self) -> bool {
        matches!(self, Pattern::OfferIngest)
    }
}

/// A service of the notification (`origin`, `target`): its id and its LDN inbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Service {
    pub id: String,
    pub inbox: String,
}

/// A notification the inbox took.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Notification {
    pub id: String,
    pub pattern: Pattern,
    pub origin: Service,
    pub target: Service,
    /// The object's id.
    pub object: String,
    /// What may name the record the notification is about, most telling first: OAI
    /// identifiers, landing pages, `ietf:cite-as` identifiers, items.
    pub names: Vec<String>,
    pub in_reply_to: Option<String>,
}

/// Why a notification was refused, in words naming the property.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid<T>(why: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(why.into()))
}

/// An absolute URI (`http(s)://…`, `urn:uuid:…`, `oai:…`, `doi:…`), at most 2,048 bytes.
fn uri(v: &Value, what: &str) -> Result<String, Invalid> {
    let Some(s) = v.as_str() else {
        return invalid(format!("{what} is not a string"));
    };
    if s.len() > 2048 {
        return invalid(format!("{what} is longer than 2,048 bytes"));
    }
    match url::Url::parse(s) {
        Ok(_) => Ok(s.to_string()),
        Err(e) => invalid(format!("{what} {s:?} is not an absolute URI: {e}")),
    }
}

/// An `http(s)` URL (an inbox: where replies go).
fn http_url(v: &Value, what: &str) -> Result<String, Invalid> {
    let s = uri(v, what)?;
    match url::Url::parse(&s)
        .map(|u| u.scheme().to_string())
        .as_deref()
    {
        Ok("http" | "https") => Ok(s),
        _ => invalid(format!("{what} {s:?} is not an http(s) URL")),
    }
}

/// A `type`: a string or an array of strings.
fn types(v: Option<&Value>, what: &str) -> Result<Vec<String>, Invalid> {
    match v {
        None => invalid(format!("{what} has no type")),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Invalid(format!("{what}'s type holds a non-string")))
            })
            .collect(),
        Some(_) => invalid(format!(
            "{what}'s type is not a string or an array of strings"
        )),
    }
}

/// A type name without a `coar-notify:` or `as:` prefix.
fn bare(t: &str) -> &str {
    t.strip_prefix("coar-notify:")
        .or_else(|| t.strip_prefix("as:"))
        .unwrap_or(t)
}

fn object<'a>(v: &'a Value, key: &str) -> Result<&'a serde_json::Map<String, Value>, Invalid> {
    match v.get(key) {
        None => invalid(format!("the notification has no {key}")),
        Some(Value::Object(o)) => Ok(o),
        Some(_) => invalid(format!("{key} is not an object")),
    }
}

fn service(v: &Value, key: &str) -> Result<Service, Invalid> {
    let o = object(v, key)?;
    let id = uri(
        o.get("id")
            .ok_or_else(|| Invalid(format!("{key} has no id")))?,
        &format!("{key}.id"),
    )?;
    let inbox = http_url(
        o.get("inbox")
            .ok_or_else(|| Invalid(format!("{key} has no inbox")))?,
        &format!("{key}.inbox"),
    )?;
    if !types(o.get("type"), key)?
        .iter()
        .any(|t| bare(t) == "Service")
    {
        return invalid(format!("{key}'s type is not Service"));
    }
    Ok(Service { id, inbox })
}

/// Reads and checks a notification (the JSON already parsed, within the inbox's size and
/// depth bounds).
pub fn parse(v: &Value) -> Result<Notification, Invalid> {
    if !v.is_object() {
        return invalid("the notification is not a JSON object");
    }
    let context: Vec<&Value> = match v.get("@context") {
        None => return invalid("the notification has no @context"),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(c) => vec![c],
    };
    let named = |want: &[&str]| {
        context.iter().any(|c| {
            c.as_str()
                .is_some_and(|s| want.contains(&s.trim_end_matches('/')))
        })
    };
    if !named(&[AS_CONTEXT]) {
        return invalid(format!(
            "@context does not name the Activity Streams context {AS_CONTEXT}"
        ));
    }
    if !named(&COAR_CONTEXTS) {
        return invalid(format!(
            "@context does not name the COAR Notify context {}",
            COAR_CONTEXTS[0]
        ));
    }
    if let Some(c) = context.iter().find(|c| !(c.is_string() || c.is_object())) {
        return invalid(format!("@context holds {c}, neither a URL nor an object"));
    }
    let id = uri(
        v.get("id")
            .ok_or_else(|| Invalid("the notification has no id".into()))?,
        "id",
    )?;
    let ts = types(v.get("type"), "the notification")?;
    let has = |name: &str| ts.iter().any(|t| bare(t) == name);
    let pattern = if has("Offer") && has("IngestAction") {
        Pattern::OfferIngest
    } else if has("Announce") && has("IngestAction") {
        Pattern::AnnounceIngest
    } else if has("Announce") && has("RelationshipAction") {
        Pattern::AnnounceRelationship
    } else if has("Announce") && has("ReviewAction") {
        Pattern::AnnounceReview
    } else if has("Announce") && has("EndorsementAction") {
        Pattern::AnnounceEndorsement
    } else {
        return invalid(format!(
            "type {ts:?} is not a pattern this inbox takes (Offer IngestAction; Announce IngestAction, RelationshipAction, ReviewAction or EndorsementAction)"
        ));
    };
    let origin = service(v, "origin")?;
    let target = service(v, "target")?;
    let obj = object(v, "object")?;
    let object_id = uri(
        obj.get("id")
            .ok_or_else(|| Invalid("object has no id".into()))?,
        "object.id",
    )?;
    types(obj.get("type"), "object")?;
    if let Some(a) = v.get("actor") {
        let a = a
            .as_object()
            .ok_or_else(|| Invalid("actor is not an object".into()))?;
        uri(
            a.get("id")
                .ok_or_else(|| Invalid("actor has no id".into()))?,
            "actor.id",
        )?;
        types(a.get("type"), "actor")?;
    }
    let in_reply_to = v
        .get("inReplyTo")
        .map(|r| uri(r, "inReplyTo"))
        .transpose()?;
    let context_obj = match v.get("context") {
        None => None,
        Some(Value::Object(o)) => {
            uri(
                o.get("id")
                    .ok_or_else(|| Invalid("context has no id".into()))?,
                "context.id",
            )?;
            Some(o)
        }
        Some(_) => return invalid("context is not an object"),
    };
    // What names the record: for an offer, the object (the item's landing page); for an
    // announcement, the context (the item the review or relationship is about), the
    // relationship's subject and object, then the object.
    let mut names = Vec::new();
    let mut add = |o: &serde_json::Map<String, Value>, keys: &[&str]| {
        for k in keys {
            let found = match o.get(*k) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Object(i)) => i.get("id").and_then(Value::as_str).map(str::to_string),
                _ => None,
            };
            if let Some(s) = found.filter(|s| s.len() <= 2048 && !names.contains(s)) {
                names.push(s);
            }
        }
    };
    let record_keys = ["id", "ietf:cite-as", "ietf:item"];
    if pattern.is_offer() || pattern == Pattern::AnnounceIngest {
        add(obj, &record_keys);
    } else {
        if let Some(c) = context_obj {
            add(c, &record_keys);
        }
        add(obj, &["as:subject", "as:object"]);
    }
    Ok(Notification {
        id,
        pattern,
        origin,
        target,
        object: object_id,
        names,
        in_reply_to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// DSpace's offer to ingest an item (its landing page, `ietf:cite-as`, `ietf:item`).
    pub fn offer() -> Value {
        json!({
            "@context": [AS_CONTEXT, "https://coar-notify.net"],
            "id": "urn:uuid:0370c0fb-bb78-4a9b-87f5-bed307a509dd",
            "type": ["Offer", "coar-notify:IngestAction"],
            "actor": {"id": "https://repo.example.edu", "type": "Service", "name": "Repo"},
            "origin": {"id": "https://repo.example.edu", "inbox": "https://repo.example.edu/ldn/inbox", "type": "Service"},
            "target": {"id": "https://hub.example.org", "inbox": "https://hub.example.org/inbox", "type": "Service"},
            "object": {
                "id": "https://repo.example.edu/handle/123/456",
                "ietf:cite-as": "https://hdl.handle.net/123/456",
                "ietf:item": {"id": "https://repo.example.edu/bitstream/123/456/1/a.pdf", "mediaType": "application/pdf", "type": ["Article", "sorg:ScholarlyArticle"]},
                "type": ["Page", "sorg:AboutPage"]
            }
        })
    }

    #[test]
    fn an_offer_is_read_with_what_names_its_record() {
        let n = parse(&offer()).unwrap();
        assert_eq!(n.pattern, Pattern::OfferIngest);
        assert_eq!(n.origin.inbox, "https://repo.example.edu/ldn/inbox");
        assert_eq!(
            n.names,
            [
                "https://repo.example.edu/handle/123/456",
                "https://hdl.handle.net/123/456",
                "https://repo.example.edu/bitstream/123/456/1/a.pdf"
            ]
        );
    }

    #[test]
    fn an_announcement_names_its_context_first() {
        let mut v = offer();
        v["type"] = json!(["Announce", "coar-notify:ReviewAction"]);
        v["context"] = json!({"id": "oai:repo.example.edu:123/456", "type": "sorg:AboutPage"});
        v["object"] =
            json!({"id": "https://reviews.example.org/r/9", "type": ["Page", "sorg:WebPage"]});
        let n = parse(&v).unwrap();
        assert_eq!(n.pattern, Pattern::AnnounceReview);
        assert_eq!(n.names, ["oai:repo.example.edu:123/456"]);
    }

    /// Each malformed notification is refused naming what is wrong.
    #[test]
    fn malformed_notifications_are_refused_in_words() {
        type Edit = fn(&mut Value);
        let table: &[(&str, Edit)] = &[
            ("no @context", |v| {
                v.as_object_mut().unwrap().remove("@context");
            }),
            ("Activity Streams context", |v| {
                v["@context"] = json!("https://coar-notify.net")
            }),
            ("COAR Notify context", |v| v["@context"] = json!(AS_CONTEXT)),
            ("neither a URL nor an object", |v| {
                v["@context"] = json!([AS_CONTEXT, "https://coar-notify.net", 7])
            }),
            ("has no id", |v| {
                v.as_object_mut().unwrap().remove("id");
            }),
            ("not an absolute URI", |v| v["id"] = json!("not a uri")),
            ("not a pattern this inbox takes", |v| {
                v["type"] = json!(["Offer", "coar-notify:ReviewAction"])
            }),
            ("has no type", |v| {
                v.as_object_mut().unwrap().remove("type");
            }),
            ("has no origin", |v| {
                v.as_object_mut().unwrap().remove("origin");
            }),
            ("origin has no inbox", |v| {
                v["origin"].as_object_mut().unwrap().remove("inbox");
            }),
            ("origin.inbox", |v| {
                v["origin"]["inbox"] = json!("mailto:a@b.c")
            }),
            ("target's type is not Service", |v| {
                v["target"]["type"] = json!("Person")
            }),
            ("object has no id", |v| {
                v["object"].as_object_mut().unwrap().remove("id");
            }),
            ("object is not an object", |v| v["object"] = json!("x")),
            ("actor has no id", |v| {
                v["actor"] = json!({"type": "Service"})
            }),
            ("inReplyTo", |v| v["inReplyTo"] = json!(3)),
            ("context is not an object", |v| v["context"] = json!([1])),
            ("longer than 2,048 bytes", |v| {
                v["object"]["id"] = json!(format!("https://x.org/{}", "a".repeat(3000)))
            }),
            ("not a JSON object", |v| *v = json!([1, 2])),
        ];
        for (why, edit) in table {
            let mut v = offer();
            edit(&mut v);
            let e = parse(&v).expect_err(why).0;
            assert!(e.contains(why), "{why:?} not in {e:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any JSON is read without a panic: taken, or refused in words.
        #[test]
        fn any_json_is_taken_or_refused(v in crate::fuzz::json_value()) {
            if let Err(e) = parse(&v) {
                proptest::prop_assert!(!e.0.is_empty());
            }
        }

        /// Any bytes a sender can post, once they are JSON, likewise.
        #[test]
        fn mangled_notifications_are_taken_or_refused(
            b in crate::fuzz::mutated(vec![offer().to_string().into_bytes()])
        ) {
            if let Ok(v) = serde_json::from_slice::<Value>(&b) {
                let _ = parse(&v);
            }
        }
    }
}
