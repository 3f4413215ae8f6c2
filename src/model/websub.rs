//! The hub's records: topics, callbacks, intents awaiting verification, subscriptions,
//! published messages and their deliveries, as the store keeps them.

use std::fmt;

use bytes::Bytes;
use serde::Serialize;

pub use super::signature::{
    signature, standard_signature, whsec, write_signature, write_standard_signature, SignatureAlg,
};
use super::Timestamp;

/// The form URLs are matched in (WebSub §5.1 leaves equivalence to RFC 3986 §6): the URL
/// parser's normal form (scheme and host lower-case, default port dropped, an empty path as
/// `/`, no fragment) with percent-encoded unreserved characters decoded (`%7E` is `~`) and
/// other escapes in upper case.
pub fn url_key(u: &url::Url) -> String {
    let s = u.as_str();
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
            && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
        {
            let v = u8::from_str_radix(&s[i + 1..i + 3], 16).expect("two hex digits");
            if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') {
                out.push(v as char);
            } else {
                out.push('%');
                out.push_str(&s[i + 1..i + 3].to_ascii_uppercase());
            }
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

macro_rules! url_newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        ///
        /// Kept as the subscriber or publisher gave it (sent back exactly so, WebSub §5.3 and §6),
        /// compared by its normal form ([`url_key`]): equality, hashing and the store's keys use
        /// the latter.
        #[derive(Debug, Clone)]
        pub struct $name {
            key: String,
            given: String,
        }

        impl $name {
            /// Parses an absolute http(s) URL (the caller names it in errors).
            pub fn parse(s: &str) -> Result<$name, String> {
                let what = stringify!($name).to_ascii_lowercase();
                let given = s.trim();
                let u = url::Url::parse(given).map_err(|e| format!("{what} {s:?} is not a URL: {e}"))?;
                if u.scheme() != "http" && u.scheme() != "https" {
                    return Err(format!("{what} {s:?} must be an http or https URL"));
                }
                if u.host().is_none() {
                    return Err(format!("{what} {s:?} has no host"));
                }
                let mut u = u;
                u.set_fragment(None);
                let given = given.split('#').next().unwrap_or(given).to_string();
                Ok($name { key: url_key(&u), given })
            }

            /// A value read back from the store: its key, and the form it was given in (older
            /// records have none: the key then).
            pub fn from_stored(key: String) -> $name {
                $name { given: key.clone(), key }
            }

            pub fn from_stored_given(key: String, given: Option<String>) -> $name {
                $name { given: given.unwrap_or_else(|| key.clone()), key }
            }

            /// The normal form: what the store keys and matching use.
            pub fn as_str(&self) -> &str {
                &self.key
            }

            /// Exactly as given (to send back).
            pub fn given(&self) -> &str {
                &self.given
            }

            /// The URL to connect to (parsed from the given form).
            pub fn url(&self) -> url::Url {
                url::Url::parse(&self.given).or_else(|_| url::Url::parse(&self.key)).expect("stored URLs parse")
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.key == other.key
            }
        }

        impl Eq for $name {}

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
                self.key.hash(h)
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.key.cmp(&other.key)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.given)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.given)
            }
        }
    };
}

url_newtype!(
    /// A topic URL (WebSub's topic, ResourceSync's channel).
    Topic
);
url_newtype!(
    /// A subscriber's callback URL.
    Callback
);

pub type SubscriptionId = i64;
/// Messages are numbered in publish order over all topics.
pub type MessageId = i64;

/// What a subscriber asked for, or what the hub decided to tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentMode {
    Subscribe,
    Unsubscribe,
    /// The hub refuses the subscription by policy and tells the callback so.
    Denied,
}

impl IntentMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentMode::Subscribe => "subscribe",
            IntentMode::Unsubscribe => "unsubscribe",
            IntentMode::Denied => "denied",
        }
    }

    pub fn parse(s: &str) -> Option<IntentMode> {
        match s {
            "subscribe" => Some(IntentMode::Subscribe),
            "unsubscribe" => Some(IntentMode::Unsubscribe),
            "denied" => Some(IntentMode::Denied),
            _ => None,
        }
    }
}

/// A (un)subscription request waiting for verification of intent (or a denial to send).
#[derive(Clone)]
pub struct Intent {
    pub id: i64,
    pub mode: IntentMode,
    pub topic: Topic,
    pub callback: Callback,
    /// Granted lease (already clamped).
    pub lease_secs: u64,
    pub secret: Option<String>,
    pub alg: SignatureAlg,
    /// Why a denial is sent.
    pub reason: Option<String>,
    pub requested_at: Timestamp,
    /// PubSubHubbub 0.3's `hub.verify_token`, echoed in the verification request.
    pub verify_token: Option<String>,
}

