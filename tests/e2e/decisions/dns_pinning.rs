//! Resolution and pinning (design section 7, 4.2): the mediator resolves once per
//! connection, vets every answer, and connects only to the vetted pin; so a name that
//! rebinds from an allowed address to a private one between connections is caught, and a
//! name with one bad answer among good ones is refused.
//!
//! The DNS answers use TTL 0 so the mediator's resolver cache cannot hide a resolution.

use e2e::case;
use e2e::harness::Case;
use std::net::{IpAddr, Ipv4Addr};

use anyhow::Result;
use e2e::{AGENT_A, LOOPBACK, ORIGIN_HOST, QueryKind, TOKEN_A, check_deny, proxy_authorization};
use serde_json::{Value, json};

use crate::support::agent_a;

/// A private address the mediator must never dial (RFC 1918).
const PRIVATE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

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
        .expect_allow(ORIGIN_HOST, &[("pin", json!("127.0.0.1"))])
        .await?;
    assert_eq!(
        fx.dns.queries_of(ORIGIN_HOST, QueryKind::A),
        1,
        "one resolution per connection"
    );

    // Second lookup: the name now answers 10.0.0.1, which the mediator must refuse to dial.
    let resp = fx.connect_a(&target).await?;
    let denied = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "private_address",
            Some(ORIGIN_HOST),
            &[("pin", Value::Null), ("authority", json!(AGENT_A))],
        )
        .await?
        .line;
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

async fn mixed_answers_with_one_private_address_are_denied() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns.set(ORIGIN_HOST, [LOOPBACK, PRIVATE_IP]);
    let resp = fx.connect_a(&fx.origin_target()).await?;
    fx.mediator
        .expect_deny(
            &resp,
            403,
            "private_address",
            Some(ORIGIN_HOST),
            &[("pin", Value::Null)],
        )
        .await?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn mixed_ipv4_and_ipv6_answers_with_one_private_are_denied() -> Result<()> {
    let fx = agent_a().await?;
    let ula: IpAddr = "fd00::1".parse()?;
    fx.dns.set(ORIGIN_HOST, [LOOPBACK, ula]);
    let resp = fx.connect_a(&fx.origin_target()).await?;
    check_deny(&resp, 403, "private_address")?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn absolute_form_requests_resolve_once_each() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns
        .set_sequence(ORIGIN_HOST, vec![vec![LOOPBACK], vec![PRIVATE_IP]]);
    let t = fx.origin_target();
    let auth = proxy_authorization(AGENT_A, TOKEN_A);
    let req = format!("GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\n{auth}Connection: close\r\n\r\n");
    let resp = fx.request(&req).await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    let resp = fx.request(&req).await?;
    check_deny(&resp, 403, "private_address")?;
    assert_eq!(fx.dns.queries_of(ORIGIN_HOST, QueryKind::A), 2);
    assert_eq!(fx.origin.requests(), 1);
    Ok(())
}

/// A label with an underscore is a legal host (design section 4.1): it is resolved by DNS
/// like any other name (the resolver's name is built from the canonical labels, never
/// re-checked as if it had to be an IDNA hostname) and reaches the origin.
async fn a_name_with_an_underscore_label_resolves_and_connects() -> Result<()> {
    const UNDERSCORE: &str = "under_score.example.test";
    let fx = e2e::Fixture::start(
        crate::support::mediator().authority(e2e::agent_a_spec().allow(&[UNDERSCORE])),
    )
    .await?;
    fx.dns.set(UNDERSCORE, [LOOPBACK]);
    let resp = fx.tunnel_get(UNDERSCORE, "/underscore").await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    fx.mediator
        .expect_allow(UNDERSCORE, &[("pin", json!("127.0.0.1"))])
        .await?;
    assert_eq!(fx.dns.queries_of(UNDERSCORE, QueryKind::A), 1);
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(dns_rebinding_between_connections_is_caught_per_connection),
        case!(mixed_answers_with_one_private_address_are_denied),
        case!(mixed_ipv4_and_ipv6_answers_with_one_private_are_denied),
        case!(absolute_form_requests_resolve_once_each),
        case!(a_name_with_an_underscore_label_resolves_and_connects),
    ]
}
