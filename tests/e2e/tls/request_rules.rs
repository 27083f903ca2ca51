//! Request rules on headers and query (design section 9, narrowing only): inside a
//! terminated tunnel and for plain `http://` to a terminated host, `GET /repos/` is
//! allowed without `?access_token=`, and `POST` only with a JSON `Content-Type`.

use anyhow::{Result, ensure};
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use e2e::mediator::{toml_list, toml_str};
use e2e::tls::{TestCa, TlsOrigin};
use e2e::{AGENT_A, Fixture, TOKEN_A, agent_a_allowing};

use crate::support::mediator;

const API: &str = "api.test";

#[expect(
    clippy::too_many_lines,
    reason = "a table of header and query rows against one terminated origin"
)]
async fn header_and_query_rules_narrow_terminated_requests() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = TlsOrigin::start(&test_ca.ca, API).await?;
    let ca_dir = dir.path().join("mediator-ca");
    let authority = agent_a_allowing(&[API])
        .raw(&format!("tls_terminate = {}", toml_list(&[API])))
        .raw("\n[[authority.request_rule]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("methods = [\"GET\"]")
        .raw("path_prefixes = [\"/repos/\"]")
        .raw("query = [\"page\", \"per_page\"]")
        .raw("\n[[authority.request_rule]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("methods = [\"POST\"]")
        .raw("path_prefixes = [\"/repos/\"]")
        .raw("headers = { \"content-type\" = \"application/json*\" }");
    let builder = mediator()
        .extra_toml(&format!(
            "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
            toml_str(&ca_dir.display().to_string()),
            toml_list(&[test_ca.pem_path.display().to_string()])
        ))
        .authority(authority);
    let fx = Fixture::start(builder).await?;
    fx.dns.set(API, [e2e::LOOPBACK]);
    let ca = ca_dir.join("ca.pem").display().to_string();
    let base = format!("https://{API}:{}", origin.port());
    let rows: &[(&[&str], &str, u16, &str)] = &[
        (&["--http2"], "/repos/a/b?page=2&per_page=50", 200, ""),
        (
            &["--http1.1"],
            "/repos/a/b?access_token=abc",
            403,
            "denied_by_rule",
        ),
        (
            &["--http2"],
            "/repos/a/b?access%5Ftoken=abc",
            403,
            "denied_by_rule",
        ),
        (
            &["--http2"],
            "/repos/a/b?access%255Ftoken=abc",
            400,
            "malformed_target",
        ),
        (
            &["--http2"],
            "/repos/a/b?page=1;access_token=abc",
            400,
            "malformed_target",
        ),
        (
            &[
                "--http2",
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                "{}",
            ],
            "/repos/a/issues",
            200,
            "",
        ),
        (
            &["--http1.1", "-X", "POST", "-d", "a=1"],
            "/repos/a/issues",
            403,
            "denied_by_rule",
        ),
    ];
    for (flags, path, status, reason) in rows {
        let url = format!("{base}{path}");
        let mut args = vec!["--cacert", ca.as_str()];
        args.extend_from_slice(flags);
        args.push(&url);
        let out = fx
            .mediator
            .curl_via("http", (AGENT_A, TOKEN_A), &args)
            .await?;
        ensure!(out.http_code == *status, "{flags:?} {path}: {out:?}");
        if !reason.is_empty() {
            ensure!(
                out.body.contains(&format!("\"reason\":\"{reason}\"")),
                "{flags:?} {path}: {out:?}"
            );
        }
    }
    // A rule covers the method and path: the denial names what it refused (the query
    // parameter and the rule's list; the header) and how to change it.
    let wording: &[(&[&str], &str, &str, &str)] = &[
        (
            &["--http2"],
            "/repos/a/b?page=1&access%5Ftoken=abc",
            "GET /repos/a/b on api.test: query parameter \"access_token\" not allowed: request_rule[1] api.test allows only \"page\", \"per_page\"",
            "add \"access_token\" to the query list of request_rule[1] api.test, or send the request without it",
        ),
        (
            &["--http1.1", "-X", "POST", "-d", "a=1"],
            "/repos/a/issues",
            "POST /repos/a/issues on api.test: header content-type has a value that does not match: request_rule[2] api.test requires content-type: application/json*",
            "send content-type with a value matching \"application/json*\" (request_rule[2] api.test requires it), or ask for that rule's headers to change",
        ),
    ];
    for (flags, path, detail, hint) in wording {
        let url = format!("{base}{path}");
        let mut args = vec!["--cacert", ca.as_str()];
        args.extend_from_slice(flags);
        args.push(&url);
        let out = fx
            .mediator
            .curl_via("http", (AGENT_A, TOKEN_A), &args)
            .await?;
        let body: serde_json::Value = serde_json::from_str(&out.body)?;
        ensure!(
            out.http_code == 403 && body["detail"] == *detail && body["hint"] == *hint,
            "{flags:?} {path}: {body}"
        );
    }
    // The decision lines keep the query redacted, as for every terminated request.
    fx.mediator.expect_log_lacks("abc")?;
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(header_and_query_rules_narrow_terminated_requests).needs(&[Tool::Curl])]
}
