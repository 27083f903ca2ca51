//! `parent_auth = "negotiate"` (RFC 4559): SPNEGO tokens (RFC 4178) carrying Kerberos for
//! `Proxy-Authorization: Negotiate`, made with the host's Kerberos credentials through
//! GSSAPI (MIT krb5's library, loaded at run time by the `gss` crate).
//!
//! Credentials come from the configured credential store: `kerberos_ccache` (a ccache
//! name, `KRB5CCNAME` semantics) and `kerberos_keytab` (a client keytab,
//! `KRB5_CLIENT_KTNAME` semantics: initial credentials are obtained from it when the ccache
//! has none or only expired ones). Unset keys leave MIT's defaults (those variables, then
//! the default ccache). The parent's service name is `HTTP@<parent host>` (a host-based
//! service, RFC 2743 section 4.1), the host as configured: never canonicalised through DNS.
//!
//! GSSAPI calls may talk to the KDC (blocking I/O), so every call runs on the blocking
//! pool. Tokens are secrets: they are never logged, and error messages carry only the
//! library's status text.

use base64::Engine as _;
use gss::{Credential, Gssapi, Initiator, Usage};
use policy::CanonicalHost;
use policy::config::Kerberos;

/// The credential store keys of MIT krb5 (`gss_acquire_cred_from`, gssapi_ext.h).
const STORE_CCACHE: &str = "ccache";
const STORE_CLIENT_KEYTAB: &str = "client_keytab";

