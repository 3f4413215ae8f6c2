//! Authenticated content distribution (WebSub §7.1): the `X-Hub-Signature` value, as pure
//! functions with known-answer tests.

use hmac::{Hmac, KeyInit, Mac};

use crate::digest::write_hex;

/// The recognised algorithm names of WebSub §7.1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureAlg {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl SignatureAlg {
    pub fn parse(s: &str) -> Option<SignatureAlg> {
        match s {
            "sha1" => Some(SignatureAlg::Sha1),
            "sha256" => Some(SignatureAlg::Sha256),
            "sha384" => Some(SignatureAlg::Sha384),
            "sha512" => Some(SignatureAlg::Sha512),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SignatureAlg::Sha1 => "sha1",
            SignatureAlg::Sha256 => "sha256",
            SignatureAlg::Sha384 => "sha384",
            SignatureAlg::Sha512 => "sha512",
        }
    }
}

impl serde::Serialize for SignatureAlg {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for SignatureAlg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SignatureAlg::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{s:?} is not a signature algorithm: use sha1, sha256, sha384 or sha512"
            ))
        })
    }
}

impl std::fmt::Display for SignatureAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! hmac_hex {
    ($digest:ty, $secret:expr, $body:expr, $out:expr) => {{
        let mut mac = <Hmac<$digest> as KeyInit>::new_from_slice($secret)
            .expect("HMAC takes keys of any length");
        mac.update($body);
        write_hex($out, &mac.finalize().into_bytes())
    }};
}

/// The `X-Hub-Signature` header value: `<alg>=<hex HMAC of body keyed with secret>`.
pub fn signature(alg: SignatureAlg, secret: &[u8], body: &[u8]) -> String {
    let mut s = String::with_capacity(7 + 128);
    write_signature(&mut s, alg, secret, body).expect("a String takes any text");
    s
}

/// [`signature`], written into `out` (a delivery writes all its header values into one
/// buffer).
pub fn write_signature(
    out: &mut impl std::fmt::Write,
    alg: SignatureAlg,
    secret: &[u8],
    body: &[u8],
) -> std::fmt::Result {
    out.write_str(alg.as_str())?;
    out.write_char('=')?;
    match alg {
        SignatureAlg::Sha1 => hmac_hex!(sha1::Sha1, secret, body, out),
        SignatureAlg::Sha256 => hmac_hex!(sha2::Sha256, secret, body, out),
        SignatureAlg::Sha384 => hmac_hex!(sha2::Sha384, secret, body, out),
        SignatureAlg::Sha512 => hmac_hex!(sha2::Sha512, secret, body, out),
    }
}

/// The Standard Webhooks `webhook-signature` value: `v1,<base64 of HMAC-SHA256 of
/// "{id}.{timestamp}.{body}">` keyed with `secret`'s bytes. A receiver using the
/// `standardwebhooks` libraries passes the secret as `whsec_` + base64 of those bytes
/// ([`whsec`]).
pub fn standard_signature(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut s = String::with_capacity(3 + 44);
    write_standard_signature(&mut s, secret, id, timestamp, body).expect("a String takes any text");
    s
}

/// [`standard_signature`], written into `out`.
pub fn write_standard_signature(
    out: &mut impl std::fmt::Write,
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> std::fmt::Result {
    use base64::Engine as _;
    use std::io::Write as _;
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC takes keys of any length");
    // Signed on every delivery: the pieces go in without a string made of them.
    let mut digits = std::io::Cursor::new([0u8; 24]);
    write!(digits, "{timestamp}").expect("an i64 has at most 20 digits");
    let n = digits.position() as usize;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(&digits.get_ref()[..n]);
    mac.update(b".");
    mac.update(body);
    let mut b64 = [0u8; 44];
    let n = base64::engine::general_purpose::STANDARD
        .encode_slice(mac.finalize().into_bytes(), &mut b64)
        .expect("44 characters hold the base64 of 32 bytes");
    out.write_str("v1,")?;
    out.write_str(std::str::from_utf8(&b64[..n]).expect("base64 is ASCII"))
}

/// The `whsec_` form of a WebSub `hub.secret`, as the Standard Webhooks libraries take it.
pub fn whsec(secret: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(secret)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2202 / RFC 4231 test case 2 (key "Jefe").
    #[test]
    fn known_answers_for_every_algorithm() {
        let (key, data) = (
            b"Jefe".as_slice(),
            b"what do ya want for nothing?".as_slice(),
        );
        assert_eq!(
            signature(SignatureAlg::Sha1, key, data),
            "sha1=effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            signature(SignatureAlg::Sha256, key, data),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            signature(SignatureAlg::Sha384, key, data),
            "sha384=af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649"
        );
        assert_eq!(
            signature(SignatureAlg::Sha512, key, data),
            "sha512=164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
    }

    #[test]
    fn names_round_trip() {
        for a in [
            SignatureAlg::Sha1,
            SignatureAlg::Sha256,
            SignatureAlg::Sha384,
            SignatureAlg::Sha512,
        ] {
            assert_eq!(SignatureAlg::parse(a.as_str()), Some(a));
        }
        assert_eq!(SignatureAlg::parse("md5"), None);
    }

    /// The example of the Standard Webhooks specification (its secret, id, timestamp and
    /// payload give this signature).
    #[test]
    fn the_standard_webhooks_example() {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        assert_eq!(
            standard_signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(whsec(&key), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    }
}
