//! Which addresses the hub may call. Callbacks and fetched topics on loopback, private,
//! link-local, shared (CGNAT) or cloud-metadata addresses are refused unless their network is
//! allow-listed (`hub.allow_networks`). IP literals are checked before every request; host
//! names are checked where they are resolved ([`SafeResolver`]), so a name that later
//! re-resolves to an internal address is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
}

impl AddressPolicy {
    /// `allow` holds CIDR networks; configuration validation has checked them.
    pub fn new(allow: &[ipnet::IpNet]) -> AddressPolicy {
        AddressPolicy {
            allow: allow.to_vec(),
        }
    }

    /// Whether the hub may open a connection to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        !is_internal(ip) || self.allow.iter().any(|n| n.contains(&ip))
    }

    /// Checks the scheme, and the host when it is an IP literal or `localhost`; other host
    /// names are checked when they are resolved. `what` names the URL in the message.
    pub fn check_url(&self, url: &Url, what: &str) -> Result<(), String> {
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(format!("{what} {url} must be an http or https URL"));
        }
        let ip = match url.host() {
            None => return Err(format!("{what} {url} has no host")),
            Some(Host::Ipv4(a)) => IpAddr::V4(a),
            Some(Host::Ipv6(a)) => IpAddr::V6(a),
            Some(Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if d == "localhost" || d.ends_with(".localhost") {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    return Ok(());
                }
            }
        };
        if self.permits(ip) {
            Ok(())
        } else {
            Err(format!(
                "{what} {url} is on a loopback, private, link-local or metadata address, which this hub does not call (see hub.allow_networks)"
            ))
        }
    }
}

/// Loopback, private, link-local, shared, unspecified, multicast, broadcast, reserved and
/// metadata addresses (169.254.169.254 is link-local; fd00:ec2::254 is unique-local).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => is_internal_v4(a),
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_internal_v4(v4);
            }
            let seg0 = a.segments()[0];
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (seg0 & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (seg0 & 0xffc0) == 0xfe80 // link-local fe80::/10
                || is_nat64_internal(a)
        }
    }
}

fn is_internal_v4(a: Ipv4Addr) -> bool {
    let o = a.octets();
    a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_broadcast()
        || a.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared 100.64.0.0/10 (Alibaba metadata lives here)
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18.0.0/15
        || o[0] >= 240 // reserved
}

/// 64:ff9b::/96 embeds an IPv4 address: judge that one.
fn is_nat64_internal(a: Ipv6Addr) -> bool {
    let s = a.segments();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let o = a.octets();
        return is_internal_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    false
}

/// A resolver for the hub's HTTP client that drops every address the policy refuses and fails
/// when none is left.
pub struct SafeResolver {
    pub policy: Arc<AddressPolicy>,
}

impl Resolve for SafeResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let ok: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| policy.permits(a.ip()))
                .collect();
            if ok.is_empty() {
                let msg = if found.is_empty() {
                    format!("{host} does not resolve")
                } else {
                    format!("{host} resolves only to loopback, private, link-local or metadata addresses, which this hub does not call (see hub.allow_networks)")
                };
                return Err(msg.into());
            }
            let addrs: Addrs = Box::new(ok.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed() {
        let p = AddressPolicy::default();
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "255.255.255.255",
        ] {
            assert!(!p.permits(ip(a)), "{a} should be refused");
        }
        for a in [
            "93.184.216.34",
            "2606:2800:220:1:248:1893:25c8:1946",
            "8.8.8.8",
        ] {
            assert!(p.permits(ip(a)), "{a} should be allowed");
        }
        let p = AddressPolicy::new(&["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
        assert!(p.permits(ip("127.0.0.1")) && p.permits(ip("::1")));
        assert!(!p.permits(ip("10.0.0.1")));
    }

    #[test]
    fn url_checks_cover_literals_localhost_and_schemes() {
        let p = AddressPolicy::default();
        let check = |u: &str| p.check_url(&Url::parse(u).unwrap(), "callback");
        assert!(check("http://127.0.0.1:9/cb")
            .unwrap_err()
            .contains("loopback"));
        assert!(check("http://[::1]/cb").is_err());
        assert!(check("http://LOCALHOST./cb").is_err());
        assert!(check("http://169.254.169.254/latest/meta-data").is_err());
        assert!(check("ftp://example.org/cb")
            .unwrap_err()
            .contains("http or https"));
        assert!(
            check("https://example.org/cb?x=1").is_ok(),
            "names are checked when resolved"
        );
    }
}
