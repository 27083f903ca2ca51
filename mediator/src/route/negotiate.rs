//! `parent_auth = "negotiate"` (RFC 4559): SPNEGO tokens (RFC 4178) carrying Kerberos for
//! `Proxy-Authorization: Negotiate`, made with the host's Kerberos credentials through
//! GSSAPI (MIT krb5, the `libgssapi` binding).
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

use std::ffi::CString;
use std::ptr;

use base64::Engine as _;
use libgssapi::context::{ClientCtx, CtxFlags};
use libgssapi::credential::Cred;
use libgssapi::error::{Error as GssError, MajorFlags};
use libgssapi::name::Name;
use libgssapi::oid::{GSS_MECH_SPNEGO, GSS_NT_HOSTBASED_SERVICE};
use policy::CanonicalHost;
use policy::config::Kerberos;

/// The credential store keys of MIT krb5 (`gss_acquire_cred_from`, gssapi_ext.h).
const STORE_CCACHE: &str = "ccache";
const STORE_CLIENT_KEYTAB: &str = "client_keytab";

/// Makes Negotiate tokens with the configured Kerberos credentials.
#[derive(Debug, Clone)]
pub(crate) struct Negotiator {
    /// `(key, value)` pairs of the credential store; empty: the library's defaults.
    store: Vec<(CString, CString)>,
    /// What the credentials are, for messages: "kerberos_ccache FILE:/x", "the default
    /// ccache".
    source: String,
}

/// A context after its first token: the parent's answer may carry a token that completes
/// mutual authentication.
pub(crate) struct Pending {
    ctx: ClientCtx,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl Negotiator {
    /// A negotiator for `[upstream] kerberos_*`.
    ///
    /// # Errors
    /// A message when a configured name holds a NUL byte (the validator refuses control
    /// characters, so this does not happen with a validated config).
    pub(crate) fn new(cfg: &Kerberos) -> Result<Self, String> {
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
                let c = CString::new(v.as_str()).map_err(|_| format!("{name} holds a NUL byte"))?;
                let k = CString::new(key).map_err(|_| format!("{key}: NUL"))?;
                store.push((k, c));
                shown.push(format!("{name} {v}"));
            }
        }
        let source = if shown.is_empty() {
            "the default Kerberos credentials (KRB5CCNAME, KRB5_CLIENT_KTNAME)".to_owned()
        } else {
            shown.join(", ")
        };
        Ok(Self { store, source })
    }

    /// The first token for the parent on `host`, as a `Proxy-Authorization` value
    /// (`Negotiate <base64>`), and the context that checks the parent's answer.
    ///
    /// # Errors
    /// What failed, in the library's words (no credentials, expired credentials, no such
    /// service principal at the KDC, the KDC unreachable).
    pub(crate) async fn start(&self, host: &CanonicalHost) -> Result<(String, Pending), String> {
        let this = self.clone();
        let service = format!("HTTP@{}", host.as_text());
        tokio::task::spawn_blocking(move || this.start_blocking(&service))
            .await
            .map_err(|e| format!("the Kerberos task failed: {e}"))?
    }

    fn start_blocking(&self, service: &str) -> Result<(String, Pending), String> {
        let cred = self.credentials().map_err(|e| {
            format!(
                "no usable Kerberos credentials in {}: {}",
                self.source,
                words(&e)
            )
        })?;
        let target = Name::new(service.as_bytes(), Some(GSS_NT_HOSTBASED_SERVICE))
            .map_err(|e| format!("bad service name {service}: {}", words(&e)))?;
        let mut ctx = ClientCtx::new(
            Some(cred),
            target,
            CtxFlags::GSS_C_MUTUAL_FLAG,
            Some(GSS_MECH_SPNEGO),
        );
        let token = ctx
            .step(None, None)
            .map_err(|e| {
                format!(
                    "cannot get a Kerberos ticket for {service} with {}: {}",
                    self.source,
                    words(&e)
                )
            })?
            .ok_or_else(|| format!("GSSAPI made no token for {service}"))?;
        let value = format!(
            "Negotiate {}",
            base64::engine::general_purpose::STANDARD.encode(&*token)
        );
        Ok((value, Pending { ctx }))
    }

    /// Acquires initiator credentials from the store (`gss_acquire_cred_from`), or the
    /// library's defaults when no store key is configured.
    fn credentials(&self) -> Result<Cred, GssError> {
        if self.store.is_empty() {
            return Cred::acquire(None, None, libgssapi::credential::CredUsage::Initiate, None);
        }
        acquire_from(&self.store)
    }
}

