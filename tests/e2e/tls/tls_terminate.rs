//! TLS termination (design section 9): for a host in the grant's `tls_terminate`, the
//! mediator presents a leaf for exactly that host (issued by its own CA), serves HTTP/1.1
//! and HTTP/2 inside the tunnel, applies the grant's request rules to every request,
//! refuses requests for any other host (`421`), and forwards the rest over TLS verified
//! against `[tls] extra_ca_files` (here: a test CA of ours for the loopback origin).
//!
//! Clients: real curl (`--http1.1`, `--http2`) trusting only the mediator's CA, and a hyper
//! HTTP/2 client over rustls.

use crate::support::is;
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::{Event, Protocol};
use policy::{Reason, Verdict};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use bytes::Bytes;
use e2e::mediator::{MediatorBuilder, toml_list, toml_str};
use e2e::tls::{TestCa, TlsOrigin, h2_client, tls_through_connect};
use e2e::{
    AGENT_A, CurlOutput, Fixture, TOKEN_A, agent_a_allowing, check_deny, proxy_authorization,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::mediator;

const API: &str = "api.test";

/// The common fixture, plus a TLS origin for `api.test` and the mediator's CA.
struct Env {
    fx: Fixture,
    origin: TlsOrigin,
    /// The configuration the mediator was started with (to start it again).
    builder: MediatorBuilder,
    /// The mediator's CA certificate (what a child trusts).
    mediator_ca: PathBuf,
    ca_dir: PathBuf,
    _dir: TempDir,
}

/// `agent-a` may reach `api.test` (our loopback TLS origin), whose TLS is terminated;
/// request rules: GET and HEAD under `/public/` only.
fn authority() -> e2e::AuthoritySpec {
    agent_a_allowing(&[API])
        .raw(&format!("tls_terminate = {}", toml_list(&[API])))
        .raw("\n[[authority.request_rule]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("methods = [\"GET\", \"HEAD\"]")
        .raw("path_prefixes = [\"/public/\"]")
}

fn tls_toml(ca_dir: &Path, extra: &[&Path]) -> String {
    let extra: Vec<String> = extra.iter().map(|p| p.display().to_string()).collect();
    format!(
        "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
        toml_str(&ca_dir.display().to_string()),
        toml_list(&extra)
    )
}

/// Where the TLS origin listens unless a test needs an address of its own.
fn any_loopback_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Starts a TLS origin for `api.test` on `bind` whose certificate comes from a test CA
/// (trusted by the mediator via `extra_ca_files` when `trust_origin_ca`), then the
/// fixture with `api.test` resolving to the origin's IP and the mediator `configure`d
/// further.
async fn start_with(
    trust_origin_ca: bool,
    bind: SocketAddr,
    configure: impl FnOnce(MediatorBuilder) -> MediatorBuilder,
) -> Result<Env> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = TlsOrigin::start_on(&test_ca.ca, API, bind).await?;
    let ca_dir = dir.path().join("mediator-ca");
    let extra: Vec<&Path> = if trust_origin_ca {
        vec![test_ca.pem_path.as_path()]
    } else {
        Vec::new()
    };
    let builder = configure(
        mediator()
            .extra_toml(&tls_toml(&ca_dir, &extra))
            .authority(authority()),
    );
    let fx = Fixture::start(builder.clone()).await?;
    fx.dns.set(API, [bind.ip()]);
    Ok(Env {
        fx,
        origin,
        builder,
        mediator_ca: ca_dir.join("ca.pem"),
        ca_dir,
        _dir: dir,
    })
}

/// [`start_with`] on any loopback port, the mediator as configured above.
async fn start(trust_origin_ca: bool) -> Result<Env> {
    start_with(trust_origin_ca, any_loopback_port(), |b| b).await
}

impl Env {
    fn url(&self, path: &str) -> String {
        match self.origin.port() {
            443 => format!("https://{API}{path}"),
            port => format!("https://{API}:{port}{path}"),
        }
    }

    fn target(&self) -> String {
        format!("{API}:{}", self.origin.port())
    }

    /// curl through the mediator's TCP listener (`scheme`: `http` or `socks5h`) as
    /// `agent-a`, trusting only the mediator's CA, with `args` (the URL last).
    async fn curl_via(&self, scheme: &str, args: &[&str]) -> Result<CurlOutput> {
        let ca = self.mediator_ca.display().to_string();
        let mut all = vec!["--cacert", ca.as_str()];
        all.extend_from_slice(args);
        self.fx
            .mediator
            .curl_via(scheme, (AGENT_A, TOKEN_A), &all)
            .await
    }

    /// [`Self::curl_via`] an HTTP proxy, with `-i` (response headers in the body) and
    /// `extra` before the `url`.
    async fn curl(&self, extra: &[&str], url: &str) -> Result<CurlOutput> {
        let mut args = vec!["-i", "--suppress-connect-headers"];
        args.extend_from_slice(extra);
        args.push(url);
        self.curl_via("http", &args).await
    }

    /// A hyper HTTP/2 client inside a CONNECT tunnel to the origin, speaking TLS with SNI
    /// `api.test` and trusting only the mediator's CA: the handshake verifies, with webpki
    /// against that CA alone, that the leaf names exactly the tunnel host.
    async fn h2(&self) -> Result<SendRequest<Full<Bytes>>> {
        let tls = tls_through_connect(
            self.fx.mediator.tcp_addr(),
            (AGENT_A, TOKEN_A),
            &self.target(),
            API,
            &self.mediator_ca,
            &[b"h2"],
        )
        .await?;
        h2_client(tls).await
    }
}

/// An HTTP/2 request with `body`, for [`Env::h2`].
fn h2_request(
    method: &str,
    uri: String,
    body: &'static str,
) -> Result<hyper::Request<Full<Bytes>>> {
    Ok(hyper::Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from_static(body.as_bytes())))?)
}

