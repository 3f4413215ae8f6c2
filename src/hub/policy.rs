//! Which addresses the hub may call. Callbacks and fetched topics on loopback, private,
//! link-local, shared (CGNAT) or cloud-metadata addresses are refused unless their network is
//! allow-listed (`hub.allow_networks`). IP literals are checked before every request; host
//! names are checked where they are resolved ([`SafeResolver`]), so a name that later
//! re-resolves to an internal address is still refused. Behind an egress proxy
//! (`hub.egress_proxy`) the proxy resolves and connects: the hub then resolves each host
//! itself before every request and refuses it when any of its addresses is refused.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
    /// Every request goes through this HTTP proxy (CONNECT for https).
    proxy: Option<Url>,
}

impl AddressPolicy {
    /// `allow` holds CIDR networks; configuration validation has checked them.
    pub fn new(allow: &[ipnet::IpNet]) -> AddressPolicy {
        AddressPolicy {
            allow: allow.to_vec(),
            proxy: None,
        }
    }

    /// The same policy, with every request sent through `proxy`.
    pub fn through(mut self, proxy: Option<Url>) -> AddressPolicy {
        self.proxy = proxy;
        self
    }

    /// Whether requests go through an egress proxy.
    pub fn is_proxied(&self) -> bool {
        self.proxy.is_some()
    }

    /// Checks `url` before a request: as [`AddressPolicy::check_url`], and behind a proxy
    /// (which resolves the host itself) every address its host resolves to here.
    pub async fn check_before_sending(&self, url: &Url, what: &str) -> Result<(), String> {
        self.check_url(url, what)?;
        let (Some(_), Some(Host::Domain(d))) = (&self.proxy, url.host()) else {
            return Ok(());
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let found: Vec<SocketAddr> = lookup(d, port)
            .await
            .map_err(|e| format!("{what} {url}: {d} does not resolve ({e})"))?
            .collect();
        if found.is_empty() {
            return Err(format!("{what} {url}: {d} does not resolve"));
        }
        for a in found {
            if let Err(why) = self.check_ip(a.ip()) {
                return Err(format!(
                    "{what} {url}: {d} resolves to {}, {why}, which this hub does not call (see hub.allow_networks)",
                    a.ip()
                ));
            }
        }
        Ok(())
    }

    /// Whether `ip` lies in a network the operator listed (`hub.allow_networks`).
    pub fn listed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(&ip))
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
        self.check_ip(ip).map_err(|why| {
            format!(
                "{what} {url} is on {why}, which this hub does not call (see hub.allow_networks)"
            )
        })
    }

    /// The peer of a connection actually made: a last check, should anything between the
    /// resolver and the socket (a proxy, a resolver quirk) have led elsewhere.
    pub fn check_peer(&self, resp: &reqwest::Response) -> Result<(), String> {
        if self.proxy.is_some() {
            // The peer is the proxy; the target was checked before sending.
            return Ok(());
        }
        match resp.remote_addr() {
            Some(a) => self.check_ip(a.ip()).map_err(|why| {
                format!("the connection went to {a}, {why}, which this hub does not call")
            }),
            None => Ok(()),
        }
    }

    /// `Err(why)` naming the range when the hub may not connect to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), String> {
        if self.permits(ip) {
            return Ok(());
        }
        Err(match special_range(ip) {
            Some((net, why)) => format!("a {why} address ({net})"),
            None => "an address of this machine".into(),
        })
    }
}

