//! The relay's tests: real socket pairs and in-memory duplex streams.

use super::*;
use crate::rewind::Rewind;
use bytes::Bytes;
use tokio::io::duplex;
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;

/// The relay between `client` and a plain TCP `upstream`, spawned: idle timeout `idle`,
/// stopped by `closing`, no progress reports.
fn spawn_relay<C>(
    client: C,
    upstream: TcpStream,
    idle: Duration,
    closing: CancellationToken,
) -> JoinHandle<RelayOutcome>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(relay(
        client,
        UpstreamStream::Plain(upstream),
        idle,
        closing,
        None,
    ))
}

/// The buffered relay between any two streams, spawned as [`spawn_relay`] spawns.
fn spawn_buffered<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    closing: CancellationToken,
) -> JoinHandle<RelayOutcome>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(relay_streams(client, upstream, idle, closing, None))
}

/// Sends `request` from `from` and half-closes it; asserts that `to` reads exactly
/// `request` and then EOF (the half-close passed on).
async fn half_close_passes<A, B>(from: &mut A, to: &mut B, request: &[u8])
where
    A: AsyncWrite + Unpin,
    B: AsyncRead + Unpin,
{
    from.write_all(request).await.unwrap();
    from.shutdown().await.unwrap();
    let mut got = Vec::new();
    to.read_to_end(&mut got).await.unwrap(); // EOF passed on
    assert_eq!(got, request);
}

/// Writes `data` and half-closes `w` while reading `r` to its end: what `r` read.
async fn send_all_and_read_all<R, W>(r: &mut R, w: &mut W, data: &[u8]) -> Vec<u8>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let send = async {
        w.write_all(data).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut got = Vec::new();
    let recv = r.read_to_end(&mut got);
    let ((), read) = tokio::join!(send, recv);
    read.unwrap();
    got
}

#[tokio::test]
async fn half_close_each_direction_ends_on_its_own() {
    let (client, mut client_peer) = duplex(64);
    let (upstream, mut upstream_peer) = duplex(64);
    let rx = CancellationToken::new();
    let task = spawn_buffered(client, upstream, Duration::from_secs(60), rx);

    // The client half-closes.
    half_close_passes(&mut client_peer, &mut upstream_peer, b"request").await;
    // The other direction still works after the client's half-close.
    half_close_passes(&mut upstream_peer, &mut client_peer, b"response!").await;

    let out = task.await.unwrap();
    assert_eq!(
        (out.up, out.down, out.close_reason),
        (7, 9, CloseReason::ClientClosed)
    );
}

#[tokio::test]
async fn bulk_transfer_grows_the_buffer_and_keeps_every_byte_in_order() {
    let (client, mut client_peer) = duplex(256 * 1024);
    let (upstream, mut upstream_peer) = duplex(256 * 1024);
    let rx = CancellationToken::new();
    let task = spawn_buffered(client, upstream, Duration::from_secs(60), rx);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        client_peer.write_all(&sent).await.unwrap();
        client_peer.shutdown().await.unwrap();
        client_peer
    });
    let mut got = Vec::new();
    upstream_peer.read_to_end(&mut got).await.unwrap();
    assert!(got == data, "bytes differ");
    drop(upstream_peer);
    let _client_peer = writer.await.unwrap();
    let out = task.await.unwrap();
    assert_eq!(out.up, 3_000_000);
}

/// A connected pair of loopback TCP sockets.
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    (a.unwrap(), b.unwrap().0)
}

/// Bulk bytes both ways between a Unix-socket client and a TCP upstream: the relay
/// moves from copying to splice(2) mid-stream and must keep every byte in order, pass
/// each half-close on, and count exactly.
#[tokio::test]
async fn socket_relay_splices_bulk_transfers_both_ways_without_losing_a_byte() {
    let (client, mut client_peer) = UnixStream::pair().unwrap();
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let rx = CancellationToken::new();
    // The client arrives as the listener hands it over: behind a consumed Rewind.
    let mut client = Rewind::new(Bytes::from_static(b"C"), client);
    let mut first = [0u8; 1];
    client.read_exact(&mut first).await.unwrap();
    assert!(
        socket_of(&client).is_some(),
        "a consumed Rewind is a plain socket"
    );
    let task = spawn_relay(client, upstream, Duration::from_secs(60), rx);
    let up: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    let down: Vec<u8> = (0..7_000_000u32).map(|i| (i % 241) as u8).collect();
    let (mut cr, mut cw) = client_peer.split();
    let (mut ur, mut uw) = upstream_peer.split();
    let client_side = send_all_and_read_all(&mut cr, &mut cw, &up);
    let upstream_side = send_all_and_read_all(&mut ur, &mut uw, &down);
    let (client_got, upstream_got) = tokio::join!(client_side, upstream_side);
    assert!(upstream_got == up, "client -> upstream bytes differ");
    assert!(client_got == down, "upstream -> client bytes differ");
    let out = task.await.unwrap();
    assert_eq!((out.up, out.down), (5_000_000, 7_000_000));
    assert_ne!(out.close_reason, CloseReason::Error);
}

