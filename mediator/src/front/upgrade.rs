//! Upgrades inside a terminated tunnel (RFC 9110 section 7.8): HTTP/1.1 `Upgrade:
//! websocket` (RFC 6455 section 4). The upgrade request is judged like any request by
//! `super::tls` (host, request rules, credentials); this file says which upgrades are
//! relayed, puts the upgrade back on the rebuilt request and response (they are
//! hop-by-hop), and relays the upgraded bytes both ways with the relay's accounting, idle
//! timeout and cut, ending in the upgrade's own close record (`protocol: "tls"`,
//! `upgrade: "websocket"`).
//!
//! Any other token (`h2c`, `TLS/1.2`, ...) is refused: the mediator cannot judge what
//! would flow after it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::Version;
use http::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::conn::record;
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::decision_log::UpgradeKind;
use crate::relay::{RelayOutcome, relay_streams};
use crate::shared::Shared;
use crate::vocab::CloseReason;

/// The upgrade a request asks for: `Ok(None)` for none, `Ok(Some(_))` for one the
/// mediator relays.
///
/// # Errors
/// A detail for the denial: an upgrade token other than `websocket`, several tokens, or
/// an `Upgrade` without `Connection: upgrade` or outside HTTP/1.1.
pub(crate) fn requested(
    headers: &HeaderMap,
    version: Version,
) -> Result<Option<UpgradeKind>, String> {
    let values: Vec<&HeaderValue> = headers.get_all(header::UPGRADE).iter().collect();
    if values.is_empty() {
        return Ok(None);
    }
    let tokens: Vec<String> = values
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        // OWS is spaces and tabs (RFC 9110 section 5.6.3): never other Unicode whitespace.
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).into_owned())
        .filter(|t| !t.is_empty())
        .collect();
    let shown = crate::redact::escape_raw(tokens.join(", ").as_bytes());
    if version != Version::HTTP_11 {
        return Err(format!(
            "Upgrade: {shown} in an {version:?} request: upgrades are HTTP/1.1 only"
        ));
    }
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    match tokens.as_slice() {
        [one] if one.eq_ignore_ascii_case("websocket") && connection_upgrade => {
            Ok(Some(UpgradeKind::Websocket))
        }
        [one] if one.eq_ignore_ascii_case("websocket") => {
            Err("Upgrade: websocket without Connection: upgrade (RFC 9110 section 7.8)".into())
        }
        _ => Err(format!(
            "Upgrade: {shown} is not relayed through TLS termination; only websocket (RFC 6455) is"
        )),
    }
}

/// Puts the upgrade back on a rebuilt request or response (`Connection` and `Upgrade` are
/// hop-by-hop, so the rebuild removed them).
pub(crate) fn restore(headers: &mut HeaderMap, kind: UpgradeKind) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(kind.token()));
}

/// What the upgrade's close record repeats of the tunnel and the request.
pub(crate) struct Upgraded {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ctx: Ctx,
    pub(crate) label: TargetLabel,
    pub(crate) request: RequestLine,
    /// The decision id of the upgrade request's line.
    pub(crate) id: u64,
    pub(crate) kind: UpgradeKind,
    pub(crate) pin: SocketAddr,
    pub(crate) route: String,
}

/// Waits for both sides to complete the upgrade, relays until either ends, the idle
/// timeout passes or `closing` is cancelled, and writes the close record: bytes up and
/// down are the upgraded protocol's bytes (inside TLS).
pub(crate) async fn relay(
    client: OnUpgrade,
    upstream: OnUpgrade,
    facts: Upgraded,
    closing: CancellationToken,
) -> RelayOutcome {
    let started = Instant::now();
    let (client, upstream) = tokio::join!(client, upstream);
    let outcome = match (client, upstream) {
        (Ok(c), Ok(u)) => {
            relay_streams(
                TokioIo::new(c),
                TokioIo::new(u),
                facts.shared.timeouts.idle_tunnel,
                closing,
            )
            .await
        }
        (c, u) => {
            tracing::debug!(
                "upgrade to {}: client {:?}, upstream {:?}",
                facts.label.host.as_deref().unwrap_or("?"),
                c.err(),
                u.err()
            );
            RelayOutcome::ended(CloseReason::Error)
        }
    };
    record::upgrade_close(
        &facts.shared,
        &facts.ctx,
        facts.id,
        &facts.label,
        &facts.request,
        record::UpgradeFacts {
            kind: facts.kind,
            pin: facts.pin,
            route: facts.route,
            started,
        },
        outcome,
    );
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_websocket_is_relayed() {
        let ws = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
        ]);
        assert_eq!(
            requested(&ws, Version::HTTP_11),
            Ok(Some(UpgradeKind::Websocket))
        );
        assert_eq!(requested(&headers(&[]), Version::HTTP_11), Ok(None));
        for bad in [
            headers(&[("connection", "upgrade"), ("upgrade", "h2c")]),
            headers(&[("connection", "upgrade"), ("upgrade", "websocket, h2c")]),
            headers(&[("upgrade", "websocket")]),
        ] {
            assert!(requested(&bad, Version::HTTP_11).is_err(), "{bad:?}");
        }
        assert!(requested(&ws, Version::HTTP_2).is_err());
        // Bytes that are Unicode whitespace once decoded are part of the token.
        for odd in [&b"websocket\xc2\xa0"[..], b"\xe3\x80\x80websocket"] {
            let mut h = headers(&[("connection", "upgrade")]);
            h.append(header::UPGRADE, HeaderValue::from_bytes(odd).unwrap());
            assert!(requested(&h, Version::HTTP_11).is_err(), "{odd:?}");
        }
    }
}