/// Every range of the IANA IPv4 and IPv6 Special-Purpose Address Registries (as of 2026),
/// multicast, and every IPv6 form that embeds an IPv4 address (IPv4-mapped, IPv4-compatible,
/// NAT64 well-known and local-use, 6to4, Teredo): an embedded address could point anywhere,
/// including back inside. Each with the name the registry gives it.
pub const SPECIAL_PURPOSE: &[(&str, &str)] = &[
    ("0.0.0.0/8", "\"this network\""),
    ("10.0.0.0/8", "private-use"),
    ("100.64.0.0/10", "shared address space"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata lives here)"),
    ("172.16.0.0/12", "private-use"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112-v4"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast"),
    ("192.168.0.0/16", "private-use"),
    ("192.175.48.0/24", "direct delegation AS112 service"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited broadcast"),
    ("::/96", "unspecified, loopback and IPv4-compatible"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("64:ff9b::/96", "IPv4/IPv6 translation (NAT64)"),
    ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy IPv6 prefix"),
    (
        "2001::/23",
        "IETF protocol assignments (Teredo 2001::/32 included)",
    ),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "direct delegation AS112 service"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing SIDs"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "deprecated site-local"),
    ("ff00::/8", "multicast"),
];

fn special_nets() -> &'static [(IpNet, &'static str)] {
    static NETS: std::sync::OnceLock<Vec<(IpNet, &'static str)>> = std::sync::OnceLock::new();
    NETS.get_or_init(|| {
        SPECIAL_PURPOSE
            .iter()
            .map(|(n, why)| (n.parse().expect("a valid network"), *why))
            .collect()
    })
}

/// The special-purpose range `ip` lies in, if any (see [`SPECIAL_PURPOSE`]).
pub fn special_range(ip: IpAddr) -> Option<(&'static IpNet, &'static str)> {
    // The most specific range names it (255.255.255.255 lies in 240.0.0.0/4 too).
    special_nets()
        .iter()
        .filter(|(n, _)| n.contains(&ip))
        .max_by_key(|(n, _)| n.prefix_len())
        .map(|(n, why)| (n, *why))
}

/// Whether `ip` is special-purpose or one of this machine's own addresses.
pub fn is_internal(ip: IpAddr) -> bool {
    special_range(ip).is_some() || own_addresses().contains(&ip)
}

/// This machine's interface addresses (read once): a callback on the hub's own public address
/// points inward as surely as 127.0.0.1 does.
pub fn own_addresses() -> &'static [IpAddr] {
    static OWN: std::sync::OnceLock<Vec<IpAddr>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        if_addrs::get_if_addrs()
            .map(|v| v.into_iter().map(|i| i.ip()).collect())
            .unwrap_or_default()
    })
}

