//! Absolute-form forwarding through an HTTP(S) parent: the `Proxy-Authorization` each
//! request carries (Basic on every request, or Negotiate on the first only, RFC 4559
//! section 6), what the parent's `407` means, and the check of its mutual-authentication
//! token. Never logs a credential or a token.

use std::sync::{Arc, Mutex};

use super::{handshake, negotiate};

/// Absolute-form forwarding through an HTTP(S) parent.
#[derive(Debug, Clone)]
pub(crate) struct ForwardProxy {
    /// The parent as logged (`http://proxy.corp:3128`), for messages.
    parent: String,
    auth: ForwardAuth,
}

/// How forwarded requests authenticate to the parent.
#[derive(Debug, Clone)]
enum ForwardAuth {
    /// `Proxy-Authorization: Basic ...` on every request (from configuration only), or
    /// nothing.
    Basic(Option<String>),
    /// Negotiate (RFC 4559): the token on the first request of the connection only (a
    /// Kerberos token is good once; the parent then holds the connection authenticated,
    /// section 6), and the context that checks the parent's mutual-authentication token.
    Negotiate {
        /// The service the ticket is for: `HTTP@host`.
        service: String,
        state: Arc<Mutex<NegotiateState>>,
    },
}

/// A forwarding connection's Negotiate exchange.
#[derive(Debug, Default)]
struct NegotiateState {
    /// The `Proxy-Authorization` value, until the first request takes it.
    value: Option<String>,
    /// The context, until the answer to the first request is checked.
    pending: Option<negotiate::Pending>,
    /// Requests sent on the connection.
    sent: u32,
}

impl std::fmt::Display for ForwardProxy {
    /// `parent http://proxy.corp:3128`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "parent {}", self.parent)
    }
}

impl ForwardProxy {
    /// Forwarding through `parent` (as logged) with the `Proxy-Authorization` value
    /// `basic` (or none) on every request.
    pub(crate) fn basic(parent: String, basic: Option<String>) -> Self {
        Self {
            parent,
            auth: ForwardAuth::Basic(basic),
        }
    }

    /// Forwarding through `parent` with Negotiate: `value` (the first token) goes on the
    /// first request only, and `pending` checks the parent's answer to it; `service` is
    /// what the ticket is for (`HTTP@host`).
    pub(super) fn negotiate(
        parent: String,
        service: String,
        value: String,
        pending: negotiate::Pending,
    ) -> Self {
        Self {
            parent,
            auth: ForwardAuth::Negotiate {
                service,
                state: Arc::new(Mutex::new(NegotiateState {
                    value: Some(value),
                    pending: Some(pending),
                    sent: 0,
                })),
            },
        }
    }

    /// The `Proxy-Authorization` value for the next request, if any. Never logged.
    pub(crate) fn authorization(&self) -> Option<String> {
        match &self.auth {
            ForwardAuth::Basic(value) => value.clone(),
            ForwardAuth::Negotiate { state, .. } => state.lock().ok().and_then(|mut s| {
                s.sent = s.sent.saturating_add(1);
                s.value.take()
            }),
        }
    }

    /// What a `407` from the parent to a forwarded request means: the detail (naming the
    /// parent and what it offers) and the hint. `challenges` are its `Proxy-Authenticate`
    /// values.
    pub(crate) fn refusal<'a>(
        &self,
        challenges: impl Iterator<Item = &'a str>,
    ) -> (String, String) {
        let challenges: Vec<&str> = challenges.collect();
        let offered = handshake::offered_in(challenges.iter().copied());
        let p = &self.parent;
        match &self.auth {
            ForwardAuth::Basic(Some(_)) => (
                format!("parent {p} refused the configured credentials: it answered 407 (it offers {offered})"),
                "check the parent's user:password (userinfo in [upstream] parents, parent_credentials_file, or the desktop's proxy settings), or set parent_auth if it wants Negotiate".into(),
            ),
            ForwardAuth::Basic(None) => (
                format!("parent {p} answered 407 Proxy Authentication Required (it offers {offered}) and no credentials are configured for it"),
                "configure the parent's credentials (userinfo or parent_credentials_file) or parent_auth = \"negotiate\"".into(),
            ),
            ForwardAuth::Negotiate { service, state } => {
                let sent = state.lock().map_or(0, |s| s.sent);
                if handshake::negotiate_in(challenges.iter().copied()).is_none() {
                    (
                        format!("parent {p} answered 407 without offering Negotiate (it offers {offered}): parent_auth = \"negotiate\" does not fit this parent"),
                        "set parent_auth for this parent to the scheme it offers (Basic: remove \"negotiate\" and configure user:password)".into(),
                    )
                } else if sent <= 1 {
                    (
                        format!("parent {p} refused the Kerberos (Negotiate) credentials: it answered 407 again after the token"),
                        format!("check that the parent's keytab holds the current key of {service} (after a key change the parent's helper may need a reload) and that the parent accepts this client"),
                    )
                } else {
                    (
                        format!("parent {p} asked for Negotiate credentials again (407) on a connection it had authenticated"),
                        "the parent does not keep the connection authenticated (RFC 4559 section 6); the next request opens a new connection and authenticates again".into(),
                    )
                }
            }
        }
    }

    /// Checks the parent's answer to the first forwarded request: a Negotiate parent's
    /// mutual-authentication token (`Proxy-Authenticate: Negotiate <token>`), when it
    /// sends one, must verify, as on the tunnel path.
    ///
    /// # Errors
    /// The detail: the token is not base64 or does not verify (the parent is not the
    /// service the ticket is for).
    // A `String` error: it is the `detail` of the denial as is (naming the parent); no
    // caller branches on it.
    pub(crate) async fn verify<'a>(
        &self,
        challenges: impl Iterator<Item = &'a str>,
    ) -> Result<(), String> {
        let ForwardAuth::Negotiate { service, state } = &self.auth else {
            return Ok(());
        };
        let Some(pending) = state.lock().ok().and_then(|mut s| s.pending.take()) else {
            return Ok(());
        };
        let Some(token) = handshake::negotiate_in(challenges).filter(|t| !t.is_empty()) else {
            return Ok(());
        };
        let p = &self.parent;
        let token = negotiate::decode(token)
            .ok_or_else(|| format!("parent {p}: its Negotiate answer is not base64"))?;
        pending.finish(token).await.map_err(|e| {
            format!("parent {p}: Kerberos mutual authentication failed (the parent is not the service {service}): {e}")
        })
    }

    /// The detail of a forwarded request that failed at the HTTP level (the connection
    /// broke, or the answer was not valid HTTP/1.1), naming the parent.
    pub(crate) fn broken(&self, error: &dyn std::fmt::Display) -> String {
        format!("{self}: the forwarded request failed: {error}")
    }
}