/// TCP urgent data (MSG_OOB) in the middle of a spliced stream: splice(2) stops at the
/// urgent mark, so the relay must read past it. Every ordinary byte arrives (the
/// urgent byte is dropped, as a plain read drops it) and is counted.
#[tokio::test]
async fn urgent_data_does_not_cut_a_spliced_stream_short() {
    let (client, client_peer) = tcp_pair().await;
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let rx = CancellationToken::new();
    let task = spawn_relay(client, upstream, Duration::from_secs(60), rx);
    let before: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    let after: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 239) as u8).collect();
    let mut expected = before.clone();
    expected.extend_from_slice(&after);
    let writer = tokio::spawn(async move {
        let mut peer = client_peer;
        peer.write_all(&before).await.unwrap();
        socket2::SockRef::from(&peer)
            .send_out_of_band(b"!")
            .unwrap();
        peer.write_all(&after).await.unwrap();
        peer.shutdown().await.unwrap();
        peer
    });
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), upstream_peer.read_to_end(&mut got))
        .await
        .expect("the stream stalled at the urgent mark")
        .unwrap();
    assert_eq!(got.len(), expected.len(), "bytes lost at the urgent mark");
    assert!(got == expected, "bytes differ");
    drop(upstream_peer);
    drop(writer.await.unwrap());
    let out = task.await.unwrap();
    assert_eq!(out.up, expected.len() as u64);
}

/// A client that resets while the upstream is silent ends the tunnel at once (not
/// after the idle timeout), with reason `error`.
#[tokio::test]
async fn a_reset_on_one_side_ends_the_whole_tunnel() {
    let (client, client_peer) = tcp_pair().await;
    let (upstream, _upstream_peer) = tcp_pair().await;
    let rx = CancellationToken::new();
    let task = spawn_relay(client, upstream, Duration::from_secs(600), rx);
    // SO_LINGER 0: close sends a reset.
    socket2::SockRef::from(&client_peer)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client_peer);
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the tunnel outlived the reset")
        .unwrap();
    assert_eq!(out.close_reason, CloseReason::Error);
}

/// Closes `s` with a reset (SO_LINGER 0), as many clients end a finished exchange.
fn reset(s: TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

/// One request and its answer through a relay started by `start`, then `who` resets its
/// connection: how the tunnel ended.
async fn reset_after_an_exchange<F>(start: F, client_resets: bool) -> CloseReason
where
    F: FnOnce(TcpStream, TcpStream) -> JoinHandle<RelayOutcome>,
{
    let (client, mut client_peer) = tcp_pair().await;
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let task = start(client, upstream);
    client_peer.write_all(b"request").await.unwrap();
    let mut got = [0u8; 7];
    upstream_peer.read_exact(&mut got).await.unwrap();
    upstream_peer.write_all(b"answer").await.unwrap();
    let mut back = [0u8; 6];
    client_peer.read_exact(&mut back).await.unwrap();
    if client_resets {
        reset(client_peer);
        drop(upstream_peer);
    } else {
        reset(upstream_peer);
        drop(client_peer);
    }
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the tunnel outlived the reset")
        .unwrap()
        .close_reason
}

/// A client that resets its connection after it got an answer (cargo, curl with unread
/// TLS session tickets) has closed it; an upstream's reset stays an error. Both relays:
/// between sockets and through buffers.
#[tokio::test]
async fn a_clients_reset_after_an_exchange_is_its_close_not_an_error() {
    let sockets = |c: TcpStream, u: TcpStream| {
        spawn_relay(c, u, Duration::from_secs(600), CancellationToken::new())
    };
    let buffers = |c: TcpStream, u: TcpStream| {
        spawn_buffered(c, u, Duration::from_secs(600), CancellationToken::new())
    };
    for (client_resets, expected) in [
        (true, CloseReason::ClientClosed),
        (false, CloseReason::Error),
    ] {
        let got = (
            reset_after_an_exchange(sockets, client_resets).await,
            reset_after_an_exchange(buffers, client_resets).await,
        );
        assert_eq!(got, (expected, expected), "client resets: {client_resets}");
    }
}

/// A relay stopped mid-transfer (shutdown) reports exactly the bytes the client got.
#[tokio::test]
async fn counts_are_exact_when_a_bulk_transfer_is_cut_off() {
    let (client, mut client_peer) = tcp_pair().await;
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let tx = CancellationToken::new();
    let rx = tx.clone();
    let task = spawn_relay(client, upstream, Duration::from_secs(60), rx);
    let feeder = tokio::spawn(async move {
        let chunk = vec![7u8; 1 << 20];
        // Until the relay goes away.
        while upstream_peer.write_all(&chunk).await.is_ok() {}
    });
    // Read slowly so that chunks are part-written when the relay is stopped.
    let mut got = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    while got < 24 << 20 {
        got += client_peer.read(&mut buf).await.unwrap() as u64;
    }
    tx.cancel();
    let out = task.await.unwrap();
    assert_eq!(out.close_reason, CloseReason::Shutdown);
    loop {
        match client_peer.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n as u64,
        }
    }
    assert_eq!(out.down, got, "close record vs bytes the client received");
    feeder.abort();
}