/// The JSON body of an HTTP/2 response.
async fn h2_json(resp: hyper::Response<Incoming>) -> Result<Value> {
    Ok(serde_json::from_slice(
        &resp.into_body().collect().await?.to_bytes(),
    )?)
}

/// The JSON body after the header block of `curl -i` output.
fn body_json(out: &CurlOutput) -> Result<Value> {
    let body = out
        .body
        .split_once("\r\n\r\n")
        .map_or(out.body.as_str(), |(_, b)| b);
    serde_json::from_str(body).map_err(|e| anyhow::anyhow!("body is not JSON ({e}): {out:?}"))
}

/// The value of header `name` in `curl -i` output.
fn header<'a>(out: &'a CurlOutput, name: &str) -> Option<&'a str> {
    out.body
        .split("\r\n\r\n")
        .next()?
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

async fn http1_request_is_terminated_forwarded_and_logged_with_the_query_redacted() -> Result<()> {
    let env = start(true).await?;
    let out = env
        .curl(&["--http1.1"], &env.url("/public/hello?token=s3cret"))
        .await?;
    ensure!(out.exit_code == 0, "{out:?}");
    ensure!(out.http_connect == 200 && out.http_code == 200, "{out:?}");
    ensure!(out.body.starts_with("HTTP/1.1 200"), "{out:?}");
    let echo = body_json(&out)?;
    assert_eq!(echo["method"], "GET");
    let target = echo["target"].as_str().unwrap_or_default();
    ensure!(
        target.ends_with("/public/hello?token=s3cret"),
        "the origin got the path and query: {echo}"
    );
    ensure!(
        !out.body.contains("forged-by-origin"),
        "an upstream X-Mediator-Decision is stripped: {out:?}"
    );
    env.fx
        .mediator
        .expect_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
            &[
                ("decision", json!("allow")),
                ("reason", json!("allowed")),
                ("authority", json!(AGENT_A)),
                ("host", json!(API)),
                ("port", json!(env.origin.port())),
                ("method", json!("GET")),
                ("path", json!("/public/hello?<redacted>")),
                ("rule", json!("request_rule[1] api.test")),
                ("pin", json!("127.0.0.1")),
            ],
        )
        .await?;
    // The tunnel itself was decided as a CONNECT.
    env.fx
        .mediator
        .expect_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Connect),
            &[("reason", json!("allowed"))],
        )
        .await?;
    env.fx.mediator.expect_log_lacks("s3cret")?;
    Ok(())
}

async fn http2_with_curl_is_terminated_and_post_outside_the_rules_gets_the_json_denial()
-> Result<()> {
    let env = start(true).await?;
    let out = env.curl(&["--http2"], &env.url("/public/a")).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "{out:?}");
    ensure!(
        out.body.starts_with("HTTP/2 200"),
        "ALPN h2 on the client leg: {out:?}"
    );
    assert_eq!(body_json(&out)?["method"], "GET");

    let before = env.origin.requests();
    let out = env
        .curl(
            &["--http2", "-X", "POST", "-d", "x=1"],
            &env.url("/public/a"),
        )
        .await?;
    ensure!(out.http_code == 403, "{out:?}");
    assert_eq!(
        header(&out, "x-mediator-decision"),
        Some("deny; reason=denied_by_rule")
    );
    ensure!(
        header(&out, "content-type").is_some_and(|c| c.starts_with("application/json")),
        "{out:?}"
    );
    let body = body_json(&out)?;
    assert_eq!(body["error"], "egress_denied");
    assert_eq!(body["reason"], "denied_by_rule");
    assert_eq!(body["authority"], AGENT_A);
    assert_eq!(body["host"], API);
    assert_eq!(body["port"], env.origin.port());
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("POST /public/a")),
        "{body}"
    );
    ensure!(
        body["hint"]
            .as_str()
            .is_some_and(|h| h.contains("GET|HEAD /public/")),
        "{body}"
    );
    assert_eq!(
        env.origin.requests(),
        before,
        "a denied request never reaches the origin"
    );
    env.fx
        .mediator
        .expect_log(
            is(|r| r.protocol == Protocol::Tls && r.decision == Verdict::Deny),
            &[
                ("reason", json!("denied_by_rule")),
                ("method", json!("POST")),
                ("path", json!("/public/a")),
            ],
        )
        .await?;
    Ok(())
}

async fn a_30_kb_header_passes_on_http2_as_on_http1_under_the_request_head_limit() -> Result<()> {
    // `[limits] request_head_bytes` is 64 KiB by default: a 30 KB header fits on both
    // versions (HTTP/2 no longer stops at hyper's 16 KiB header list).
    let env = start(true).await?;
    let big = format!("X-Big: {}", "b".repeat(30_000));
    for version in ["--http1.1", "--http2"] {
        let out = env
            .curl(&[version, "-H", &big], &env.url("/public/big"))
            .await?;
        ensure!(
            out.exit_code == 0 && out.http_code == 200,
            "{version}: {} {}",
            out.exit_code,
            out.http_code
        );
        let echo = body_json(&out)?;
        ensure!(
            echo["target"]
                .as_str()
                .is_some_and(|t| t.ends_with("/public/big")),
            "{version}: the origin answered: {echo}"
        );
    }
    Ok(())
}

