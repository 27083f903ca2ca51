//! TLS termination (design section 9): for a host in the grant's `tls_terminate`, the
//! mediator presents a leaf for exactly that host (issued by its own CA), serves HTTP/1.1
//! and HTTP/2 inside the tunnel, applies the grant's request rules to every request,
//! refuses requests for any other host (`421`), and forwards the rest over TLS verified
//! against `[tls] extra_ca_files` (here: a test CA of ours for the loopback origin).
//!
//! Clients: real curl (`--http1.1`, `--http2`) trusting only the mediator's CA, and a hyper
//! HTTP/2 client over rustls.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use bytes::Bytes;
use e2e::mediator::{AuthoritySpec, MediatorBuilder, toml_list, toml_str};
use e2e::tls::{TestCa, TlsOrigin, h2_client, tls_through_connect};
use e2e::{
    AGENT_A, DnsServer, HttpConn, LOG_TIMEOUT, Mediator, Origin, TOKEN_A, basic_auth, check_deny,
    curl,
};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tempfile::TempDir;

use crate::support::mediator;

const API: &str = "api.test";

struct Env {
    _dir: TempDir,
    _dns: DnsServer,
    origin: TlsOrigin,
    mediator: Mediator,
    /// The mediator's CA certificate (what a child trusts).
    mediator_ca: PathBuf,
    ca_dir: PathBuf,
}

