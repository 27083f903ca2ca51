//! The `watchdog` key of an authority (design section 1, layer 2): where the hook that may
//! narrow an allowed decision listens. Parsed once, here, at load; the mediator only ever
//! connects to the typed [`WatchdogEndpoint`].
//!
//! The watchdog is sent every allowed destination, so it must run on this host: a Unix
//! socket (`unix:/absolute/path`) or an `http://` URL whose host is a loopback IP literal
//! or `localhost` (taken as `127.0.0.1`), without userinfo. Nothing here connects.

use crate::error::ValueError;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// Where a watchdog listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchdogEndpoint {
    /// `unix:/path`: HTTP over this Unix socket, request path `/`.
    Unix(PathBuf),
    /// `http://ip:port/path` on loopback.
    Http {
        /// The loopback address (port 80 when the URL names none).
        addr: SocketAddr,
        /// The request path (with query), `/` when none.
        path: String,
    },
}

impl WatchdogEndpoint {
    /// Parses the `watchdog` key of an authority.
    ///
    /// # Errors
    /// A message naming the value when it is neither `unix:/absolute/path` nor an
    /// `http://` URL on a loopback IP literal or `localhost` (with an optional port, no
    /// userinfo).
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let must = || ValueError::Watchdog(s.to_owned());
        if let Some(path) = s.strip_prefix("unix:") {
            return if path.starts_with('/') {
                Ok(Self::Unix(PathBuf::from(path)))
            } else {
                Err(must())
            };
        }
        let rest = s.strip_prefix("http://").ok_or_else(must)?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (hostport, tail) = rest.split_at(end);
        if hostport.contains('@') {
            return Err(must());
        }
        let (host, port) = match hostport.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((h, "")) => (h, None),
                Some((h, p)) => (h, Some(p.strip_prefix(':').ok_or_else(must)?)),
                None => return Err(must()),
            },
            None => match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            },
        };
        let port = match port {
            None => 80,
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(must)?,
        };
        let ip = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            host.parse::<IpAddr>().map_err(|_| must())?
        };
        if !ip.is_loopback() {
            return Err(must());
        }
        let path = match tail.split('#').next().unwrap_or("") {
            "" => "/".to_owned(),
            p if p.starts_with('/') => p.to_owned(),
            query => format!("/{query}"),
        };
        Ok(Self::Http {
            addr: SocketAddr::new(ip, port),
            path,
        })
    }
}

impl fmt::Display for WatchdogEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Http { addr, path } => write!(f, "http://{addr}{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_on_this_host_parse() {
        let rows = [
            ("unix:/run/w.sock", "unix:/run/w.sock"),
            (
                "http://127.0.0.1:9000/check?x=1",
                "http://127.0.0.1:9000/check?x=1",
            ),
            ("http://[::1]:9000", "http://[::1]:9000/"),
            ("http://localhost:1/", "http://127.0.0.1:1/"),
            ("http://LOCALHOST", "http://127.0.0.1:80/"),
            ("http://127.9.9.9", "http://127.9.9.9:80/"),
            ("http://127.0.0.1:8080?q", "http://127.0.0.1:8080/?q"),
        ];
        for (input, shown) in rows {
            let e = WatchdogEndpoint::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(e.to_string(), shown, "{input}");
        }
    }

    #[test]
    fn endpoints_elsewhere_are_refused() {
        for bad in [
            "unix:rel.sock",
            "http://10.0.0.1:80/",
            "http://watchdog.example:80/",
            "http://localhost.evil.com:80/x",
            "http://user@127.0.0.1/",
            "http://127.0.0.1@evil.test/",
            "http://[::1]x/",
            "http://[2001:db8::1]:80/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:99999/",
            "https://127.0.0.1/",
            "",
        ] {
            let e = WatchdogEndpoint::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("must run on this host"),
                "{bad}: {e}"
            );
        }
    }
}