/// A reader slower than the idle timeout's worth of socket buffer is still a live
/// tunnel: bytes leaving the send queue count as activity. A reader that stops is cut.
#[tokio::test]
async fn a_slow_reader_is_not_idle_but_a_stopped_one_is() {
    // The reader's window is small, so its reads show as window updates; our side's
    // send buffer is large, so it reports writable only after a long drain: without
    // watching the send queue, the relay would see no activity for seconds.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reader = tokio::net::TcpSocket::new_v4().unwrap();
    reader.set_recv_buffer_size(32 * 1024).unwrap();
    let (client_peer, accepted) = tokio::join!(reader.connect(l.local_addr().unwrap()), l.accept());
    let mut client_peer = client_peer.unwrap();
    let client = accepted.unwrap().0;
    socket2::SockRef::from(&client)
        .set_send_buffer_size(4 << 20)
        .unwrap();
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let rx = CancellationToken::new();
    let idle = Duration::from_millis(1000);
    let task = spawn_relay(client, upstream, idle, rx);
    let feeder = tokio::spawn(async move {
        let chunk = vec![1u8; 1 << 20];
        for _ in 0..64 {
            if upstream_peer.write_all(&chunk).await.is_err() {
                break;
            }
        }
        upstream_peer
    });
    // Let the buffers fill, then read a little every 100 ms for 3 s (5 idle periods):
    // the relay writes nothing new in that time, only the queue drains.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut buf = vec![0u8; 8 * 1024];
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        client_peer.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !task.is_finished(),
            "a slowly read tunnel was closed as idle"
        );
    }
    // Stop reading: the tunnel is idle now.
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("a stopped reader kept the tunnel open")
        .unwrap();
    assert_eq!(out.close_reason, CloseReason::IdleTimeout);
    feeder.abort();
}

/// A tunnel whose replayed bytes are not yet read is not a plain socket: relaying it
/// by file descriptor would skip them.
#[tokio::test]
async fn an_unconsumed_rewind_is_relayed_through_buffers() {
    let (a, _b) = UnixStream::pair().unwrap();
    let r = Rewind::new(Bytes::from_static(b"early"), a);
    assert!(socket_of(&r).is_none());
    let (c, _d) = duplex(8);
    assert!(socket_of(&c).is_none());
}

#[tokio::test]
async fn socket_relay_passes_a_half_close_and_ends_on_idle() {
    let (client, mut client_peer) = UnixStream::pair().unwrap();
    let (upstream, mut upstream_peer) = tcp_pair().await;
    let rx = CancellationToken::new();
    let task = spawn_relay(client, upstream, Duration::from_millis(300), rx);
    half_close_passes(&mut client_peer, &mut upstream_peer, b"request").await;
    upstream_peer.write_all(b"late answer").await.unwrap();
    let mut back = [0u8; 11];
    client_peer.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"late answer");
    // The upstream never closes: the idle timeout ends the tunnel.
    let out = task.await.unwrap();
    assert_eq!(
        (out.up, out.down, out.close_reason),
        (7, 11, CloseReason::IdleTimeout)
    );
}

#[tokio::test(start_paused = true)]
async fn idle_tunnel_is_closed_after_the_idle_timeout() {
    let (client, mut client_peer) = duplex(64);
    let (upstream, _upstream_peer) = duplex(64);
    let rx = CancellationToken::new();
    let task = spawn_buffered(client, upstream, Duration::from_secs(30), rx);
    client_peer.write_all(b"x").await.unwrap();
    let out = task.await.unwrap();
    assert_eq!((out.up, out.close_reason), (1, CloseReason::IdleTimeout));
}

#[tokio::test]
async fn shutdown_signal_closes_a_live_tunnel() {
    let (client, _c) = duplex(64);
    let (upstream, _u) = duplex(64);
    let tx = CancellationToken::new();
    let rx = tx.clone();
    let task = spawn_buffered(client, upstream, Duration::from_secs(300), rx);
    tx.cancel();
    assert_eq!(task.await.unwrap().close_reason, CloseReason::Shutdown);
}