/// `agent-a` may reach `api.test` (our loopback TLS origin), whose TLS is terminated;
/// request rules: GET and HEAD under `/public/` only.
fn authority() -> AuthoritySpec {
    AuthoritySpec::new(AGENT_A)
        .allow(&[API])
        .allow_private(&["127.0.0.0/8"])
        .token(TOKEN_A)
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

/// Starts DNS (`api.test` -> 127.0.0.1), a TLS origin whose certificate comes from a test CA
/// (trusted by the mediator via `extra_ca_files` when `trust_origin_ca`), and the mediator.
async fn start(trust_origin_ca: bool) -> Result<Env> {
    start_on(trust_origin_ca, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// As [`start`], with the origin bound to `bind` (and `api.test` resolving to its IP).
async fn start_on(trust_origin_ca: bool, bind: SocketAddr) -> Result<Env> {
    start_with(trust_origin_ca, bind, |b| b).await
}

/// As [`start_on`], with the mediator builder further configured by `configure`.
async fn start_with(
    trust_origin_ca: bool,
    bind: SocketAddr,
    configure: impl FnOnce(MediatorBuilder) -> MediatorBuilder,
) -> Result<Env> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = TlsOrigin::start_on(&test_ca.ca, API, bind).await?;
    let dns = DnsServer::start().await?;
    dns.set(API, [bind.ip()]);
    let ca_dir = dir.path().join("mediator-ca");
    let extra: Vec<&Path> = if trust_origin_ca {
        vec![test_ca.pem_path.as_path()]
    } else {
        Vec::new()
    };
    let mediator = configure(
        mediator()
            .nameserver(dns.addr())
            .extra_toml(&tls_toml(&ca_dir, &extra))
            .authority(authority()),
    )
    .start()
    .await?;
    Ok(Env {
        _dir: dir,
        _dns: dns,
        origin,
        mediator,
        mediator_ca: ca_dir.join("ca.pem"),
        ca_dir,
    })
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

    /// curl through the mediator's TCP listener, trusting only the mediator's CA, with
    /// `-i` (response headers in the body).
    async fn curl(&self, extra: &[&str], url: &str) -> Result<e2e::CurlOutput> {
        let proxy = format!("http://{}", self.mediator.tcp_addr());
        let user = format!("{AGENT_A}:{TOKEN_A}");
        let ca = self.mediator_ca.display().to_string();
        let mut args = vec![
            "--proxy",
            &proxy,
            "--proxy-user",
            &user,
            "--cacert",
            &ca,
            "-i",
            "--suppress-connect-headers",
        ];
        args.extend_from_slice(extra);
        args.push(url);
        curl(&args).await
    }
}

/// The JSON body after the header block of `curl -i` output.
fn body_json(out: &e2e::CurlOutput) -> Result<Value> {
    let body = out
        .body
        .split_once("\r\n\r\n")
        .map_or(out.body.as_str(), |(_, b)| b);
    serde_json::from_str(body).map_err(|e| anyhow::anyhow!("body is not JSON ({e}): {out:?}"))
}

/// The value of header `name` in `curl -i` output.
fn header<'a>(out: &'a e2e::CurlOutput, name: &str) -> Option<&'a str> {
    out.body
        .split("\r\n\r\n")
        .next()?
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let line = env
        .mediator
        .wait_for_log(
            |v| v["event"] == "decision" && v["protocol"] == "tls",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["reason"], "allowed");
    assert_eq!(line["authority"], AGENT_A);
    assert_eq!(line["host"], API);
    assert_eq!(line["port"], env.origin.port());
    assert_eq!(line["method"], "GET");
    assert_eq!(line["path"], "/public/hello?<redacted>");
    assert_eq!(line["rule"], "request_rule[1] api.test");
    assert_eq!(line["pin"], "127.0.0.1");
    // The tunnel itself was decided as a CONNECT.
    let connect = env
        .mediator
        .wait_for_log(
            |v| v["event"] == "decision" && v["protocol"] == "connect",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(connect["reason"], "allowed");
    let log = std::fs::read_to_string(env.mediator.log_path())?;
    ensure!(!log.contains("s3cret"), "no query value in the log: {log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let line = env
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "tls" && v["decision"] == "deny",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["reason"], "denied_by_rule");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/public/a");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_h2_client_gets_allowed_denied_and_misdirected_answers_on_one_connection()
-> Result<()> {
    let env = start(true).await?;
    let tls = tls_through_connect(
        env.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        &env.target(),
        API,
        &env.mediator_ca,
        &[b"h2"],
    )
    .await?;
    // The leaf names exactly the tunnel host and chains to the mediator's CA (the
    // handshake above verified it with webpki against that CA alone).
    let mut h2 = h2_client(tls).await?;
    let send = |method: &str, uri: String, body: &'static str| {
        hyper::Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };

    let resp = h2
        .send_request(send("GET", env.url("/public/one"), ""))
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-mediator-decision").is_none());
    let echo: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    assert_eq!(echo["method"], "GET");

    let resp = h2
        .send_request(send("POST", env.url("/public/one"), "payload"))
        .await?;
    assert_eq!(resp.status(), 403);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=denied_by_rule"
    );
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    assert_eq!(body["reason"], "denied_by_rule");

    let resp = h2
        .send_request(send("GET", env.url("/private"), ""))
        .await?;
    assert_eq!(resp.status(), 403, "GET outside /public/ is denied too");

    // Domain fronting through the terminated leg: :authority of another host.
    let resp = h2
        .send_request(send(
            "GET",
            format!("https://blocked.test:{}/public/x", env.origin.port()),
            "",
        ))
        .await?;
    assert_eq!(resp.status(), 421);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=sni_mismatch"
    );
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("blocked.test")),
        "{body}"
    );

    // The connection is still good after the denials.
    let resp = h2
        .send_request(send("HEAD", env.url("/public/two"), ""))
        .await?;
    assert_eq!(resp.status(), 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    ensure!(out.exit_code != 0, "{out:?}");
    ensure!(
        out.http_connect == 200,
        "the CONNECT itself is allowed: {out:?}"
    );
    let line = env
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    assert_eq!(env.origin.requests(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let out = env.mediator.cli("ca-cert", &[]).await?;
    ensure!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout)?, first);

    // A second mediator on the same ca_dir loads the same CA, and a client that trusts the
    // first run's certificate works against it.
    let Env {
        _dir: dir,
        _dns: dns,
        origin,
        mediator: first_run,
        mediator_ca,
        ca_dir,
    } = env;
    drop(first_run);
    let test_ca_pem = dir.path().join("test-ca.pem");
    let mediator = mediator()
        .nameserver(dns.addr())
        .extra_toml(&tls_toml(&ca_dir, &[&test_ca_pem]))
        .authority(authority())
        .start()
        .await?;
    assert_eq!(std::fs::read_to_string(&mediator_ca)?, first);
    let env = Env {
        _dir: dir,
        _dns: dns,
        origin,
        mediator,
        mediator_ca,
        ca_dir,
    };
    let out = env.curl(&[], &env.url("/public/again")).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_tunnels_are_terminated_under_the_same_rules() -> Result<()> {
    let env = start(true).await?;
    let proxy = format!("socks5h://{}", env.mediator.tcp_addr());
    let user = format!("{AGENT_A}:{TOKEN_A}");
    let ca = env.mediator_ca.display().to_string();
    let base = [
        "--proxy",
        proxy.as_str(),
        "--proxy-user",
        user.as_str(),
        "--cacert",
        ca.as_str(),
    ];
    let mut args = base.to_vec();
    let url = env.url("/public/s");
    args.push(&url);
    let out = curl(&args).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "{out:?}");
    let mut args = base.to_vec();
    args.extend(["-X", "DELETE", url.as_str()]);
    let out = curl(&args).await?;
    ensure!(out.http_code == 403, "{out:?}");
    let line = env
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "tls" && v["method"] == "DELETE",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["reason"], "denied_by_rule");
    let tunnel = env
        .mediator
        .wait_for_log(
            |v| v["event"] == "decision" && v["protocol"] == "socks5",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(tunnel["reason"], "allowed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_443_tunnel_passes_the_sni_gate_and_is_then_terminated() -> Result<()> {
    // On 443 the SNI gate reads the ClientHello first; termination must replay it. The
    // origin has an address of its own so that no other test competes for port 443.
    let env = start_on(true, SocketAddr::from(([127, 66, 1, 1], 443))).await?;
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rules_also_apply_to_plain_http_for_the_terminated_host() -> Result<()> {
    let env = start(true).await?;
    // A plain HTTP origin on 127.0.0.1, which api.test resolves to.
    let plain = Origin::start().await?;
    let host = format!("{API}:{}", plain.port());
    let auth = basic_auth(AGENT_A, TOKEN_A);
    let req = |method: &str, path: &str| {
        format!(
            "{method} http://{host}{path} HTTP/1.1\r\nHost: {host}\r\n\
             Proxy-Authorization: {auth}\r\nContent-Length: 0\r\n\r\n"
        )
    };
    let mut c = HttpConn::tcp(env.mediator.tcp_addr()).await?;
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

    let line = env
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "http" && v["method"] == "POST",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["reason"], "denied_by_rule");
    assert_eq!(line["path"], "/admin");
    assert_eq!(line["rule"], "request_rule[1] api.test");
    let line = env
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "http" && v["path"] == "/public/b?<redacted>",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["method"], "GET");

    // What the reviewer ran: curl with an absolute-form POST.
    let proxy = format!("http://{}", env.mediator.tcp_addr());
    let user = format!("{AGENT_A}:{TOKEN_A}");
    let url = format!("http://{host}/admin");
    let out = curl(&["--proxy", &proxy, "--proxy-user", &user, "-X", "POST", &url]).await?;
    ensure!(out.http_code == 403, "{out:?}");
    assert_eq!(plain.requests(), 2);
    let log = std::fs::read_to_string(env.mediator.log_path())?;
    ensure!(!log.contains("s3cret"), "no query value in the log: {log}");
    Ok(())
}

