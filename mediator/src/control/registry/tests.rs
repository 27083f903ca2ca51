//! The record's sealed encoding and the default state directory.

use std::ffi::OsString;
use std::path::Path;

use policy::config::Placement;
use serde_json::json;

use super::*;

fn record() -> Record {
    Record {
        name: "a".into(),
        created_at: "2026-12-04T10:00:00.000Z".into(),
        expires_at: Some("2026-12-04T11:00:00.000Z".into()),
        authority: json!({ "name": "a", "allow": ["x.test"], "token_sha256": "00" })
            .as_object()
            .unwrap()
            .clone(),
    }
}

#[test]
fn a_record_round_trips_and_any_change_breaks_its_seal() {
    let bytes = encode(&record(), 42).unwrap();
    assert_eq!(decode(&bytes, "a").unwrap(), (record(), 42));
    let text = String::from_utf8(bytes).unwrap();
    for (from, to) in [
        ("x.test", "y.test"),
        ("\"generation\": 42", "\"generation\": 43"),
        ("11:00:00", "12:00:00"),
    ] {
        assert!(text.contains(from), "{from}");
        let e = decode(text.replace(from, to).as_bytes(), "a").unwrap_err();
        assert!(e.contains("SHA-256 does not match"), "{from}: {e}");
    }
    let e = decode(
        text.replace("\"format\": 1", "\"format\": 2").as_bytes(),
        "a",
    )
    .unwrap_err();
    assert!(e.contains("format 2"), "{e}");
    assert!(decode(&encode(&record(), 1).unwrap(), "b").is_err());
    assert!(decode(b"", "a").is_err());
}

#[test]
fn expiry_reads_the_record() {
    let mut r = record();
    let at = |s: &str| humantime::parse_rfc3339(s).unwrap();
    assert!(!r.expired(at("2026-12-04T10:59:59Z")));
    assert!(r.expired(at("2026-12-04T11:00:00Z")));
    r.expires_at = Some("soon".into());
    assert!(
        r.expired(at("2026-12-04T10:00:00Z")),
        "unreadable counts as expired"
    );
    r.expires_at = None;
    assert!(!r.expired(at("2099-01-01T00:00:00Z")));
}

#[test]
fn the_default_state_directory() {
    let d = |pairs: &'static [(&'static str, &'static str)], root| {
        default_state_dir(crate::testing::env(pairs), root)
    };
    assert_eq!(
        d(
            &[("STATE_DIRECTORY", "/var/lib/m:/other"), ("HOME", "/h")],
            false
        ),
        Path::new("/var/lib/m")
    );
    assert_eq!(
        d(&[("STATE_DIRECTORY", "/var/lib/m")], true),
        Path::new("/var/lib/m")
    );
    assert_eq!(
        d(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")], false),
        Path::new("/x/egress-mediator")
    );
    assert_eq!(
        d(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")], false),
        Path::new("/h/.local/state/egress-mediator")
    );
    assert_eq!(
        d(&[("XDG_STATE_HOME", "/x"), ("HOME", "/root")], true),
        Path::new("/x/egress-mediator")
    );
    assert_eq!(
        d(&[("HOME", "/root")], true),
        Path::new("/var/lib/egress-mediator")
    );
    assert_eq!(d(&[], false), Path::new("/var/lib/egress-mediator"));
    assert_eq!(
        d(&[("STATE_DIRECTORY", "relative")], true),
        Path::new("/var/lib/egress-mediator")
    );
}

#[test]
fn the_node_is_the_config_s_else_the_environment_s_else_the_host_name() {
    let with = |node: Option<&str>| Registry {
        node: node.map(str::to_owned),
        ..Registry::default()
    };
    let env = |v: Option<&'static str>| {
        move |k: &str| (k == NODE_ENV).then_some(v).flatten().map(OsString::from)
    };
    let host = |h: Option<&'static str>| move || h.map(str::to_owned);
    assert_eq!(
        node_of(&with(Some("a")), env(Some("b")), host(Some("c"))),
        Ok("a".into())
    );
    assert_eq!(
        node_of(&with(None), env(Some("b")), host(Some("c"))),
        Ok("b".into())
    );
    assert_eq!(
        node_of(&with(None), env(None), host(Some("Web-1.Example"))),
        Ok("web-1.example".into())
    );
    let e = node_of(&with(None), env(Some("B_1")), host(Some("c"))).unwrap_err();
    assert!(e.contains(NODE_ENV) && e.contains("B_1"), "{e}");
    let e = node_of(&with(None), env(None), host(Some("under_score"))).unwrap_err();
    assert!(
        e.contains("host name") && e.contains("[registry] node"),
        "{e}"
    );
    let e = node_of(&with(None), env(None), host(None)).unwrap_err();
    assert!(e.contains("cannot be read"), "{e}");
}

#[test]
fn a_record_s_placement_is_its_table_s_node() {
    let mut r = record();
    assert_eq!(r.placement(), Ok(Placement::Fleet));
    r.authority.insert("node".into(), json!("*"));
    assert_eq!(r.placement(), Ok(Placement::Fleet));
    r.authority.insert("node".into(), json!("n-1"));
    assert_eq!(r.placement(), Ok(Placement::Node("n-1".into())));
    r.authority.insert("node".into(), json!("N 1"));
    assert!(r.placement().is_err());
    r.authority.insert("node".into(), json!(1));
    assert!(r.placement().is_err());
}
