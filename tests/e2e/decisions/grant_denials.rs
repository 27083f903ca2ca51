//! Every policy denial the grant and the address classifier produce (design sections
//! 4.1-4.3, 6), each checked on the wire (status, `X-Mediator-Decision`, JSON body) and
//! in the decision log, and each shown not to have reached the origin.
//!
//! The private and special addresses below only ever appear inside DNS answers from our
//! loopback DNS server; the mediator must refuse them, and the test connects only to the
//! mediator.

use crate::support::is;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::Event;
use policy::Reason;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Denial, Fixture, LOOPBACK, ORIGIN_HOST, TOKEN_A, TOKEN_B,
    check_deny, check_line, check_tcp_peer,
};
use serde_json::{Value, json};

use crate::support::mediator;

/// `agent-a` with a grant that has something for every denial reason; `agent-b` may
/// reach `origin.test` but has no `allow_private`.
async fn fixture() -> Result<Fixture> {
    let fx = Fixture::start(
        mediator()
            .authority(
                AuthoritySpec::new(AGENT_A)
                    .allow(&[
                        ORIGIN_HOST,
                        "*.svc.test",
                        "ported.test:443",
                        "*.addr.test",
                        "evil.test",
                        "127.0.0.1",
                        "self.test",
                    ])
                    .deny(&["bad.svc.test", "*:25"])
                    .allow_private(&["127.0.0.0/8"])
                    .token(TOKEN_A),
            )
            .authority(
                AuthoritySpec::new(AGENT_B)
                    .allow(&[ORIGIN_HOST])
                    .token(TOKEN_B),
            )
            .global_deny(&["evil.test"]),
    )
    .await?;
    fx.resolve(
        &[
            "a.svc.test",
            "bad.svc.test",
            "ported.test",
            "evil.test",
            "other.test",
            "self.test",
        ],
        LOOPBACK,
    );
    Ok(fx)
}

async fn host_outside_grant_is_403_not_in_allowlist_and_never_resolved() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    let resp = fx.connect_a(&format!("other.test:{port}")).await?;
    let Denial { body, line } = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some("other.test"),
            &[
                ("event", json!("decision")),
                ("authority", json!(AGENT_A)),
                ("channel", json!("tcp")),
                ("protocol", json!("connect")),
                ("port", json!(port)),
                ("pin", Value::Null),
            ],
        )
        .await?;
    assert_eq!(body["authority"], AGENT_A);
    assert_eq!(body["port"], json!(port));
    // The hint tells an agent what would make it work: the missing grant entry.
    assert!(
        body["hint"]
            .as_str()
            .is_some_and(|h| h.contains("other.test")),
        "hint should name the host to add: {body}"
    );
    check_tcp_peer(&line)?;
    assert_eq!(
        fx.dns.queries("other.test"),
        0,
        "resolution must come after the decision"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn deny_rule_beats_allow_wildcard_403_denied_by_rule() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    // The wildcard itself works...
    let ok = fx.connect_a(&format!("a.svc.test:{port}")).await?;
    assert_eq!(ok.status, 200, "{ok:?} {}", ok.text());
    // ...but the deny entry wins.
    let resp = fx.connect_a(&format!("bad.svc.test:{port}")).await?;
    let line = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "denied_by_rule",
            Some("bad.svc.test"),
            &[("authority", json!(AGENT_A)), ("pin", Value::Null)],
        )
        .await?
        .line;
    assert!(
        line["rule"]
            .as_str()
            .is_some_and(|r| r.contains("bad.svc.test")),
        "rule should name the deny entry: {line}"
    );
    assert_eq!(fx.dns.queries("bad.svc.test"), 0);
    Ok(())
}

async fn wildcard_deny_on_port_applies_to_every_host() -> Result<()> {
    let fx = fixture().await?;
    let resp = fx.connect_a(&format!("{ORIGIN_HOST}:25")).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "denied_by_rule",
            Some(ORIGIN_HOST),
            &[("port", json!(25))],
        )
        .await?;
    assert_eq!(denial.body["port"], json!(25));
    Ok(())
}

