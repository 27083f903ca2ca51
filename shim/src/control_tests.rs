use super::*;

#[test]
fn a_rebind_is_listed_and_new_connections_take_it() {
    let b = Binding::new(
        Bound::Socket("/run/m/a.sock".into()),
        mediator::labels::Labels::default(),
    );
    let r = b.rebind(Bound::Socket("/run/m/b.sock".into()));
    assert_eq!(
        (r.from.as_str(), r.to.as_str()),
        ("/run/m/a.sock", "/run/m/b.sock")
    );
    assert!(matches!(b.current(), Bound::Socket(p) if p == Path::new("/run/m/b.sock")));
    assert_eq!(b.rebinds().0, [r]);
}

#[test]
fn a_stale_socket_is_taken_over_and_a_live_one_is_not() {
    let dir = std::env::temp_dir().join(format!("shim-control-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ctl.sock");
    // Live: refused.
    let live = UnixListener::bind(&path).unwrap();
    assert!(
        ControlSocket::bind(&path)
            .unwrap_err()
            .to_string()
            .contains("exists")
    );
    // Stale (its listener gone, the file left): taken over.
    drop(live);
    let c = ControlSocket::bind(&path).unwrap();
    assert!(UnixStream::connect(&path).is_ok());
    drop(c);
    assert!(!path.exists(), "removed at drop");
    // A file: refused, and left alone.
    std::fs::write(&path, "x").unwrap();
    assert!(ControlSocket::bind(&path).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "x");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn commands_are_checked() {
    let b = Binding::new(
        Bound::Socket("/nonexistent/a.sock".into()),
        mediator::labels::Labels::default(),
    );
    let mut r = socket_rebinder(Path::new("/nonexistent/a.sock"), false);
    let e = |line: &str, r: &mut Rebinder| rebind(line.as_bytes(), &b, r).unwrap_err().to_string();
    assert!(e("nope", &mut r).contains("not a JSON line"));
    assert!(e(r#"{"edit": {}}"#, &mut r).contains("unknown command"));
    assert!(e(r#"{"rebind": "b", "x": 1}"#, &mut r).contains("one key"));
    assert!(e(r#"{"rebind": "../b"}"#, &mut r).contains("rebind \"../b\""));
    assert!(e(r#"{"rebind": "b"}"#, &mut r).contains("/nonexistent/b.sock"));
    assert!(e(r#"{"rebind": 5}"#, &mut r).contains("a string"));
    let twice = e(
        r#"{"rebind": {"allow": ["ok.test"], "allow": ["evil.test"]}}"#,
        &mut r,
    );
    assert!(twice.contains(r#"key "allow" is given twice"#), "{twice}");
    assert!(e(r#"{"rebind": "b", "rebind": "c"}"#, &mut r).contains("given twice"));
    assert!(b.rebinds().0.is_empty(), "nothing was rebound");
}