/// What a callback host's request budget is kept by: its address, not its name, so that the
/// names of one machine (`localhost`, `localhost.`, a wildcard domain's names) share one.
/// IPv4 loopback is one machine (all of 127.0.0.0/8); an IPv6 address counts by its /64 (what
/// one host is usually given). A name is resolved (within 2 s; an IPv4 address preferred);
/// names that do not resolve share one budget.
pub async fn budget_key(url: &Url) -> String {
    let ip = match url.host() {
        Some(Host::Ipv4(a)) => IpAddr::V4(a),
        Some(Host::Ipv6(a)) => IpAddr::V6(a),
        Some(Host::Domain(d)) => {
            // `name.` is `name` (the absolute form): one machine, one budget.
            let d = d.strip_suffix('.').unwrap_or(d);
            let found = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                lookup(d, url.port_or_known_default().unwrap_or(80)),
            )
            .await;
            let addrs: Vec<IpAddr> = match found {
                Ok(Ok(a)) => a.map(|a| a.ip()).collect(),
                _ => Vec::new(),
            };
            match addrs.iter().find(|a| a.is_ipv4()).or_else(|| addrs.first()) {
                Some(a) => *a,
                None => return "unresolved".into(),
            }
        }
        None => return "unresolved".into(),
    };
    match ip {
        IpAddr::V4(a) if a.is_loopback() => "127.0.0.0/8".into(),
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) if v4.is_loopback() => "127.0.0.0/8".into(),
            Some(v4) => v4.to_string(),
            None => {
                let s = a.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

/// Name lookups under way at once, process-wide. A lookup runs `getaddrinfo` on tokio's
/// blocking pool, which the store's calls share: a burst of slow lookups (a resolver that
/// times out, names a peer chose) must never take every blocking thread from the store.
const LOOKUPS_AT_ONCE: usize = 32;

/// `tokio::net::lookup_host`, at most [`LOOKUPS_AT_ONCE`] at a time.
pub async fn lookup(host: &str, port: u16) -> std::io::Result<std::vec::IntoIter<SocketAddr>> {
    static LOOKUPS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    let _turn = LOOKUPS
        .get_or_init(|| tokio::sync::Semaphore::new(LOOKUPS_AT_ONCE))
        .acquire()
        .await
        .expect("never closed");
    Ok(tokio::net::lookup_host((host, port))
        .await?
        .collect::<Vec<_>>()
        .into_iter())
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
            let found: Vec<SocketAddr> = lookup(host.as_str(), 0).await?.collect();
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

/// An HTTP client that calls only addresses `policy` permits (checked where names are
/// resolved; the peer of each response is checked with [`AddressPolicy::check_peer`]), follows
/// no redirects and uses no proxy but the policy's: the hub's, and the dump builder's for
/// remote resources. Behind a proxy, callers check each URL with
/// [`AddressPolicy::check_before_sending`] (the proxy's own address is the operator's choice).
pub fn guarded_client(policy: &Arc<AddressPolicy>, user_agent: &str) -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder()
        .user_agent(user_agent)
        .redirect(reqwest::redirect::Policy::none());
    match &policy.proxy {
        Some(p) => b.proxy(reqwest::Proxy::all(p.as_str()).expect("a validated proxy URL")),
        None => b
            .dns_resolver(Arc::new(SafeResolver {
                policy: policy.clone(),
            }))
            .no_proxy(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn budgets_are_kept_by_address() {
        let key = |u: &str| {
            let u = Url::parse(u).unwrap();
            async move { super::budget_key(&u).await }
        };
        assert_eq!(key("http://127.0.0.9:1/a").await, "127.0.0.0/8");
        assert_eq!(key("http://localhost/a").await, "127.0.0.0/8");
        assert_eq!(key("http://[::ffff:127.0.0.1]/a").await, "127.0.0.0/8");
        assert_eq!(key("http://192.0.2.7/a").await, "192.0.2.7");
        assert_eq!(
            key("http://[2001:db8:1:2:3::4]/a").await,
            key("http://[2001:db8:1:2:ffff::1]/b").await,
            "one /64"
        );
        assert_eq!(key("http://[2001:db8:1:2::1]/a").await, "2001:db8:1:2::/64");
        assert_ne!(key("http://[2001:db8:1:3::1]/a").await, "2001:db8:1:2::/64");
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

    /// One refused address in every range of the registries, and the IPv6 forms that embed
    /// IPv4 (with inward and outward IPv4 inside: both refused); public ones allowed.
    #[test]
    fn every_special_purpose_range_is_refused_and_public_addresses_are_not() {
        let p = AddressPolicy::default();
        let refused = [
            ("0.1.2.3", "\"this network\""),
            ("10.9.8.7", "private-use"),
            ("100.100.100.200", "shared address space"),
            ("127.0.0.53", "loopback"),
            ("169.254.169.254", "link-local"),
            ("172.31.255.1", "private-use"),
            ("192.0.0.9", "IETF protocol assignments"),
            ("192.0.2.1", "TEST-NET-1"),
            ("192.31.196.1", "AS112-v4"),
            ("192.52.193.1", "AMT"),
            ("192.88.99.1", "6to4 relay"),
            ("192.168.1.1", "private-use"),
            ("192.175.48.1", "AS112 service"),
            ("198.19.255.1", "benchmarking"),
            ("198.51.100.7", "TEST-NET-2"),
            ("203.0.113.9", "TEST-NET-3"),
            ("239.1.1.1", "multicast"),
            ("250.1.1.1", "reserved"),
            ("255.255.255.255", "limited broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("::8.8.8.8", "IPv4-compatible"),
            ("::ffff:127.0.0.1", "IPv4-mapped"),
            ("::ffff:8.8.8.8", "IPv4-mapped"),
            ("64:ff9b::a9fe:a9fe", "NAT64"),
            ("64:ff9b:1::1", "local-use IPv4/IPv6 translation"),
            ("100::1", "discard-only"),
            ("100:0:0:1::1", "dummy"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("2001:2::1", "IETF protocol assignments"),
            ("2001:db8::1", "documentation"),
            ("2002:7f00:1::1", "6to4"),
            ("2002:a9fe:a9fe::1", "6to4"),
            ("2620:4f:8000::1", "AS112 service"),
            ("3fff::1", "documentation"),
            ("5f00::1", "segment routing"),
            ("fd00:ec2::254", "unique-local"),
            ("fe80::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
        ];
        for (a, why) in refused {
            let e = p.check_ip(ip(a)).expect_err(a);
            assert!(e.contains(why), "{a}: {e:?} should name {why:?}");
        }
        for a in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "2606:2800:220:1:248:1893:25c8:1946",
            "2a00:1450:4001:800::200e",
        ] {
            if !own_addresses().contains(&ip(a)) {
                assert!(p.permits(ip(a)), "{a} should be allowed");
            }
        }
        // This machine's own addresses, whatever they are, are refused too.
        for own in own_addresses() {
            assert!(!p.permits(*own), "own address {own}");
        }
        // An allow-list opens exactly its networks.
        let p = AddressPolicy::new(&["192.0.2.0/24".parse().unwrap()]);
        assert!(p.permits(ip("192.0.2.1")) && !p.permits(ip("198.51.100.7")));
    }
}
