//! Credentials held by the mediator (design section 14): loading each secret (from its
//! file, which must not be readable by others nor writable by its group or others, or
//! from the mediator's environment), adding
//! it to the terminated requests of its host ([`apply`], the one path of h1 and h2
//! requests), and refusing a request that carries one of its authority's placeholders
//! anywhere else: reason `credential_misuse`. Where it is looked for: the header values
//! and target of terminated requests ([`apply`]), of plain `http://` ones
//! ([`check_plain`]), their trailer fields ([`CheckedBody`]), and the host of every
//! target where it is decided ([`check_target`], CONNECT and SOCKS5 included). Bodies
//! and WebSocket frames are streamed and not looked into.
//!
//! No message built here quotes a secret: errors name the credential's source and
//! location, denials its header and host.

mod body;
mod load;
mod scan;

use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use policy::Target;
use policy::config::Authority;

use crate::decision_log::CredentialUse;
use crate::denial::Denial;

pub(crate) use body::CheckedBody;
pub(crate) use load::load_secrets;
use scan::{Found, Place, contains, find_placeholder, has_placeholders, misuse, refuse_found};
pub(crate) use scan::{Headers, percent_decode};

/// A request's credentials, judged for a terminated request of `authority` to `target`:
/// each credential of that host sets its header to its secret (replacing what the client
/// sent; with a placeholder, only where the client sent the placeholder), and a
/// placeholder anywhere else (another header, the target, a request to another host) is
/// refused. Returns the credentials used, for the request's log line.
///
/// # Errors
/// A `credential_misuse` denial naming the credential (never its secret).
pub(crate) fn apply(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &mut HeaderMap,
) -> Result<Vec<CredentialUse>, Denial> {
    let mut used = Vec::new();
    let mut set: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (i, c) in authority.credentials.iter().enumerate() {
        if !c.belongs_to(target) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(c.header().as_bytes()) else {
            continue;
        };
        let wanted = match c.placeholder() {
            None => true,
            Some(p) => headers
                .get_all(&name)
                .iter()
                .any(|v| contains(v.as_bytes(), p.as_bytes())),
        };
        if !wanted {
            continue;
        }
        // A credential without a loaded secret cannot occur (the loader refuses to start
        // without it); fail closed rather than send the placeholder on.
        let found = Found {
            index: i,
            credential: c,
            place: Place::Header(name.as_str().to_owned()),
            encoded: false,
        };
        if !c.has_secret() {
            return Err(misuse(
                authority,
                &found,
                target,
                "but its secret is not loaded",
            ));
        }
        let value = HeaderValue::from_bytes(&c.header_value()).map_err(|_| {
            misuse(
                authority,
                &found,
                target,
                "but its secret is not a header value",
            )
        })?;
        set.push((name, value));
        used.push(CredentialUse {
            header: c.header().to_owned(),
            host: c.host().to_owned(),
        });
    }
    for (name, mut value) in set {
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    // What is left may hold no placeholder: every one that was asked for is replaced.
    find_placeholder(authority, uri, headers).map_or(Ok(used), |found| {
        Err(misuse(authority, &found, target, &found.why(target)))
    })
}

/// A plain `http://` request of `authority` to `target`: it may carry none of the
/// authority's placeholders, not even to the credential's own host (a secret never
/// travels in clear text, so there it would be forwarded as it is).
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_plain(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Denial> {
    refuse_found(
        authority,
        find_placeholder(authority, uri, headers),
        target,
        " of a plain http:// request, where no secret is ever added",
    )
}

/// The target of a tunnel (`CONNECT host:port`, a SOCKS5 domain name) or of any request,
/// judged where it is decided and before its name is resolved: a host name that holds one
/// of `authority`'s placeholders (as a label under an allowed `*.` pattern, say) would
/// carry it to DNS resolvers and, as the TLS SNI, to whoever answers. The canonical host
/// is compared as the request-target check compares (as it is and percent-decoded),
/// ignoring ASCII case (host names are case-insensitive, RFC 4343).
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_target(authority: &Authority, target: &Target) -> Result<(), Denial> {
    if !has_placeholders(authority) {
        return Ok(());
    }
    let host = target.host.as_text().to_ascii_lowercase();
    let decoded = if host.contains('%') {
        percent_decode(host.as_bytes())
    } else {
        Vec::new()
    };
    for (index, credential) in authority.credentials.iter().enumerate() {
        let Some(p) = credential.placeholder() else {
            continue;
        };
        let p = p.to_ascii_lowercase();
        let raw = contains(host.as_bytes(), p.as_bytes());
        let encoded = !raw && decoded.iter().any(|d| contains(d, p.as_bytes()));
        if raw || encoded {
            let found = Found {
                index,
                credential,
                place: Place::Host,
                encoded,
            };
            return Err(misuse(
                authority,
                &found,
                target,
                "in the host name itself (refused before the name is resolved)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
