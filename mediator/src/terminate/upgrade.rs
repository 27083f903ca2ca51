//! Protocol switches inside a terminated tunnel: an HTTP/1.1 `Upgrade` (RFC 9110 section
//! 7.8; `websocket`, RFC 6455 section 4) and an HTTP/2 extended CONNECT (RFC 8441 section
//! 4: `:method CONNECT` with `:protocol`). The request is judged like any request by
//! `super::request` (the tunnel host, then `crate::request::judge`: request rules,
//! credentials); this file says which switches are
//! asked for ([`requested`], the one parser of a request's `Upgrade`/`:protocol`, pure so
//! that it can be fuzzed), how the upstream request carries it ([`plan`], [`prepare`]: as
//! asked, or an extended CONNECT translated to an HTTP/1.1 upgrade, RFC 8441 section 5),
//! whether the origin's answer switched ([`switched`], which checks a translated
//! WebSocket's `Sec-WebSocket-Accept`), and relays the switched bytes both ways with the
//! relay's accounting, idle timeout and cut, ending in the switch's own close record
//! (`protocol: "tls"`, `upgrade: "<token>"`).
//!
//! It must never relay `h2c` (HTTP/2 requests would pass the request rules), a plain
//! CONNECT (a tunnel inside the tunnel would), or a switch the origin did not answer.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use policy::UpgradeToken;
use tokio_util::sync::CancellationToken;

use crate::conn::record;
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::relay::{RelayOutcome, relay_streams};
use crate::shared::Shared;
use crate::tap::{Tap, Tapped};
use crate::vocab::CloseReason;

/// `Sec-WebSocket-Key` (RFC 6455 section 11.3.1).
const WS_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
/// `Sec-WebSocket-Accept` (RFC 6455 section 11.3.3).
const WS_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// How a request asks to switch protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// HTTP/1.1 `Connection: upgrade` and `Upgrade: <token>`, answered `101`.
    Upgrade,
    /// HTTP/2 extended CONNECT with `:protocol <token>`, answered `200` (RFC 8441).
    ExtendedConnect,
}

/// A protocol switch a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Switch {
    /// The protocol switched to.
    pub(crate) token: UpgradeToken,
    /// How the client asked.
    pub(crate) via: Via,
}

impl Switch {
    /// The method the request rules judge (and the log shows): an extended CONNECT is
    /// the `GET` of the HTTP/1.1 upgrade it stands for (RFC 8441 section 5), so that one
    /// rule means the same for both versions.
    pub(crate) fn judged_method<'a>(&self, sent: &'a Method) -> &'a str {
        match self.via {
            Via::Upgrade => sent.as_str(),
            Via::ExtendedConnect => Method::GET.as_str(),
        }
    }
}

