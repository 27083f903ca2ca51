//! Unit tests of `upgrade`.

use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn h1(pairs: &[(&str, &str)]) -> Result<Option<Switch>, String> {
    requested(&Method::GET, &headers(pairs), Version::HTTP_11, None).map_err(|e| e.to_string())
}

#[test]
fn one_token_with_connection_upgrade_is_a_switch() {
    let ws = Switch {
        token: UpgradeToken::WebSocket,
        via: Via::Upgrade,
    };
    assert_eq!(
        h1(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket")
        ]),
        Ok(Some(ws))
    );
    assert_eq!(h1(&[]), Ok(None));
    assert_eq!(
        h1(&[("connection", "upgrade"), ("upgrade", "Foo/2")]).map(|s| s.map(|s| s.token)),
        Ok(Some(UpgradeToken::Other("foo/2".into())))
    );
    for (bad, why) in [
        (&[("connection", "upgrade"), ("upgrade", "h2c")][..], "h2c"),
        (
            &[("connection", "upgrade"), ("upgrade", "websocket, h2c")],
            "one protocol",
        ),
        (&[("upgrade", "websocket")], "without Connection"),
        (&[("connection", "upgrade"), ("upgrade", "a b")], "token"),
    ] {
        let err = h1(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
    let ws = headers(&[("connection", "upgrade"), ("upgrade", "websocket")]);
    assert!(requested(&Method::GET, &ws, Version::HTTP_2, None).is_err());
    // Bytes that are Unicode whitespace once decoded are part of the token.
    for odd in [&b"websocket\xc2\xa0"[..], b"\xe3\x80\x80websocket"] {
        let mut h = headers(&[("connection", "upgrade")]);
        h.append(header::UPGRADE, HeaderValue::from_bytes(odd).unwrap());
        assert!(
            requested(&Method::GET, &h, Version::HTTP_11, None).is_err(),
            "{odd:?}"
        );
    }
}

#[test]
fn an_extended_connect_is_judged_as_the_get_it_stands_for_and_a_plain_connect_is_refused() {
    let none = HeaderMap::new();
    let s = requested(&Method::CONNECT, &none, Version::HTTP_2, Some(b"websocket"))
        .unwrap()
        .unwrap();
    assert_eq!(s.via, Via::ExtendedConnect);
    assert_eq!(s.judged_method(&Method::CONNECT), "GET");
    for (method, version, protocol) in [
        (Method::CONNECT, Version::HTTP_2, None),
        (Method::CONNECT, Version::HTTP_11, None),
        (Method::GET, Version::HTTP_2, Some(&b"websocket"[..])),
        (Method::CONNECT, Version::HTTP_2, Some(b"h2c")),
        (Method::CONNECT, Version::HTTP_2, Some(b"a\x01")),
        (Method::CONNECT, Version::HTTP_2, Some(b"websocket\t")),
        (Method::CONNECT, Version::HTTP_2, Some(b" websocket")),
    ] {
        assert!(
            requested(&method, &none, version, protocol).is_err(),
            "{method} {version:?} {protocol:?}"
        );
    }
}

#[test]
fn a_translated_websocket_needs_the_accept_of_its_own_key() {
    let switch = Switch {
        token: UpgradeToken::WebSocket,
        via: Via::ExtendedConnect,
    };
    let plan = plan(&switch, Carrier::H1).unwrap();
    let Plan::ToUpgrade { key: Some(key) } = &plan else {
        panic!("{plan:?}");
    };
    let (mut req, ()) = http::Request::new(()).into_parts();
    req.method = Method::CONNECT;
    prepare(&mut req, &switch, &plan);
    assert_eq!(req.method, Method::GET);
    assert_eq!(req.headers[header::UPGRADE], "websocket");
    assert_eq!(req.headers[&WS_KEY], key.as_str());

    let answer = |status: StatusCode, accept: &str| {
        let mut r = http::Response::new(()).into_parts().0;
        r.status = status;
        r.headers.insert(WS_ACCEPT, accept.parse().unwrap());
        r
    };
    let good = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut ok = answer(StatusCode::SWITCHING_PROTOCOLS, &good);
    assert_eq!(switched(&mut ok, &switch, &plan), Ok(true));
    assert_eq!(ok.status, StatusCode::OK);
    assert!(!ok.headers.contains_key(&WS_ACCEPT));
    let mut forged = answer(StatusCode::SWITCHING_PROTOCOLS, "AAAA");
    assert!(switched(&mut forged, &switch, &plan).is_err());
    let mut plain = answer(StatusCode::OK, &good);
    assert!(switched(&mut plain, &switch, &plan).is_err());
    let mut refused = answer(StatusCode::FORBIDDEN, "");
    assert_eq!(switched(&mut refused, &switch, &plan), Ok(false));
    assert!(
        super::plan(
            &switch,
            Carrier::H2 {
                extended_connect: false
            }
        )
        .is_err()
    );
}
