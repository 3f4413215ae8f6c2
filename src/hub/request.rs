//! Parsing what arrives at the hub URL: WebSub (un)subscribe and publish forms, and the Link
//! header of a ResourceSync fat ping. Pure functions.

use super::HubError;
use crate::model::websub::{Callback, Topic};

/// A form POSTed to the hub URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubRequest {
    Subscribe(SubscribeRequest),
    Unsubscribe(SubscribeRequest),
    /// `hub.mode=publish` with one or more `hub.topic`/`hub.url` values.
    Publish(Vec<Topic>),
}

#[derive(Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub topic: Topic,
    pub callback: Callback,
    pub lease_seconds: Option<u64>,
    pub secret: Option<String>,
    /// A PubSubHubbub 0.3 client (it sent `hub.verify`): signs with sha1.
    pub legacy: bool,
    pub verify_token: Option<String>,
}

impl std::fmt::Debug for SubscribeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscribeRequest")
            .field("topic", &self.topic)
            .field("callback", &self.callback)
            .field("lease_seconds", &self.lease_seconds)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// WebSub §5.1: "MUST be less than 200 bytes".
pub const MAX_SECRET_BYTES: usize = 199;

/// The longest topic or callback URL taken (the de facto URL limit of browsers and servers):
/// a longer one is refused at the request, never stored and then failing to verify.
pub const MAX_URL_CHARS: usize = 2048;

fn bounded<'a>(name: &str, v: &'a str) -> Result<&'a str, HubError> {
    let n = v.chars().count();
    if n > MAX_URL_CHARS {
        return Err(HubError::BadRequest(format!(
            "{name} is {n} characters long: at most {MAX_URL_CHARS} are taken"
        )));
    }
    Ok(v)
}

/// Parses an `application/x-www-form-urlencoded` body. Unknown parameters are ignored.
pub fn parse_form(body: &[u8]) -> Result<HubRequest, HubError> {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(body).into_owned().collect();
    let one = |name: &str| -> Result<Option<&str>, HubError> {
        let mut it = pairs.iter().filter(|(k, _)| k == name);
        let first = it.next().map(|(_, v)| v.as_str());
        if it.next().is_some() {
            return Err(HubError::BadRequest(format!(
                "{name} is given more than once"
            )));
        }
        Ok(first)
    };
    let mode = one("hub.mode")?.ok_or_else(|| {
        HubError::BadRequest("hub.mode is required: subscribe, unsubscribe or publish".into())
    })?;
    match mode {
        "subscribe" | "unsubscribe" => {
            let topic = one("hub.topic")?
                .ok_or_else(|| HubError::BadRequest("hub.topic is required".into()))?;
            let callback = one("hub.callback")?
                .ok_or_else(|| HubError::BadRequest("hub.callback is required".into()))?;
            let topic = Topic::parse(bounded("hub.topic", topic)?).map_err(HubError::BadRequest)?;
            let callback = Callback::parse(bounded("hub.callback", callback)?)
                .map_err(HubError::BadRequest)?;
            let lease_seconds = match one("hub.lease_seconds")? {
                None | Some("") => None,
                Some(v) => Some(v.trim().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(
                    || {
                        HubError::BadRequest(format!(
                            "hub.lease_seconds {v:?} is not a positive whole number"
                        ))
                    },
                )?),
            };
            let secret = one("hub.secret")?
                .filter(|s| !s.is_empty())
                .map(str::to_string);
            if secret.as_ref().is_some_and(|s| s.len() > MAX_SECRET_BYTES) {
                return Err(HubError::BadRequest(
                    "hub.secret must be less than 200 bytes".into(),
                ));
            }
            let req = SubscribeRequest {
                topic,
                callback,
                // "MUST be ignored by the hub" for unsubscription requests.
                lease_seconds: if mode == "subscribe" {
                    lease_seconds
                } else {
                    None
                },
                secret,
                legacy: pairs.iter().any(|(k, _)| k == "hub.verify"),
                verify_token: one("hub.verify_token")?.map(str::to_string),
            };
            Ok(if mode == "subscribe" {
                HubRequest::Subscribe(req)
            } else {
                HubRequest::Unsubscribe(req)
            })
        }
        "publish" => {
            let mut topics = Vec::new();
            for (k, v) in pairs
                .iter()
                .filter(|(k, _)| k == "hub.topic" || k == "hub.url")
            {
                topics.push(Topic::parse(bounded(k, v)?).map_err(HubError::BadRequest)?);
            }
            if topics.is_empty() {
                return Err(HubError::BadRequest(
                    "hub.mode=publish needs hub.topic or hub.url".into(),
                ));
            }
            topics.dedup();
            Ok(HubRequest::Publish(topics))
        }
        other => Err(HubError::BadRequest(format!(
            "hub.mode {other:?} is not one of subscribe, unsubscribe, publish"
        ))),
    }
}

