//! Connecting through one parent: TCP (or TLS for an HTTPS parent) to the parent, then
//! CONNECT (with Basic or Negotiate credentials, answering a `407` with a Kerberos token
//! and checking the parent's mutual-authentication answer) or a SOCKS5 handshake, or
//! the connection for absolute-form forwarding. Names the vetted IP to the parent when
//! `pin_through_parent` is on.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use policy::upstream::{ParentAuth, ParentScheme, ParentUrl};
use policy::{Pin, Target};

use super::connect::ConnectFailure;
use super::forward_proxy::ForwardProxy;
use super::handshake::{self, BodyLength, Dest, HandshakeError};
use super::parents::ParentEntry;
use super::{Established, Route, Router, UpstreamStream, Via, negotiate};

impl Router {
    pub(super) async fn via_parent(
        &self,
        entry: &ParentEntry,
        route: Route,
        via: Via,
        target: &Target,
        pin: &Pin,
        timeout: Duration,
    ) -> Result<Established, Attempt> {
        let first_pin = pin
            .addrs()
            .first()
            .map(|ip| SocketAddr::new(*ip, target.port))
            .ok_or_else(|| Attempt::Answered("no vetted address".into()))?;
        let url = &entry.url;
        let shown = url.to_string();
        let creds = url.credentials.as_ref();
        let deadline = tokio::time::Instant::now() + timeout;
        if via == Via::Forward && url.scheme.is_http() {
            let stream = self.connect_parent(url, timeout).await?;
            let forward = match url.auth {
                ParentAuth::Basic => ForwardProxy::basic(shown, creds.map(handshake::basic)),
                ParentAuth::Negotiate => {
                    let (value, pending) = self.negotiate_start(url).await?;
                    let service = format!("HTTP@{}", url.addr.host.as_text());
                    ForwardProxy::negotiate(shown, service, value, pending)
                }
            };
            return Ok(Established {
                stream,
                pin: first_pin,
                route,
                forward: Some(forward),
            });
        }
        // The destinations to name: every vetted address in turn (pinning), or the host.
        let dests: Vec<(Dest<'_>, SocketAddr)> = if self.pin_through_parent {
            pin.addrs()
                .iter()
                .map(|ip| (Dest::Ip(*ip), SocketAddr::new(*ip, target.port)))
                .collect()
        } else {
            vec![(Dest::Host(&target.host), first_pin)]
        };
        let mut refusal = String::new();
        for (dest, addr) in dests {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut stream = self.connect_parent(url, remaining).await?;
            let shake = async {
                match (url.scheme, url.auth) {
                    (ParentScheme::Socks5, _) => {
                        handshake::socks5_connect(&mut stream, dest, target.port, creds, &shown)
                            .await
                    }
                    (_, ParentAuth::Basic) => {
                        handshake::http_connect(&mut stream, dest, target.port, creds, &shown).await
                    }
                    (_, ParentAuth::Negotiate) => {
                        self.negotiate_connect(&mut stream, url, dest, target.port, deadline)
                            .await
                    }
                }
            };
            match tokio::time::timeout_at(deadline, shake).await {
                Err(_) => return Err(Attempt::Connection(ConnectFailure::Timeout)),
                Ok(Ok(())) => {
                    return Ok(Established {
                        stream,
                        pin: addr,
                        route,
                        forward: None,
                    });
                }
                Ok(Err(HandshakeError::Broken(detail))) => {
                    return Err(Attempt::Connection(ConnectFailure::Other(
                        io::Error::other(detail),
                    )));
                }
                Ok(Err(HandshakeError::Refused {
                    detail, next_addr, ..
                })) => {
                    refusal = detail;
                    if !next_addr {
                        break;
                    }
                }
            }
        }
        Err(Attempt::Answered(refusal))
    }

    /// The first Negotiate token for `url`'s host.
    pub(super) async fn negotiate_start(
        &self,
        url: &ParentUrl,
    ) -> Result<(String, negotiate::Pending), Attempt> {
        let Some(n) = &self.negotiator else {
            return Err(Attempt::Answered(format!(
                "parent {url}: parent_auth = \"negotiate\" but no Kerberos client is set up"
            )));
        };
        n.start(&url.addr.host).await.map_err(|e| {
            Attempt::Answered(format!("parent {url} demands Negotiate (Kerberos): {e}"))
        })
    }