async fn hyper_h2_client_gets_allowed_denied_and_misdirected_answers_on_one_connection()
-> Result<()> {
    let env = start(true).await?;
    // The leaf names exactly the tunnel host and chains to the mediator's CA (the
    // handshake verifies it with webpki against that CA alone).
    let mut h2 = env.h2().await?;

    let resp = h2
        .send_request(h2_request("GET", env.url("/public/one"), "")?)
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-mediator-decision").is_none());
    let echo: Value = h2_json(resp).await?;
    assert_eq!(echo["method"], "GET");

    let resp = h2
        .send_request(h2_request("POST", env.url("/public/one"), "payload")?)
        .await?;
    assert_eq!(resp.status(), 403);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=denied_by_rule"
    );
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = h2_json(resp).await?;
    assert_eq!(body["reason"], "denied_by_rule");

    let resp = h2
        .send_request(h2_request("GET", env.url("/private"), "")?)
        .await?;
    assert_eq!(resp.status(), 403, "GET outside /public/ is denied too");

    // Domain fronting through the terminated leg: :authority of another host.
    let resp = h2
        .send_request(h2_request(
            "GET",
            format!("https://blocked.test:{}/public/x", env.origin.port()),
            "",
        )?)
        .await?;
    assert_eq!(resp.status(), 421);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=sni_mismatch"
    );
    let body: Value = h2_json(resp).await?;
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("blocked.test")),
        "{body}"
    );

    // The connection is still good after the denials.
    let resp = h2
        .send_request(h2_request("HEAD", env.url("/public/two"), "")?)
        .await?;
    assert_eq!(resp.status(), 200);
    Ok(())
}

async fn domain_fronting_with_the_host_header_or_sni_of_another_host_is_refused() -> Result<()> {
    let env = start(true).await?;
    // Host header of a denied host inside a tunnel to an allowed one.
    let before = env.origin.requests();
    let out = env
        .curl(
            &["--http1.1", "-H", "Host: blocked.test"],
            &env.url("/public/x"),
        )
        .await?;
    ensure!(out.http_code == 421, "{out:?}");
    assert_eq!(
        header(&out, "x-mediator-decision"),
        Some("deny; reason=sni_mismatch")
    );
    assert_eq!(body_json(&out)?["error"], "egress_denied");
    assert_eq!(env.origin.requests(), before);

    // SNI of a denied host inside a tunnel to an allowed one: no certificate is presented.
    let port = env.origin.port();
    let connect_to = format!("blocked.test:{port}:{API}:{port}");
    let out = env
        .curl(
            &["--connect-to", &connect_to],
            &format!("https://blocked.test:{port}/public/x"),
        )
        .await?;
    out.expect_cut_after_connect()?;
    let line = env
        .fx
        .mediator
        .wait_for_decision("sni_mismatch", Some(API))
        .await?;
    ensure!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("blocked.test")),
        "{line}"
    );
    assert_eq!(env.origin.requests(), before);
    Ok(())
}

async fn upstream_certificate_not_trusted_is_a_clear_502() -> Result<()> {
    // The origin's CA is not in extra_ca_files (nor in the system store).
    let env = start(false).await?;
    let out = env.curl(&["--http1.1"], &env.url("/public/x")).await?;
    ensure!(out.http_code == 502, "{out:?}");
    assert_eq!(
        header(&out, "x-mediator-decision"),
        Some("deny; reason=upstream_failure")
    );
    let body = body_json(&out)?;
    assert_eq!(body["reason"], "upstream_failure");
    let detail = body["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains("certificate") && detail.contains(API),
        "the detail says what failed: {detail}"
    );
    // In words, not rustls' variant names.
    ensure!(
        detail.contains("signed by an issuer that is not trusted")
            && !detail.contains("InvalidCertificate"),
        "the detail says why in words: {detail}"
    );
    assert_eq!(env.origin.requests(), 0);
    Ok(())
}

async fn ca_persists_across_restarts_and_ca_cert_prints_it() -> Result<()> {
    let env = start(true).await?;
    let first = std::fs::read_to_string(&env.mediator_ca)?;
    ensure!(first.starts_with("-----BEGIN CERTIFICATE-----"), "{first}");
    let key_mode = std::fs::metadata(env.ca_dir.join("ca-key.pem"))?
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(key_mode, 0o600);

    // `mediator ca-cert` prints exactly that certificate.
    let out = env.fx.mediator.cli("ca-cert", &[]).await?;
    ensure!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout)?, first);

    // A second mediator on the same ca_dir loads the same CA, and a client that trusts the
    // first run's certificate works against it.
    let mut env = env;
    drop(env.fx.mediator);
    env.fx.mediator = env
        .builder
        .clone()
        .nameserver(env.fx.dns.addr())
        .start()
        .await?;
    assert_eq!(std::fs::read_to_string(&env.mediator_ca)?, first);
    let out = env.curl(&[], &env.url("/public/again")).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "{out:?}");
    Ok(())
}

