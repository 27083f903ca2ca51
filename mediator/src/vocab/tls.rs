//! The TLS alert vocabulary: [`TlsAlert`], made from the IANA "TLS Alerts" registry's
//! table, and how the client of a terminated tunnel ended a handshake it did not complete
//! ([`ClientTlsEnd`]: its string forms are made with the rest of the vocabulary's).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The TLS alerts (the IANA "TLS Alerts" registry: RFC 8446 section 6 and the RFCs it
/// names), each with its code and registry name; [`TlsAlert`] is made from this table.
macro_rules! tls_alerts {
    ($($(#[$doc:meta])* $variant:ident = $code:literal, $name:literal;)*) => {
        /// An alert a TLS peer sent (the `tls_alert` field of a close record: the alert the
        /// client of a terminated tunnel ended its handshake with). Its string form is the
        /// registry's name (`unknown_ca`); [`TlsAlert::code`] is the wire value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum TlsAlert {
            $($(#[$doc])* $variant,)*
        }

        impl TlsAlert {
            /// Every alert of the registry, in code order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The registry name (`unknown_ca`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The alert's code on the wire.
            pub fn code(self) -> u8 {
                match self {
                    $(Self::$variant => $code,)*
                }
            }

            /// The alert of `code`; `None` for a code the registry does not list.
            pub fn from_code(code: u8) -> Option<Self> {
                match code {
                    $($code => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

tls_alerts! {
    /// The peer is closing the connection.
    CloseNotify = 0, "close_notify";
    /// A message arrived that was not expected.
    UnexpectedMessage = 10, "unexpected_message";
    /// A record could not be deprotected.
    BadRecordMac = 20, "bad_record_mac";
    /// Reserved (TLS 1.0).
    DecryptionFailed = 21, "decryption_failed";
    /// A record was too long.
    RecordOverflow = 22, "record_overflow";
    /// Reserved (TLS 1.2 compression).
    DecompressionFailure = 30, "decompression_failure";
    /// No acceptable set of security parameters.
    HandshakeFailure = 40, "handshake_failure";
    /// Reserved (SSL 3.0).
    NoCertificate = 41, "no_certificate";
    /// A certificate was corrupt or its signatures did not verify.
    BadCertificate = 42, "bad_certificate";
    /// A certificate of a type the peer does not support.
    UnsupportedCertificate = 43, "unsupported_certificate";
    /// A certificate was revoked by its signer.
    CertificateRevoked = 44, "certificate_revoked";
    /// A certificate has expired or is not yet valid.
    CertificateExpired = 45, "certificate_expired";
    /// Some other problem with a certificate made it unacceptable.
    CertificateUnknown = 46, "certificate_unknown";
    /// A field was out of range or inconsistent.
    IllegalParameter = 47, "illegal_parameter";
    /// The certificate chain does not lead to a CA the peer trusts.
    UnknownCa = 48, "unknown_ca";
    /// Valid certificate, but access control refused the handshake.
    AccessDenied = 49, "access_denied";
    /// A message could not be decoded.
    DecodeError = 50, "decode_error";
    /// A handshake cryptographic operation failed (a signature, a Finished).
    DecryptError = 51, "decrypt_error";
    /// Reserved (export ciphers).
    ExportRestriction = 60, "export_restriction";
    /// The protocol version is recognised but not supported.
    ProtocolVersion = 70, "protocol_version";
    /// The server's parameters are weaker than the peer requires.
    InsufficientSecurity = 71, "insufficient_security";
    /// An error of the peer's own.
    InternalError = 80, "internal_error";
    /// A downgrade was attempted (RFC 7507).
    InappropriateFallback = 86, "inappropriate_fallback";
    /// The user cancelled the handshake.
    UserCanceled = 90, "user_canceled";
    /// Reserved (renegotiation).
    NoRenegotiation = 100, "no_renegotiation";
    /// A required extension is missing.
    MissingExtension = 109, "missing_extension";
    /// An extension the peer did not offer was sent.
    UnsupportedExtension = 110, "unsupported_extension";
    /// Reserved (certificate URLs, RFC 6066).
    CertificateUnobtainable = 111, "certificate_unobtainable";
    /// No server by the name the client indicated (SNI).
    UnrecognizedName = 112, "unrecognized_name";
    /// An invalid or unacceptable OCSP response.
    BadCertificateStatusResponse = 113, "bad_certificate_status_response";
    /// Reserved (certificate hashes, RFC 6066).
    BadCertificateHashValue = 114, "bad_certificate_hash_value";
    /// No acceptable PSK identity.
    UnknownPskIdentity = 115, "unknown_psk_identity";
    /// A certificate is required.
    CertificateRequired = 116, "certificate_required";
    /// No application protocol in common (ALPN, RFC 7301).
    NoApplicationProtocol = 120, "no_application_protocol";
    /// Encrypted ClientHello is required (RFC 9849).
    EchRequired = 121, "ech_required";
}

impl TlsAlert {
    /// Whether the alert refuses the certificate it was shown: its chain (`unknown_ca`), the
    /// certificate itself (`bad_certificate`, `certificate_unknown`, ...), or its status.
    /// A client of a terminated tunnel sends one when it does not trust the mediator's CA.
    pub fn rejects_certificate(self) -> bool {
        matches!(
            self,
            Self::BadCertificate
                | Self::UnsupportedCertificate
                | Self::CertificateRevoked
                | Self::CertificateExpired
                | Self::CertificateUnknown
                | Self::UnknownCa
                | Self::BadCertificateStatusResponse
        )
    }
}

/// How the client of a terminated tunnel ended a TLS handshake it did not complete (the
/// `client_tls` field of the tunnel's close record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientTlsEnd {
    /// It sent an alert that refuses the certificate the mediator presented (the
    /// record's `tls_alert` names it): it does not trust the mediator's CA.
    RejectedCertificate,
    /// It closed the connection once the mediator had presented its certificate, with
    /// no alert: what Node.js (npm, node) does with a certificate it does not trust.
    ClosedAfterCertificate,
    /// It sent another alert (`tls_alert` names it, when the registry lists it).
    Alert,
}

impl ClientTlsEnd {
    /// Every ending.
    pub const ALL: [Self; 3] = [
        Self::RejectedCertificate,
        Self::ClosedAfterCertificate,
        Self::Alert,
    ];

    /// The contract string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RejectedCertificate => "rejected_certificate",
            Self::ClosedAfterCertificate => "closed_after_certificate",
            Self::Alert => "alert",
        }
    }

    /// The ending of a client that sent `alert` (`None`: a code the registry does not
    /// list).
    pub fn of_alert(alert: Option<TlsAlert>) -> Self {
        match alert {
            Some(a) if a.rejects_certificate() => Self::RejectedCertificate,
            _ => Self::Alert,
        }
    }

    /// Whether the client refused the mediator's certificate.
    pub fn rejects_certificate(self) -> bool {
        match self {
            Self::RejectedCertificate | Self::ClosedAfterCertificate => true,
            Self::Alert => false,
        }
    }

    /// The first word of the close record's `detail`: [`CLIENT_REJECTED_CERTIFICATE`],
    /// or `client_tls_alert`.
    pub fn detail_word(self) -> &'static str {
        if self.rejects_certificate() {
            CLIENT_REJECTED_CERTIFICATE
        } else {
            "client_tls_alert"
        }
    }
}

/// The first word of a close record's `detail` (and of the admin API's entry) when the
/// client of a terminated tunnel refused the certificate the mediator presented.
pub const CLIENT_REJECTED_CERTIFICATE: &str = "client_rejected_certificate";

impl fmt::Display for TlsAlert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TlsAlert {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TlsAlert {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown TLS alert {s:?}")))
    }
}
