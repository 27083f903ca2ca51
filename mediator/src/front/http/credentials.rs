//! HTTP proxy credentials on the shared TCP listener: `Proxy-Authorization: Basic
//! base64(authority:token)` (RFC 9110 section 11.7.2, RFC 7617), checked by
//! [`authenticate`]. A keep-alive connection remembers the value it verified, so a client
//! that repeats it on every request is not hashed again while that grant stays live.
//!
//! Exactly one `Proxy-Authorization` header is accepted; anything that is not Basic with
//! a `name:token` pair is a missing credential.

use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use http::header::{self, HeaderMap, HeaderValue};
use policy::config::Authority;

use crate::conn::Ctx;
use crate::conn::identify::{authenticate, missing_credential};
use crate::denial::Denial;
use crate::shared::Shared;

/// The name and token of a `Basic` credential, or `None` when `value` is not one.
pub(crate) fn parse_basic(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let encoded = value
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
        .and_then(|_| value.get(6..))?;
    let mut decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let token = decoded.split_off(colon + 1);
    decoded.truncate(colon);
    let name = String::from_utf8(decoded).ok()?;
    Some((name, token))
}

/// The authority bound to the channel (or the one a reload replaced it with), or named by
/// `Proxy-Authorization: Basic` on the shared TCP listener.
///
/// # Errors
/// The [`Denial`] of a missing, malformed, unknown or wrong credential (not yet logged).
pub(crate) fn authority_of(
    shared: &Shared,
    ctx: &Ctx,
    headers: &HeaderMap,
) -> Result<Arc<Authority>, Denial> {
    if let Some(a) = &ctx.authority {
        // A channel's connection opened before a reload re-created its authority is
        // decided under the successor (same channel); a revoked one keeps its old grant,
        // which `establish` then refuses.
        return Ok(shared
            .authorities
            .current_of(a)
            .map_or_else(|| Arc::clone(a), |live| Arc::clone(&live.authority)));
    }
    let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(missing());
    };
    let Some((name, token)) = parse_basic(value.as_bytes()) else {
        return Err(missing());
    };
    authenticate(shared, &name, &token)
}

fn missing() -> Denial {
    missing_credential(
        "this listener needs Proxy-Authorization: Basic base64(authority:token)",
        "send the authority name as proxy user and its token as password (curl --proxy-user NAME:TOKEN)",
    )
}

/// The credential last verified on a keep-alive TCP connection, and what it named.
#[derive(Debug, Default)]
pub(crate) struct Verified(Mutex<Option<(HeaderValue, Arc<Authority>)>>);

impl Verified {
    /// [`authority_of`], skipping the token hash when this connection already proved the very
    /// same `Proxy-Authorization` value for an authority whose grant is still live. A
    /// different value, or a revoked or replaced authority, is verified in full again.
    ///
    /// # Errors
    /// As [`authority_of`].
    pub(crate) fn authority_of(
        &self,
        shared: &Shared,
        ctx: &Ctx,
        headers: &HeaderMap,
    ) -> Result<Arc<Authority>, Denial> {
        if ctx.authority.is_some() {
            return authority_of(shared, ctx, headers);
        }
        let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return authority_of(shared, ctx, headers);
        };
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((known, authority)) = cache.as_ref()
            && known == value
            && shared.authorities.is_live(authority)
        {
            return Ok(Arc::clone(authority));
        }
        let result = authority_of(shared, ctx, headers);
        *cache = result.as_ref().ok().map(|a| (value.clone(), Arc::clone(a)));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials() {
        let enc = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let v = enc("agent-a:tok:en");
        let (name, token) = parse_basic(v.as_bytes()).unwrap();
        assert_eq!(
            (name.as_str(), token.as_slice()),
            ("agent-a", b"tok:en".as_slice())
        );
        assert!(parse_basic(enc("agent-a:").as_bytes()).is_some());
        for bad in [
            "Bearer abc".to_owned(),
            "Basic !!!".to_owned(),
            enc("no-colon"),
            "Basic".to_owned(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode([0xff, b':', b'x'])
            ),
        ] {
            assert!(parse_basic(bad.as_bytes()).is_none(), "{bad}");
        }
        assert!(
            parse_basic(b"bAsIc YTpi").is_some(),
            "the scheme is case-insensitive"
        );
    }
}
