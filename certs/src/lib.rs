//! The egress mediator's certificate authority (design section 9).
//!
//! - [`Ca`]: create a CA (ECDSA P-256 by default), persist it in a directory (key file mode
//!   0600, written atomically), or load one from that directory (a CA of the operator's
//!   own may be placed there). A loaded CA is checked before use: the key file must not be
//!   readable by group or others, the certificate must be a CA within its validity period,
//!   and the key must be the certificate's key.
//! - [`Ca::issue`]: a short-lived leaf certificate for exactly one name ([`LeafName`]:
//!   one DNS name or one IP address, never a wildcard), for TLS server authentication.
//! - [`LeafCache`]: leaves ready for rustls, cached in an LRU bounded by count and renewed
//!   well before they expire.
//! - [`Ca::cert_pem`]: the CA certificate in PEM, for the trust stores of children.
//!
//! This crate never writes the private key anywhere but the CA directory, never logs it,
//! and never issues a certificate for more than one name. Cryptography is `ring`, through
//! rcgen and rustls.
#![forbid(unsafe_code)]

mod ca;
mod cache;
mod error;

pub use ca::{
    CA_CERT_FILE, CA_KEY_FILE, Ca, CaOptions, KeyAlgorithm, LEAF_VALIDITY, Leaf, LeafName,
};
pub use cache::LeafCache;
pub use error::Error;
