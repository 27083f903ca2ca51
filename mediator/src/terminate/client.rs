//! The client's leg of a terminated tunnel: the ClientHello (replaying the bytes the SNI
//! gate already read), the one SNI rule, and the handshake with a certificate for exactly
//! the tunnel host. Counts the bytes of the leg for the close record.

use std::sync::Arc;

use policy::{Target, check_sni};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use crate::conn::close::Opened;
use crate::conn::{TargetLabel, record};
use crate::counting::{Counters, Counting};
use crate::denial::{Cause, Denial};
use crate::relay::{RelayOutcome, hung_up};
use crate::rewind::Rewind;
use crate::shared::Shared;
use crate::tap::Tapped;
use crate::tls::{ALPN, TlsState};
use crate::vocab::{ClientTlsEnd, CloseReason, TlsAlert};

/// The client's connection before its handshake, counted.
pub(super) struct Leg<C> {
    counting: Counting<Rewind<C>>,
}

/// The byte counts of the client's leg, readable after the stream moved on.
pub(super) struct Bytes(Counters);

impl Bytes {
    /// `(up, down)` so far: what the client sent, what it was sent.
    pub(super) fn moved(&self) -> (u64, u64) {
        let (written, read) = self.0.get();
        (read, written)
    }

    /// The tunnel's outcome with these counts: up is what the client sent (read), down
    /// what it was sent (written).
    pub(super) fn outcome(&self, close_reason: CloseReason) -> RelayOutcome {
        let (written, read) = self.0.get();
        RelayOutcome {
            up: read,
            down: written,
            close_reason,
        }
    }
}

/// Why the client's leg did not come up: how the tunnel ends, the decision line to write
/// (the SNI rule refused it), and how the client ended its handshake (with the alert it
/// sent).
pub(super) struct Refused {
    pub(super) reason: CloseReason,
    pub(super) denial: Option<Denial>,
    pub(super) ending: Option<(ClientTlsEnd, Option<TlsAlert>)>,
}

impl Refused {
    fn ended(reason: CloseReason) -> Self {
        Self {
            reason,
            denial: None,
            ending: None,
        }
    }
}

/// The tunnel whose client's leg did not come up ends: the SNI rule's denial is logged,
/// the alert the client sent is said in the close record, which is written with the
/// leg's `bytes`.
pub(super) fn ended(
    shared: &Shared,
    mut opened: Opened,
    bytes: &Bytes,
    refused: Refused,
    target: &Target,
) {
    if let Some(denial) = refused.denial {
        let label = TargetLabel::from(target);
        record::deny(shared, opened.ctx(), opened.protocol(), &label, denial);
    }
    if let Some((end, alert)) = refused.ending {
        opened.client_ended(end, alert, ending_detail(end, alert, target));
    }
    opened.finish(bytes.outcome(refused.reason));
}

/// How the client ended the handshake that failed with `e`: with an alert (rustls'
/// `AlertReceived`, inside the I/O error tokio-rustls returns), or by closing (or
/// resetting) the connection once the mediator had `presented` its certificate. `None`
/// for any other failure.
fn ending_of(e: &std::io::Error, presented: bool) -> Option<(ClientTlsEnd, Option<TlsAlert>)> {
    if let Some(rustls::Error::AlertReceived(d)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        let alert = TlsAlert::from_code(u8::from(*d));
        return Some((ClientTlsEnd::of_alert(alert), alert));
    }
    let closed = e.kind() == std::io::ErrorKind::UnexpectedEof || hung_up(e.kind());
    (presented && closed).then_some((ClientTlsEnd::ClosedAfterCertificate, None))
}

/// The close record's `detail` for a client that ended the handshake (`end`, with
/// `alert`), the tunnel being to `target`.
fn ending_detail(end: ClientTlsEnd, alert: Option<TlsAlert>, target: &Target) -> String {
    let word = end.detail_word();
    let give = "give the client that CA (`mediator ca-cert`, the shim's --ca-cert)";
    match (end, alert) {
        (ClientTlsEnd::RejectedCertificate, Some(alert)) => format!(
            "{word}: the client ended the TLS handshake with the alert {alert}: it does not trust the certificate the mediator presented for {}, issued by the mediator's CA; {give}",
            target.host
        ),
        (ClientTlsEnd::ClosedAfterCertificate, _) => format!(
            "{word}: the client closed the connection during the TLS handshake, once the mediator had presented its certificate for {}, without an alert (as Node.js does, npm included, when it does not trust the certificate's CA); {give}",
            target.host
        ),
        (_, Some(alert)) => {
            format!("{word}: the client ended the TLS handshake with the alert {alert}")
        }
        (_, None) => format!(
            "{word}: the client ended the TLS handshake with an alert the IANA registry does not list"
        ),
    }
}

