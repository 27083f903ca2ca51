//! TLS failures in words an operator can act on. rustls and webpki name their errors by
//! variant (`InvalidCertificate(Other(OtherError(CaUsedAsEndEntity)))`); these functions
//! say what went wrong and, where it helps, what to check.

use std::io;

use rustls::{CertificateError, Error as TlsError};

/// What an I/O error of a TLS handshake means: the TLS error in words when it wraps one,
/// else the I/O error itself.
pub(crate) fn handshake_error(e: &io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<TlsError>())
    {
        Some(tls) => tls_error(tls),
        None => e.to_string(),
    }
}

/// A rustls error in words.
pub(crate) fn tls_error(e: &TlsError) -> String {
    match e {
        TlsError::InvalidCertificate(c) => format!("the server's certificate: {}", certificate(c)),
        TlsError::AlertReceived(alert) => {
            format!("the server refused the handshake (alert {alert:?})")
        }
        TlsError::NoCertificatesPresented => "the server presented no certificate".into(),
        TlsError::PeerIncompatible(why) => {
            format!(
                "the server has no protocol version or cipher suite in common with us ({why:?})"
            )
        }
        other => other.to_string(),
    }
}

fn certificate(c: &CertificateError) -> String {
    match c {
        CertificateError::UnknownIssuer => "it is signed by an issuer that is not trusted (not in \
            the system trust store nor in [tls] extra_ca_files)"
            .into(),
        CertificateError::Expired => "it has expired".into(),
        CertificateError::NotValidYet => "it is not valid yet (check the clocks)".into(),
        CertificateError::Revoked => "it has been revoked".into(),
        CertificateError::BadSignature => "its signature does not verify".into(),
        CertificateError::BadEncoding => "it is not a well-formed certificate".into(),
        CertificateError::NotValidForName => "it is not valid for the host name".into(),
        CertificateError::InvalidPurpose => {
            "it is not meant for TLS servers (extended key usage)".into()
        }
        CertificateError::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(w) => webpki_words(w),
            None => other.to_string(),
        },
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => {
            let names: Vec<&str> = presented.iter().map(|p| plain_name(p)).collect();
            format!(
                "it is not valid for the name {} (it is for {})",
                expected.to_str(),
                if names.is_empty() {
                    "no name".to_owned()
                } else {
                    names.join(", ")
                }
            )
        }
        // The other context variants already read well.
        other => other.to_string(),
    }
}

/// A certificate's subject name as webpki shows it (`DnsName("a.example")`,
/// `IpAddress(10.0.0.1)`), without the type name.
fn plain_name(shown: &str) -> &str {
    ["DnsName(", "IpAddress(", "URI("]
        .iter()
        .find_map(|kind| shown.strip_prefix(kind))
        .and_then(|rest| rest.strip_suffix(')'))
        .map_or(shown, |inner| inner.trim_matches('"'))
}

fn webpki_words(e: &webpki::Error) -> String {
    match e {
        webpki::Error::CaUsedAsEndEntity => {
            "it is a CA certificate, not a server's (a CA was configured as the server's own \
             certificate)"
                .into()
        }
        webpki::Error::EndEntityUsedAsCa => {
            "its chain uses a server certificate as if it were a CA".into()
        }
        webpki::Error::UnknownIssuer => "it is signed by an issuer that is not trusted".into(),
        webpki::Error::CertExpired { .. } => "it has expired".into(),
        webpki::Error::CertNotValidYet { .. } => "it is not valid yet (check the clocks)".into(),
        webpki::Error::CertNotValidForName(_) => "it is not valid for the host name".into(),
        webpki::Error::BadDer | webpki::Error::BadDerTime => {
            "it is not a well-formed certificate".into()
        }
        webpki::Error::PathLenConstraintViolated | webpki::Error::MaximumPathDepthExceeded => {
            "its chain is longer than its issuers allow".into()
        }
        webpki::Error::NameConstraintViolation => {
            "its issuer's name constraints do not allow this name".into()
        }
        webpki::Error::RequiredEkuNotFoundContext(_) => {
            "it is not meant for TLS servers (extended key usage)".into()
        }
        other => format!("it does not verify ({other:?})"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn certificate_errors_read_as_words() {
        let ca_as_leaf = TlsError::InvalidCertificate(CertificateError::Other(rustls::OtherError(
            Arc::new(webpki::Error::CaUsedAsEndEntity),
        )));
        let wrapped = io::Error::new(io::ErrorKind::InvalidData, ca_as_leaf);
        let text = handshake_error(&wrapped);
        assert!(text.contains("a CA certificate, not a server's"), "{text}");
        assert!(!text.contains("OtherError"), "{text}");
        let unknown = TlsError::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(tls_error(&unknown).contains("extra_ca_files"));
        assert_eq!(handshake_error(&io::Error::other("reset")), "reset");
        let other_name = TlsError::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("proxy.corp.test").unwrap(),
            presented: vec![
                "DnsName(\"other.corp.test\")".into(),
                "IpAddress(10.0.0.1)".into(),
            ],
        });
        assert_eq!(
            tls_error(&other_name),
            "the server's certificate: it is not valid for the name proxy.corp.test (it is for other.corp.test, 10.0.0.1)"
        );
    }
}
