//! How the hub authenticates itself to a receiver behind a firewall, per subscription: a client
//! certificate (mutual TLS, with an optional CA to trust for that receiver) or OAuth2 client
//! credentials (a bearer token kept until it expires, fetched again on a 401). Each lane holds
//! its [`Link`]: the HTTP client it delivers with and its token.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use std::sync::Arc;

use super::policy::AddressPolicy;
use crate::model::websub::{DeliveryAuth, Subscription};

/// The most of a token endpoint's answer read.
const TOKEN_BODY_MAX: usize = 64 << 10;
/// A token is used until this long before it expires (or a tenth of its lifetime, if less).
const TOKEN_MARGIN: Duration = Duration::from_secs(30);
/// A token whose answer names no lifetime is kept this long.
const TOKEN_DEFAULT_LIFE: Duration = Duration::from_secs(300);
/// The longest a token is kept, whatever its endpoint says.
const TOKEN_MAX_LIFE: Duration = Duration::from_secs(86_400);

/// A lane's way to its receiver: the client (the hub's, or one with the subscription's client
/// certificate) and the OAuth2 token it holds.
pub(super) struct Link {
    auth: Option<DeliveryAuth>,
    /// `Err` when the subscription's certificate cannot make a client (said at each attempt).
    pub client: Result<reqwest::Client, String>,
    token: Option<(String, Instant)>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl Link {
    pub fn new(clients: &Clients, sub: &Subscription) -> Link {
        Link {
            auth: sub.auth.clone(),
            client: clients.client_for(sub.auth.as_ref()),
            token: None,
        }
    }

    /// Follows a change of the subscription's auth (a new client, no token).
    pub fn update(&mut self, clients: &Clients, sub: &Subscription) {
        if sub.auth != self.auth {
            *self = Link::new(clients, sub);
        }
    }

    pub fn uses_oauth2(&self) -> bool {
        matches!(self.auth, Some(DeliveryAuth::Oauth2 { .. }))
    }

    /// The bearer token to send, if the subscription uses OAuth2: the one held unless it is
    /// about to expire or `fresh` is asked for (after a 401), else one fetched now.
    pub async fn bearer(
        &mut self,
        clients: &Clients,
        fresh: bool,
    ) -> Result<Option<String>, String> {
        let Some(DeliveryAuth::Oauth2 {
            token_url,
            client_id,
            client_secret,
            scope,
        }) = &self.auth
        else {
            return Ok(None);
        };
        if let Some((t, until)) = &self.token {
            if !fresh && Instant::now() < *until {
                return Ok(Some(t.clone()));
            }
        }
        self.token = None;
        let what = "the OAuth2 token URL";
        let url = url::Url::parse(token_url).map_err(|e| format!("{what} {token_url}: {e}"))?;
        clients.policy.check_before_sending(&url, what).await?;
        check_secret_transport(&clients.policy, &url)?;
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(s) = scope {
            form.push(("scope", s.as_str()));
        }
        let mut resp = clients
            .client
            .post(url)
            .basic_auth(client_id, Some(client_secret))
            .form(&form)
            .send()
            .await
            .map_err(|e| format!("{what} {token_url}: {}", crate::cause::chain(&e)))?;
        clients.policy.check_peer(&resp)?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(c) = resp
            .chunk()
            .await
            .map_err(|e| format!("{what} {token_url}: {}", crate::cause::chain(&e)))?
        {
            if body.len() + c.len() > TOKEN_BODY_MAX {
                return Err(format!(
                    "{what} {token_url} answered more than {TOKEN_BODY_MAX} bytes"
                ));
            }
            body.extend_from_slice(&c);
        }
        if !status.is_success() {
            return Err(format!("{what} {token_url} answered {status}"));
        }
        let a: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            format!("{what} {token_url} answered no token (RFC 6749 §5.1 JSON expected): {e}")
        })?;
        if a.token_type
            .as_deref()
            .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
        {
            return Err(format!(
                "{what} {token_url} issued a {:?} token; only bearer tokens are sent",
                a.token_type.unwrap_or_default()
            ));
        }
        let life = token_life(a.expires_in);
        tracing::info!(token_url = %token_url, lifetime_secs = life.as_secs(), "OAuth2 token fetched");
        // `life` is at most a day: no overflow, whatever the endpoint said.
        self.token = Some((a.access_token.clone(), Instant::now() + life));
        Ok(Some(a.access_token))
    }
}

