//! `[upstream] mode = "env"`: the mediator's own proxy environment, read once at start
//! (design section 8). Tunnels (CONNECT, SOCKS5) use `HTTPS_PROXY`, absolute-form HTTP
//! uses `HTTP_PROXY`, `ALL_PROXY` is the fallback for both; each may be spelled in lower
//! or upper case (lower case wins, as in curl). `NO_PROXY` follows curl
//! (`lib/noproxy.c`): a comma- or blank-separated list; the value `*` alone matches every
//! host; a name entry matches the host and every name below it (one leading and one
//! trailing dot ignored, case-insensitive, `example.com` never matches `notexample.com`);
//! an IP or CIDR entry matches IP-literal hosts only. Beyond curl, an entry may carry a
//! port (`example.com:8080`, `[::1]:8080`) and then matches that port only.
//!
//! This module only reads variables; it never sets one.

use std::net::IpAddr;

use ipnet::IpNet;
use policy::Target;
use policy::upstream::{ParentSyntax, ParentUrl, parse_parent_url};

use crate::error::Error;

/// The proxy settings found in the environment.
#[derive(Debug, Clone, Default)]
pub(crate) struct EnvProxies {
    /// `https_proxy` / `HTTPS_PROXY`.
    pub https: Option<ParentUrl>,
    /// `http_proxy` / `HTTP_PROXY`.
    pub http: Option<ParentUrl>,
    /// `all_proxy` / `ALL_PROXY`.
    pub all: Option<ParentUrl>,
    /// `no_proxy` / `NO_PROXY`.
    pub no_proxy: NoProxy,
}

impl EnvProxies {
    /// Reads the variables through `get` (the process environment in production: pass
    /// `|k| std::env::var(k).ok()`). An empty value counts as unset.
    ///
    /// # Errors
    /// [`Error::Upstream`] naming the variable when a value cannot be used (a SOCKS4
    /// proxy, a bad host or port): the mediator refuses to start rather than
    /// silently connect directly.
    pub(crate) fn read(get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let var = |lower: &str| -> Option<(String, String)> {
            let upper = lower.to_ascii_uppercase();
            [lower.to_owned(), upper]
                .into_iter()
                .find_map(|k| get(&k).filter(|v| !v.trim().is_empty()).map(|v| (k, v)))
        };
        let proxy = |lower: &str| -> Result<Option<ParentUrl>, Error> {
            let Some((key, value)) = var(lower) else {
                return Ok(None);
            };
            parse_parent_url(value.trim(), ParentSyntax::Environment)
                .map(Some)
                .map_err(|why| Error::upstream_by(format!("environment variable {key}"), why))
        };
        Ok(Self {
            https: proxy("https_proxy")?,
            http: proxy("http_proxy")?,
            all: proxy("all_proxy")?,
            no_proxy: NoProxy::parse(&var("no_proxy").map(|(_, v)| v).unwrap_or_default()),
        })
    }
}

/// A parsed `NO_PROXY` list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NoProxy {
    all: bool,
    entries: Vec<Entry>,
    /// The value as given, for messages.
    text: String,
}

impl std::fmt::Display for NoProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.text.is_empty() {
            f.write_str("-")
        } else {
            f.write_str(&self.text)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A lowercase name without leading or trailing dot; optional port.
    Name(String, Option<u16>),
    /// An address or CIDR; optional port.
    Net(IpNet, Option<u16>),
}

impl NoProxy {
    /// Parses a `NO_PROXY` value. Entries that cannot match anything (empty, a bad CIDR)
    /// are dropped.
    pub(crate) fn parse(value: &str) -> Self {
        let value = value.trim();
        let text: String = value
            .chars()
            .filter(|c| !c.is_control())
            .take(512)
            .collect();
        if value == "*" {
            return Self {
                all: true,
                entries: Vec::new(),
                text,
            };
        }
        let entries = value
            .split([',', ' ', '\t'])
            .filter(|t| !t.is_empty())
            .filter_map(parse_entry)
            .collect();
        Self {
            all: false,
            entries,
            text,
        }
    }

    /// Whether `target` bypasses the proxy.
    pub(crate) fn matches(&self, target: &Target) -> bool {
        if self.all {
            return true;
        }
        self.entries.iter().any(|e| match (e, target.host.ip()) {
            (Entry::Net(net, port), Some(ip)) => {
                port.is_none_or(|p| p == target.port) && net_contains(net, ip)
            }
            (Entry::Name(name, port), None) => {
                let host = target.host.as_text();
                port.is_none_or(|p| p == target.port)
                    && (host == *name
                        || (host.len() > name.len()
                            && host.ends_with(name.as_str())
                            && host.as_bytes()[host.len() - name.len() - 1] == b'.'))
            }
            _ => false,
        })
    }
}

fn net_contains(net: &IpNet, ip: IpAddr) -> bool {
    // CIDRs with host bits set ("10.1.2.3/8") match like curl: by the prefix.
    net.trunc().contains(&ip)
}

