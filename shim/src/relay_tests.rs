use super::*;

/// The mediator's 403 denial of `evil.example:443` for `reason`, header and body.
fn denial_of_evil_example(reason: &str) -> String {
    let body = format!(r#"{{"host":"evil.example","port":443,"reason":"{reason}"}}"#);
    format!(
        "HTTP/1.1 403 Forbidden\r\nX-Mediator-Decision: deny; reason={reason}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn http_denial_is_parsed_from_header_and_body() {
    let body = r#"{"error":"egress_denied","authority":"a","host":"evil.example","port":443,"reason":"not_in_allowlist","detail":"no rule","hint":"add evil.example:443"}"#;
    let reply = format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nX-Mediator-Decision: deny; reason=not_in_allowlist\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let Sniff::Denied(d) = inspect_reply(reply.as_bytes()) else {
        panic!()
    };
    assert_eq!(d.status, 403);
    assert_eq!(d.reason.as_deref(), Some("not_in_allowlist"));
    assert_eq!(d.host.as_deref(), Some("evil.example"));
    assert_eq!(d.port, Some(443));
    assert_eq!(d.hint.as_deref(), Some("add evil.example:443"));
    // Split across reads: needs more until the body is complete.
    assert_eq!(
        inspect_reply(&reply.as_bytes()[..reply.len() - 5]),
        Sniff::NeedMore
    );
}

#[test]
fn an_http_denial_of_a_connect_is_a_connect_denial() {
    let reply = denial_of_evil_example("ask_timeout");
    let Sniff::Denied(d) = inspect_reply(reply.as_bytes()) else {
        panic!()
    };
    let connect = Mutex::new(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n".to_vec());
    assert_eq!(with_target(d.clone(), &connect).protocol, "connect");
    let get = Mutex::new(b"GET http://evil.example/ HTTP/1.1\r\n\r\n".to_vec());
    assert_eq!(with_target(d, &get).protocol, "http");
}

#[test]
fn allowed_connect_and_origin_headers_are_not_denials() {
    assert_eq!(
        inspect_reply(b"HTTP/1.1 200 Connection established\r\n\r\n"),
        Sniff::NotDenied
    );
    assert_eq!(
        inspect_reply(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"),
        Sniff::NotDenied
    );
    assert_eq!(inspect_reply(b"\x16\x03\x01"), Sniff::NotDenied);
}

#[test]
fn socks5_not_allowed_reply_is_a_denial() {
    assert!(matches!(
        inspect_reply(&[5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0]),
        Sniff::Denied(_)
    ));
    assert_eq!(inspect_reply(&[5, 0, 5, 0, 0, 1]), Sniff::NotDenied);
    let Sniff::Denied(d) = inspect_reply(&[5, 0, 5, 4, 0, 1]) else {
        panic!("REP 0x04 is a failure");
    };
    assert_eq!(d.status, 4);
    assert!(d.detail.unwrap().contains("host unreachable"));
    assert_eq!(inspect_reply(&[5, 0]), Sniff::NeedMore);
}

#[test]
fn an_answer_is_held_until_it_is_known_and_a_socks_method_selection_is_not() {
    // HTTP, in pieces: nothing passes until the denial's body is complete.
    let reply = denial_of_evil_example("not_in_allowlist");
    let mut w = Watch::default();
    let (pass, d) = w.take(&reply.as_bytes()[..20]);
    assert!(pass.is_empty() && d.is_none());
    let (pass, d) = w.take(&reply.as_bytes()[20..]);
    assert_eq!(pass, reply.as_bytes());
    assert_eq!(d.unwrap().host.as_deref(), Some("evil.example"));
    assert_eq!(w.take(b"more").0, b"more");
    // SOCKS5: the method selection passes at once, the failure reply after its denial.
    let mut w = Watch::default();
    let (pass, d) = w.take(&[5, 0]);
    assert_eq!((pass, d), (vec![5, 0], None));
    let (pass, d) = w.take(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(pass, [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(d.unwrap().status, 2);
    // A success passes whole, and so does an answer that is not the mediator's.
    let mut w = Watch::default();
    assert_eq!(
        w.take(b"HTTP/1.1 200 OK\r\n\r\nx"),
        (b"HTTP/1.1 200 OK\r\n\r\nx".to_vec(), None)
    );
    let mut w = Watch::default();
    assert_eq!(w.take(b"HTTP/1.1 2").0, b"");
    assert_eq!(w.end(), (b"HTTP/1.1 2".to_vec(), None));
}

#[test]
fn the_connect_line_names_the_target() {
    assert_eq!(
        connect_target(b"CONNECT api.test:8443 HTTP/1.1\r\nHost: x\r\n\r\n"),
        Some(("api.test".into(), 8443))
    );
    assert_eq!(
        connect_target(b"CONNECT [::1]:443 HTTP/1.1\r\n"),
        Some(("::1".into(), 443))
    );
    assert_eq!(connect_target(b"GET http://a/ HTTP/1.1\r\n"), None);
}

#[test]
fn the_socks5_request_names_the_target() {
    let mut name = vec![5, 1, 0, 5, 1, 0, 3, 12];
    name.extend_from_slice(b"evil.example");
    name.extend_from_slice(&443u16.to_be_bytes());
    assert_eq!(socks_target(&name), Some(("evil.example".into(), 443)));
    let v4 = [5, 2, 0, 1, 5, 1, 0, 1, 192, 0, 2, 1, 0, 80];
    assert_eq!(socks_target(&v4), Some(("192.0.2.1".into(), 80)));
    assert_eq!(socks_target(&[5, 1, 0, 5, 1, 0, 3]), None);
    assert_eq!(socks_target(b"CONNECT a:1 HTTP/1.1"), None);
}
