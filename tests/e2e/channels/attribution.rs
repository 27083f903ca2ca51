//! Attribution (design sections 1, 5, 10): one mediator, two authorities with different
//! grants; the same destination gets opposite verdicts depending on who asks, and each
//! decision line names the authority that asked, on both channels.

use crate::support::{is, records};
use anyhow::Result;
use e2e::case;
use e2e::harness::Case;
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Fixture, LOG_TIMEOUT, LOOPBACK, ORIGIN_HOST, TOKEN_A, TOKEN_B,
    agent_a_spec, check_deny, check_line,
};
use mediator::vocab::Event;
use policy::{Reason, Verdict};
use serde_json::json;

use crate::support::mediator;

async fn fixture() -> Result<Fixture> {
    let fx = Fixture::start(
        mediator().authority(agent_a_spec()).authority(
            AuthoritySpec::new(AGENT_B)
                .allow(&["other.test"])
                .allow_private(&["127.0.0.0/8"])
                .token(TOKEN_B),
        ),
    )
    .await?;
    fx.dns.set("other.test", [LOOPBACK]);
    Ok(fx)
}

/// The decision lines for `host`, as `(authority, decision, reason)`, by authority.
fn verdicts(fx: &Fixture, host: &str) -> Result<Vec<(String, Verdict, Reason)>> {
    let mut out: Vec<_> = records(&fx.mediator)?
        .into_iter()
        .filter(|r| r.event == Event::Decision && r.host.as_deref() == Some(host))
        .map(|r| (r.authority.unwrap_or_default(), r.decision, r.reason))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

async fn same_destination_opposite_verdicts_over_tcp_credentials() -> Result<()> {
    let fx = fixture().await?;
    let port = fx.origin.port();
    for (host, allowed_by, denied_by) in [
        (ORIGIN_HOST, (AGENT_A, TOKEN_A), (AGENT_B, TOKEN_B)),
        ("other.test", (AGENT_B, TOKEN_B), (AGENT_A, TOKEN_A)),
    ] {
        let target = format!("{host}:{port}");
        let ok = fx.connect(&target, Some(allowed_by)).await?;
        assert_eq!(ok.status, 200, "{} -> {host}: {ok:?}", allowed_by.0);
        let no = fx.connect(&target, Some(denied_by)).await?;
        let body = check_deny(&no, 403, "not_in_allowlist")?;
        assert_eq!(body["authority"], denied_by.0);
    }
    fx.mediator
        .wait_for_count(is(|r| r.event == Event::Decision), 4, LOG_TIMEOUT)
        .await?;
    assert_eq!(
        verdicts(&fx, ORIGIN_HOST)?,
        vec![
            (AGENT_A.to_owned(), Verdict::Allow, Reason::Allowed),
            (AGENT_B.to_owned(), Verdict::Deny, Reason::NotInAllowlist),
        ]
    );
    let other = verdicts(&fx, "other.test")?;
    assert_eq!(
        other,
        vec![
            (AGENT_A.to_owned(), Verdict::Deny, Reason::NotInAllowlist),
            (AGENT_B.to_owned(), Verdict::Allow, Reason::Allowed),
        ]
    );
    for line in fx.mediator.decisions()? {
        check_line(
            &line,
            &[("channel", json!("tcp")), ("protocol", json!("connect"))],
        )?;
    }
    Ok(())
}

async fn same_destination_opposite_verdicts_over_unix_sockets() -> Result<()> {
    let fx = fixture().await?;
    let target = fx.origin_target();
    let ok = fx.connect_unix(AGENT_A, &target).await?;
    assert_eq!(ok.status, 200, "{ok:?}");
    let no = fx.connect_unix(AGENT_B, &target).await?;
    let body = check_deny(&no, 403, "not_in_allowlist")?;
    assert_eq!(body["authority"], AGENT_B);
    fx.mediator
        .wait_for_count(is(|r| r.event == Event::Decision), 2, LOG_TIMEOUT)
        .await?;
    assert_eq!(
        verdicts(&fx, ORIGIN_HOST)?,
        vec![
            (AGENT_A.to_owned(), Verdict::Allow, Reason::Allowed),
            (AGENT_B.to_owned(), Verdict::Deny, Reason::NotInAllowlist),
        ]
    );
    for line in fx.mediator.decisions()? {
        check_line(&line, &[("channel", json!("unix"))])?;
    }
    Ok(())
}

async fn credential_on_a_unix_socket_cannot_borrow_another_authority() -> Result<()> {
    let fx = fixture().await?;
    // agent-a's socket, presenting agent-b's valid credential for agent-b's host.
    let resp = fx
        .unix_conn(AGENT_A)
        .await?
        .connect(
            &format!("other.test:{}", fx.origin.port()),
            Some((AGENT_B, TOKEN_B)),
        )
        .await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some("other.test"),
            &[("authority", json!(AGENT_A)), ("channel", json!("unix"))],
        )
        .await?;
    assert_eq!(
        denial.body["authority"], AGENT_A,
        "the socket decides the authority"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(same_destination_opposite_verdicts_over_tcp_credentials),
        case!(same_destination_opposite_verdicts_over_unix_sockets),
        case!(credential_on_a_unix_socket_cannot_borrow_another_authority),
    ]
}
