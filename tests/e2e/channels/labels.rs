//! Invocation labels (design section 20): on an authority's Unix socket a PROXY protocol
//! v2 header before the client's bytes carries the invocation id (TLV `0xE0`) and the
//! host's `KEY=VALUE` tags (TLV `0xE1`); every record of the connection carries them
//! (decision, close, `/denials`). A header out of bounds is refused `bad_request`; a
//! second header (what a confined client would send after the shim's) is client bytes,
//! never labels; the shared TCP listener reads no header at all.

use anyhow::{Result, ensure};
use e2e::case;
use e2e::harness::Case;
use e2e::{AGENT_A, AuthoritySpec, Fixture, ORIGIN_HOST, agent_a_spec};
use mediator::labels::Labels;
use serde_json::json;

use crate::support::mediator;

const NARROW: &str = "narrow";

async fn fixture() -> Result<Fixture> {
    Fixture::start(
        mediator()
            .admin(true)
            .authority(agent_a_spec())
            .authority(AuthoritySpec::new(NARROW).allow(&["other.test"])),
    )
    .await
}

fn labels(invocation: &str, tags: &[&str]) -> Vec<u8> {
    Labels::new(Some(invocation), tags.iter().copied())
        .unwrap()
        .proxy_v2_header()
        .unwrap()
}

async fn labels_in_front_of_a_connect_are_on_its_decision_and_close_lines() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    conn.send(&labels("inv-41", &["tool=call_7", "step=2"]))
        .await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    let inner = conn.get(&fx.origin_target(), "/labelled", true).await?;
    assert_eq!(inner.status, 200);
    drop(conn);
    let tags = json!({"tool": "call_7", "step": "2"});
    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("authority", json!(AGENT_A)),
                ("invocation", json!("inv-41")),
                ("tags", tags.clone()),
            ],
        )
        .await?;
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    ensure!(
        close["invocation"] == "inv-41" && close["tags"] == tags,
        "the close line lost the labels: {close}"
    );
    // A connection without a header has no labels at all.
    let mut plain = fx.unix_conn(AGENT_A).await?;
    let resp = plain.connect(&fx.origin_target(), None).await?;
    assert_eq!(resp.status, 200);
    let lines = fx
        .mediator
        .wait_for_count(
            |v| v["event"] == "decision" && v["reason"] == "allowed",
            2,
            e2e::LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        lines[1].get("invocation").is_none() && lines[1].get("tags").is_none(),
        "{}",
        lines[1]
    );
    Ok(())
}

async fn a_labelled_denial_carries_them_to_its_line_and_the_denials_list() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(NARROW).await?;
    conn.send(&labels("inv-d", &["tool=call_9"])).await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    fx.mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some(ORIGIN_HOST),
            &[
                ("authority", json!(NARROW)),
                ("invocation", json!("inv-d")),
                ("tags", json!({"tool": "call_9"})),
            ],
        )
        .await?;
    let denials = fx
        .mediator
        .admin_get(&format!("/v1/authorities/{NARROW}/denials"))
        .await?;
    let first = &denials["denials"][0];
    ensure!(
        first["invocation"] == "inv-d" && first["tags"]["tool"] == "call_9",
        "{denials}"
    );
    Ok(())
}

/// A header whose labels break a bound (a TLV type of the custom range the mediator does
/// not read, here) is refused as a whole: `400`, `bad_request`, nothing is decided.
async fn a_header_out_of_bounds_is_refused_bad_request() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let mut wire = labels("inv-x", &[]);
    // Turn the invocation TLV (type 0xE0 right after the 16-byte fixed part) into 0xE5.
    ensure!(wire[16] == 0xE0, "{wire:?}");
    wire[16] = 0xE5;
    let resp = refused_in_one_write(&mut conn, wire, &fx.origin_target()).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            400,
            "bad_request",
            None,
            &[("authority", json!(AGENT_A))],
        )
        .await?;
    ensure!(
        denial.line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("0xe5")),
        "{}",
        denial.line
    );
    ensure!(
        fx.mediator
            .decision_lines()?
            .iter()
            .all(|v| v["reason"] != "allowed"),
        "something was allowed"
    );
    Ok(())
}

/// Sends `wire` and a CONNECT to `target` in one write and reads the answer: a header the
/// mediator refuses is answered at once and the connection closed, so a CONNECT written
/// after it could meet a closed socket (EPIPE) instead of the answer.
async fn refused_in_one_write(
    conn: &mut e2e::HttpConn,
    mut wire: Vec<u8>,
    target: &str,
) -> Result<e2e::HttpResponse> {
    wire.extend_from_slice(
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
    );
    conn.send(&wire).await?;
    conn.read_response(true).await
}

/// What a confined client would try: the shim's header is in front, so the client's own
/// header is the start of its request: not HTTP, refused `malformed_target`, and the line
/// carries the shim's labels, not the forged ones.
async fn a_second_header_is_client_bytes_and_cannot_relabel() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let mut wire = labels("inv-host", &["tool=real"]);
    wire.extend_from_slice(&labels("inv-forged", &["tool=forged"]));
    let resp = refused_in_one_write(&mut conn, wire, &fx.origin_target()).await?;
    fx.mediator
        .expect_deny(
            &resp,
            400,
            "malformed_target",
            None,
            &[
                ("invocation", json!("inv-host")),
                ("tags", json!({"tool": "real"})),
            ],
        )
        .await?;
    let text = std::fs::read_to_string(fx.mediator.log_path())?;
    ensure!(
        !text.contains("forged"),
        "a forged label reached the log:\n{text}"
    );
    Ok(())
}

/// The shared TCP listener never reads a header: the signature is a malformed request.
async fn the_tcp_listener_reads_no_header() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.tcp_conn().await?;
    conn.send(&labels("inv-tcp", &[])).await?;
    let resp = conn
        .connect(&fx.origin_target(), Some((AGENT_A, e2e::TOKEN_A)))
        .await?;
    ensure!(resp.status == 400, "{resp:?}");
    let text = std::fs::read_to_string(fx.mediator.log_path())?;
    ensure!(!text.contains("inv-tcp"), "{text}");
    Ok(())
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(labels_in_front_of_a_connect_are_on_its_decision_and_close_lines),
        case!(a_labelled_denial_carries_them_to_its_line_and_the_denials_list),
        case!(a_header_out_of_bounds_is_refused_bad_request),
        case!(a_second_header_is_client_bytes_and_cannot_relabel),
        case!(the_tcp_listener_reads_no_header),
    ]
}
