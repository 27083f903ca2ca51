//! Resolution and pinning (design section 7, 4.2): the mediator resolves once per
//! connection, vets every answer, and connects only to the vetted pin; so a name that
//! rebinds from an allowed address to a private one between connections is caught, and a
//! name with one bad answer among good ones is refused.
//!
//! The DNS answers use TTL 0 so the mediator's resolver cache cannot hide a resolution.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::Result;
use e2e::{AGENT_A, LOOPBACK, ORIGIN_HOST, QueryKind, TOKEN_A, check_deny, check_line};
use serde_json::{Value, json};

use crate::support::agent_a;

/// A private address the mediator must never dial (RFC 1918).
const PRIVATE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_between_connections_is_caught_per_connection() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns
        .set_sequence(ORIGIN_HOST, vec![vec![LOOPBACK], vec![PRIVATE_IP]]);
    let target = fx.origin_target();

    // First connection: the name answers 127.0.0.1 (allowed by allow_private).
    let mut first = fx.tcp_conn().await?;
    let resp = first.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    let allowed = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &allowed,
        &[("pin", json!("127.0.0.1")), ("decision", json!("allow"))],
    )?;
    assert_eq!(
        fx.dns.queries_of(ORIGIN_HOST, QueryKind::A),
        1,
        "one resolution per connection"
    );

    // Second lookup: the name now answers 10.0.0.1, which the mediator must refuse to dial.
    let mut second = fx.tcp_conn().await?;
    let resp = second.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
    let body = check_deny(&resp, 403, "private_address")?;
    assert_eq!(body["host"], ORIGIN_HOST);
    let denied = fx
        .mediator
        .wait_for_decision("private_address", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &denied,
        &[
            ("pin", Value::Null),
            ("decision", json!("deny")),
            ("authority", json!(AGENT_A)),
        ],
    )?;
    assert_ne!(allowed["id"], denied["id"]);

    assert_eq!(
        fx.dns.queries_of(ORIGIN_HOST, QueryKind::A),
        2,
        "the mediator must resolve exactly once per connection"
    );
    assert_eq!(
        fx.origin.connections(),
        1,
        "only the first connection may reach the origin"
    );
    drop(first);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_answers_with_one_private_address_are_denied() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns.set(ORIGIN_HOST, [LOOPBACK, PRIVATE_IP]);
    let mut conn = fx.tcp_conn().await?;
    let resp = conn
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    check_deny(&resp, 403, "private_address")?;
    let line = fx
        .mediator
        .wait_for_decision("private_address", Some(ORIGIN_HOST))
        .await?;
    check_line(&line, &[("pin", Value::Null), ("decision", json!("deny"))])?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_ipv4_and_ipv6_answers_with_one_private_are_denied() -> Result<()> {
    let fx = agent_a().await?;
    let ula: IpAddr = "fd00::1".parse()?;
    fx.dns.set(ORIGIN_HOST, [LOOPBACK, ula]);
    let mut conn = fx.tcp_conn().await?;
    let resp = conn
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    check_deny(&resp, 403, "private_address")?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_requests_resolve_once_each() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns
        .set_sequence(ORIGIN_HOST, vec![vec![LOOPBACK], vec![PRIVATE_IP]]);
    let t = fx.origin_target();
    let auth = e2e::basic_auth(AGENT_A, TOKEN_A);
    let req = format!(
        "GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n"
    );
    let resp = fx.tcp_conn().await?.request(req.as_bytes()).await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    let resp = fx.tcp_conn().await?.request(req.as_bytes()).await?;
    check_deny(&resp, 403, "private_address")?;
    assert_eq!(fx.dns.queries_of(ORIGIN_HOST, QueryKind::A), 2);
    assert_eq!(fx.origin.requests(), 1);
    Ok(())
}