    /// CONNECT through a parent that takes Negotiate (RFC 4559): the request without
    /// credentials; on `407` offering Negotiate, the token (on the same connection when
    /// the refusal's body can be skipped, else on a new one); then the parent's answer,
    /// whose mutual-authentication token, if any, must verify.
    pub(super) async fn negotiate_connect(
        &self,
        stream: &mut UpstreamStream,
        url: &ParentUrl,
        dest: Dest<'_>,
        port: u16,
        deadline: tokio::time::Instant,
    ) -> Result<(), HandshakeError> {
        let shown = url.to_string();
        let authority = dest.authority(port);
        let answer = handshake::send_connect(stream, dest, port, None, &shown).await?;
        if (200..300).contains(&answer.status) {
            return Ok(());
        }
        if answer.status != 407 {
            return Err(answer.refusal(&authority, false, &shown));
        }
        if answer.negotiate().is_none() {
            return Err(HandshakeError::Refused {
                detail: format!(
                    "parent {shown} answered 407 without offering Negotiate (it offers {}): parent_auth = \"negotiate\" does not fit this parent",
                    answer.offered()
                ),
                next_addr: false,
            });
        }
        match answer.body() {
            BodyLength::Known(n) => handshake::discard(stream, n)
                .await
                .map_err(|e| HandshakeError::Broken(format!("{shown}: {e}")))?,
            BodyLength::Unusable => {
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                *stream = self
                    .connect_parent(url, remaining)
                    .await
                    .map_err(|a| HandshakeError::Broken(a.to_string()))?;
            }
        }
        let (value, pending) =
            self.negotiate_start(url)
                .await
                .map_err(|a| HandshakeError::Refused {
                    detail: a.to_string(),
                    next_addr: false,
                })?;
        let answer = handshake::send_connect(stream, dest, port, Some(&value), &shown).await?;
        drop(value);
        if answer.status == 407 {
            return Err(HandshakeError::Refused {
                detail: format!(
                    "parent {shown} refused the Kerberos (Negotiate) credentials: it answered 407 again after the token; check that the ticket is for HTTP@{} and that the parent accepts this client",
                    url.addr.host.as_text()
                ),
                next_addr: false,
            });
        }
        if !(200..300).contains(&answer.status) {
            return Err(answer.refusal(&authority, false, &shown));
        }
        if let Some(token) = answer.negotiate().filter(|t| !t.is_empty()) {
            let token = negotiate::decode(token).ok_or_else(|| HandshakeError::Refused {
                detail: format!("parent {shown}: its Negotiate answer is not base64"),
                next_addr: false,
            })?;
            pending.finish(token).await.map_err(|e| HandshakeError::Refused {
                detail: format!(
                    "parent {shown}: Kerberos mutual authentication failed (the parent is not the service HTTP@{}): {e}",
                    url.addr.host.as_text()
                ),
                next_addr: false,
            })?;
        }
        Ok(())
    }

    /// Opens a stream to a parent: its name through the mediator's resolver (parents are
    /// operator configuration, not vetted like destinations), then Happy Eyeballs, then
    /// TLS for an HTTPS parent. A TLS failure (a certificate that does not verify) is a
    /// connection-level failure of that parent: the next route is tried.
    pub(super) async fn connect_parent(
        &self,
        url: &ParentUrl,
        timeout: Duration,
    ) -> Result<UpstreamStream, Attempt> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (resolved, _) = self.resolver.resolve(&url.addr.host).await;
        let addrs: Vec<SocketAddr> = resolved
            .map_err(|e| {
                Attempt::Connection(ConnectFailure::Other(io::Error::other(format!(
                    "cannot resolve its name: {e}"
                ))))
            })?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, url.addr.port))
            .collect();
        let (r, _) = super::connect::connect_addrs(&addrs, timeout).await;
        let (tcp, _) = r.map_err(Attempt::Connection)?;
        if url.scheme != ParentScheme::Https {
            return Ok(UpstreamStream::Plain(tcp));
        }
        let Some(tls) = &self.tls else {
            return Err(Attempt::Answered(format!("parent {url}: no TLS client")));
        };
        match tokio::time::timeout_at(deadline, tls.connect(url, tcp)).await {
            Err(_) => Err(Attempt::Connection(ConnectFailure::Timeout)),
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(why)) => Err(Attempt::Connection(ConnectFailure::Other(
                io::Error::other(why),
            ))),
        }
    }
}

/// One route attempt's failure.
pub(super) enum Attempt {
    /// Connection-level: the next route may be tried.
    Connection(ConnectFailure),
    /// The parent answered (refused, demanded credentials): stop here.
    Answered(String),
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connection(c) => c.fmt(f),
            Self::Answered(d) => f.write_str(d),
        }
    }
}
