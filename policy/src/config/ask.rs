//! The asking keys of an authority (design section 20): `ask` (where the question about a
//! grant miss goes), `ask_timeout_s` and `max_pending_asks`, parsed once, here, at load
//! into an [`Ask`]; the mediator only ever uses the typed value. Nothing here connects.
//!
//! `ask` is an endpoint on this host, as the watchdog's ([`WatchdogEndpoint`]: a Unix
//! socket or a loopback `http://` URL), or `admin`: no endpoint, the question is served
//! by the mediator's own interfaces only (the admin API's `/v1/asks`, and in embedded mode
//! the running mediator's handle).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::raw::RawAuthority;
use super::validate::Validator;
use super::watchdog::WatchdogEndpoint;
use crate::error::ValueError;

/// `ask_timeout_s` when not given: how long a request is held for the host's answer.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `ask_timeout_s` accepted, in seconds (a held client waits that long).
pub const MAX_ASK_TIMEOUT_S: u32 = 3600;
/// `max_pending_asks` when not given: requests one authority may have held at once.
pub const DEFAULT_MAX_PENDING_ASKS: u32 = 8;
/// The largest `max_pending_asks` accepted (each held request holds a connection).
pub const MAX_PENDING_ASKS: u32 = 1024;

/// Where the questions of an authority go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskEndpoint {
    /// `unix:/path`: `POST /` over HTTP/1.1 on this Unix socket.
    Unix(PathBuf),
    /// `http://ip:port/path` on loopback: `POST` to that path.
    Http {
        /// The loopback address (port 80 when the URL names none).
        addr: std::net::SocketAddr,
        /// The request path (with query), `/` when none.
        path: String,
    },
    /// `admin`: no endpoint is asked; the question waits for an answer through the admin
    /// API (or, embedded, through the running mediator's handle).
    Admin,
}

impl AskEndpoint {
    /// Parses the `ask` key of an authority.
    ///
    /// # Errors
    /// [`ValueError::Ask`] when the value is neither `admin`, `unix:/absolute/path` nor an
    /// `http://` URL on a loopback IP literal or `localhost` (with an optional port, no
    /// userinfo).
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        if s == "admin" {
            return Ok(Self::Admin);
        }
        match WatchdogEndpoint::parse(s) {
            Ok(WatchdogEndpoint::Unix(path)) => Ok(Self::Unix(path)),
            Ok(WatchdogEndpoint::Http { addr, path }) => Ok(Self::Http { addr, path }),
            Err(_) => Err(ValueError::Ask(s.to_owned())),
        }
    }
}

impl fmt::Display for AskEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Http { addr, path } => write!(f, "http://{addr}{path}"),
            Self::Admin => f.write_str("admin"),
        }
    }
}

/// An authority's asking (design section 20): a grant miss of it (`not_in_allowlist`,
/// `port_not_allowed`) is held for the host's answer instead of denied at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// Where the question goes (`ask`).
    pub endpoint: AskEndpoint,
    /// How long a request is held before it is denied `ask_timeout` (`ask_timeout_s`,
    /// 1..=3600 seconds, default 30).
    pub timeout: Duration,
    /// How many of its requests may be held at once (`max_pending_asks`, 1..=1024,
    /// default 8); one more is denied `ask_overloaded` at once.
    pub max_pending: u32,
}

impl Validator<'_> {
    /// `ask`, `ask_timeout_s` and `max_pending_asks` of one authority: `None` without
    /// `ask` (an empty value is none too); the other two keys without `ask` are an error
    /// (they would do nothing), as is a count out of its range.
    pub(super) fn ask(&mut self, raw: &RawAuthority, label: &str) -> Option<Ask> {
        let endpoint = raw.ask.as_ref().filter(|a| !a.get_ref().is_empty());
        let timeout = self.count(
            &raw.ask_timeout_s,
            label,
            "ask_timeout_s",
            MAX_ASK_TIMEOUT_S,
        );
        let pending = self.count(
            &raw.max_pending_asks,
            label,
            "max_pending_asks",
            MAX_PENDING_ASKS,
        );
        let Some(endpoint) = endpoint else {
            for (key, given) in [
                ("ask_timeout_s", raw.ask_timeout_s.as_ref()),
                ("max_pending_asks", raw.max_pending_asks.as_ref()),
            ] {
                if let Some(v) = given {
                    self.error(
                        Some(v.span()),
                        label,
                        format!(
                            "{key} needs ask (where the questions go); set ask, or remove {key}"
                        ),
                    );
                }
            }
            return None;
        };
        let mut zero = |v: Option<&Spanned<i64>>, key: &str| {
            if let Some(v) = v {
                self.error(
                    Some(v.span()),
                    label,
                    format!("{key} = 0 would deny every question at once; give at least 1"),
                );
            }
        };
        if timeout == Some(0) {
            zero(raw.ask_timeout_s.as_ref(), "ask_timeout_s");
        }
        if pending == Some(0) {
            zero(raw.max_pending_asks.as_ref(), "max_pending_asks");
        }
        match AskEndpoint::parse(endpoint.get_ref()) {
            Ok(endpoint) => Some(Ask {
                endpoint,
                timeout: timeout
                    .filter(|&t| t > 0)
                    .map_or(DEFAULT_ASK_TIMEOUT, |t| Duration::from_secs(u64::from(t))),
                max_pending: pending
                    .filter(|&n| n > 0)
                    .unwrap_or(DEFAULT_MAX_PENDING_ASKS),
            }),
            Err(why) => {
                self.error(Some(endpoint.span()), label, why);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_on_this_host_and_admin_parse() {
        for (input, shown) in [
            ("admin", "admin"),
            ("unix:/run/ask.sock", "unix:/run/ask.sock"),
            ("http://127.0.0.1:9000/ask", "http://127.0.0.1:9000/ask"),
            ("http://localhost:9", "http://127.0.0.1:9/"),
        ] {
            let e = AskEndpoint::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(e.to_string(), shown, "{input}");
        }
    }

    #[test]
    fn endpoints_elsewhere_are_refused() {
        for bad in [
            "",
            "Admin",
            "unix:rel",
            "http://10.0.0.1/",
            "https://127.0.0.1/",
        ] {
            let e = AskEndpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains("must stay on this host"), "{bad}: {e}");
        }
    }
}