/// The switch a request asks for: `Ok(None)` for none. `protocol` is an HTTP/2 request's
/// `:protocol` pseudo-header (hyper's `ext::Protocol`).
///
/// # Errors
/// A detail for the denial: a CONNECT without `:protocol`, `:protocol` outside an HTTP/2
/// CONNECT, an `Upgrade` outside HTTP/1.1 or without `Connection: upgrade`, several
/// tokens, a token that is not an RFC 9110 token, or `h2c`.
pub(crate) fn requested(
    method: &Method,
    headers: &HeaderMap,
    version: Version,
    protocol: Option<&[u8]>,
) -> Result<Option<Switch>, SwitchError> {
    let values: Vec<&[u8]> = headers
        .get_all(header::UPGRADE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if let Some(raw) = protocol {
        let shown = crate::redact::escape_raw(raw);
        if *method != Method::CONNECT || version != Version::HTTP_2 {
            return Err(SwitchError::ProtocolOutsideConnect(shown));
        }
        if !values.is_empty() {
            return Err(SwitchError::ExtendedWithUpgrade);
        }
        // A field value carries no surrounding whitespace in HTTP/2 (RFC 9113 section
        // 8.2.1), and `:protocol` is one token, not a list whose elements are trimmed.
        if raw.trim_ascii().len() != raw.len() {
            return Err(SwitchError::PaddedProtocol(shown));
        }
        return match UpgradeToken::parse(raw).map_err(SwitchError::Token)? {
            UpgradeToken::H2c => Err(SwitchError::H2c),
            token => Ok(Some(Switch {
                token,
                via: Via::ExtendedConnect,
            })),
        };
    }
    if *method == Method::CONNECT {
        return Err(SwitchError::ConnectInside);
    }
    if values.is_empty() {
        return Ok(None);
    }
    let tokens: Vec<&[u8]> = values
        .iter()
        .flat_map(|v| v.split(|&b| b == b','))
        // OWS is spaces and tabs (RFC 9110 section 5.6.3): never other Unicode whitespace.
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .collect();
    let shown = crate::redact::escape_raw(&tokens.join(&b", "[..]));
    if version != Version::HTTP_11 {
        return Err(SwitchError::NotHttp11 { shown, version });
    }
    let [one] = tokens.as_slice() else {
        return Err(SwitchError::SeveralTokens(shown));
    };
    let token = match UpgradeToken::parse(one).map_err(SwitchError::Token)? {
        UpgradeToken::H2c => return Err(SwitchError::H2c),
        token => token,
    };
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    if !connection_upgrade {
        return Err(SwitchError::NoConnectionUpgrade(token));
    }
    Ok(Some(Switch {
        token,
        via: Via::Upgrade,
    }))
}

/// Why a request's switch is refused (the detail of its denial), or cannot go upstream
/// (the detail of a `502`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SwitchError {
    #[error(":protocol {0} outside an HTTP/2 CONNECT (RFC 8441 section 4)")]
    ProtocolOutsideConnect(String),
    #[error("an extended CONNECT with an Upgrade header (RFC 9113 section 8.2.2)")]
    ExtendedWithUpgrade,
    #[error(":protocol {0} has surrounding whitespace (RFC 9113 section 8.2.1)")]
    PaddedProtocol(String),
    #[error("{0}")]
    Token(policy::RuleError),
    #[error(
        "Upgrade: h2c is not relayed through TLS termination (its HTTP/2 requests would pass the request rules)"
    )]
    H2c,
    #[error(
        "CONNECT inside a terminated tunnel is not relayed (a tunnel inside the tunnel would pass the request rules)"
    )]
    ConnectInside,
    #[error("Upgrade: {shown} in an {version:?} request: upgrades are HTTP/1.1 only")]
    NotHttp11 { shown: String, version: Version },
    #[error("Upgrade: {0}: one protocol at a time is relayed through TLS termination")]
    SeveralTokens(String),
    #[error("Upgrade: {0} without Connection: upgrade (RFC 9110 section 7.8)")]
    NoConnectionUpgrade(UpgradeToken),
    #[error("the upstream connection speaks HTTP/2, which cannot carry an HTTP/1.1 upgrade")]
    H2CannotUpgrade,
    #[error(
        "the origin's HTTP/2 connection does not accept extended CONNECT (no SETTINGS_ENABLE_CONNECT_PROTOCOL, RFC 8441 section 3), so :protocol {0} cannot reach it"
    )]
    NoExtendedConnect(UpgradeToken),
    #[error("the origin answered the HTTP/1.1 upgrade to {token} with {status}, not 101")]
    Not101 {
        token: UpgradeToken,
        status: StatusCode,
    },
    #[error(
        "the origin's Sec-WebSocket-Accept does not answer the mediator's Sec-WebSocket-Key (RFC 6455 section 4.2.2)"
    )]
    BadAccept,
}

/// What the tunnel's upstream HTTP connection can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// HTTP/1.1: an `Upgrade` takes the connection over.
    H1,
    /// HTTP/2; `extended_connect`: the origin sent SETTINGS_ENABLE_CONNECT_PROTOCOL = 1
    /// (RFC 8441 section 3).
    H2 {
        /// Whether the origin accepts extended CONNECT.
        extended_connect: bool,
    },
}