impl fmt::Debug for Intent {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intent")
            .field("id", &self.id)
            .field("mode", &self.mode)
            .field("topic", &self.topic)
            .field("callback", &self.callback)
            .field("lease_secs", &self.lease_secs)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// A verified subscription, with where its delivery queue stands.
///
/// The queue is not stored per delivery: it is every message of the topic after `cursor`
/// (the last message delivered, failed for good, or skipped because the lease had ended).
/// Only the head of the queue can be in retry, so its attempts live here too.
#[derive(Clone)]
pub struct Subscription {
    pub id: SubscriptionId,
    pub topic: Topic,
    pub callback: Callback,
    pub secret: Option<String>,
    /// The secret before the last one, and until when deliveries are signed with it too (a
    /// receiver switches at its own pace: `hub.secret_grace_secs`).
    pub previous_secret: Option<(String, Timestamp)>,
    pub alg: SignatureAlg,
    pub lease_secs: u64,
    pub lease_start: Timestamp,
    pub expires_at: Timestamp,
    pub verified_at: Timestamp,
    pub created_at: Timestamp,
    pub cursor: MessageId,
    /// Failed attempts at the head of the queue.
    pub attempts: u32,
    pub next_attempt_at: Option<Timestamp>,
    /// Since when every attempt has failed (none since the last success), if the last did.
    pub failing_since: Option<Timestamp>,
    /// Nothing is delivered while held: paused by an admin, or disabled after failing for
    /// `hub.disable_after_secs`. Messages keep accumulating in the log.
    pub held: Option<Hold>,
    /// Deliveries a second at most for this subscriber (`None`: the hub's
    /// `hub.max_per_sec_per_subscriber`).
    pub max_per_sec: Option<f64>,
    /// How the hub authenticates itself to the receiver (set by an admin; never shown back).
    pub auth: Option<DeliveryAuth>,
}

/// What an admin changes of a subscription: each field given is set (`Some(None)` clears it).
#[derive(Debug, Clone, Default)]
pub struct SubscriptionChange {
    pub max_per_sec: Option<Option<f64>>,
    pub auth: Option<Option<DeliveryAuth>>,
    /// A new secret, and until when the one it replaces still signs (a rotation).
    pub secret: Option<(super::Secret, Timestamp)>,
}

/// How the hub authenticates itself to a receiver behind a firewall.
#[derive(Clone, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DeliveryAuth {
    /// Mutual TLS: the hub presents this client certificate (PEM, the chain after it) and its
    /// private key (PEM); `ca` (PEM), when given, is trusted for this receiver's server
    /// certificate besides the usual roots.
    Mtls {
        certificate: String,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ca: Option<String>,
    },
    /// OAuth2 client credentials (RFC 6749 §4.4): a bearer token from `token_url`, asked for
    /// with HTTP Basic client authentication, kept until it expires.
    Oauth2 {
        token_url: String,
        client_id: String,
        client_secret: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
}

impl DeliveryAuth {
    pub fn kind(&self) -> &'static str {
        match self {
            DeliveryAuth::Mtls { .. } => "mtls",
            DeliveryAuth::Oauth2 { .. } => "oauth2",
        }
    }
}

impl fmt::Debug for DeliveryAuth {
    /// Never prints a key or a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryAuth::Mtls { .. } => f.write_str("Mtls(<set>)"),
            DeliveryAuth::Oauth2 {
                token_url,
                client_id,
                ..
            } => f
                .debug_struct("Oauth2")
                .field("token_url", token_url)
                .field("client_id", client_id)
                .finish(),
        }
    }
}

/// Why a subscription's deliveries are held, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub reason: HoldReason,
    pub since: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// An admin paused it.
    Paused,
    /// It failed for `hub.disable_after_secs` with no success.
    Disabled,
}

impl HoldReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::Paused => "paused",
            HoldReason::Disabled => "disabled",
        }
    }

    pub fn parse(s: &str) -> Option<HoldReason> {
        match s {
            "paused" => Some(HoldReason::Paused),
            "disabled" => Some(HoldReason::Disabled),
            _ => None,
        }
    }
}

impl fmt::Debug for Subscription {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("callback", &self.callback)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field(
                "previous_secret_until",
                &self.previous_secret.as_ref().map(|(_, until)| until),
            )
            .field("alg", &self.alg)
            .field("expires_at", &self.expires_at)
            .field("held", &self.held)
            .finish()
    }
}

