//! What the two consoles share (the hub's at `serve`'s `/console/`, the harvester's on
//! `harvest`): the page frame and its templates, the style sheet and the one script, the
//! security headers, rendering, and signed session cookies with their CSRF tokens.
//!
//! Pages are minijinja templates compiled into the binary, rendered on the server and readable
//! without JavaScript; the script only swaps in fresh `data-live-part`s of an open page.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::Mac as _;
use subtle::ConstantTimeEq as _;

/// The frame every page extends, the login form and the message page.
const SHARED: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("message.html", include_str!("templates/message.html")),
];

/// A console's templates, with what its frame shows on every page (`brand`, `nav_items` of
/// `{key, href, label}`, `logout`).
pub struct Pages {
    env: minijinja::Environment<'static>,
    site: serde_json::Map<String, serde_json::Value>,
}

impl Pages {
    /// The shared templates and `own`; panics on a template that does not parse (they are
    /// compiled in: the tests render every one).
    pub fn new(own: &[(&'static str, &'static str)], site: serde_json::Value) -> Pages {
        let mut env = minijinja::Environment::new();
        env.add_filter("when", when);
        for (name, source) in SHARED.iter().chain(own) {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("console template {name}: {e}"));
        }
        Pages {
            env,
            site: match site {
                serde_json::Value::Object(m) => m,
                _ => Default::default(),
            },
        }
    }

    /// A page as HTML; the context's keys win over the site's.
    pub fn render(&self, name: &str, ctx: serde_json::Value) -> Response {
        let mut all = self.site.clone();
        if let serde_json::Value::Object(m) = ctx {
            all.extend(m);
        }
        let ctx = minijinja::Value::from(minijinja::value::Serde(serde_json::Value::Object(all)));
        match self.env.get_template(name).and_then(|t| t.render(ctx)) {
            Ok(html) => {
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
            }
            Err(e) => {
                tracing::error!(template = name, error = %e, "a console page could not be rendered");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the console could not render this page; the server log says why",
                )
                    .into_response()
            }
        }
    }

    /// A page saying what went wrong, with its status.
    pub fn message(&self, status: StatusCode, message: &str, back: &str) -> Response {
        let page = self.render(
            "message.html",
            serde_json::json!({
                "title": status.canonical_reason().unwrap_or("Error"),
                "message": message,
                "back": back,
                "signed_in": false,
            }),
        );
        (status, page).into_response()
    }

    /// The login form refusing an address that gave too many wrong tokens (429, `Retry-After`).
    pub fn too_many_guesses(&self, token_label: &str, wait: u64) -> Response {
        let mut r = self.login(
            StatusCode::TOO_MANY_REQUESTS,
            token_label,
            Some(&format!(
                "Too many wrong tokens from your address: try again in {wait} s."
            )),
        );
        r.headers_mut().insert(header::RETRY_AFTER, wait.into());
        r
    }

    /// The login form, with a message after a refusal.
    pub fn login(&self, status: StatusCode, token_label: &str, message: Option<&str>) -> Response {
        let page = self.render(
            "login.html",
            serde_json::json!({
                "title": "Sign in",
                "message": message,
                "token_label": token_label,
                "hours": SESSION_HOURS,
                "signed_in": false,
            }),
        );
        (status, page).into_response()
    }
}