/// How the upstream request carries a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// As the client asked (an upgrade on HTTP/1.1, an extended CONNECT on HTTP/2).
    AsAsked,
    /// An extended CONNECT sent as an HTTP/1.1 `GET` with `Upgrade` (RFC 8441 section 5),
    /// with a fresh `Sec-WebSocket-Key` for a WebSocket.
    ToUpgrade {
        /// The `Sec-WebSocket-Key` sent upstream (WebSocket only).
        key: Option<String>,
    },
}

/// How `switch` goes upstream over `carrier`.
///
/// # Errors
/// The detail of a `502`: an HTTP/1.1 upgrade over an HTTP/2 upstream (HTTP/2 has no
/// upgrade), or an extended CONNECT to an HTTP/2 origin that does not accept it.
pub(crate) fn plan(switch: &Switch, carrier: Carrier) -> Result<Plan, SwitchError> {
    match (switch.via, carrier) {
        (Via::Upgrade, Carrier::H1)
        | (
            Via::ExtendedConnect,
            Carrier::H2 {
                extended_connect: true,
            },
        ) => Ok(Plan::AsAsked),
        (Via::Upgrade, Carrier::H2 { .. }) => Err(SwitchError::H2CannotUpgrade),
        (
            Via::ExtendedConnect,
            Carrier::H2 {
                extended_connect: false,
            },
        ) => Err(SwitchError::NoExtendedConnect(switch.token.clone())),
        (Via::ExtendedConnect, Carrier::H1) => Ok(Plan::ToUpgrade {
            key: (switch.token == UpgradeToken::WebSocket)
                .then(tungstenite::handshake::client::generate_key),
        }),
    }
}

/// Puts the switch on the rebuilt upstream request (`Connection` and `Upgrade` are
/// hop-by-hop, so the rebuild removed them; `Sec-WebSocket-Version`, `-Protocol` and
/// `-Extensions` pass as sent).
pub(crate) fn prepare(parts: &mut http::request::Parts, switch: &Switch, plan: &Plan) {
    let token = HeaderValue::from_str(switch.token.as_str());
    match (switch.via, plan) {
        (Via::ExtendedConnect, Plan::AsAsked) => {
            parts.method = Method::CONNECT;
            parts
                .extensions
                .insert(hyper::ext::Protocol::from(switch.token.as_str()));
        }
        (Via::Upgrade, _) | (Via::ExtendedConnect, Plan::ToUpgrade { .. }) => {
            parts.method = match switch.via {
                Via::Upgrade => parts.method.clone(),
                Via::ExtendedConnect => Method::GET,
            };
            parts.extensions.remove::<hyper::ext::Protocol>();
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            // A token is visible ASCII (`UpgradeToken::parse`), so always a header value.
            if let Ok(value) = token {
                parts.headers.insert(header::UPGRADE, value);
            }
            if let Plan::ToUpgrade { key: Some(key) } = plan
                && let Ok(value) = HeaderValue::from_str(key)
            {
                parts.headers.insert(WS_KEY, value);
            }
        }
    }
}