impl<C> Leg<C>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// The client's connection, `prefix` (the bytes already read) replayed first.
    pub(super) fn new(client: C, prefix: Vec<u8>) -> Self {
        Self {
            counting: Tapped::new(Rewind::new(prefix, client), Counters::default()),
        }
    }

    /// Its byte counts.
    pub(super) fn bytes(&self) -> Bytes {
        Bytes(self.counting.counters())
    }

    /// Reads the ClientHello, applies the one SNI rule, and completes the handshake with
    /// `leaf`, each within the request-head timeout.
    ///
    /// # Errors
    /// [`Refused`]: a ClientHello that is not one, a silent client, an SNI the rule
    /// refuses (with its denial), a failed handshake (typically a client that does not
    /// trust the mediator's CA; said at the info level, where an operator looks).
    pub(super) async fn accept(
        self,
        tls: &TlsState,
        leaf: Arc<CertifiedKey>,
        target: &Target,
        shared: &Shared,
    ) -> Result<TlsStream<Counting<Rewind<C>>>, Refused> {
        let wait = shared.timeouts.request_head;
        let counters = self.counting.counters();
        let start = match tokio::time::timeout(
            wait,
            LazyConfigAcceptor::new(Acceptor::default(), self.counting),
        )
        .await
        {
            Ok(Ok(start)) => start,
            Ok(Err(e)) => {
                tracing::debug!("terminated tunnel to {target}: client hello: {e}");
                return Err(Refused::ended(CloseReason::Error));
            }
            Err(_) => return Err(Refused::ended(CloseReason::IdleTimeout)),
        };
        // The one SNI rule, as the tunnel's gate applies it.
        let hello = start.client_hello();
        let names: Vec<&str> = hello.server_name().into_iter().collect();
        if let Err(why) = check_sni(&names, target) {
            return Err(Refused {
                reason: CloseReason::SniMismatch,
                denial: Some(
                    Denial::sni_mismatch(why.to_string(), target).with_cause(Cause::AfterReply),
                ),
                ending: None,
            });
        }
        let config = server_config(tls, leaf).map_err(|e| {
            tracing::error!("TLS server configuration: {e}");
            Refused::ended(CloseReason::Error)
        })?;
        match tokio::time::timeout(wait, start.into_stream(config)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => {
                tracing::info!(
                    "terminated tunnel to {target}: client TLS handshake failed (does the client trust the mediator CA?): {e}"
                );
                // Something was written to the client: the mediator's first flight, with
                // its certificate.
                let presented = counters.get().0 > 0;
                Err(Refused {
                    ending: ending_of(&e, presented),
                    ..Refused::ended(CloseReason::Error)
                })
            }
            Err(_) => Err(Refused::ended(CloseReason::IdleTimeout)),
        }
    }
}

/// Serves exactly one certificate: the leaf for the tunnel host.
#[derive(Debug)]
struct OneLeaf(Arc<CertifiedKey>);

impl ResolvesServerCert for OneLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

/// The server configuration of one tunnel: its leaf only, the ALPN the mediator speaks.
fn server_config(
    tls: &TlsState,
    leaf: Arc<CertifiedKey>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&tls.provider))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneLeaf(leaf)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::*;

    fn alert(d: rustls::AlertDescription) -> Error {
        Error::new(ErrorKind::InvalidData, rustls::Error::AlertReceived(d))
    }

    #[test]
    fn a_handshake_error_says_how_the_client_ended_it() {
        use rustls::AlertDescription as A;
        assert_eq!(
            ending_of(&alert(A::UnknownCA), true),
            Some((ClientTlsEnd::RejectedCertificate, Some(TlsAlert::UnknownCa)))
        );
        assert_eq!(
            ending_of(&alert(A::ProtocolVersion), false),
            Some((ClientTlsEnd::Alert, Some(TlsAlert::ProtocolVersion)))
        );
        // Node.js: the connection ends once the certificate was presented, no alert.
        for kind in [ErrorKind::UnexpectedEof, ErrorKind::ConnectionReset] {
            assert_eq!(
                ending_of(&Error::from(kind), true),
                Some((ClientTlsEnd::ClosedAfterCertificate, None))
            );
            // Before the mediator wrote anything, a hang-up says nothing of its certificate.
            assert_eq!(ending_of(&Error::from(kind), false), None);
        }
        assert_eq!(ending_of(&Error::from(ErrorKind::InvalidData), true), None);
    }

    #[test]
    fn the_detail_says_what_to_do_when_the_certificate_was_refused() {
        let target = policy::parse_authority_form("registry.test:443").unwrap();
        let detail = |end, alert| ending_detail(end, alert, &target);
        let closed = detail(ClientTlsEnd::ClosedAfterCertificate, None);
        assert!(
            closed.starts_with("client_rejected_certificate: the client closed the connection")
                && closed.contains("registry.test")
                && closed.contains("mediator ca-cert"),
            "{closed}"
        );
        let refused = detail(ClientTlsEnd::RejectedCertificate, Some(TlsAlert::UnknownCa));
        assert!(
            refused.starts_with("client_rejected_certificate: the client ended the TLS handshake with the alert unknown_ca"),
            "{refused}"
        );
        let other = detail(ClientTlsEnd::Alert, Some(TlsAlert::ProtocolVersion));
        assert_eq!(
            other,
            "client_tls_alert: the client ended the TLS handshake with the alert protocol_version"
        );
        let unlisted = detail(ClientTlsEnd::Alert, None);
        assert!(unlisted.starts_with("client_tls_alert: "), "{unlisted}");
    }
}