/// The headers every console response carries: a Content-Security-Policy without inline
/// script and without framing, no sniffing, no referrer, nothing cached (but the assets).
pub async fn secure(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// `/console/static/{file}`: the style sheet, the script and the icon, compiled in; `None`
/// for any other name.
pub fn asset(file: &str) -> Option<Response> {
    let (body, ct) = match file {
        "console.js" => (
            include_str!("static/console.js"),
            "text/javascript; charset=utf-8",
        ),
        "console.css" => (
            include_str!("static/console.css"),
            "text/css; charset=utf-8",
        ),
        "favicon.svg" => (include_str!("static/favicon.svg"), "image/svg+xml"),
        _ => return None,
    };
    Some(
        (
            [
                (header::CONTENT_TYPE, ct),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            body,
        )
            .into_response(),
    )
}

/// How long a session lasts.
pub const SESSION_HOURS: i64 = 8;

/// Seconds as people read them (a lag, a time left).
/// The `when` filter: an instant (RFC 3339) as people read it, to the second and in UTC
/// (`2026-11-28 20:41:18 UTC`), its exact value in the tooltip and the `datetime` attribute;
/// nothing as `—`, and text that is not an instant as itself.
fn when(v: minijinja::Value) -> minijinja::Value {
    let text = match v.as_str() {
        Some(t) if !t.is_empty() => t.to_string(),
        _ if v.is_none() || v.is_undefined() || v.as_str() == Some("") => {
            return minijinja::Value::from("—")
        }
        _ => v.to_string(),
    };
    let esc = |s: &str| minijinja::HtmlEscape(s).to_string();
    match chrono::DateTime::parse_from_rfc3339(&text) {
        Ok(t) => minijinja::Value::from_safe_string(format!(
            "<time datetime=\"{0}\" title=\"{0}\">{1}</time>",
            esc(&text),
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M:%S UTC")
        )),
        Err(_) => minijinja::Value::from(text),
    }
}

pub fn span(secs: f64) -> String {
    match secs {
        s if s < 1.0 => "0 s".into(),
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// Whether a request's `Host` names this machine by a loopback name or any IP literal: what a
/// console without a token accepts, so that a web page whose own host name an attacker points
/// at 127.0.0.1 (DNS rebinding) is not served it.
pub fn host_is_direct(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac(key: &[u8; 32], what: &str) -> String {
    let mut m = <HmacSha256 as hmac::KeyInit>::new_from_slice(key).expect("any key length");
    m.update(what.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
}

/// A key derived from `key` and `secret` (a session signed under one admin token is no
/// session under the next).
pub fn derive_key(key: &[u8; 32], secret: &str) -> [u8; 32] {
    let mut m = <HmacSha256 as hmac::KeyInit>::new_from_slice(key).expect("any key length");
    m.update(secret.as_bytes());
    m.finalize().into_bytes().into()
}

/// Whether a token given by a person is the one configured (in constant time).
pub fn token_matches(given: &str, configured: &str) -> bool {
    !configured.is_empty() && bool::from(given.as_bytes().ct_eq(configured.as_bytes()))
}

/// Wrong tokens an address may give in a minute (at once, then one every 60 / this seconds)
/// before every sign-in and bearer check from it is answered 429 until its budget refills
/// (the harvester's console; the server's is `admin.wrong_tokens_per_minute`).
pub const GUESSES_PER_MINUTE: u32 = 10;

/// Addresses tracked at most: past this, those not heard from lately are forgotten first, and
/// at the cap a new address shares one bucket with every other newcomer (a flood of spoofed
/// sources costs a fixed amount of memory and throttles itself).
const GUESSERS_MAX: usize = 100_000;

/// Failed token checks (both consoles' sign-in, the admin API's bearer check) counted per
/// client address by `governor`: an address past its budget is refused before its token is
/// even looked at, so guessing runs at a few a minute, not thousands a second. IPv6
/// addresses count by their /64 (one host's whole range).
pub struct Guesses {
    failures: governor::DefaultKeyedRateLimiter<std::net::IpAddr>,
    /// Until when an address is refused (set when its budget ran out).
    blocked: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, std::time::Instant>>,
}

impl Default for Guesses {
    fn default() -> Guesses {
        Guesses::per_minute(GUESSES_PER_MINUTE)
    }
}

impl Guesses {
    /// `n` wrong tokens a minute per address (at least one).
    pub fn per_minute(n: u32) -> Guesses {
        let quota = governor::Quota::per_minute(
            std::num::NonZeroU32::MIN.saturating_add(n.saturating_sub(1)),
        );
        Guesses {
            failures: governor::RateLimiter::keyed(quota),
            blocked: Default::default(),
        }
    }

    fn key(&self, ip: Option<std::net::IpAddr>) -> std::net::IpAddr {
        use std::net::IpAddr;
        let ip = match ip.map(|i| i.to_canonical()) {
            Some(IpAddr::V6(v6)) => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
            Some(v4) => v4,
            None => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        };
        if self.failures.len() >= GUESSERS_MAX {
            self.failures.retain_recent();
            if self.failures.len() >= GUESSERS_MAX {
                return IpAddr::V4(std::net::Ipv4Addr::BROADCAST);
            }
        }
        ip
    }

    /// `Err(seconds to wait)` while the address is refused.
    pub fn check(&self, ip: Option<std::net::IpAddr>) -> Result<(), u64> {
        let key = self.key(ip);
        let mut blocked = self.blocked.lock().expect("the blocked addresses");
        let now = std::time::Instant::now();
        match blocked.get(&key) {
            Some(until) if *until > now => Err((*until - now).as_secs().max(1)),
            Some(_) => {
                blocked.remove(&key);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Counts a wrong token from the address; `Err(seconds)` when that used up its budget.
    pub fn failed(&self, ip: Option<std::net::IpAddr>) -> Result<(), u64> {
        let key = self.key(ip);
        let Err(not_until) = self.failures.check_key(&key) else {
            return Ok(());
        };
        use governor::clock::{Clock as _, DefaultClock};
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        let mut blocked = self.blocked.lock().expect("the blocked addresses");
        let now = std::time::Instant::now();
        blocked.retain(|_, until| *until > now);
        if blocked.len() < GUESSERS_MAX {
            blocked.insert(key, now + wait);
        }
        Err(wait.as_secs().max(1))
    }
}

/// The answer to an address that guessed too often: 429 with `Retry-After`.
pub fn too_many_guesses(secs: u64) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, secs.to_string())],
        format!("too many wrong tokens from this address: try again in {secs} s"),
    )
        .into_response()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Session cookies signed with one key: `expires.nonce.mac`, `HttpOnly`, `SameSite=Strict`,
/// on `/console`, `Secure` behind https.
pub struct Sessions {
    key: [u8; 32],
    cookie: &'static str,
    secure: bool,
}

/// Why a state-changing form is refused.
pub const CSRF_REFUSED: &str =
    "this form did not come from this console session (its CSRF token is missing or wrong): reload the page and repeat";

/// The login form's one field.
#[derive(serde::Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    pub token: String,
}

/// A session a request carries: the CSRF token its forms hold, and what names it (its nonce)
/// and ends it (its expiry, Unix seconds) for a server that revokes sessions on sign-out.
pub struct Session {
    pub csrf: String,
    pub nonce: String,
    pub expires: i64,
}

impl Sessions {
    pub fn new(key: [u8; 32], cookie: &'static str, secure: bool) -> Sessions {
        Sessions {
            key,
            cookie,
            secure,
        }
    }

    /// A new session's `Set-Cookie` value and the session.
    pub fn issue(&self) -> Result<(String, Session), String> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| format!("no randomness: {e}"))?;
        let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(nonce);
        let expires = now_secs() + SESSION_HOURS * 3600;
        let payload = format!("{expires}.{nonce}");
        let value = format!(
            "{payload}.{}",
            mac(&self.key, &format!("session|{payload}"))
        );
        Ok((
            format!(
                "{}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{}",
                self.cookie,
                SESSION_HOURS * 3600,
                if self.secure { "; Secure" } else { "" }
            ),
            Session {
                csrf: mac(&self.key, &format!("csrf|{nonce}")),
                nonce,
                expires,
            },
        ))
    }

    /// A new session, and the answer to a successful sign-in: to the console, with its cookie.
    pub fn signed_in(&self) -> Result<Response, String> {
        let (cookie, _) = self.issue()?;
        Ok((
            StatusCode::SEE_OTHER,
            [
                (header::SET_COOKIE, cookie),
                (header::LOCATION, "/console/".to_string()),
            ],
        )
            .into_response())
    }

    /// The `Set-Cookie` value that ends the session.
    pub fn clear(&self) -> String {
        format!(
            "{}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{}",
            self.cookie,
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The session the request's cookie holds, if this key signed it and it has not expired.
    pub fn check(&self, headers: &HeaderMap) -> Option<Session> {
        let value = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(self.cookie)?.strip_prefix('='))
            .next()?;
        let (payload, tag) = value.rsplit_once('.')?;
        let (expires, nonce) = payload.split_once('.')?;
        let want = mac(&self.key, &format!("session|{payload}"));
        if !bool::from(want.as_bytes().ct_eq(tag.as_bytes())) {
            return None;
        }
        let expires = expires.parse::<i64>().ok()?;
        if expires <= now_secs() {
            return None;
        }
        Some(Session {
            csrf: mac(&self.key, &format!("csrf|{nonce}")),
            nonce: nonce.to_string(),
            expires,
        })
    }

    /// Whether a form's CSRF token is its session's.
    pub fn csrf_ok(session: &Session, given: &str) -> bool {
        !given.is_empty() && bool::from(session.csrf.as_bytes().ct_eq(given.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_only_under_its_key_and_untouched() {
        let s = Sessions::new([1; 32], "c", false);
        let (set, session) = s.issue().unwrap();
        let cookie = set.split(';').next().unwrap().to_string();
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, cookie.parse().unwrap());
        let back = s.check(&h).expect("its own cookie");
        assert_eq!(back.csrf, session.csrf);
        assert!(Sessions::csrf_ok(&back, &session.csrf));
        assert!(!Sessions::csrf_ok(&back, ""));
        assert!(Sessions::new([2; 32], "c", false).check(&h).is_none());
        let mut t = HeaderMap::new();
        t.insert(header::COOKIE, format!("{cookie}A").parse().unwrap());
        assert!(s.check(&t).is_none());
        let expired = format!("c=1.{}", "ab");
        let mut e = HeaderMap::new();
        e.insert(header::COOKIE, expired.parse().unwrap());
        assert!(s.check(&e).is_none());
    }

    #[test]
    fn guesses_are_counted_per_address_and_per_ipv6_64() {
        let g = Guesses::default();
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        for _ in 0..GUESSES_PER_MINUTE {
            assert_eq!(g.failed(ip("2001:db8::1")), Ok(()));
        }
        assert!(g.failed(ip("2001:db8::2")).is_err(), "the same /64");
        assert!(g.check(ip("2001:db8::99")).is_err());
        assert_eq!(g.check(ip("2001:db8:0:1::1")), Ok(()), "another /64");
        assert_eq!(g.check(ip("192.0.2.1")), Ok(()));
        assert_eq!(g.failed(ip("192.0.2.1")), Ok(()));
    }

    #[test]
    fn only_loopback_names_and_ip_literals_are_direct() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, v.parse().unwrap());
            host_is_direct(&m)
        };
        assert!(h("127.0.0.1:8900") && h("localhost:1") && h("[::1]:80") && h("10.0.0.2"));
        assert!(!h("evil.example.org:8900") && !h("127.0.0.1.nip.io") && !h("[nonsense]"));
        assert!(!host_is_direct(&HeaderMap::new()));
        assert_eq!(
            (span(0.2), span(75.0), span(600.0)),
            ("0 s".into(), "75 s".into(), "10 min".into())
        );
    }

    #[test]
    fn every_shared_template_renders() {
        let p = Pages::new(&[], serde_json::json!({"brand": "b", "nav_items": []}));
        for name in ["login.html", "message.html"] {
            let r = p.render(
                name,
                serde_json::json!({"title": "t", "message": "m", "back": "/"}),
            );
            assert_eq!(r.status(), StatusCode::OK, "{name}");
        }
    }
}