/// The client secret goes out only over TLS: an `http` token URL only on a network the operator
/// allow-listed by address (`hub.allow_networks`, as for internal callbacks), never by a name.
fn check_secret_transport(
    policy: &super::policy::AddressPolicy,
    url: &url::Url,
) -> Result<(), String> {
    if url.scheme() == "https" {
        return Ok(());
    }
    let ip = match url.host() {
        Some(url::Host::Ipv4(a)) => Some(std::net::IpAddr::V4(a)),
        Some(url::Host::Ipv6(a)) => Some(std::net::IpAddr::V6(a)),
        _ => None,
    };
    if ip.is_some_and(|ip| policy.listed(ip)) {
        return Ok(());
    }
    Err(format!(
        "token_url {url} is plain http: the client secret is sent only over https (or to an address in hub.allow_networks)"
    ))
}

/// How long a token is used, from the endpoint's `expires_in` (a number the peer chooses):
/// its lifetime less a margin, at most [`TOKEN_MAX_LIFE`] (a token is simply asked for again).
fn token_life(expires_in: Option<u64>) -> Duration {
    let life = expires_in.map_or(TOKEN_DEFAULT_LIFE, |s| {
        Duration::from_secs(s.min(TOKEN_MAX_LIFE.as_secs()))
    });
    life - TOKEN_MARGIN.min(life / 10)
}

/// The hub's HTTP clients: its own, and for a mutual-TLS subscription one made with its
/// certificate, all through the address policy; and what a subscription's auth must satisfy.
pub struct Clients {
    policy: Arc<AddressPolicy>,
    client: reqwest::Client,
    timeout: Duration,
}

impl Clients {
    pub(super) fn new(policy: Arc<AddressPolicy>, timeout: Duration) -> reqwest::Result<Clients> {
        let client = super::client_builder(&policy, timeout).build()?;
        Ok(Clients {
            policy,
            client,
            timeout,
        })
    }

    /// The address policy every request of the hub goes through.
    pub fn policy(&self) -> &Arc<AddressPolicy> {
        &self.policy
    }

    /// The hub's own client.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The client a subscription's deliveries go through: the hub's, or for mutual TLS one
    /// with its client certificate (and the CA it trusts for that receiver).
    pub(super) fn client_for(
        &self,
        auth: Option<&DeliveryAuth>,
    ) -> Result<reqwest::Client, String> {
        let Some(DeliveryAuth::Mtls {
            certificate,
            key,
            ca,
        }) = auth
        else {
            return Ok(self.client.clone());
        };
        let identity = reqwest::Identity::from_pem(format!("{certificate}\n{key}").as_bytes())
            .map_err(|e| {
                format!(
                    "the client certificate and key: {}",
                    crate::cause::chain(&e)
                )
            })?;
        let mut b = super::client_builder(&self.policy, self.timeout).identity(identity);
        if let Some(ca) = ca {
            for c in reqwest::Certificate::from_pem_bundle(ca.as_bytes())
                .map_err(|e| format!("the CA: {}", crate::cause::chain(&e)))?
            {
                b = b.add_root_certificate(c);
            }
        }
        b.build()
            .map_err(|e| format!("a client with the certificate: {}", crate::cause::chain(&e)))
    }

    /// Whether `auth` can be used for `sub`: a client certificate and key that make a client,
    /// an https callback for mutual TLS, a token URL the address policy permits.
    pub fn check(&self, sub: &Subscription, auth: &DeliveryAuth) -> Result<(), String> {
        match auth {
            DeliveryAuth::Mtls { .. } => {
                if sub.callback.url().scheme() != "https" {
                    return Err(format!(
                        "the callback {} is not https: mutual TLS needs https",
                        sub.callback
                    ));
                }
                self.client_for(Some(auth)).map(|_| ())
            }
            DeliveryAuth::Oauth2 {
                token_url,
                client_id,
                ..
            } => {
                let url = url::Url::parse(token_url)
                    .map_err(|e| format!("token_url {token_url:?}: {e}"))?;
                self.policy.check_url(&url, "token_url")?;
                check_secret_transport(&self.policy, &url)?;
                if client_id.is_empty() {
                    return Err("client_id is empty".into());
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_expires_in_gives_a_usable_life() {
        for (given, want) in [
            (None, 270),
            (Some(0), 0),
            (Some(10), 9),
            (Some(3600), 3570),
            (Some(u64::MAX), 86_370),
            (Some(u64::MAX / 1000), 86_370),
        ] {
            let life = token_life(given);
            assert_eq!(life.as_secs(), want, "{given:?}");
            let _ = Instant::now() + life; // never overflows
        }
    }
}
