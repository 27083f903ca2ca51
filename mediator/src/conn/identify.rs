//! Which authority a connection belongs to (design section 5). A Unix socket *is* its
//! authority (the accept loop attributes the connection and records `SO_PEERCRED`); on the
//! shared TCP listener a credential names it: the front-ends extract the name and token
//! (HTTP `Proxy-Authorization: Basic`, SOCKS5 RFC 1929) and [`authenticate`] checks them.
//!
//! It must never tell an authority it did not verify: the token is hashed with SHA-256 and
//! compared with the stored hash in constant time, and a failed attempt is attributed only
//! to a configured name (for the log), never to the connection. Nor may it tell a client
//! which names exist: every rejected credential is answered alike (`Cause::CredentialRejected`,
//! see `Denial::public`); only the decision log says which case it was.

use std::sync::Arc;

use policy::Reason;
use policy::config::Authority;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::denial::{Cause, Denial};
use crate::redact::escape_raw;
use crate::shared::Shared;

/// The authority named `name` whose token is `token`.
///
/// # Errors
/// `unknown_authority` when no such authority exists (or it has no token), and
/// `bad_credential` when the token does not match; a configured name is recorded in
/// [`Denial::claimed_authority`].
pub(crate) fn authenticate(
    shared: &Shared,
    name: &str,
    token: &[u8],
) -> Result<Arc<Authority>, Denial> {
    let digest: [u8; 32] = Sha256::digest(token).into();
    let Some(auth) = shared
        .authorities
        .get(name)
        .map(|l| Arc::clone(&l.authority))
    else {
        // Compare anyway so that timing does not reveal which names exist.
        let _ = digest.ct_eq(&[0u8; 32]);
        return Err(Denial::new(
            Reason::UnknownAuthority,
            format!(
                "the credential names \"{}\", which is not an authority",
                escape_raw(name.as_bytes())
            ),
            "use the authority name your security team configured as the proxy user name",
        )
        .with_cause(Cause::CredentialRejected));
    };
    let claimed = Some(auth.grant.name().to_owned());
    let Some(stored) = auth.token_sha256 else {
        return Err(Denial::new(
            Reason::UnknownAuthority,
            format!(
                "authority \"{}\" has no token and cannot use the TCP listener",
                auth.grant.name()
            ),
            "use the authority's Unix socket, or configure token_sha256 for it",
        )
        .with_cause(Cause::CredentialRejected)
        .claiming(claimed));
    };
    if bool::from(digest.ct_eq(&stored)) {
        Ok(auth)
    } else {
        Err(Denial::new(
            Reason::BadCredential,
            "wrong token for this authority",
            "check the proxy password (the token whose SHA-256 is configured)",
        )
        .with_cause(Cause::CredentialRejected)
        .claiming(claimed))
    }
}

/// A missing or malformed credential on the shared TCP listener.
pub(crate) fn missing_credential(how: &'static str, hint: &'static str) -> Denial {
    Denial::new(Reason::BadCredential, how, hint).with_cause(Cause::CredentialRejected)
}

/// A connection attributed to an authority that was revoked (or replaced by a new
/// generation) since: it takes no new decision (design section 5).
pub(crate) fn revoked(name: &str) -> Denial {
    Denial::new(
        Reason::UnknownAuthority,
        format!("authority \"{name}\" was revoked or replaced after this connection was opened"),
        "open a new connection; if the authority was revoked, ask an operator",
    )
}
