//! Resumption tokens: a list's arguments and its position in the change log, signed with a
//! key the store keeps (so every process and restart accepts them), in URL-safe base64. They
//! do not expire: a position stays valid while the change log keeps it.

use base64::Engine as _;
use hmac::Mac as _;
use serde::{Deserialize, Serialize};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Where a list stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The verb of the list.
    #[serde(rename = "v")]
    pub verb: String,
    #[serde(rename = "p")]
    pub prefix: String,
    /// Changes dated from (µs).
    #[serde(rename = "f")]
    pub from: Option<i64>,
    /// Changes dated before (µs): `until`, or the time of the list's first request.
    #[serde(rename = "b")]
    pub bound: i64,
    /// The OAI set asked for.
    #[serde(rename = "s")]
    pub set: Option<String>,
    /// The set being walked and the last change passed in it (datetime µs, id).
    #[serde(rename = "w")]
    pub at_set: Option<String>,
    #[serde(rename = "a")]
    pub after: Option<(i64, i64)>,
    /// Items answered before this page.
    #[serde(rename = "n")]
    pub cursor: u64,
}

fn mac(key: &[u8; 32], payload: &[u8]) -> Vec<u8> {
    let mut m = <HmacSha256 as hmac::KeyInit>::new_from_slice(key).expect("any key length");
    m.update(payload);
    m.finalize().into_bytes()[..16].to_vec()
}

impl Position {
    /// The token: `payload.tag`.
    pub fn seal(&self, key: &[u8; 32]) -> String {
        let payload = serde_json::to_vec(self).expect("a position serializes");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}",
            b64.encode(&payload),
            b64.encode(mac(key, &payload))
        )
    }

    /// The position a token holds; `None` for one this repository did not sign.
    pub fn open(key: &[u8; 32], token: &str) -> Option<Position> {
        let (payload, tag) = token.split_once('.')?;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = b64.decode(payload).ok()?;
        let tag = b64.decode(tag).ok()?;
        use subtle::ConstantTimeEq as _;
        if !bool::from(mac(key, &payload).ct_eq(&tag)) {
            return None;
        }
        serde_json::from_slice(&payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]
        /// A forged or mangled token opens nothing (and never panics).
        #[test]
        fn a_mangled_token_opens_nothing(t in crate::fuzz::peer_input(&["eyJ2IjoiTGlzdFJlY29yZHMifQ.c2lnbmF0dXJl"])) {
            let t = String::from_utf8_lossy(&t);
            proptest::prop_assert!(Position::open(&[7; 32], &t).is_none());
        }
    }

    #[test]
    fn a_token_opens_only_untouched_and_with_its_key() {
        let p = Position {
            verb: "ListRecords".into(),
            prefix: "oai_dc".into(),
            from: None,
            bound: 1,
            set: Some("papers".into()),
            at_set: Some("papers".into()),
            after: Some((5, 7)),
            cursor: 500,
        };
        let key = [7u8; 32];
        let t = p.seal(&key);
        assert_eq!(Position::open(&key, &t), Some(p));
        assert_eq!(Position::open(&[8u8; 32], &t), None);
        let mut tampered = t.clone().into_bytes();
        tampered[3] ^= 1;
        assert_eq!(
            Position::open(&key, &String::from_utf8(tampered).unwrap()),
            None
        );
        assert_eq!(Position::open(&key, "nonsense"), None);
    }
}