/// Why a Negotiate exchange (or its setup) failed. Tokens never appear: messages carry
/// only names and the library's status text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NegotiateError {
    /// The GSSAPI library cannot be loaded or lacks what the configuration needs.
    #[error(transparent)]
    Library(#[from] gss::Error),
    /// A configured client keytab cannot be read.
    #[error("kerberos_keytab {name}: {error}")]
    Keytab {
        /// The keytab as configured.
        name: String,
        /// Why it cannot be opened.
        error: std::io::Error,
    },
    /// No credentials could be acquired.
    #[error("no usable Kerberos credentials in {source_of}: {error}")]
    NoCredentials {
        /// Where they were looked for.
        source_of: String,
        /// The library's words.
        error: gss::Error,
    },
    /// The service name cannot be imported.
    #[error("bad service name {service}: {error}")]
    ServiceName {
        /// `HTTP@host`.
        service: String,
        /// The library's words.
        error: gss::Error,
    },
    /// No ticket for the service (none at the KDC, expired credentials, no KDC).
    #[error("cannot get a Kerberos ticket for {service} with {source_of}: {error}")]
    NoTicket {
        /// `HTTP@host`.
        service: String,
        /// The credentials used.
        source_of: String,
        /// The library's words.
        error: gss::Error,
    },
    /// The library made no first token.
    #[error("GSSAPI made no token for {0}")]
    NoToken(String),
    /// The parent's token does not verify.
    #[error("{0}")]
    Verify(gss::Error),
    /// The parent's token verified but left the context incomplete.
    #[error("the token did not complete the context")]
    Incomplete,
    /// The blocking task that calls the library failed.
    #[error("the Kerberos task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Makes Negotiate tokens with the configured Kerberos credentials.
#[derive(Debug, Clone)]
pub(crate) struct Negotiator {
    /// The GSSAPI library, loaded when this negotiator was made.
    gss: &'static Gssapi,
    /// `(key, value)` pairs of the credential store; empty: the library's defaults.
    store: Vec<(&'static str, String)>,
    /// What the credentials are, for messages: "kerberos_ccache FILE:/x", "the default
    /// ccache".
    source: String,
}

/// A context after its first token: the parent's answer may carry a token that completes
/// mutual authentication.
#[derive(Debug)]
pub(crate) struct Pending {
    ctx: Initiator,
}

impl Negotiator {
    /// A negotiator for `[upstream] kerberos_*`: loads the GSSAPI library
    /// (`gssapi_library`, else `libgssapi_krb5.so.2`) now, so that a start or `mediator
    /// check` with a Negotiate parent fails at once where it is missing.
    ///
    /// # Errors
    /// The library cannot be loaded (the message names the package that ships it), or a
    /// credential store is configured and the library has no `gss_acquire_cred_from`, or a
    /// configured keytab cannot be read.
    pub(crate) fn new(cfg: &Kerberos) -> Result<Self, NegotiateError> {
        let mut store = Vec::new();
        let mut shown = Vec::new();
        for (key, value, name) in [
            (STORE_CCACHE, &cfg.ccache, "kerberos_ccache"),
            (STORE_CLIENT_KEYTAB, &cfg.keytab, "kerberos_keytab"),
        ] {
            if let Some(v) = value {
                if key == STORE_CLIENT_KEYTAB {
                    keytab_exists(v)?;
                }
                store.push((key, v.clone()));
                shown.push(format!("{name} {v}"));
            }
        }
        let gss = Gssapi::load(cfg.library.as_deref())?;
        if !store.is_empty() && !gss.has_credential_store() {
            return Err(gss::Error::NoCredentialStore {
                library: gss.path().to_path_buf(),
            }
            .into());
        }
        let source = if shown.is_empty() {
            "the default Kerberos credentials (KRB5CCNAME, KRB5_CLIENT_KTNAME)".to_owned()
        } else {
            shown.join(", ")
        };
        Ok(Self { gss, store, source })
    }

    /// Which GSSAPI library was loaded, in words for the start and `mediator check`:
    /// `GSSAPI: loaded /usr/lib/x86_64-linux-gnu/libgssapi_krb5.so.2 (credential store:
    /// yes)`.
    pub(crate) fn describe_library(&self) -> String {
        format!(
            "GSSAPI: loaded {} (credential store: {})",
            self.gss.path().display(),
            if self.gss.has_credential_store() {
                "yes"
            } else {
                "no, gss_acquire_cred_from missing"
            }
        )
    }

    /// The first token for the parent on `host`, as a `Proxy-Authorization` value
    /// (`Negotiate <base64>`), and the context that checks the parent's answer.
    ///
    /// # Errors
    /// What failed, in the library's words (no credentials, expired credentials, no such
    /// service principal at the KDC, the KDC unreachable).
    pub(crate) async fn start(
        &self,
        host: &CanonicalHost,
    ) -> Result<(String, Pending), NegotiateError> {
        let this = self.clone();
        let service = format!("HTTP@{}", host.as_text());
        tokio::task::spawn_blocking(move || this.start_blocking(&service)).await?
    }

    fn start_blocking(&self, service: &str) -> Result<(String, Pending), NegotiateError> {
        let cred = self
            .credentials()
            .map_err(|error| NegotiateError::NoCredentials {
                source_of: self.source.clone(),
                error,
            })?;
        let target =
            self.gss
                .host_service(service)
                .map_err(|error| NegotiateError::ServiceName {
                    service: service.to_owned(),
                    error,
                })?;
        let mut ctx = self.gss.initiator(Some(cred), target);
        let token = ctx
            .step(None)
            .map_err(|error| NegotiateError::NoTicket {
                service: service.to_owned(),
                source_of: self.source.clone(),
                error,
            })?
            .ok_or_else(|| NegotiateError::NoToken(service.to_owned()))?;
        let value = format!(
            "Negotiate {}",
            base64::engine::general_purpose::STANDARD.encode(&token)
        );
        Ok((value, Pending { ctx }))
    }

    /// Acquires initiator credentials from the store (`gss_acquire_cred_from`), or the
    /// library's defaults when no store key is configured.
    fn credentials(&self) -> Result<Credential, gss::Error> {
        let store: Vec<(&str, &str)> = self.store.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.gss.credential(Usage::Initiate, &store)
    }
}

impl Pending {
    /// Completes the context with the parent's token (the `Negotiate <token>` of its 2xx
    /// answer, mutual authentication).
    ///
    /// # Errors
    /// The token does not verify, or leaves the context incomplete: the parent is not the
    /// service it was asked to be.
    pub(crate) async fn finish(self, token: Vec<u8>) -> Result<(), NegotiateError> {
        let mut ctx = self.ctx;
        tokio::task::spawn_blocking(move || {
            ctx.step(Some(&token)).map_err(NegotiateError::Verify)?;
            if ctx.is_complete() {
                Ok(())
            } else {
                Err(NegotiateError::Incomplete)
            }
        })
        .await?
    }
}

/// Checks that a `kerberos_keytab` of type `FILE` (or a plain path) exists and can be
/// read: a missing keytab would fail every Negotiate exchange, so the start (and
/// `mediator check`) refuses it. Other keytab types are left to GSSAPI.
///
/// # Errors
/// The keytab cannot be read.
fn keytab_exists(name: &str) -> Result<(), NegotiateError> {
    let path = match name.split_once(':') {
        Some(("FILE", path)) => path,
        Some((kind, _)) if !kind.contains('/') => return Ok(()),
        _ => name,
    };
    std::fs::File::open(path)
        .map(drop)
        .map_err(|error| NegotiateError::Keytab {
            name: name.to_owned(),
            error,
        })
}

/// The decoded token of a `Negotiate <base64>` challenge (the token as
/// `handshake::negotiate_in` gives it, without its OWS), `None` when it is not canonical
/// base64 (RFC 4648 section 4).
pub(crate) fn decode(token: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(token).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_from_config_and_messages() {
        let n = Negotiator::new(&Kerberos {
            ccache: Some("FILE:/tmp/none".into()),
            ..Kerberos::default()
        })
        .unwrap();
        assert_eq!(n.store.len(), 1);
        assert_eq!(n.source, "kerberos_ccache FILE:/tmp/none");
        let e = Negotiator::new(&Kerberos {
            keytab: Some("FILE:/nonexistent/client.keytab".into()),
            ..Kerberos::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("kerberos_keytab FILE:/nonexistent/client.keytab"),
            "{e}"
        );
        assert!(keytab_exists("/nonexistent/k.keytab").is_err());
        assert!(keytab_exists("MEMORY:k").is_ok());
        let d = Negotiator::new(&Kerberos::default()).unwrap();
        assert!(d.store.is_empty());
        assert_eq!(decode("YWJj"), Some(b"abc".to_vec()));
        assert_eq!(decode("not base64!"), None);
        // Not canonical base64: whitespace (the parser trims only OWS, before), no padding.
        for odd in ["YWJj\u{3000}", "\u{b}YWJj", "YWI"] {
            assert_eq!(decode(odd), None, "{odd:?}");
        }
    }
}