fn parse_entry(token: &str) -> Option<Entry> {
    // Split an optional port: "[v6]:p", "[v6]", "v4:p", "name:p"; a bare IPv6 (more than
    // one colon, no brackets) has no port.
    let (host, port) = if let Some(rest) = token.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if let Some(len) = after.strip_prefix('/') {
            // "[2001:db8::]/32"
            let net = format!("{inside}/{len}").parse::<IpNet>().ok()?;
            return Some(Entry::Net(net, None));
        }
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse::<u16>().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        (inside, port)
    } else if token.matches(':').count() == 1 {
        let (h, p) = token.split_once(':')?;
        (h, Some(p.parse::<u16>().ok()?))
    } else {
        (token, None)
    };
    if let Ok(net) = host.parse::<IpNet>() {
        return Some(Entry::Net(net, port));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(Entry::Net(IpNet::from(ip), port));
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let name = name.strip_prefix('.').unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    Some(Entry::Name(name.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Via;
    use crate::route::strategy::select;
    use crate::route::system::Setting;
    use crate::testing::env;
    use crate::testing::target as t;

    #[test]
    fn no_proxy_follows_curl() {
        let np = NoProxy::parse(
            " example.com, .corp.example ,10.0.0.0/8 192.0.2.7,,[2001:db8::]/32, ::1, 2001:db8:2::/48, intranet., local.test:8080, [2001:db8:1::5]:443",
        );
        for (target, want) in [
            ("example.com:443", true),
            ("www.example.com:443", true),
            ("a.b.example.com:80", true),
            ("notexample.com:443", false),
            ("example.com.evil:443", false),
            ("corp.example:1", true),
            ("x.corp.example:1", true),
            ("xcorp.example:1", false),
            ("10.1.2.3:80", true),
            ("11.1.2.3:80", false),
            ("192.0.2.7:80", true),
            ("192.0.2.8:80", false),
            ("[2001:db8::9]:443", true),
            ("[2001:db9::9]:443", false),
            ("[::1]:80", true),
            ("[2001:db8:2::7]:80", true),
            ("intranet:80", true),
            ("a.intranet:80", true),
            ("local.test:8080", true),
            ("local.test:80", false),
            ("[2001:db8:1::5]:443", true),
        ] {
            assert_eq!(np.matches(&t(target)), want, "{target}");
        }
        let np = NoProxy::parse("10.0.0.0/8");
        assert!(!np.matches(&t("ten.example:80")));
        assert!(NoProxy::parse("*").matches(&t("anything.example:1")));
        assert!(!NoProxy::parse("*.example.com").matches(&t("a.example.com:1")));
        assert!(!NoProxy::parse("").matches(&t("a.example.com:1")));
        // Case-insensitive entries.
        assert!(NoProxy::parse("EXAMPLE.com").matches(&t("www.example.com:1")));
    }

    #[test]
    fn variables_by_protocol_and_case() {
        let e = EnvProxies::read(env(&[
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "http://lower:1"),
            ("HTTP_PROXY", "plain:3128"),
            ("ALL_PROXY", "socks5h://all:1080"),
            ("no_proxy", "skip.example"),
        ]))
        .unwrap();
        // What the router plans: the reading `mode = "env"` makes, then the one `select`.
        let select = |e: &EnvProxies, tunnel: bool, target: &Target| -> Option<ParentUrl> {
            let via = if tunnel { Via::Tunnel } else { Via::Forward };
            match crate::route::system::from_env(e.clone(), String::new()).setting {
                Setting::Manual {
                    tunnel,
                    forward,
                    no_proxy,
                } => select(tunnel, forward, &no_proxy, via, target).map(|p| *p),
                _ => None,
            }
        };
        let show = |p: Option<ParentUrl>| p.map(|p| p.to_string());
        // The parents of a tunnel to a.example:443 and a forward to a.example:80.
        let both = |e: &EnvProxies| {
            (
                show(select(e, true, &t("a.example:443"))),
                show(select(e, false, &t("a.example:80"))),
            )
        };
        let parents = |tunnel: &str, forward: &str| (Some(tunnel.into()), Some(forward.into()));
        assert_eq!(both(&e), parents("http://lower:1", "http://plain:3128"));
        assert_eq!(show(select(&e, true, &t("skip.example:443"))), None);
        let e = EnvProxies::read(env(&[
            ("all_proxy", "socks5://all:1080"),
            ("HTTPS_PROXY", " "),
        ]))
        .unwrap();
        assert_eq!(both(&e), parents("socks5://all:1080", "socks5://all:1080"));
        let e = EnvProxies::read(env(&[])).unwrap();
        assert_eq!(show(select(&e, true, &t("a.example:443"))), None);
        let err = EnvProxies::read(env(&[("HTTPS_PROXY", "socks4://p:1")])).unwrap_err();
        assert!(err.to_string().contains("HTTPS_PROXY"), "{err}");
    }
}