impl Pending {
    /// Completes the context with the parent's token (the `Negotiate <token>` of its 2xx
    /// answer, mutual authentication).
    ///
    /// # Errors
    /// The token does not verify: the parent is not the service it was asked to be.
    pub(crate) async fn finish(self, token: Vec<u8>) -> Result<(), String> {
        let mut ctx = self.ctx;
        tokio::task::spawn_blocking(move || {
            ctx.step(Some(&token), None)
                .map(drop)
                .map_err(|e| words(&e))
        })
        .await
        .map_err(|e| format!("the Kerberos task failed: {e}"))?
    }
}

/// Checks that a `kerberos_keytab` of type `FILE` (or a plain path) exists and can be
/// read: a missing keytab would fail every Negotiate exchange, so the start (and
/// `mediator check`) refuses it. Other keytab types are left to GSSAPI.
///
/// # Errors
/// The keytab cannot be read.
fn keytab_exists(name: &str) -> Result<(), String> {
    let path = match name.split_once(':') {
        Some(("FILE", path)) => path,
        Some((kind, _)) if !kind.contains('/') => return Ok(()),
        _ => name,
    };
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| format!("kerberos_keytab {name}: {e}"))
}

/// The decoded token of a `Negotiate <base64>` challenge (the token as
/// `parent::negotiate_in` gives it, without its OWS), `None` when it is not canonical
/// base64 (RFC 4648 section 4).
pub(crate) fn decode(token: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(token).ok()
}

/// A GSSAPI error in the library's words, on one line.
fn words(e: &GssError) -> String {
    let text = e.to_string();
    let text: String = text
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        format!("GSSAPI error {:#x}/{}", e.major.bits(), e.minor)
    } else {
        text
    }
}

/// `gss_acquire_cred_from` with `store` for initiating, default name, indefinite lifetime.
#[allow(unsafe_code)] // one FFI call; libgssapi has no safe wrapper for credential stores
fn acquire_from(store: &[(CString, CString)]) -> Result<Cred, GssError> {
    use libgssapi_sys::{
        _GSS_C_INDEFINITE, GSS_C_INITIATE, GSS_S_COMPLETE, OM_uint32, gss_OID_set,
        gss_acquire_cred_from, gss_cred_id_t, gss_cred_usage_t, gss_key_value_element_desc,
        gss_key_value_set_desc,
    };
    let elements: Vec<gss_key_value_element_desc> = store
        .iter()
        .map(|(k, v)| gss_key_value_element_desc {
            key: k.as_ptr(),
            value: v.as_ptr(),
        })
        .collect();
    let set = gss_key_value_set_desc {
        // At most two elements.
        count: u32::try_from(elements.len()).unwrap_or(0),
        elements: elements.as_ptr().cast_mut(),
    };
    let mut minor: OM_uint32 = GSS_S_COMPLETE;
    let mut cred: gss_cred_id_t = ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `set` and `elements` (and the CStrings
    // they point into, owned by `store`) outlive it; the name and mechanism set are null
    // (default name, default mechanisms), as are the optional outputs; `cred` receives a
    // new handle that `Cred::from_c` takes ownership of (released on drop).
    let major = unsafe {
        gss_acquire_cred_from(
            &mut minor,
            ptr::null_mut(),
            _GSS_C_INDEFINITE,
            ptr::null_mut(),
            GSS_C_INITIATE as gss_cred_usage_t,
            &set,
            &mut cred,
            ptr::null_mut::<gss_OID_set>(),
            ptr::null_mut(),
        )
    };
    if major == GSS_S_COMPLETE {
        // SAFETY: `cred` is the handle gss_acquire_cred_from just returned, owned by no one
        // else.
        Ok(unsafe { Cred::from_c(cred) })
    } else {
        Err(GssError {
            major: MajorFlags::from_bits_retain(major),
            minor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_from_config_and_messages() {
        let n = Negotiator::new(&Kerberos {
            ccache: Some("FILE:/tmp/none".into()),
            keytab: None,
        })
        .unwrap();
        assert_eq!(n.store.len(), 1);
        assert_eq!(n.source, "kerberos_ccache FILE:/tmp/none");
        let e = Negotiator::new(&Kerberos {
            ccache: None,
            keytab: Some("FILE:/nonexistent/client.keytab".into()),
        })
        .unwrap_err();
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
