//! Operator reasons (design section 18): a deny entry's `reason` (in an authority and in
//! `[global]`) and an authority's `default_deny_reason` reach the client as `message`
//! in the JSON deny, and the decision log and `/v1/authorities/NAME/denials` carry the
//! same text; an authority created through the admin API takes the same tables, and a
//! reason that is not printable ASCII, or longer than 400 bytes, is refused at load.

use e2e::case;
use e2e::harness::Case;

use anyhow::{Result, ensure};
use e2e::{AGENT_A, AuthoritySpec, Fixture, LOOPBACK, ORIGIN_HOST, TOKEN_A};
use serde_json::{Value, json};

use crate::support::mediator;

const PASTE: &str = "paste sites are off limits; use gist.corp";
const MAIL: &str = "agents send no mail; use the notify API";
const ASK: &str = "ask #netops (netops@corp.test) for a new host";

async fn fixture() -> Result<Fixture> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .authority(
                AuthoritySpec::new(AGENT_A)
                    .allow(&[ORIGIN_HOST, "*.paste.test", "mail.test"])
                    .deny(&["plain.paste.test"])
                    .deny_because("*.paste.test", PASTE)
                    .raw(&format!("default_deny_reason = {ASK:?}"))
                    .allow_private(&["127.0.0.0/8"])
                    .token(TOKEN_A),
            )
            .global_deny_because("*:25", MAIL),
    )
    .await?;
    fx.resolve(&["x.paste.test", "plain.paste.test", "mail.test"], LOOPBACK);
    Ok(fx)
}

async fn a_deny_entrys_reason_is_the_message_on_the_wire_in_the_log_and_in_denials() -> Result<()> {
    let fx = fixture().await?;
    let m = &fx.mediator;
    let resp = fx.connect_a("x.paste.test:443").await?;
    let d = m
        .expect_deny(&resp, 403, "denied_by_rule", Some("x.paste.test"), &[])
        .await?;
    ensure!(d.body["message"] == PASTE, "JSON deny: {}", d.body);
    ensure!(d.line["message"] == PASTE, "decision line: {}", d.line);
    // The same entry written plainly carries no message.
    let resp = fx.connect_a("plain.paste.test:443").await?;
    let d = m
        .expect_deny(&resp, 403, "denied_by_rule", Some("plain.paste.test"), &[])
        .await?;
    ensure!(
        d.body.get("message").is_none(),
        "no reason, no message: {}",
        d.body
    );
    ensure!(d.line.get("message").is_none(), "{}", d.line);
    let denials = m
        .admin_get(&format!("/v1/authorities/{AGENT_A}/denials"))
        .await?;
    let list = denials["denials"].as_array().cloned().unwrap_or_default();
    ensure!(list.len() == 2, "{denials}");
    ensure!(list[0]["message"] == PASTE, "{denials}");
    ensure!(list[1].get("message").is_none(), "{denials}");
    Ok(())
}

async fn a_global_reason_and_the_default_reason_reach_the_client() -> Result<()> {
    let fx = fixture().await?;
    let m = &fx.mediator;
    let resp = fx.connect_a("mail.test:25").await?;
    let d = m
        .expect_deny(&resp, 403, "denied_by_rule", Some("mail.test"), &[])
        .await?;
    ensure!(d.body["message"] == MAIL, "{}", d.body);
    // Outside the grant, and on a port the grant does not name: the default reason.
    let resp = fx.connect_a("elsewhere.test:443").await?;
    let d = m
        .expect_deny(&resp, 403, "not_in_allowlist", Some("elsewhere.test"), &[])
        .await?;
    ensure!(d.body["message"] == ASK, "{}", d.body);
    ensure!(d.line["message"] == ASK, "{}", d.line);
    // An allowed connection says nothing of it.
    let port = fx.origin.port();
    let ok = fx.connect_a(&format!("{ORIGIN_HOST}:{port}")).await?;
    ensure!(ok.status == 200, "{ok:?}");
    Ok(())
}

async fn the_admin_api_takes_reasons_and_refuses_bad_ones() -> Result<()> {
    let fx = fixture().await?;
    let m = &fx.mediator;
    let body = json!({
        "name": "agent-c",
        "allow": [ORIGIN_HOST],
        "deny": [{"host": "*.paste.test", "reason": PASTE}],
        "default_deny_reason": ASK,
        "generate_token": true,
    });
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let token = resp.json()?["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let resp = fx
        .connect("y.paste.test:443", Some(("agent-c", &token)))
        .await?;
    let d = m
        .expect_deny(&resp, 403, "denied_by_rule", Some("y.paste.test"), &[])
        .await?;
    ensure!(d.body["message"] == PASTE, "{}", d.body);
    let resp = fx
        .connect("other.test:443", Some(("agent-c", &token)))
        .await?;
    let d = m
        .expect_deny(&resp, 403, "not_in_allowlist", Some("other.test"), &[])
        .await?;
    ensure!(d.body["message"] == ASK, "{}", d.body);

    for (bad, field) in [
        (
            json!({"name": "x", "deny": [{"host": "a.test", "reason": "caf\u{e9}"}]}),
            "deny",
        ),
        (
            json!({"name": "x", "deny": [{"host": "a.test", "reason": "r".repeat(401)}]}),
            "deny",
        ),
        (
            json!({"name": "x", "default_deny_reason": "line\nbreak"}),
            "default_deny_reason",
        ),
        (
            json!({"name": "x", "deny": [{"host": "a.test", "why": "typo"}]}),
            "deny",
        ),
    ] {
        let resp = m
            .admin("POST", "/v1/authorities", Some(&bad.to_string()), None)
            .await?;
        ensure!(resp.status == 400, "{bad}: {}", resp.text());
        let v: Value = resp.json()?;
        ensure!(v["field"] == field, "{bad}: {v}");
    }
    let list = m.admin_get("/v1/authorities").await?;
    ensure!(
        !list.to_string().contains("\"x\""),
        "a refused authority must not exist: {list}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(a_deny_entrys_reason_is_the_message_on_the_wire_in_the_log_and_in_denials),
        case!(a_global_reason_and_the_default_reason_reach_the_client),
        case!(the_admin_api_takes_reasons_and_refuses_bad_ones),
    ]
}