/// Whether the origin's answer switched protocols, and the answer the client gets: `101`
/// with `Connection`/`Upgrade` put back for an HTTP/1.1 upgrade, `200` for an extended
/// CONNECT (a translated `101` becomes `200` without `Sec-WebSocket-Accept`). An answer
/// that did not switch passes as it is.
///
/// # Errors
/// The detail of a `502`: a translated WebSocket whose `Sec-WebSocket-Accept` is not the
/// key's (RFC 6455 section 4.2.2), or an origin that answered an extended CONNECT's
/// translation with a success other than `101` (which the client would take for a
/// switch).
pub(crate) fn switched(
    parts: &mut http::response::Parts,
    switch: &Switch,
    plan: &Plan,
) -> Result<bool, SwitchError> {
    match (switch.via, plan) {
        (Via::Upgrade, _) => {
            let up = parts.status == StatusCode::SWITCHING_PROTOCOLS;
            if up {
                parts
                    .headers
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                if let Ok(value) = HeaderValue::from_str(switch.token.as_str()) {
                    parts.headers.insert(header::UPGRADE, value);
                }
            }
            Ok(up)
        }
        (Via::ExtendedConnect, Plan::AsAsked) => {
            let up = parts.status.is_success();
            if up {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            Ok(up)
        }
        (Via::ExtendedConnect, Plan::ToUpgrade { key }) => {
            if parts.status.is_success() {
                return Err(SwitchError::Not101 {
                    token: switch.token.clone(),
                    status: parts.status,
                });
            }
            if parts.status != StatusCode::SWITCHING_PROTOCOLS {
                return Ok(false);
            }
            if let Some(key) = key {
                let expected = tungstenite::handshake::derive_accept_key(key.as_bytes());
                let got = parts.headers.get(&WS_ACCEPT).map(HeaderValue::as_bytes);
                if got != Some(expected.as_bytes()) {
                    return Err(SwitchError::BadAccept);
                }
            }
            parts.status = StatusCode::OK;
            parts.version = Version::HTTP_2;
            parts.headers.remove(&WS_ACCEPT);
            parts.headers.remove(header::CONTENT_LENGTH);
            Ok(true)
        }
    }
}

/// What the switch's close record repeats of the tunnel and the request.
pub(crate) struct Upgraded {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ctx: Ctx,
    pub(crate) label: TargetLabel,
    pub(crate) request: RequestLine,
    /// The decision id of the request's line.
    pub(crate) id: u64,
    pub(crate) token: UpgradeToken,
    pub(crate) pin: SocketAddr,
    pub(crate) route: String,
}

/// Waits for both sides to complete the switch, relays until either ends, the idle
/// timeout passes or `closing` is cancelled, and writes the close record: bytes up and
/// down are the switched protocol's bytes (inside TLS; for HTTP/2, the stream's DATA).
/// A side whose TLS ends without close_notify has ended, as a closed TCP connection ends
/// a tunnel: the switched protocol has its own close (a WebSocket Close frame). A side
/// whose connection is then found gone (a reset on read, a write refused with EPIPE or
/// ECONNRESET: the peer closed with bytes still coming) ended the switch too: the close
/// record says `client_closed` or `upstream_closed` for the side that went first, never
/// `error`.
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
            let gone = OnceLock::new();
            let mut outcome = relay_streams(
                Tapped::new(
                    TokioIo::new(c),
                    EndWithoutNotify::new(&gone, CloseReason::ClientClosed),
                ),
                Tapped::new(
                    TokioIo::new(u),
                    EndWithoutNotify::new(&gone, CloseReason::UpstreamClosed),
                ),
                facts.shared.timeouts.idle_tunnel,
                closing,
                None,
            )
            .await;
            if let (CloseReason::Error, Some(side)) = (outcome.close_reason, gone.get()) {
                outcome.close_reason = *side;
            }
            outcome
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
            kind: facts.token,
            pin: facts.pin,
            route: facts.route,
            started,
        },
        outcome,
    );
    outcome
}

/// The tap of one side of a switched stream. Its read of a TLS end without close_notify
/// (rustls' `UnexpectedEof`) is the end of the stream, not an error. A read, a write or a
/// flush that finds the connection gone (reset, or EPIPE: the peer closed) stays an error
/// for the relay, but records in `gone`, unless the other side was found gone first, that
/// this side ended: `side` is the close reason it stands for.
struct EndWithoutNotify<'a> {
    gone: &'a OnceLock<CloseReason>,
    side: CloseReason,
}

impl<'a> EndWithoutNotify<'a> {
    fn new(gone: &'a OnceLock<CloseReason>, side: CloseReason) -> Self {
        Self { gone, side }
    }

    /// `polled`, noting first that this side's peer is gone when its error says so.
    fn noted<T>(&self, polled: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &polled
            && matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            )
        {
            let _ = self.gone.set(self.side);
        }
        polled
    }
}

impl Tap for EndWithoutNotify<'_> {
    fn read(&mut self, _: &[u8], polled: io::Result<()>) -> io::Result<()> {
        match polled {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
            other => self.noted(other),
        }
    }

    fn write(&mut self, _: &[IoSlice<'_>], polled: io::Result<usize>) -> io::Result<usize> {
        self.noted(polled)
    }

    fn flush(&mut self, polled: io::Result<()>) -> io::Result<()> {
        self.noted(polled)
    }
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