/// A published payload.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: MessageId,
    pub topic: Topic,
    pub content_type: String,
    pub body: Bytes,
    pub published_at: Timestamp,
}

/// What one delivery attempt (or the end of a lease) came to, recorded by the store in
/// batches. Each moves the subscription's cursor or its retry state.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// `attempts` counts this one.
    Delivered {
        sub: SubscriptionId,
        message: MessageId,
        attempts: u32,
        at: Timestamp,
        status: u16,
    },
    /// Failed; will be tried again at `next_at`.
    Retry {
        sub: SubscriptionId,
        message: MessageId,
        attempts: u32,
        at: Timestamp,
        next_at: Timestamp,
        status: Option<u16>,
        error: String,
    },
    /// Failed and the retry schedule is exhausted: recorded as a failed delivery, queue moves on.
    Failed {
        sub: SubscriptionId,
        message: MessageId,
        attempts: u32,
        at: Timestamp,
        status: Option<u16>,
        error: String,
    },
    /// Not attempted: the lease had ended when these (up to `through`) were due.
    Skipped {
        sub: SubscriptionId,
        through: MessageId,
    },
}

/// The delivery partition of a subscription (of `count`): on a shared store each partition
/// is delivered by one process at a time.
pub fn partition_of(id: SubscriptionId, count: u32) -> u32 {
    (id.unsigned_abs() % u64::from(count.max(1))) as u32
}

impl Outcome {
    /// The subscription it is about.
    pub fn subscription(&self) -> SubscriptionId {
        match self {
            Outcome::Delivered { sub, .. }
            | Outcome::Retry { sub, .. }
            | Outcome::Failed { sub, .. }
            | Outcome::Skipped { sub, .. } => *sub,
        }
    }
}

/// How a verification ended.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Verified subscribe: create or update the (topic, callback) subscription.
    /// A secret the subscription had that the request changes is kept for signing until
    /// `keep_old_secret_until`.
    Subscribed {
        verified_at: Timestamp,
        keep_old_secret_until: Timestamp,
    },
    /// Verified unsubscribe (or 410 Gone): remove the subscription, cancel its deliveries.
    Unsubscribed,
    /// Verification failed or a denial was sent: drop the intent, change nothing else.
    Dropped,
}

/// What a topic looks like to its GET/HEAD and to admins.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    pub topic: Topic,
    pub latest: Option<Message>,
    pub subscribers: u64,
}

/// How a subscription is doing, as admins see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SubState {
    /// Requested, verification of intent not yet answered.
    PendingVerification,
    Active,
    /// Its queue's head is being retried, or its last attempt failed.
    Failing,
    /// The lease ended.
    Expired,
    /// An admin paused its deliveries.
    Paused,
    /// Its deliveries stopped after failing for `hub.disable_after_secs`.
    Disabled,
}

impl SubState {
    pub fn as_str(self) -> &'static str {
        match self {
            SubState::PendingVerification => "pending_verification",
            SubState::Active => "active",
            SubState::Failing => "failing",
            SubState::Expired => "expired",
            SubState::Paused => "paused",
            SubState::Disabled => "disabled",
        }
    }
}

/// A subscription's delivery record.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionStats {
    pub state: Option<SubState>,
    pub delivered: u64,
    pub failed: u64,
    pub last_success_at: Option<Timestamp>,
    pub last_success_status: Option<u16>,
    pub last_failure_at: Option<Timestamp>,
    pub last_failure_status: Option<u16>,
    pub last_failure_error: Option<String>,
    /// Messages still to deliver.
    pub pending: u64,
}

/// Which subscriptions to list; `after` is the last id of the previous page.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionFilter {
    pub topic: Option<String>,
    pub callback_contains: Option<String>,
    pub state: Option<SubState>,
    pub after: Option<SubscriptionId>,
    pub limit: usize,
}

#[derive(Debug, Clone)]
pub struct TopicSummary {
    pub topic: Topic,
    pub subscribers: u64,
    pub last_publish: Option<Timestamp>,
}

/// Totals for the stats endpoint and the metrics.
#[derive(Debug, Clone, Default)]
pub struct HubTotals {
    pub active: u64,
    pub failing: u64,
    pub expired: u64,
    pub paused: u64,
    pub disabled: u64,
    pub pending_verification: u64,
    pub delivered: u64,
    pub failed: u64,
    /// Messages still to deliver, over all subscriptions.
    pub queue_depth: u64,
}