/// The targets of `rel` in Link header values (RFC 8288), in order.
pub fn link_targets<'a>(values: impl IntoIterator<Item = &'a str>, rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    for value in values {
        let mut rest = value;
        while let Some(start) = rest.find('<') {
            let Some(end) = rest[start..].find('>') else {
                break;
            };
            let target = rest[start + 1..start + end].trim().to_string();
            let after = &rest[start + end + 1..];
            // Parameters run up to the next link (a comma outside quotes followed by '<').
            let mut params_end = after.len();
            let mut in_quotes = false;
            for (i, ch) in after.char_indices() {
                match ch {
                    '"' => in_quotes = !in_quotes,
                    ',' if !in_quotes && after[i + 1..].trim_start().starts_with('<') => {
                        params_end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let params = &after[..params_end];
            let has_rel = params.split(';').any(|p| {
                let p = p.trim();
                let Some((k, v)) = p.split_once('=') else {
                    return false;
                };
                k.trim().eq_ignore_ascii_case("rel")
                    && v.trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|r| r.eq_ignore_ascii_case(rel))
            });
            if has_rel {
                out.push(target);
            }
            rest = &after[params_end..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// Any form a client posts to the hub is a request or a refusal in words.
        #[test]
        fn any_form_is_a_request_or_refused_in_words(body in crate::fuzz::peer_input(&[
            "hub.mode=subscribe&hub.topic=http%3A%2F%2Fh%2Ft&hub.callback=http%3A%2F%2Fc%2Fcb&hub.lease_seconds=3600&hub.secret=s3cret",
            "hub.mode=publish&hub.url=http%3A%2F%2Fh%2Ft",
            "hub.mode=unsubscribe&hub.topic=http://h/t&hub.callback=http://c/cb&hub.verify=sync",
        ])) {
            if let Err(e) = parse_form(&body) {
                proptest::prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    fn form(s: &str) -> Result<HubRequest, HubError> {
        parse_form(s.as_bytes())
    }

    #[test]
    fn subscribe_forms_parse_and_unknown_parameters_are_ignored() {
        let r = form("hub.mode=subscribe&hub.topic=http%3A%2F%2Fexample.com%2Ft&hub.callback=https%3A%2F%2Fd.example%2Fcb%3Fa%3D1&hub.lease_seconds=3600&hub.secret=s3&x=y").unwrap();
        let HubRequest::Subscribe(s) = r else {
            panic!("{r:?}")
        };
        assert_eq!(s.topic.as_str(), "http://example.com/t");
        assert_eq!(s.callback.as_str(), "https://d.example/cb?a=1");
        assert_eq!(s.lease_seconds, Some(3600));
        assert_eq!(s.secret.as_deref(), Some("s3"));
        assert!(!s.legacy);
        let HubRequest::Subscribe(s) =
            form("hub.mode=subscribe&hub.topic=http://e/t&hub.callback=http://d/cb&hub.verify=async&hub.verify_token=vt").unwrap()
        else {
            panic!()
        };
        assert!(s.legacy, "PubSubHubbub 0.3 client");
        assert_eq!(s.verify_token.as_deref(), Some("vt"));
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let msg = |s: &str| match form(s) {
            Err(HubError::BadRequest(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        assert!(msg("hub.topic=http://e/t").contains("hub.mode is required"));
        assert!(
            msg("hub.mode=subscribe&hub.callback=http://d/cb").contains("hub.topic is required")
        );
        assert!(msg("hub.mode=subscribe&hub.topic=http://e/t").contains("hub.callback is required"));
        assert!(
            msg("hub.mode=subscribe&hub.topic=http://e/t&hub.callback=ftp://d/cb")
                .contains("http or https")
        );
        assert!(
            msg("hub.mode=subscribe&hub.topic=nope&hub.callback=http://d/cb").contains("not a URL")
        );
        assert!(msg(
            "hub.mode=subscribe&hub.topic=http://e/t&hub.callback=http://d/cb&hub.lease_seconds=-5"
        )
        .contains("positive"));
        let long = "a".repeat(200);
        assert!(msg(&format!(
            "hub.mode=subscribe&hub.topic=http://e/t&hub.callback=http://d/cb&hub.secret={long}"
        ))
        .contains("200 bytes"));
        let url = format!("http://e/{}", "t".repeat(2100));
        assert!(msg(&format!(
            "hub.mode=subscribe&hub.topic={url}&hub.callback=http://d/cb"
        ))
        .contains("hub.topic is 2109 characters long: at most 2048"));
        assert!(msg(&format!(
            "hub.mode=subscribe&hub.topic=http://e/t&hub.callback={url}"
        ))
        .contains("hub.callback is 2109 characters long"));
        assert!(msg(&format!("hub.mode=publish&hub.url={url}")).contains("hub.url is 2109"));
        assert!(msg("hub.mode=fetch").contains("not one of"));
        assert!(msg("hub.mode=publish").contains("needs hub.topic or hub.url"));
    }

    #[test]
    fn publish_takes_topics_and_urls_repeatedly() {
        let r = form("hub.mode=publish&hub.url=http://e/a&hub.topic=http://e/b&hub.url=http://e/c")
            .unwrap();
        let HubRequest::Publish(t) = r else { panic!() };
        assert_eq!(
            t.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
            ["http://e/a", "http://e/b", "http://e/c"]
        );
    }

    #[test]
    fn link_headers_in_the_forms_publishers_send() {
        let v = r#"<http://example.com/dataset1/change/> ; rel="self",
 <http://hub.example.org/websub/> ; rel="hub", <http://www.example.com/dataset1/capabilitylist.xml> ; rel="resourcesync""#;
        assert_eq!(
            link_targets([v], "self"),
            ["http://example.com/dataset1/change/"]
        );
        assert_eq!(link_targets([v], "hub"), ["http://hub.example.org/websub/"]);
        assert_eq!(
            link_targets(["<http://a/>; rel=\"hub self\""], "self"),
            ["http://a/"]
        );
        assert_eq!(
            link_targets(["<http://a/>; rel=self", "<http://b/>; rel=hub"], "hub"),
            ["http://b/"]
        );
        assert!(link_targets(["<http://a/>; title=\"x, <y>\"; rel=hub"], "self").is_empty());
    }
}