async fn socks5_tunnels_are_terminated_under_the_same_rules() -> Result<()> {
    let env = start(true).await?;
    let url = env.url("/public/s");
    let out = env.curl_via("socks5h", &[&url]).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "{out:?}");
    let out = env.curl_via("socks5h", &["-X", "DELETE", &url]).await?;
    ensure!(out.http_code == 403, "{out:?}");
    env.fx
        .mediator
        .expect_log(
            is(|r| r.protocol == Protocol::Tls && r.method.as_deref() == Some("DELETE")),
            &[("reason", json!("denied_by_rule"))],
        )
        .await?;
    env.fx
        .mediator
        .expect_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Socks5),
            &[("reason", json!("allowed"))],
        )
        .await?;
    Ok(())
}

async fn port_443_tunnel_passes_the_sni_gate_and_is_then_terminated() -> Result<()> {
    // On 443 the SNI gate reads the ClientHello first; termination must replay it. The
    // origin has an address of its own so that no other test competes for port 443.
    let env = start_with(true, SocketAddr::from(([127, 66, 1, 1], 443)), |b| b).await?;
    for http in ["--http1.1", "--http2"] {
        let out = env.curl(&[http], &env.url("/public/443")).await?;
        ensure!(
            out.exit_code == 0 && out.http_code == 200,
            "{http}: {out:?}"
        );
        assert_eq!(body_json(&out)?["method"], "GET");
    }
    let out = env
        .curl(
            &["--http1.1", "-H", "Host: blocked.test"],
            &env.url("/public/x"),
        )
        .await?;
    ensure!(out.http_code == 421, "{out:?}");
    Ok(())
}

/// Path tricks that Tomcat, Jetty or Spring (`..;`), double-decoding servers (`%252e`) or
/// lenient decoders (`%c0%ae`, `%u002e`) serve outside the rule's prefix are refused
/// before the origin sees them; a plain path with unreserved characters still passes.
async fn path_rule_escapes_are_refused_inside_the_tunnel() -> Result<()> {
    let env = start(true).await?;
    let out = env
        .curl(&["--http1.1"], &env.url("/public/a-b_c~d/e.json?q=1"))
        .await?;
    ensure!(out.http_code == 200, "{out:?}");
    let before = env.origin.requests();
    for path in [
        "/public/..;/admin",
        "/public/..%3b/admin",
        "/public/.;/admin",
        "/public/..;jsessionid=x/admin",
        "/public/%252e%252e/admin",
        "/public%252fadmin",
        "/public/%c0%ae%c0%ae/admin",
        "/public/%u002e%u002e/admin",
        "/public/..%09/admin",
    ] {
        let out = env
            .curl(&["--http1.1", "--path-as-is"], &env.url(path))
            .await?;
        ensure!(out.http_code == 400, "{path}: {out:?}");
        assert_eq!(
            header(&out, "x-mediator-decision"),
            Some("deny; reason=malformed_target"),
            "{path}"
        );
    }
    assert_eq!(env.origin.requests(), before, "no trick reached the origin");
    Ok(())
}

/// `tls_terminate = ["api.test"]` with rules: plain absolute-form `http://api.test/...`
/// is held to the same rules, on every request of a kept-alive connection.
async fn request_rules_also_apply_to_plain_http_for_the_terminated_host() -> Result<()> {
    let env = start(true).await?;
    // The fixture's plain HTTP origin on 127.0.0.1, which api.test resolves to.
    let plain = &env.fx.origin;
    let host = format!("{API}:{}", plain.port());
    let auth = proxy_authorization(AGENT_A, TOKEN_A);
    let req = |method: &str, path: &str| {
        format!(
            "{method} http://{host}{path} HTTP/1.1\r\nHost: {host}\r\n\
             {auth}Content-Length: 0\r\n\r\n"
        )
    };
    let mut c = env.fx.tcp_conn().await?;
    let r = c.request(req("GET", "/public/a").as_bytes()).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    // The same client connection, whose upstream connection is kept: still judged.
    let body = check_deny(
        &c.request(req("POST", "/admin").as_bytes()).await?,
        403,
        "denied_by_rule",
    )?;
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("POST /admin")),
        "{body}"
    );
    ensure!(
        body["hint"]
            .as_str()
            .is_some_and(|h| h.contains("GET|HEAD /public/")),
        "{body}"
    );
    check_deny(
        &c.request(req("GET", "/private").as_bytes()).await?,
        403,
        "denied_by_rule",
    )?;
    check_deny(
        &c.request(req("GET", "/public/..;/admin").as_bytes())
            .await?,
        400,
        "malformed_target",
    )?;
    let r = c
        .request(req("GET", "/public/b?k=s3cret").as_bytes())
        .await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        plain.requests(),
        2,
        "denied requests never reach the origin"
    );

    env.fx
        .mediator
        .expect_log(
            is(|r| r.protocol == Protocol::Http && r.method.as_deref() == Some("POST")),
            &[
                ("decision", json!("deny")),
                ("reason", json!("denied_by_rule")),
                ("path", json!("/admin")),
                ("rule", json!("request_rule[1] api.test")),
            ],
        )
        .await?;
    env.fx
        .mediator
        .expect_log(
            is(|r| {
                r.protocol == Protocol::Http && r.path.as_deref() == Some("/public/b?<redacted>")
            }),
            &[("decision", json!("allow")), ("method", json!("GET"))],
        )
        .await?;

    // What the reviewer ran: curl with an absolute-form POST.
    let url = format!("http://{host}/admin");
    let out = env
        .fx
        .mediator
        .curl_via("http", (AGENT_A, TOKEN_A), &["-X", "POST", &url])
        .await?;
    ensure!(out.http_code == 403, "{out:?}");
    assert_eq!(plain.requests(), 2);
    env.fx.mediator.expect_log_lacks("s3cret")?;
    Ok(())
}

