//! Unit tests of `route::handshake`.

use super::*;

#[test]
fn status_lines() {
    let status = |head: &[u8]| Answer::parse(head).map(|a| a.status).ok();
    assert_eq!(
        status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
        Some(200)
    );
    assert_eq!(status(b"HTTP/1.0 407 Auth\r\n\r\n"), Some(407));
    assert!(status(b"SSH-2.0-x\r\n\r\n").is_none());
    assert!(status(b"HTTP/1.1 20 x\r\n\r\n").is_none());
    assert!(status(b"HTTP/1.1 200 OK\r\n").is_none(), "incomplete");
    assert_eq!(
        Answer::parse(b"HTTP/1.1 403 Go away\xff\r\n\r\n")
            .unwrap()
            .reason,
        "Go away"
    );
}

fn answer(head: &str) -> Answer {
    Answer::parse(head.as_bytes()).unwrap()
}

/// One obs-text byte (legal in a field value, RFC 9110 section 5.5) hides no field: the
/// Negotiate offer and the Content-Length beside it are still read.
#[test]
fn a_non_utf8_byte_in_one_field_hides_no_other() {
    let head = b"HTTP/1.1 407 Proxy Authentication Required\r\nServer: Caf\xe9\r\nProxy-Authenticate: Negotiate\r\nContent-Length: 5\r\n\r\n";
    let a = Answer::parse(head).unwrap();
    assert_eq!(a.negotiate(), Some(""));
    assert_eq!(a.body(), BodyLength::Known(5));
    // An obsolete line folding is read as a space.
    let a = answer(
        "HTTP/1.1 407 A\r\nProxy-Authenticate: Basic\r\n realm=x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(a.offered(), "Basic");
    assert_eq!(a.body(), BodyLength::Known(0));
}

#[test]
fn answers_say_what_they_offer_and_how_their_body_ends() {
    let r = answer(
        "HTTP/1.1 407 Auth\r\nProxy-Authenticate: Basic realm=\"x\"\r\nproxy-authenticate: NEGOTIATE\r\nContent-Length: 12\r\n\r\n",
    );
    assert_eq!(r.negotiate(), Some(""));
    assert_eq!(r.offered(), "Basic, NEGOTIATE");
    assert_eq!(r.body(), BodyLength::Known(12));
    // A control character in a field is no HTTP answer at all; a scheme that is not a
    // token is shown as it is, never as the word it resembles.
    assert!(
        Answer::parse(b"HTTP/1.1 407 Auth\r\nProxy-Authenticate: Nego\0tiate\r\n\r\n").is_err()
    );
    assert_eq!(negotiate_in(["Nego\0tiate abc"].into_iter()), None);
    assert_eq!(
        offered_in(["Nego\0tiate abc"].into_iter()),
        "\"Nego\\u{0}tiate\""
    );
    let r = answer("HTTP/1.1 200 OK\r\nProxy-Authenticate: Negotiate YWJj\r\n\r\n");
    assert_eq!(r.negotiate(), Some("YWJj"));
    // Only spaces and tabs are trimmed (OWS): a control or Unicode space is part of
    // the scheme or token.
    for odd in ["\u{b}Negotiate", "\u{a0}Negotiate", "Negotiate\u{c}"] {
        assert_eq!(negotiate_in([odd].into_iter()), None, "{odd:?}");
    }
    assert_eq!(negotiate_in([" \tNegotiate \t"].into_iter()), Some(""));
    assert_eq!(
        negotiate_in(["Negotiate YWJj\u{3000}"].into_iter()),
        Some("YWJj\u{3000}")
    );
    let r = answer(
        "HTTP/1.1 407 Auth\r\nProxy-Authenticate: Basic\r\nContent-Length: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.negotiate(), None);
    assert_eq!(r.body(), BodyLength::Unusable);
    for unusable in [
        "HTTP/1.1 407 A\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 407 A\r\n\r\n",
        "HTTP/1.0 407 A\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 407 A\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 407 A\r\nContent-Length: -1\r\n\r\n",
    ] {
        assert_eq!(
            answer(unusable).body(),
            BodyLength::Unusable,
            "{unusable:?}"
        );
    }
    assert_eq!(answer("HTTP/1.1 407 A\r\n\r\n").offered(), "no scheme");
    let refusal = answer("HTTP/1.1 407 A\r\nProxy-Authenticate: Basic\r\n\r\n").refusal(
        "192.0.2.1:443",
        true,
        "http://p:1",
    );
    let HandshakeError::Refused { detail, next_addr } = refusal else {
        panic!("{refusal:?}");
    };
    assert!(!next_addr);
    assert!(
        detail.contains("configured credentials were refused"),
        "{detail}"
    );
    assert!(detail.contains("it offers Basic"), "{detail}");
}

/// Through TLS the head is read byte by byte: the tunnel's first bytes stay unread.
#[tokio::test]
async fn a_head_inside_a_stream_without_peek_is_read_exactly() {
    let (mut a, mut b) = tokio::io::duplex(1024);
    b.write_all(b"HTTP/1.1 200 OK\r\n\r\ntunnel").await.unwrap();
    let head = read_head_bytewise(&mut a).await.unwrap();
    assert_eq!(head, b"HTTP/1.1 200 OK\r\n\r\n");
    let mut rest = [0u8; 6];
    a.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"tunnel");
}

#[test]
fn authorities_are_canonical() {
    let v6: IpAddr = "2001:db8::1".parse().unwrap();
    assert_eq!(Dest::Ip(v6).authority(443), "[2001:db8::1]:443");
    let h = policy::canonicalize_host("Example.COM.").unwrap();
    assert_eq!(Dest::Host(&h).authority(80), "example.com:80");
    assert!(!line_safe("a\r\nb"));
    assert!(!line_safe("a\0"));
    assert!(line_safe("CONNECT example.com:443 HTTP/1.1"));
}

#[tokio::test]
async fn connect_head_is_read_exactly() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        let req = String::from_utf8_lossy(&buf[..n]).into_owned();
        // Head and first tunnel bytes in one segment.
        s.write_all(b"HTTP/1.1 200 OK\r\nX: y\r\n\r\nhello")
            .await
            .unwrap();
        req
    });
    let mut c = UpstreamStream::Plain(TcpStream::connect(addr).await.unwrap());
    let ip: IpAddr = "192.0.2.7".parse().unwrap();
    let creds = Credentials::new("u".into(), "p".into()).unwrap();
    http_connect(&mut c, Dest::Ip(ip), 443, Some(&creds), "http://p:1")
        .await
        .unwrap();
    let mut rest = [0u8; 5];
    c.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"hello");
    let req = server.await.unwrap();
    assert_eq!(
        req,
        "CONNECT 192.0.2.7:443 HTTP/1.1\r\nHost: 192.0.2.7:443\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
    );
}