async fn global_deny_beats_a_grants_allow() -> Result<()> {
    let fx = fixture().await?;
    let resp = fx
        .connect_a(&format!("evil.test:{}", fx.origin.port()))
        .await?;
    fx.mediator
        .expect_deny(
            &resp,
            403,
            "denied_by_rule",
            Some("evil.test"),
            &[("authority", json!(AGENT_A))],
        )
        .await?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn allowed_host_on_other_port_is_403_port_not_allowed() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    let resp = fx.connect_a(&format!("ported.test:{port}")).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "port_not_allowed",
            Some("ported.test"),
            &[("port", json!(port)), ("pin", Value::Null)],
        )
        .await?;
    assert_eq!(denial.body["port"], json!(port));
    assert_eq!(fx.dns.queries("ported.test"), 0);
    Ok(())
}

/// For each `(address, reason)`, makes `rN.addr.test` answer the address, CONNECTs to it
/// and checks the denial; collects every deviation and fails once with all of them.
async fn check_address_rows(fx: &Fixture, rows: &[(&str, &str)]) -> Result<()> {
    let port = fx.origin.port();
    let mut failures = Vec::new();
    for (i, (addr, reason)) in rows.iter().enumerate() {
        let ip: IpAddr = addr.parse()?;
        let name = format!("r{i}.addr.test");
        fx.dns.set(&name, [ip]);
        let outcome: Result<()> = async {
            let resp = fx.connect_a(&format!("{name}:{port}")).await?;
            // "a|b": either reason is acceptable (an embedding of a private address is
            // both private and special, section 4.2/4.3).
            let got = resp
                .header("x-mediator-decision")
                .and_then(|v| v.strip_prefix("deny; reason="))
                .unwrap_or_default()
                .to_owned();
            let reason: &str = if reason.split('|').any(|r| r == got) {
                got.as_str()
            } else {
                reason
            };
            fx.mediator
                .expect_deny(
                    &resp,
                    403,
                    reason,
                    Some(&name),
                    &[("pin", Value::Null), ("authority", json!(AGENT_A))],
                )
                .await?;
            anyhow::ensure!(fx.dns.queries(&name) >= 1, "never resolved");
            Ok(())
        }
        .await;
        if let Err(e) = outcome {
            failures.push(format!("{name} -> {addr} (want {reason}): {e:#}"));
        }
    }
    assert_eq!(
        fx.origin.connections(),
        0,
        "a denied address reached the origin"
    );
    if !failures.is_empty() {
        bail!(
            "{} of {} rows failed:\n{}",
            failures.len(),
            rows.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

async fn names_resolving_to_private_addresses_are_403_private_address() -> Result<()> {
    let fx = fixture().await?;
    check_address_rows(
        &fx,
        &[
            ("10.0.0.1", "private_address"),
            ("172.16.5.4", "private_address"),
            ("192.168.1.1", "private_address"),
            ("100.64.0.1", "private_address"),
            ("169.254.169.254", "private_address"),
            ("fd12:3456::1", "private_address"),
            ("fe80::1", "private_address"),
        ],
    )
    .await
}

async fn names_resolving_to_special_addresses_are_403_special_address() -> Result<()> {
    let fx = fixture().await?;
    check_address_rows(
        &fx,
        &[
            ("192.0.2.1", "special_address"),
            ("198.51.100.7", "special_address"),
            ("203.0.113.9", "special_address"),
            ("198.18.0.1", "special_address"),
            ("240.0.0.1", "special_address"),
            ("224.0.0.1", "special_address"),
            ("255.255.255.255", "special_address"),
            // 0.0.0.0 reaches local listeners on Linux: must never be dialled.
            ("0.0.0.0", "special_address"),
            ("2001:db8::1", "special_address"),
            ("ff02::1", "special_address"),
            ("::", "special_address"),
            // NAT64 embedding of 10.0.0.1: judged by the embedded address and as an
            // embedding: denied as an embedding (special_address, section 4.3).
            ("64:ff9b::a00:1", "special_address"),
            // IPv4-mapped loopback: denied as an embedding even though the grant has
            // allow_private 127.0.0.0/8 (section 4.2: "unless the grant says otherwise"
            // means an explicit embedding exception, not the IPv4 range).
            ("::ffff:127.0.0.1", "special_address"),
            // 6to4 embedding of 10.0.0.1.
            ("2002:a00:1::1", "special_address"),
        ],
    )
    .await
}

async fn loopback_without_allow_private_is_403_private_address() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    let resp = fx
        .connect(&format!("{ORIGIN_HOST}:{port}"), Some((AGENT_B, TOKEN_B)))
        .await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "private_address",
            Some(ORIGIN_HOST),
            &[("authority", json!(AGENT_B)), ("pin", Value::Null)],
        )
        .await?;
    assert_eq!(denial.body["authority"], AGENT_B);
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn connect_to_the_mediators_own_listener_is_403_special_address() -> Result<()> {
    let fx = fixture().await?;
    let own = fx.mediator.tcp_addr();
    // As an IP literal...
    let resp = fx.connect_a(&own.to_string()).await?;
    let line = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "special_address",
            Some(&own.ip().to_string()),
            &[("port", json!(own.port()))],
        )
        .await?
        .line;
    assert!(
        line["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "detail should say why: {line}"
    );
    // ...and through a name.
    let resp = fx.connect_a(&format!("self.test:{}", own.port())).await?;
    fx.mediator
        .expect_deny(&resp, 403, "special_address", Some("self.test"), &[])
        .await?;
    Ok(())
}

async fn ip_literal_in_grant_reaches_loopback_origin() -> Result<()> {
    let fx = fixture().await?;
    let resp = fx
        .connect_a(&format!("127.0.0.1:{}", fx.origin.port()))
        .await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    fx.mediator
        .expect_allow("127.0.0.1", &[("pin", json!("127.0.0.1"))])
        .await?;
    Ok(())
}

async fn malformed_connect_targets_are_400_malformed_target() -> Result<()> {
    check_malformed(&[
        "127.1:80",
        "0x7f.0.0.1:80",
        "2130706433:80",
        "0177.0.0.1:80",
        "127.000.000.001:80",
        "[fe80::1%25eth0]:80",
        "user@origin.test:80",
        "origin.test",
        "origin.test:0",
        "origin.test:99999",
        "[::1]",
    ])
    .await
}

async fn connect_target_with_a_path_is_400_with_the_json_shape() -> Result<()> {
    // Not authority-form (RFC 9110 9.3.6): still a malformed target, same JSON shape.
    check_malformed(&[
        "origin.test:80/path",
        "origin.test:80:80",
        "b\u{fc}cher.example:80",
        "origin\ttest:80",
        "%6frigin.test:80",
    ])
    .await
}

/// CONNECTs to each target as `agent-a`, expects 400 `malformed_target` with the JSON
/// shape and one decision line each, and that nothing was resolved or connected.
async fn check_malformed(targets: &[&str]) -> Result<()> {
    let fx = fixture().await?;
    let mut failures = Vec::new();
    let mut refused = 0usize;
    for target in targets {
        let target = *target;
        let outcome: Result<()> = async {
            let resp = fx.connect_a(target).await?;
            check_deny(&resp, 400, "malformed_target")?;
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => refused += 1,
            Err(e) => failures.push(format!("{target:?}: {e:#}")),
        }
    }
    // One decision line per refused target.
    let counted = fx
        .mediator
        .wait_for_count(
            is(|r| r.event == Event::Decision && r.reason == Reason::MalformedTarget),
            refused,
            Duration::from_secs(5),
        )
        .await;
    if let Err(e) = counted {
        failures.push(format!("decision lines: {e:#}"));
    }
    let lines: Vec<Value> = fx
        .mediator
        .decisions()?
        .into_iter()
        .filter(is(|r| r.reason == Reason::MalformedTarget))
        .collect();
    for line in &lines {
        check_line(
            line,
            &[
                ("decision", json!("deny")),
                ("authority", json!(AGENT_A)),
                ("pin", Value::Null),
            ],
        )?;
    }
    assert_eq!(
        fx.dns.queries(ORIGIN_HOST),
        0,
        "a malformed target was resolved"
    );
    assert_eq!(fx.origin.connections(), 0);
    if !failures.is_empty() {
        bail!(
            "malformed targets not refused as contracted:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

/// A chunked body on a GET is passed on. A chunked request body whose chunk-size line ends in a bare LF (RFC 9112 section 7.1
/// wants CRLF) is the client's fault: 400 `bad_request` naming the body, and a decision
/// line saying so, never a 502 `upstream_failure` blamed on the origin.
async fn a_chunked_body_with_a_bare_lf_is_400_bad_request_not_502() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    let auth = e2e::proxy_authorization(AGENT_A, TOKEN_A);
    let raw = format!(
        "POST http://origin.test:{port}/upload HTTP/1.1\r\nHost: origin.test\r\n{auth}Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"
    );
    // A GET with a well-formed chunked body first: the body reaches the origin (hyper
    // would send a GET whose length it does not know as one with no body).
    let good = format!(
        "GET http://origin.test:{port}/chunked HTTP/1.1\r\nHost: origin.test\r\n{auth}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    let resp = fx.request(&good).await?;
    ensure!(resp.status == 200, "{resp:?}");
    assert_eq!(resp.json()?["body"], "hello");
    let resp = fx.request(&raw).await?;
    let body = check_deny(&resp, 400, "bad_request")?;
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("request body") && d.contains("chunk")),
        "{body}"
    );
    assert_eq!(body["host"], "origin.test", "{body}");
    let line = fx
        .mediator
        .wait_for_log(|v| v["reason"] == "bad_request", e2e::LOG_TIMEOUT)
        .await?;
    check_line(
        &line,
        &[
            ("decision", json!("deny")),
            ("authority", json!(AGENT_A)),
            ("host", json!("origin.test")),
        ],
    )?;
    ensure!(
        fx.mediator
            .decision_lines()?
            .iter()
            .all(|v| v["reason"] != "upstream_failure"),
        "the client's bad body was blamed on the upstream"
    );
    Ok(())
}

/// A request head the mediator does not take (RFC 9112: a transfer coding it does not
/// implement, an obs-folded line, a bare CR) is the client's fault: the JSON deny with
/// `bad_request`, 400, and a log line whose `host` is not the raw request line.
async fn heads_it_does_not_take_are_400_bad_request() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    let auth = e2e::proxy_authorization(AGENT_A, TOKEN_A);
    for raw in [
        format!(
            "POST http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\n{auth}Transfer-Encoding: xchunked\r\n\r\n"
        ),
        format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\n{auth}X-A: b\r\n  folded\r\n\r\n"
        ),
        format!("GET http://origin.test:{port}/ HTTP/1.1\rHost: origin.test\r\n{auth}\r\n"),
    ] {
        let resp = fx.request(&raw).await?;
        let body =
            check_deny(&resp, 400, "bad_request").map_err(|e| anyhow::anyhow!("{raw:?}: {e}"))?;
        ensure!(body["host"].is_null(), "{raw:?}: {body}");
    }
    let lines = fx
        .mediator
        .wait_for_count(|v| v["reason"] == "bad_request", 3, e2e::LOG_TIMEOUT)
        .await?;
    ensure!(lines.iter().all(|l| l["host"].is_null()), "{lines:#?}");
    ensure!(fx.origin.connections() == 0);
    // A later head on a kept-alive connection is hyper's to refuse (a bare 400); it is
    // logged all the same (its credential never parsed: no authority).
    let mut conn = fx.tcp_conn().await?;
    let first = conn
        .request(
            format!(
                "GET http://origin.test:{port}/one HTTP/1.1\r\nHost: origin.test\r\n{auth}\r\n"
            )
            .as_bytes(),
        )
        .await?;
    ensure!(first.status == 200, "{first:?}");
    let second = conn
        .request(
            format!("GET http://origin.test:{port}/two HTTP/1.1\rHost: origin.test\r\n{auth}\r\n")
                .as_bytes(),
        )
        .await?;
    ensure!(second.status == 400, "{second:?}");
    fx.mediator
        .wait_for_count(
            |v| {
                v["reason"] == "bad_request"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("unparsable"))
            },
            3,
            e2e::LOG_TIMEOUT,
        )
        .await?;
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(heads_it_does_not_take_are_400_bad_request),
        case!(a_chunked_body_with_a_bare_lf_is_400_bad_request_not_502),
        case!(host_outside_grant_is_403_not_in_allowlist_and_never_resolved),
        case!(deny_rule_beats_allow_wildcard_403_denied_by_rule),
        case!(wildcard_deny_on_port_applies_to_every_host),
        case!(global_deny_beats_a_grants_allow),
        case!(allowed_host_on_other_port_is_403_port_not_allowed),
        case!(names_resolving_to_private_addresses_are_403_private_address),
        case!(names_resolving_to_special_addresses_are_403_special_address),
        case!(loopback_without_allow_private_is_403_private_address),
        case!(connect_to_the_mediators_own_listener_is_403_special_address),
        case!(ip_literal_in_grant_reaches_loopback_origin),
        case!(malformed_connect_targets_are_400_malformed_target),
        case!(connect_target_with_a_path_is_400_with_the_json_shape),
    ]
}