/// A terminated connection opened before its authority was revoked gets no further
/// decision: the next request is `unknown_authority` at once, not at the end of the grace.
async fn requests_on_an_open_terminated_connection_stop_when_the_authority_is_revoked() -> Result<()>
{
    let env = start_with(true, any_loopback_port(), |b| {
        b.admin(true).timeout("revoke_grace", 60)
    })
    .await?;
    let mut h2 = env.h2().await?;
    let get = |path: &str| h2_request("GET", env.url(path), "");
    let resp = h2.send_request(get("/public/before")?).await?;
    assert_eq!(resp.status(), 200);
    let before = env.origin.requests();

    let resp = env
        .fx
        .mediator
        .admin("DELETE", &format!("/v1/authorities/{AGENT_A}"), None, None)
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());

    let resp = h2.send_request(get("/public/after")?).await?;
    assert_eq!(resp.status(), 407);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=unknown_authority"
    );
    let body: Value = h2_json(resp).await?;
    assert_eq!(body["reason"], "unknown_authority");
    assert_eq!(env.origin.requests(), before, "nothing reached the origin");
    env.fx
        .mediator
        .expect_log(
            is(|r| r.protocol == Protocol::Tls && r.reason == Reason::UnknownAuthority),
            &[("path", json!("/public/after"))],
        )
        .await?;
    Ok(())
}

/// An `:authority` (or `Host`) that is not the tunnel host: answered `421` where the
/// request reaches the mediator (a port that is not a port is malformed, never 443), and
/// logged too where the HTTP/2 layer resets a request it cannot parse (`PROTOCOL_ERROR`).
async fn a_malformed_or_foreign_authority_is_refused_and_logged_in_h1_and_h2() -> Result<()> {
    // On 443, where a port that does not parse must not pass for the default port. An
    // address of its own (127.66.1.1:443 is another test's).
    let env = start_with(true, SocketAddr::from(([127, 66, 1, 2], 443)), |b| b).await?;
    let before = env.origin.requests();
    for http in ["--http1.1", "--http2"] {
        let out = env
            .curl(
                &[http, "-H", "Host: api.test:https"],
                &env.url("/public/port"),
            )
            .await?;
        ensure!(out.http_code == 421, "{http}: {out:?}");
        let body = body_json(&out)?;
        assert_eq!(body["reason"], "sni_mismatch", "{body}");
        ensure!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("not a host with an optional port")),
            "{body}"
        );
    }
    ensure!(env.origin.requests() == before, "nothing was forwarded");

    // Raw HTTP/2: a foreign :authority is answered (421 and its line); one that is not URI
    // syntax is reset by the HTTP/2 layer, and still gets its decision line.
    for (authority, end) in [
        (&b"blocked.test"[..], e2e::h2frames::StreamEnd::Answered),
        (&b"api.test<>"[..], e2e::h2frames::StreamEnd::Reset(1)),
    ] {
        let mut tls = tls_through_connect(
            env.fx.mediator.tcp_addr(),
            (AGENT_A, TOKEN_A),
            &env.target(),
            API,
            &env.mediator_ca,
            &[b"h2"],
        )
        .await?;
        let got =
            e2e::h2frames::send_headers(&mut tls, &e2e::h2frames::get_with_authority(authority))
                .await?;
        assert_eq!(got, end, "{}", String::from_utf8_lossy(authority));
    }
    env.fx
        .mediator
        .wait_for_log(
            |v| {
                v["protocol"] == "tls"
                    && v["reason"] == "sni_mismatch"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("blocked.test"))
            },
            std::time::Duration::from_secs(10),
        )
        .await?;
    let line = env
        .fx
        .mediator
        .wait_for_log(
            is(|r| r.protocol == Protocol::Tls && r.reason == Reason::MalformedTarget),
            std::time::Duration::from_secs(10),
        )
        .await?;
    ensure!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("HTTP/2 stream 1") && d.contains("PROTOCOL_ERROR")),
        "{line}"
    );
    assert_eq!(line["authority"], AGENT_A, "{line}");
    assert_eq!(line["host"], API, "{line}");
    ensure!(env.origin.requests() == before, "nothing was forwarded");
    Ok(())
}

