//! A PAC's answer (`"PROXY h:p; SOCKS5 h:p; DIRECT"`) read into routes: the URL a PAC is
//! asked about (scheme and authority, never a path), the entries of its answer, and the
//! mapping to the router's routes, which skips any parent not in `allowed_parents`.

use policy::upstream::ParentScheme;
use policy::{Target, parse_authority_form};

use crate::route::{Route, Router, Via};

/// The URL handed to the PAC: `https://host[:port]/` for tunnels (never a path or
/// query), `http://host[:port]/` for forwarding (the path is not handed either, so that
/// the per-host cache is exact and client-controlled text never reaches the script).
pub(crate) fn pac_url(via: Via, target: &Target) -> String {
    let (scheme, default) = match via {
        Via::Tunnel => ("https", 443),
        Via::Forward => ("http", 80),
    };
    if target.port == default {
        format!("{scheme}://{}/", target.host.to_uri_host())
    } else {
        format!("{scheme}://{}:{}/", target.host.to_uri_host(), target.port)
    }
}

/// One entry of a PAC answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PacEntry {
    /// `DIRECT`.
    Direct,
    /// `PROXY`/`HTTP` (HTTP parent), `HTTPS` (TLS to the parent) or `SOCKS`/`SOCKS5`
    /// (SOCKS5 parent) with `host:port`.
    Proxy(ParentScheme, Target),
    /// An entry this build does not use (SOCKS4, garbage), with why.
    Skipped(String),
}

/// Parses a PAC answer (`"PROXY a:1; SOCKS5 b:2; DIRECT"`): entries separated by `;`,
/// keywords case-insensitive. `SOCKS` means SOCKS5 (as in Firefox; SOCKS4 is not
/// supported, its entries are skipped); `HTTPS` is an HTTP parent spoken to over TLS.
pub(crate) fn parse_pac_answer(answer: &str) -> Vec<PacEntry> {
    answer
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let mut words = entry.split_whitespace();
            let keyword = words.next().unwrap_or_default().to_ascii_uppercase();
            let arg = words.next();
            let extra = words.next().is_some();
            let scheme = match keyword.as_str() {
                "DIRECT" if arg.is_none() => return PacEntry::Direct,
                "PROXY" | "HTTP" => ParentScheme::Http,
                "SOCKS" | "SOCKS5" => ParentScheme::Socks5,
                "SOCKS4" => {
                    return PacEntry::Skipped(format!("{entry:?}: SOCKS4 is not supported"));
                }
                "HTTPS" => ParentScheme::Https,
                _ => return PacEntry::Skipped(format!("{entry:?}: unknown entry")),
            };
            match (arg, extra) {
                (Some(a), false) => match parse_authority_form(a) {
                    Ok(t) => PacEntry::Proxy(scheme, t),
                    Err(e) => PacEntry::Skipped(format!("{entry:?}: {e}")),
                },
                _ => PacEntry::Skipped(format!("{entry:?}: expected one host:port")),
            }
        })
        .collect()
}

impl Router {
    /// Maps a PAC answer to routes: unknown and unsupported entries are skipped (logged),
    /// and so are parents not among `allowed` (the `allowed_parents` routes).
    pub(in crate::route) fn routes_from_answer(
        &self,
        allowed: &[Route],
        answer: &str,
        url: &str,
    ) -> Vec<Route> {
        let mut out = Vec::new();
        for entry in parse_pac_answer(answer) {
            let route = match entry {
                PacEntry::Direct => Some(Route::Direct),
                PacEntry::Proxy(scheme, target) => {
                    let found = allowed.iter().copied().find(|r| match r {
                        Route::Parent(i) => self
                            .parents
                            .get(*i)
                            .is_some_and(|p| p.url.scheme == scheme && p.url.addr == target),
                        Route::Direct => false,
                    });
                    match found {
                        Some(route) => Some(route),
                        None => {
                            tracing::warn!(
                                url = %url,
                                "PAC named parent {}://{target}, which is not in allowed_parents; skipped",
                                scheme.as_str()
                            );
                            None
                        }
                    }
                }
                PacEntry::Skipped(why) => {
                    tracing::warn!(url = %url, "PAC entry skipped: {why}");
                    None
                }
            };
            if let Some(r) = route
                && !out.contains(&r)
            {
                out.push(r);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::target as t;

    #[test]
    fn pac_answers() {
        assert_eq!(
            parse_pac_answer(
                " PROXY Proxy.Corp:8080 ;socks 127.0.0.1:1080; DIRECT;; HTTPS s:443; SOCKS4 x:1; HTTP h:80; bogus; PROXY nope; PROXY a b"
            ),
            vec![
                PacEntry::Proxy(ParentScheme::Http, t("proxy.corp:8080")),
                PacEntry::Proxy(ParentScheme::Socks5, t("127.0.0.1:1080")),
                PacEntry::Direct,
                PacEntry::Proxy(ParentScheme::Https, t("s:443")),
                PacEntry::Skipped("\"SOCKS4 x:1\": SOCKS4 is not supported".into()),
                PacEntry::Proxy(ParentScheme::Http, t("h:80")),
                PacEntry::Skipped("\"bogus\": unknown entry".into()),
                PacEntry::Skipped(
                    "\"PROXY nope\": invalid host \"nope\": a port is required (host:port)".into()
                ),
                PacEntry::Skipped("\"PROXY a b\": expected one host:port".into()),
            ]
        );
        assert_eq!(parse_pac_answer(""), vec![]);
    }

    #[test]
    fn pac_urls_have_no_path() {
        for (via, target, url) in [
            (Via::Tunnel, "example.com:443", "https://example.com/"),
            (
                Via::Tunnel,
                "[2001:db8::1]:8443",
                "https://[2001:db8::1]:8443/",
            ),
            (Via::Forward, "example.com:80", "http://example.com/"),
            (Via::Forward, "example.com:8080", "http://example.com:8080/"),
        ] {
            assert_eq!(pac_url(via, &t(target)), url, "{target}");
        }
    }
}
