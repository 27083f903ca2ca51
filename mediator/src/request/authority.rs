//! The tunnel host rule of a terminated request (RFC 9110 sections 7.2 and 7.4): its
//! `Host` and `:authority` (or absolute-form authority) must name the tunnel's host and
//! port, else the request is misdirected (`421`). Pure: no I/O.

use std::sync::OnceLock;

use http::Uri;
use http::header::{self, HeaderMap};
use policy::{Target, canonicalize_host, parse_authority_form};

use crate::redact::escape_raw;

/// Why a request is not for the tunnel host (the detail of its `421`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthorityError {
    #[error("more than one Host header")]
    TwoHosts,
    #[error("the Host header is not ASCII")]
    NotAscii,
    #[error("the request names no host (no Host header, no :authority)")]
    NoHost,
    #[error(
        "the request names {shown}, which is not a host with an optional port (RFC 9110 section 7.2), in a tunnel to {target}"
    )]
    Malformed { shown: String, target: Target },
    #[error("the request is for {shown}, but this tunnel is to {target}")]
    Other { shown: String, target: Target },
}

/// The `Host` or `:authority` value found to name one tunnel's target first: a client
/// names it alike on every request, and [`check_authority`] then checks it once (whether
/// a value names the target depends on the two alone).
#[derive(Debug, Default)]
pub(crate) struct Matched(OnceLock<Box<str>>);

/// Every request's `Host` and `:authority` (or absolute-form authority) must name the
/// tunnel host and port (RFC 9110 sections 7.2 and 7.4: else `421`). At least one must be
/// present; more than one `Host` header is refused. `matched` is the tunnel's: always
/// the same `target`.
pub(crate) fn check_authority(
    uri: &Uri,
    headers: &HeaderMap,
    target: &Target,
    matched: &Matched,
) -> Result<(), AuthorityError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(AuthorityError::TwoHosts);
    }
    let uri_authority = uri.authority().map(http::uri::Authority::as_str);
    let host = match host {
        Some(v) => Some(v.to_str().map_err(|_| AuthorityError::NotAscii)?),
        None => None,
    };
    if host.is_none() && uri_authority.is_none() {
        return Err(AuthorityError::NoHost);
    }
    for value in [uri_authority, host].into_iter().flatten() {
        if matched.0.get().is_some_and(|m| **m == *value) {
            continue;
        }
        authority_matches(value, target)?;
        // Only the first is kept; another is checked each time.
        let _ = matched.0.set(value.into());
    }
    Ok(())
}

/// Whether `value` (`host`, `host:port`, `[v6]:port`) is the tunnel target. A missing port
/// means 443, the default port of `https` (RFC 9110 section 4.2.2); a port that is there
/// must be one (`host:`, `host:https`, `host:65536` are malformed, never port 443), as in
/// a CONNECT target.
fn authority_matches(value: &str, target: &Target) -> Result<(), AuthorityError> {
    let shown = || escape_raw(value.as_bytes());
    let malformed = || AuthorityError::Malformed {
        shown: shown(),
        target: target.clone(),
    };
    if value.contains('@') {
        return Err(malformed());
    }
    let authority: http::uri::Authority = value.parse().map_err(|_| malformed())?;
    let host = authority.host();
    let named = if authority.as_str() == host {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        canonicalize_host(host).map(|host| Target { host, port: 443 })
    } else {
        parse_authority_form(authority.as_str())
    };
    match named {
        Ok(named) if named == *target => Ok(()),
        Ok(_) => Err(AuthorityError::Other {
            shown: shown(),
            target: target.clone(),
        }),
        Err(_) => Err(malformed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::target;

    fn request(uri: &str, hosts: &[&str]) -> http::Request<()> {
        let mut b = http::Request::builder().uri(uri);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap()
    }

    fn check(req: &http::Request<()>, target: &Target) -> Result<(), AuthorityError> {
        check_authority(req.uri(), req.headers(), target, &Matched::default())
    }

    #[test]
    fn the_host_and_authority_must_name_the_tunnel_host_and_port() {
        let t = target("api.example.com:443");
        for ok in ["api.example.com", "API.example.com.", "api.example.com:443"] {
            assert_eq!(authority_matches(ok, &t), Ok(()), "{ok}");
        }
        // A port that is there must be one; userinfo is no host.
        let elsewhere = "but this tunnel is to api.example.com:443";
        let malformed = "not a host with an optional port";
        for (refused, why) in [
            ("api.example.com:8443", elsewhere),
            ("evil.example.com", elsewhere),
            ("example.com:443", elsewhere),
            ("api.example.com:", malformed),
            ("api.example.com:https", malformed),
            ("api.example.com:65536", malformed),
            ("u@api.example.com", malformed),
            ("api example", malformed),
        ] {
            let e = authority_matches(refused, &t).unwrap_err().to_string();
            assert!(e.contains(why), "{refused}: {e}");
        }
        let v6 = target("[2001:db8::1]:443");
        assert_eq!(authority_matches("[2001:db8::1]", &v6), Ok(()));
        assert_eq!(authority_matches("[2001:db8::1]:443", &v6), Ok(()));
    }

    #[test]
    fn one_host_header_or_an_authority_is_required_and_each_must_match() {
        let t = target("api.example.com:443");
        assert_eq!(check(&request("/x", &["api.example.com"]), &t), Ok(()));
        assert_eq!(
            check(&request("https://api.example.com/x", &[]), &t),
            Ok(())
        );
        let e = check(&request("/x", &[]), &t).unwrap_err().to_string();
        assert!(e.contains("names no host"), "{e}");
        let e = check(&request("/x", &["api.example.com", "api.example.com"]), &t)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "more than one Host header");
        // Both are judged: a matching Host does not excuse another :authority.
        let e = check(
            &request("https://evil.example.com/x", &["api.example.com"]),
            &t,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("evil.example.com"), "{e}");
    }

    /// A tunnel's requests checked with its one `Matched` are judged as each alone.
    #[test]
    fn a_matched_value_changes_no_answer() {
        let t = target("api.example.com:443");
        let matched = Matched::default();
        let requests = [
            request("/x", &["api.example.com"]),
            request("/x", &["API.example.com."]),
            request("/x", &["evil.example.com"]),
            request("/x", &[]),
            request("/x", &["api.example.com", "api.example.com"]),
            request("https://evil.example.com/x", &["api.example.com"]),
            request("https://api.example.com/x", &["api.example.com:8443"]),
            request("https://api.example.com/x", &[]),
            request("/x", &["api.example.com:"]),
        ];
        for _ in 0..2 {
            for req in &requests {
                assert_eq!(
                    check_authority(req.uri(), req.headers(), &t, &matched),
                    check(req, &t),
                    "{req:?}"
                );
            }
        }
        assert_eq!(matched.0.get().map(|m| &**m), Some("api.example.com"));
    }
}