/// Writes `raw` into a fresh HTTP/1.1 connection inside a terminated tunnel and reads
/// until the mediator closes it (a TLS read error after the answer counts as the end).
async fn exchange_h1(env: &Env, raw: &[u8]) -> Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tls = tls_through_connect(
        env.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        &env.target(),
        API,
        &env.mediator_ca,
        &[b"http/1.1"],
    )
    .await?;
    tls.write_all(raw).await?;
    let mut got = Vec::new();
    let read = tokio::time::timeout(e2e::LOG_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = tls.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    ensure!(read.is_ok(), "the mediator did not close the connection");
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// Malformed HTTP/1.1 inside a terminated tunnel gets what it gets on the proxy itself:
/// a first head the mediator does not take (an unimplemented transfer coding, an
/// obs-folded line, a bare CR) is the JSON 400 `bad_request` for the tunnel host; a later
/// head hyper refuses, and a head over `[limits] request_head_bytes` (431), each write a
/// `bad_request` line; a chunked body with a bare-LF size line is 400 `bad_request`, not
/// 502.
async fn malformed_http1_inside_the_tunnel_is_400_bad_request_with_its_line() -> Result<()> {
    let env = start(true).await?;
    let before = env.origin.requests();
    for raw in [
        "GET /public/a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: xchunked\r\n\r\n",
        "GET /public/a HTTP/1.1\r\nHost: api.test\r\nX-A: b\r\n  folded\r\n\r\n",
        "GET /public/a HTTP/1.1\rHost: api.test\r\n\r\n",
    ] {
        let got = exchange_h1(&env, raw.as_bytes()).await?;
        ensure!(got.starts_with("HTTP/1.1 400"), "{raw:?}: {got}");
        let body: Value = serde_json::from_str(got.split_once("\r\n\r\n").map_or("", |b| b.1))?;
        assert_eq!(body["reason"], "bad_request", "{raw:?}: {body}");
        assert_eq!(body["host"], API, "{raw:?}: {body}");
        assert_eq!(body["authority"], AGENT_A, "{raw:?}: {body}");
    }
    ensure!(env.origin.requests() == before, "nothing was forwarded");
    let lines = env
        .fx
        .mediator
        .wait_for_count(
            |v| v["protocol"] == "tls" && v["reason"] == "bad_request",
            3,
            e2e::LOG_TIMEOUT,
        )
        .await?;
    ensure!(lines.iter().all(|l| l["host"] == API), "{lines:#?}");

    // A later head: the first is served, the second refused by hyper (a bare 400), and
    // still logged.
    let host = env.target();
    let got = exchange_h1(
        &env,
        format!("GET /public/one HTTP/1.1\r\nHost: {host}\r\n\r\nGET /public/two HTTP/1.1\rHost: {host}\r\n\r\n").as_bytes(),
    )
    .await?;
    ensure!(got.starts_with("HTTP/1.1 200"), "{got}");
    ensure!(got.contains("HTTP/1.1 400"), "{got}");
    env.fx
        .mediator
        .wait_for_count(
            |v| {
                v["protocol"] == "tls"
                    && v["reason"] == "bad_request"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("unparsable"))
            },
            1,
            e2e::LOG_TIMEOUT,
        )
        .await?;

    // Over [limits] request_head_bytes (64 KiB by default): 431, and a line.
    let big = format!(
        "GET /public/big HTTP/1.1\r\nHost: {host}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let got = exchange_h1(&env, big.as_bytes()).await?;
    ensure!(got.starts_with("HTTP/1.1 431"), "{got}");
    env.fx
        .mediator
        .wait_for_count(
            |v| {
                v["protocol"] == "tls"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("request_head_bytes"))
            },
            1,
            e2e::LOG_TIMEOUT,
        )
        .await?;

    // A GET with a well-formed chunked body: the body reaches the origin (hyper would
    // send a GET whose length it does not know as one with no body).
    let got = exchange_h1(
        &env,
        format!("GET /public/chunked HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n").as_bytes(),
    )
    .await?;
    ensure!(got.starts_with("HTTP/1.1 200"), "{got}");
    ensure!(got.contains("\"body\":\"hello\""), "{got}");

    // A chunk-size line ending in a bare LF: the client's fault.
    let got = exchange_h1(
        &env,
        format!("GET /public/body HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n").as_bytes(),
    )
    .await?;
    ensure!(got.starts_with("HTTP/1.1 400"), "{got}");
    ensure!(got.contains("\"bad_request\""), "{got}");
    env.fx
        .mediator
        .wait_for_count(
            |v| {
                v["protocol"] == "tls"
                    && v["reason"] == "bad_request"
                    && v["path"] == "/public/body"
            },
            1,
            e2e::LOG_TIMEOUT,
        )
        .await?;
    Ok(())
}

/// HTTP/2 requests the HTTP/2 layer refuses before any service sees them still get their
/// decision lines: a header list larger than `[limits] request_head_bytes` (answered
/// `431`: `bad_request`), and a stream over the connection's 200 concurrent streams
/// (`REFUSED_STREAM`: `rate_limited`).
async fn http2_requests_the_http2_layer_refuses_are_logged() -> Result<()> {
    let env = start(true).await?;
    let before = env.origin.requests();
    let target = env.target();
    let connect = || {
        tls_through_connect(
            env.fx.mediator.tcp_addr(),
            (AGENT_A, TOKEN_A),
            &target,
            API,
            &env.mediator_ca,
            &[b"h2"],
        )
    };
    let mut tls = connect().await?;
    let mut block = e2e::h2frames::get_with_authority(env.target().as_bytes());
    block.extend(e2e::h2frames::hpack_literal_new_name(
        b"x-big",
        "a".repeat(70_000).as_bytes(),
    ));
    let got = e2e::h2frames::send_headers(&mut tls, &block).await?;
    assert_eq!(got, e2e::h2frames::StreamEnd::Answered);
    let line = env
        .fx
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "tls" && v["reason"] == "bad_request",
            e2e::LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("stream 1") && d.contains("431")),
        "{line}"
    );
    assert_eq!(line["authority"], AGENT_A, "{line}");
    ensure!(env.origin.requests() == before, "nothing was forwarded");

    // 201 requests whose bodies stay open: the 201st stream (401) is refused.
    let mut tls = connect().await?;
    let block = e2e::h2frames::get_with_authority(env.target().as_bytes());
    let refused = e2e::h2frames::open_streams(&mut tls, 201, &block).await?;
    assert_eq!(refused, 401);
    let line = env
        .fx
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "tls" && v["reason"] == "rate_limited",
            e2e::LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("stream 401") && d.contains("REFUSED_STREAM")),
        "{line}"
    );
    Ok(())
}