/// A terminated connection opened before its authority was revoked gets no further
/// decision: the next request is `unknown_authority` at once, not at the end of the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_an_open_terminated_connection_stop_when_the_authority_is_revoked() -> Result<()>
{
    let env = start_with(true, SocketAddr::from(([127, 0, 0, 1], 0)), |b| {
        b.admin(true).timeout("revoke_grace", 60)
    })
    .await?;
    let tls = tls_through_connect(
        env.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        &env.target(),
        API,
        &env.mediator_ca,
        &[b"h2"],
    )
    .await?;
    let mut h2 = h2_client(tls).await?;
    let get = |path: &str| {
        hyper::Request::builder()
            .method("GET")
            .uri(env.url(path))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let resp = h2.send_request(get("/public/before")).await?;
    assert_eq!(resp.status(), 200);
    let before = env.origin.requests();

    let resp = env
        .mediator
        .admin("DELETE", &format!("/v1/authorities/{AGENT_A}"), None, None)
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());

    let resp = h2.send_request(get("/public/after")).await?;
    assert_eq!(resp.status(), 407);
    assert_eq!(
        resp.headers()["x-mediator-decision"],
        "deny; reason=unknown_authority"
    );
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    assert_eq!(body["reason"], "unknown_authority");
    assert_eq!(env.origin.requests(), before, "nothing reached the origin");
    let line = env
        .mediator
        .wait_for_log(
            |v| v["protocol"] == "tls" && v["reason"] == "unknown_authority",
            LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["path"], "/public/after");
    Ok(())
}
