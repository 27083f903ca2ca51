//! Binary handshakes: SOCKS5 (RFC 1928/1929) and the TLS ClientHello the SNI gate reads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::conn::Ctx;
use crate::decision_log::Peer;
use crate::front::socks::{SocksError, handshake};
use crate::sni::{Hello, MAX_HELLO, inspect};

use super::canonical_target;
use super::{AUTHORITY, Fixture, TOKEN, fixture};
use policy::Target;

/// The SOCKS5 handshake (RFC 1928 greeting and request, RFC 1929 authentication), driven
/// over an in-memory pipe against a mediator with one authority, [`AUTHORITY`] (token
/// [`TOKEN`]). The input's first byte picks the channel (even: the shared TCP listener,
/// odd: the authority's Unix socket); the rest is what the client sends, then EOF.
/// Properties: the handshake ends (an early EOF is an error, never a wait); a target comes
/// back only for an identified connection, canonical and with a port; on the TCP listener
/// only after the right credential.
pub fn socks5(data: &[u8]) {
    let Some((&channel, sent)) = data.split_first() else {
        return;
    };
    let on_unix = channel & 1 == 1;
    let fx = fixture();
    let (ctx, outcome) = socks5_handshake(fx, on_unix, sent);
    if let Ok(Some(target)) = outcome {
        assert_ne!(target.port, 0);
        canonical_target(&target);
        assert_eq!(ctx.authority_name(), Some(AUTHORITY));
        if !on_unix {
            let user_pass = [&[1, 7][..], AUTHORITY.as_bytes(), &[6], TOKEN.as_bytes()].concat();
            assert!(
                sent.windows(user_pass.len()).any(|w| w == user_pass),
                "a target without the credential"
            );
        }
    }
    fx.forget();
}

/// The SOCKS5 handshake on `fx`'s mediator with a client that sends `sent`, then EOF; on
/// the authority's Unix socket when `on_unix`, else on the TCP listener. The connection's
/// context after it, and what the handshake returned.
pub(super) fn socks5_handshake(
    fx: &Fixture,
    on_unix: bool,
    sent: &[u8],
) -> (Ctx, Result<Option<Target>, SocksError>) {
    let authority = on_unix.then(|| Arc::clone(&fx.authority));
    let mut ctx = Ctx::new(
        fx.shared.next_id(),
        Peer::Embedded,
        authority,
        fx.shared.limiter.admit(
            0,
            crate::limits::Door::Channel,
            &tokio_util::sync::CancellationToken::new(),
            || {},
        ),
    );
    let outcome = fx.runtime.block_on(async {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(sent).await.expect("fits the pipe");
        // EOF after the input; the client's end stays open, so the replies fit.
        client.shutdown().await.expect("in-memory pipe");
        let shake = handshake(&mut server, &fx.shared, &mut ctx);
        tokio::time::timeout(Duration::from_secs(10), shake)
            .await
            .expect("the handshake ends once the input is read")
    });
    (ctx, outcome)
}

/// A TLS ClientHello at the start of a tunnel (`sni::inspect`). Properties: never asks
/// for more once [`MAX_HELLO`] bytes are there; a final answer on a prefix of the input is
/// the answer on the whole input (bytes after a ClientHello are ignored, and a malformed
/// or non-TLS start stays so); server names are non-empty ASCII.
pub fn client_hello(data: &[u8]) {
    let whole = inspect(data);
    if data.len() >= MAX_HELLO {
        assert_ne!(whole, Hello::NeedMore);
    }
    if let Hello::Complete { server_names, .. } = &whole {
        assert!(
            server_names.iter().all(|n| !n.is_empty() && n.is_ascii()),
            "{server_names:?}"
        );
    }
    for cut in [data.len() / 2, data.len().saturating_sub(1)] {
        let part = inspect(&data[..cut]);
        if part != Hello::NeedMore {
            assert_eq!(part, whole, "prefix of {cut} bytes");
        }
    }
}

/// The PROXY protocol v2 header the shim puts in front of a connection on an authority's
/// Unix socket (`front::proxy_v2::parse`, with the labels of design section 20).
/// Properties: a header taken is no longer than the input and its labels keep their
/// bounds (`crate::labels`), and written again they read back the same; a verdict on a
/// prefix is "incomplete" or the whole input's (bytes after a header are never read).
pub fn proxy_v2(data: &[u8]) {
    use crate::front::proxy_v2::{Parsed, parse};
    use crate::labels::{MAX_INVOCATION, MAX_KEY, MAX_TAGS, MAX_VALUE};
    let whole = parse(data);
    if let Parsed::Header { len, labels } = &whole {
        assert!(*len <= data.len());
        assert!(labels.tags.len() <= MAX_TAGS);
        assert!(
            labels
                .tags
                .iter()
                .all(|(k, v)| !k.is_empty() && k.len() <= MAX_KEY && v.len() <= MAX_VALUE)
        );
        assert!(
            labels
                .invocation
                .as_ref()
                .is_none_or(|i| !i.is_empty() && i.len() <= MAX_INVOCATION)
        );
        let again = labels.proxy_v2_header().unwrap();
        match parse(&again) {
            Parsed::Header { labels: back, .. } => assert_eq!(&back, labels),
            other => panic!("the labels written again do not read back: {other:?}"),
        }
        // Only the header's bytes decide.
        assert_eq!(parse(&data[..*len]), whole);
    }
    for cut in [data.len() / 2, data.len().saturating_sub(1)] {
        let part = parse(&data[..cut]);
        if part != Parsed::Incomplete && part != Parsed::Absent {
            assert_eq!(part, whole, "prefix of {cut} bytes");
        }
    }
}