/// A terminated tunnel's bytes reach `mediator_bytes_total` while it is open, as a plain
/// tunnel's do, and its close adds only the rest.
async fn an_open_terminated_tunnels_bytes_are_counted_before_it_closes() -> Result<()> {
    let env = start_with(true, any_loopback_port(), |b| b.admin(true)).await?;
    let m = &env.fx.mediator;
    let mut h2 = env.h2().await?;
    let resp = h2
        .send_request(h2_request("GET", env.url("/public/open"), "")?)
        .await?;
    assert_eq!(resp.status(), 200);
    h2_json(resp).await?;
    let decision = m
        .wait_for_log(
            |v| v["protocol"] == "connect" && v["decision"] == "allow",
            e2e::LOG_TIMEOUT,
        )
        .await?;
    m.bytes_counted_while_open(AGENT_A).await?;
    drop(h2);
    let close = m.wait_for_close(&decision["id"]).await?;
    let p = m.metrics().await?;
    for (direction, field) in [("up", "bytes_up"), ("down", "bytes_down")] {
        assert_eq!(
            p.get(
                "mediator_bytes_total",
                &[("authority", AGENT_A), ("direction", direction)]
            ),
            close[field].as_f64().unwrap_or(-1.0),
            "{direction}"
        );
    }
    Ok(())
}

/// A client that does not trust the mediator's CA (real curl, trusting another CA) ends
/// its handshake with the alert `unknown_ca`: the tunnel's close record says so
/// (`tls_alert`, a `detail` starting `client_rejected_certificate`, the rule of its
/// decision), and the admin API's recent denials carry it, for the shim to say what to do.
async fn a_client_rejecting_the_mediators_certificate_is_said_in_its_close_record() -> Result<()> {
    let env = start_with(true, any_loopback_port(), |b| b.admin(true)).await?;
    let m = &env.fx.mediator;
    let other = tempfile::tempdir()?;
    let foreign = TestCa::create(other.path())?;
    let ca = foreign.pem_path.display().to_string();
    let out = m
        .curl_via(
            "http",
            (AGENT_A, TOKEN_A),
            &["--cacert", &ca, &env.url("/public/a")],
        )
        .await?;
    // 60: the peer's certificate cannot be authenticated with the CA certificates given.
    ensure!(out.http_connect == 200 && out.exit_code == 60, "{out:?}");
    let decision = m
        .wait_for_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Connect),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let close = m.wait_for_close(&decision["id"]).await?;
    ensure!(
        close["close_reason"] == "error"
            && close["client_tls"] == "rejected_certificate"
            && close["tls_alert"] == "unknown_ca",
        "{close}"
    );
    let detail = close["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.starts_with("client_rejected_certificate: ") && detail.contains("unknown_ca"),
        "{close}"
    );
    ensure!(
        decision["rule"].is_string() && close["rule"] == decision["rule"],
        "the close names its decision's rule: {decision} {close}"
    );
    let ring = m.admin_get("/v1/authorities/agent-a/denials").await?;
    let entry = ring["denials"]
        .as_array()
        .and_then(|d| d.iter().find(|e| e["event"] == "close"))
        .ok_or_else(|| anyhow::anyhow!("no close entry among the denials: {ring}"))?;
    ensure!(
        entry["tunnel_id"] == decision["id"]
            && entry["client_tls"] == "rejected_certificate"
            && entry["tls_alert"] == "unknown_ca"
            && entry["host"] == API
            && entry["status"] == 200
            && entry["detail"] == close["detail"],
        "{entry}"
    );
    ensure!(
        entry["id"].as_u64() > decision["id"].as_u64(),
        "drawn after the tunnel's decision, for since=: {entry}"
    );
    Ok(())
}

/// The client of `node` (npm's runtime): a CONNECT through the mediator to `target` with
/// `auth`'s header, then a TLS handshake with SNI `sni`, trusting Node's own CA list (not
/// the mediator's CA). Prints `trusted`, or the error's code (exit 2), or the CONNECT's
/// status line (exit 3).
const NODE_CLIENT: &str = r"
const net = require('net'), tls = require('tls');
const [port, target, sni, auth] = process.argv.slice(1);
const s = net.connect(+port, '127.0.0.1', () =>
  s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n\r\n`));
let head = '';
s.on('data', function onHead(d) {
  head += d;
  if (!head.includes('\r\n\r\n')) return;
  s.removeListener('data', onHead);
  if (!head.startsWith('HTTP/1.1 200')) { console.log(head.split('\r\n')[0]); process.exit(3); }
  const t = tls.connect({ socket: s, servername: sni });
  t.on('secureConnect', () => { console.log('trusted'); process.exit(0); });
  t.on('error', e => { console.log(e.code); process.exit(2); });
});
";

/// Node.js (npm's runtime) that does not trust the mediator's CA sends no alert: it hangs
/// up during the handshake, once the mediator has presented its certificate. The close
/// record says so (`client_tls: closed_after_certificate`, no `tls_alert`, a `detail`
/// starting `client_rejected_certificate`), and so does the admin API's entry the shim
/// reads.
async fn node_hanging_up_on_the_mediators_certificate_is_said_in_its_close_record() -> Result<()> {
    let env = start_with(true, any_loopback_port(), |b| b.admin(true)).await?;
    let m = &env.fx.mediator;
    let auth = proxy_authorization(AGENT_A, TOKEN_A);
    let port = m.tcp_addr().port().to_string();
    let out = Tool::Node
        .command("node")?
        .args(["-e", NODE_CLIENT, &port, &env.target(), API])
        .arg(auth.trim_end())
        .output()
        .await?;
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.code() == Some(2) && said.trim() == "SELF_SIGNED_CERT_IN_CHAIN",
        "node refuses the mediator's certificate: {out:?}"
    );
    let decision = m
        .wait_for_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Connect),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let close = m.wait_for_close(&decision["id"]).await?;
    ensure!(
        close["close_reason"] == "error"
            && close["client_tls"] == "closed_after_certificate"
            && close.get("tls_alert").is_none(),
        "{close}"
    );
    let detail = close["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.starts_with("client_rejected_certificate: ") && detail.contains("without an alert"),
        "{close}"
    );
    let ring = m.admin_get("/v1/authorities/agent-a/denials").await?;
    let entry = ring["denials"]
        .as_array()
        .and_then(|d| d.iter().find(|e| e["event"] == "close"))
        .ok_or_else(|| anyhow::anyhow!("no close entry among the denials: {ring}"))?;
    ensure!(
        entry["tunnel_id"] == decision["id"]
            && entry["client_tls"] == "closed_after_certificate"
            && entry["detail"] == close["detail"],
        "{entry}"
    );
    Ok(())
}

/// A client that resets its terminated tunnel after it was answered (as cargo does) has
/// closed it: `client_closed`, not `error`.
async fn a_clients_reset_after_its_answer_closes_a_terminated_tunnel() -> Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let env = start(true).await?;
    let m = &env.fx.mediator;
    let mut tls = tls_through_connect(
        m.tcp_addr(),
        (AGENT_A, TOKEN_A),
        &env.target(),
        API,
        &env.mediator_ca,
        &[b"http/1.1"],
    )
    .await?;
    let req = format!("GET /public/a HTTP/1.1\r\nHost: {}\r\n\r\n", env.target());
    tls.write_all(req.as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"method\"") {
        let n =
            tokio::time::timeout(std::time::Duration::from_secs(20), tls.read(&mut buf)).await??;
        ensure!(
            n > 0,
            "closed before the answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    ensure!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // SO_LINGER 0: the close is a reset, with no close_notify first.
    socket2::SockRef::from(tls.get_ref().0).set_linger(Some(std::time::Duration::ZERO))?;
    drop(tls);
    let decision = m
        .wait_for_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Connect),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let close = m.wait_for_close(&decision["id"]).await?;
    ensure!(close["close_reason"] == "client_closed", "{close}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(http1_request_is_terminated_forwarded_and_logged_with_the_query_redacted)
            .needs(&[Tool::Curl]),
        case!(http2_with_curl_is_terminated_and_post_outside_the_rules_gets_the_json_denial)
            .needs(&[Tool::Curl]),
        case!(a_30_kb_header_passes_on_http2_as_on_http1_under_the_request_head_limit)
            .needs(&[Tool::Curl]),
        case!(hyper_h2_client_gets_allowed_denied_and_misdirected_answers_on_one_connection),
        case!(domain_fronting_with_the_host_header_or_sni_of_another_host_is_refused)
            .needs(&[Tool::Curl]),
        case!(upstream_certificate_not_trusted_is_a_clear_502).needs(&[Tool::Curl]),
        case!(ca_persists_across_restarts_and_ca_cert_prints_it).needs(&[Tool::Curl]),
        case!(socks5_tunnels_are_terminated_under_the_same_rules).needs(&[Tool::Curl]),
        case!(port_443_tunnel_passes_the_sni_gate_and_is_then_terminated).needs(&[Tool::Curl]),
        case!(path_rule_escapes_are_refused_inside_the_tunnel).needs(&[Tool::Curl]),
        case!(request_rules_also_apply_to_plain_http_for_the_terminated_host).needs(&[Tool::Curl]),
        case!(requests_on_an_open_terminated_connection_stop_when_the_authority_is_revoked),
        case!(a_malformed_or_foreign_authority_is_refused_and_logged_in_h1_and_h2)
            .needs(&[Tool::Curl]),
        case!(malformed_http1_inside_the_tunnel_is_400_bad_request_with_its_line),
        case!(http2_requests_the_http2_layer_refuses_are_logged),
        case!(an_open_terminated_tunnels_bytes_are_counted_before_it_closes),
        case!(a_client_rejecting_the_mediators_certificate_is_said_in_its_close_record)
            .needs(&[Tool::Curl]),
        case!(a_clients_reset_after_its_answer_closes_a_terminated_tunnel),
        case!(node_hanging_up_on_the_mediators_certificate_is_said_in_its_close_record)
            .needs(&[Tool::Node]),
    ]
}
