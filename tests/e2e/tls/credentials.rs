//! Credentials held by the mediator (design section 14): the child sends a placeholder,
//! the origin gets the secret (HTTP/1.1 and HTTP/2, curl and a hyper client); the
//! placeholder sent to another host, inside TLS or over plain `http://`, is refused with
//! `credential_misuse`; and the secret appears in no output of the run (decision log,
//! stderr, metrics, admin API, `explain`, `check`).
//!
//! Origins: two echoing TLS origins on loopback (`api.test`, whose credential it is, and
//! `other.test`, allowed and terminated too), and the fixture's plain origin.

use crate::support::is;
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::Protocol;
use policy::Reason;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use bytes::Bytes;
use e2e::mediator::{MediatorBuilder, toml_list, toml_str};
use e2e::tls::{TestCa, TlsOrigin, h2_client, tls_through_connect};
use e2e::{AGENT_A, CurlOutput, Fixture, ORIGIN_HOST, SocksTarget, TOKEN_A, agent_a_allowing};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::mediator;

const API: &str = "api.test";
const OTHER: &str = "other.test";
/// The secret of the `Authorization` credential (with a placeholder).
const SECRET: &str = "ghp_e2eSecretValue4f1c9a";
/// The secret of the `X-Api-Key` credential (no placeholder: always set).
const KEY_SECRET: &str = "key_e2eSecretValue77d02b";
const PLACEHOLDER: &str = "mediator:api:agent-a";

struct Env {
    fx: Fixture,
    api: TlsOrigin,
    other: TlsOrigin,
    builder: MediatorBuilder,
    mediator_ca: PathBuf,
    secret_file: PathBuf,
    dir: TempDir,
}

fn write_secret(path: &Path, secret: &str, mode: u32) -> Result<()> {
    std::fs::write(path, format!("{secret}\n"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// `agent-a` may reach both TLS origins (terminated), the plain origin and any name under
/// `other.test`; its credentials for `api.test`: `Authorization: Bearer <secret>`
/// (placeholder [`PLACEHOLDER`], `child_env = "API_TOKEN"`) and `X-Api-Key` (always).
fn builder(dir: &Path, secret_file: &Path, key_file: &Path, origin_ca: &Path) -> MediatorBuilder {
    builder_with(dir, secret_file, key_file, origin_ca, PLACEHOLDER)
}

/// [`builder`] with `placeholder` for the `Authorization` credential.
fn builder_with(
    dir: &Path,
    secret_file: &Path,
    key_file: &Path,
    origin_ca: &Path,
    placeholder: &str,
) -> MediatorBuilder {
    let authority = agent_a_allowing(&[API, OTHER, ORIGIN_HOST, "*.other.test"])
        .raw(&format!("tls_terminate = {}", toml_list(&[API, OTHER])))
        .raw("\n[[authority.credential]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("header = \"Authorization\"")
        .raw(&format!(
            "secret_file = {}",
            toml_str(&secret_file.display().to_string())
        ))
        .raw("format = \"Bearer {secret}\"")
        .raw(&format!("placeholder = {}", toml_str(placeholder)))
        .raw("child_env = \"API_TOKEN\"")
        .raw("\n[[authority.credential]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("header = \"X-Api-Key\"")
        .raw(&format!(
            "secret_file = {}",
            toml_str(&key_file.display().to_string())
        ));
    mediator()
        .admin(true)
        .extra_toml(&format!(
            "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
            toml_str(&dir.join("mediator-ca").display().to_string()),
            toml_list(&[origin_ca.display().to_string()])
        ))
        .authority(authority)
}

async fn start() -> Result<Env> {
    start_with(PLACEHOLDER).await
}

/// [`start`] with `placeholder` for the `Authorization` credential.
async fn start_with(placeholder: &str) -> Result<Env> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let api = TlsOrigin::start(&test_ca.ca, API).await?;
    let other = TlsOrigin::start(&test_ca.ca, OTHER).await?;
    let secret_file = dir.path().join("api-token");
    let key_file = dir.path().join("api-key");
    write_secret(&secret_file, SECRET, 0o600)?;
    write_secret(&key_file, KEY_SECRET, 0o640)?;
    let builder = builder_with(
        dir.path(),
        &secret_file,
        &key_file,
        &test_ca.pem_path,
        placeholder,
    );
    let fx = Fixture::start(builder.clone()).await?;
    fx.dns.set(API, [e2e::LOOPBACK]);
    fx.dns.set(OTHER, [e2e::LOOPBACK]);
    Ok(Env {
        fx,
        api,
        other,
        builder,
        mediator_ca: dir.path().join("mediator-ca").join("ca.pem"),
        secret_file,
        dir,
    })
}

impl Env {
    /// curl through the mediator's TCP listener as `agent-a`, trusting only the
    /// mediator's CA, with `-i` and `args` (the URL last).
    async fn curl(&self, args: &[&str]) -> Result<CurlOutput> {
        let ca = self.mediator_ca.display().to_string();
        let mut all = vec!["--cacert", ca.as_str(), "-i", "--suppress-connect-headers"];
        all.extend_from_slice(args);
        self.fx
            .mediator
            .curl_via("http", (AGENT_A, TOKEN_A), &all)
            .await
    }

    fn url(&self, origin: &TlsOrigin, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", origin.port())
    }
}

/// The JSON body after the header block of `curl -i` output.
fn body_json(out: &CurlOutput) -> Result<Value> {
    let body = out
        .body
        .rsplit_once("\r\n\r\n")
        .map_or(out.body.as_str(), |(_, b)| b);
    serde_json::from_str(body).map_err(|e| anyhow::anyhow!("body is not JSON ({e}): {out:?}"))
}

/// The echoed request header `name` (lowercase) in the origin's JSON, if sent (all its
/// values joined by `, `).
fn echoed(echo: &Value, name: &str) -> Option<String> {
    let values = echo["headers"].get(name)?.as_array()?;
    Some(
        values
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn auth_header() -> String {
    format!("Authorization: Bearer {PLACEHOLDER}")
}

/// The denial JSON of a `credential_misuse` answer in `curl -i` output.
fn expect_misuse(out: &CurlOutput) -> Result<Value> {
    ensure!(out.http_code == 403, "{out:?}");
    ensure!(
        out.body
            .contains("X-Mediator-Decision: deny; reason=credential_misuse")
            || out
                .body
                .contains("x-mediator-decision: deny; reason=credential_misuse"),
        "{out:?}"
    );
    let body = body_json(out)?;
    assert_eq!(body["error"], "egress_denied");
    assert_eq!(body["reason"], "credential_misuse");
    assert_eq!(body["authority"], AGENT_A);
    let detail = body["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains("credential[1] (authorization for api.test)"),
        "the detail names the credential: {body}"
    );
    Ok(body)
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario over h1 and h2: the secret placed, the child never holding it, misuse denied"
)]
async fn the_origin_gets_the_secret_the_child_never_does_and_misuse_is_denied() -> Result<()> {
    let env = start().await?;
    let auth = auth_header();

    // HTTP/1.1 and HTTP/2 through curl: the placeholder becomes the secret, the client's
    // X-Api-Key is replaced.
    for version in ["--http1.1", "--http2"] {
        let url = env.url(&env.api, API, "/v1/user");
        let out = env
            .curl(&[version, "-H", &auth, "-H", "X-Api-Key: client-sent", &url])
            .await?;
        ensure!(
            out.exit_code == 0 && out.http_code == 200,
            "{version}: {out:?}"
        );
        let echo = body_json(&out)?;
        assert_eq!(
            echoed(&echo, "authorization").as_deref(),
            Some(format!("Bearer {SECRET}").as_str()),
            "{version}: {echo}"
        );
        assert_eq!(
            echoed(&echo, "x-api-key").as_deref(),
            Some(KEY_SECRET),
            "{echo}"
        );
        ensure!(!echo.to_string().contains(PLACEHOLDER), "{echo}");
    }
    // Without the placeholder, no Authorization is added (X-Api-Key still is).
    let out = env.curl(&["--http2", &env.url(&env.api, API, "/")]).await?;
    ensure!(out.http_code == 200, "{out:?}");
    let echo = body_json(&out)?;
    assert_eq!(echoed(&echo, "authorization"), None, "{echo}");
    assert_eq!(echoed(&echo, "x-api-key").as_deref(), Some(KEY_SECRET));

    // A Rust HTTP/2 client: the same code path.
    let tls = tls_through_connect(
        env.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        &format!("{API}:{}", env.api.port()),
        API,
        &env.mediator_ca,
        &[b"h2"],
    )
    .await?;
    let mut h2 = h2_client(tls).await?;
    let req = hyper::Request::builder()
        .uri(format!("https://{API}:{}/h2", env.api.port()))
        .header("authorization", format!("Bearer {PLACEHOLDER}"))
        .body(Full::new(Bytes::new()))?;
    let resp = h2.send_request(req).await?;
    ensure!(resp.status() == 200, "{resp:?}");
    let echo: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    assert_eq!(
        echoed(&echo, "authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );

    // The allow lines name the credentials, never their values.
    let line = env
        .fx
        .mediator
        .wait_for_log(
            is(|r| r.protocol == Protocol::Tls && r.path.as_deref() == Some("/h2")),
            std::time::Duration::from_secs(10),
        )
        .await?;
    assert_eq!(
        line["credential"],
        json!([{"header": "authorization", "host": API}, {"header": "x-api-key", "host": API}]),
        "{line}"
    );

    // Exfiltration: the placeholder to another allowed (terminated) host, in a header, in
    // the query (percent-encoded too), and in a plain http:// request.
    let before = env.other.requests();
    let other = env.url(&env.other, OTHER, "/collect");
    for args in [
        vec!["--http1.1", "-H", auth.as_str(), other.as_str()],
        vec![
            "--http2",
            "-H",
            "X-Note: mediator:api:agent-a",
            other.as_str(),
        ],
    ] {
        let out = env.curl(&args).await?;
        expect_misuse(&out)?;
    }
    let query = format!("{other}?t=mediator%3Aapi%3Aagent-a");
    expect_misuse(&env.curl(&["--http2", &query]).await?)?;
    ensure!(
        env.other.requests() == before,
        "no misused request reached the other origin"
    );
    let plain = format!(
        "http://{ORIGIN_HOST}:{}/?t={PLACEHOLDER}",
        env.fx.origin.port()
    );
    let before = env.fx.origin.requests();
    expect_misuse(&env.curl(&[&plain]).await?)?;
    ensure!(env.fx.origin.requests() == before, "plain origin untouched");
    // Inside its own host, outside its header: refused too (never forwarded).
    let own = format!("{}?t={PLACEHOLDER}", env.url(&env.api, API, "/x"));
    expect_misuse(&env.curl(&["--http1.1", &own]).await?)?;
    let line = env
        .fx
        .mediator
        .wait_for_decision("credential_misuse", Some(ORIGIN_HOST))
        .await?;
    assert_eq!(line["protocol"], "http");
    assert_eq!(line["rule"], "credential[1] api.test");

    // No trace of the secrets anywhere a person or an agent could look.
    let admin = env.fx.mediator.admin_get("/v1/authorities").await?;
    assert_eq!(
        admin["authorities"][0]["credentials"],
        json!([{"host": API, "header": "authorization"}, {"host": API, "header": "x-api-key"}]),
        "{admin}"
    );
    let metrics = env.fx.mediator.admin("GET", "/metrics", None, None).await?;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    ensure!(
        metrics.contains("reason=\"credential_misuse\""),
        "counted: {metrics}"
    );
    let explain = env
        .fx
        .mediator
        .cli("explain", &["--authority", AGENT_A, "--no-resolve", API])
        .await?;
    let check = env.fx.mediator.cli("check", &[]).await?;
    ensure!(check.status.success(), "{check:?}");
    let check_out = String::from_utf8_lossy(&check.stdout).into_owned();
    ensure!(
        check_out.contains("credential: authority \"agent-a\": authorization for api.test"),
        "{check_out}"
    );
    let outputs = [
        (
            "decision log",
            std::fs::read_to_string(env.fx.mediator.log_path())?,
        ),
        ("stderr", env.fx.mediator.stderr_text()),
        ("metrics", metrics.clone()),
        ("admin API", admin.to_string()),
        (
            "explain",
            format!(
                "{}{}",
                String::from_utf8_lossy(&explain.stdout),
                String::from_utf8_lossy(&explain.stderr)
            ),
        ),
        (
            "check",
            format!("{check_out}{}", String::from_utf8_lossy(&check.stderr)),
        ),
    ];
    for (what, text) in &outputs {
        for secret in [SECRET, KEY_SECRET] {
            ensure!(
                !text.contains(secret),
                "the secret is in the {what}:\n{text}"
            );
        }
    }
    let _ = (&env.builder, &env.secret_file, &env.dir);
    Ok(())
}

async fn a_secret_file_readable_by_others_or_empty_stops_the_start() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let secret_file = dir.path().join("api-token");
    let key_file = dir.path().join("api-key");
    write_secret(&secret_file, SECRET, 0o644)?;
    std::fs::write(&key_file, "\n")?;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
    let b = builder(dir.path(), &secret_file, &key_file, &test_ca.pem_path);
    let err = b.start_err().await?;
    ensure!(
        err.contains("authority \"agent-a\": credential[1]: secret_file")
            && err.contains("is readable or writable by others (mode 0644)"),
        "{err}"
    );
    ensure!(
        err.contains("credential[2]: secret_file") && err.contains("the secret is empty"),
        "{err}"
    );
    ensure!(!err.contains(SECRET), "{err}");
    let (status, out) = b.check().await?;
    ensure!(!status.success(), "{out}");
    ensure!(out.contains("mode 0644") && !out.contains(SECRET), "{out}");
    Ok(())
}

async fn a_reload_rotates_the_secret_under_a_new_generation() -> Result<()> {
    let env = start().await?;
    let auth = auth_header();
    let url = env.url(&env.api, API, "/r");
    let config = std::fs::read_to_string(env.fx.mediator.config_path())?;
    let before = env.fx.mediator.admin_get("/v1/authorities").await?;
    const ROTATED: &str = "ghp_e2eRotatedValue9b3e";
    write_secret(&env.secret_file, ROTATED, 0o600)?;
    env.fx.mediator.reload_with(&config).await?;
    let after = env.fx.mediator.admin_get("/v1/authorities").await?;
    ensure!(
        after["authorities"][0]["generation"] != before["authorities"][0]["generation"],
        "a new generation: {before} -> {after}"
    );
    let out = env.curl(&["--http1.1", "-H", &auth, &url]).await?;
    ensure!(out.http_code == 200, "{out:?}");
    assert_eq!(
        echoed(&body_json(&out)?, "authorization").as_deref(),
        Some(format!("Bearer {ROTATED}").as_str())
    );
    let stderr = env.fx.mediator.stderr_text();
    ensure!(
        !stderr.contains(ROTATED) && !stderr.contains(SECRET),
        "{stderr}"
    );
    let _ = &env.builder;
    Ok(())
}

async fn the_admin_api_cannot_create_an_authority_with_a_credential() -> Result<()> {
    let env = start().await?;
    let body = json!({
        "name": "agent-x",
        "allow": [API],
        "tls_terminate": [API],
        "credential": [{
            "host": API,
            "header": "Authorization",
            "secret_file": env.secret_file.display().to_string(),
        }],
    })
    .to_string();
    let resp = env
        .fx
        .mediator
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    ensure!(resp.status == 400, "{} {text}", resp.status);
    ensure!(
        text.contains("credential") && text.contains("configured in the file only"),
        "{text}"
    );
    ensure!(!text.contains(SECRET), "{text}");
    Ok(())
}

/// A request of `agent-a` with a body and the trailer field `x-sig: <sig>` (declared in
/// `Trailer`, as HTTP/1.1 needs), to `uri`.
fn with_trailer(uri: &str, sig: &str) -> Result<hyper::Request<TrailerBody>> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-sig", sig.parse()?);
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"hello"))),
        Ok(Frame::trailers(trailers)),
    ];
    Ok(hyper::Request::builder()
        .method("POST")
        .uri(uri)
        .header("trailer", "x-sig")
        .header("proxy-authorization", e2e::basic_auth(AGENT_A, TOKEN_A))
        .body(StreamBody::new(futures_util::stream::iter(frames)))?)
}

type TrailerBody = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>,
>;

/// The status and body (JSON) of `resp`.
async fn status_json(resp: hyper::Response<hyper::body::Incoming>) -> Result<(u16, Value)> {
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    let json = serde_json::from_slice(&body)
        .map_err(|e| anyhow::anyhow!("not JSON ({e}): {}", String::from_utf8_lossy(&body)))?;
    Ok((status, json))
}

async fn a_placeholder_in_a_trailer_cuts_the_request_before_the_trailer_leaves() -> Result<()> {
    let env = start().await?;
    let tunnel = |host: &'static str, port: u16, alpn: &'static [u8]| {
        let (proxy, ca) = (env.fx.mediator.tcp_addr(), env.mediator_ca.clone());
        async move {
            tls_through_connect(
                proxy,
                (AGENT_A, TOKEN_A),
                &format!("{host}:{port}"),
                host,
                &ca,
                &[alpn],
            )
            .await
        }
    };
    let expect_trailer_misuse = |status: u16, body: &Value, what: &str| -> Result<()> {
        ensure!(status == 403, "{what}: {status} {body}");
        assert_eq!(body["reason"], "credential_misuse", "{what}: {body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains("credential[1] (authorization for api.test)")
                && detail.contains("in the x-sig trailer field")
                && !detail.contains(SECRET),
            "{what}: {body}"
        );
        Ok(())
    };

    // A trailer without a placeholder passes (so the origin does report trailers).
    let url = |host: &str, port: u16| format!("https://{host}:{port}/upload");
    let mut h2 = h2_client_for(tunnel(OTHER, env.other.port(), b"h2").await?).await?;
    let resp = h2
        .send_request(with_trailer(&url(OTHER, env.other.port()), "sha256=abc")?)
        .await?;
    let (status, echo) = status_json(resp).await?;
    ensure!(status == 200, "{status} {echo}");
    assert_eq!(echo["trailers"]["x-sig"], json!(["sha256=abc"]), "{echo}");

    // HTTP/2 to the other host, and to the credential's own host: refused, cut before
    // the trailer.
    for (host, port) in [(OTHER, env.other.port()), (API, env.api.port())] {
        let mut h2 = h2_client_for(tunnel(host, port, b"h2").await?).await?;
        let resp = h2
            .send_request(with_trailer(&url(host, port), PLACEHOLDER)?)
            .await?;
        let (status, body) = status_json(resp).await?;
        expect_trailer_misuse(status, &body, &format!("h2 to {host}"))?;
    }
    // HTTP/1.1 (chunked, the trailer declared) inside a tunnel to the other host.
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(
        tunnel(OTHER, env.other.port(), b"http/1.1").await?,
    ))
    .await?;
    tokio::spawn(conn);
    let resp = h1
        .send_request(with_trailer(&url(OTHER, env.other.port()), PLACEHOLDER)?)
        .await?;
    let (status, body) = status_json(resp).await?;
    expect_trailer_misuse(status, &body, "h1 in a tunnel")?;
    for origin in [&env.other, &env.api] {
        ensure!(
            !origin.received_text(PLACEHOLDER),
            "an origin received the placeholder"
        );
    }

    // Plain http:// through the proxy (absolute-form, chunked with the trailer).
    let tcp = tokio::net::TcpStream::connect(env.fx.mediator.tcp_addr()).await?;
    let (mut plain, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let plain_url = format!("http://{ORIGIN_HOST}:{}/upload", env.fx.origin.port());
    let resp = plain
        .send_request(with_trailer(&plain_url, PLACEHOLDER)?)
        .await?;
    let (status, body) = status_json(resp).await?;
    expect_trailer_misuse(status, &body, "plain http://")?;

    // Each is a credential_misuse line of its request.
    for protocol in ["tls", "http"] {
        env.fx
            .mediator
            .wait_for_log(
                |v| {
                    v["protocol"] == protocol
                        && v["reason"] == "credential_misuse"
                        && v["detail"]
                            .as_str()
                            .is_some_and(|d| d.contains("x-sig trailer field"))
                },
                std::time::Duration::from_secs(10),
            )
            .await?;
    }
    env.fx.mediator.expect_log_lacks(SECRET)?;
    Ok(())
}

/// A hyper HTTP/2 client over `tls`, for requests with any body type.
async fn h2_client_for(
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) -> Result<hyper::client::conn::http2::SendRequest<TrailerBody>> {
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn a_placeholder_in_a_tunnel_host_is_refused_before_it_is_resolved() -> Result<()> {
    // A placeholder that is a valid DNS label, as a label under the allowed *.other.test.
    const LABEL: &str = "ph-api-agent-a-7f3c";
    let env = start_with(LABEL).await?;
    for target in [
        format!("{LABEL}.other.test:443"),
        format!("x.{}.other.test:443", LABEL.to_ascii_uppercase()),
    ] {
        let resp = env.fx.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
        let body = e2e::check_deny(&resp, 403, "credential_misuse")?;
        e2e::check_contains(&body, "detail", "in the host name itself")?;
        e2e::check_contains(
            &body,
            "detail",
            "credential[1] (authorization for api.test)",
        )?;
    }
    let (_client, reply) = env
        .fx
        .socks_connect_a(&SocksTarget::Domain(format!("{LABEL}.other.test"), 443))
        .await?;
    assert_eq!(reply.rep, 0x02, "REP 0x02 (not allowed by ruleset)");
    let line = env
        .fx
        .mediator
        .wait_for_log(
            is(|r| r.protocol == Protocol::Socks5 && r.reason == Reason::CredentialMisuse),
            std::time::Duration::from_secs(10),
        )
        .await?;
    assert_eq!(line["rule"], "credential[1] api.test", "{line}");
    // Refused before resolution: the name never reached a resolver.
    let name = format!("{LABEL}.other.test");
    ensure!(env.fx.dns.queries(&name) == 0, "{name} was resolved");
    Ok(())
}

async fn an_encoded_placeholder_in_its_own_header_is_refused_and_said_so() -> Result<()> {
    let env = start().await?;
    let before = env.api.requests();
    let url = env.url(&env.api, API, "/v1/user");
    for version in ["--http1.1", "--http2"] {
        let out = env
            .curl(&[
                version,
                "-H",
                "Authorization: Bearer mediator%3Aapi%3Aagent-a",
                &url,
            ])
            .await?;
        let body = expect_misuse(&out)?;
        let detail = body["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains("percent-encoded in its own authorization header")
                && detail.contains("only the placeholder exactly as given is replaced"),
            "{version}: {body}"
        );
    }
    ensure!(env.api.requests() == before, "nothing was forwarded");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(the_origin_gets_the_secret_the_child_never_does_and_misuse_is_denied)
            .needs(&[Tool::Curl]),
        case!(a_secret_file_readable_by_others_or_empty_stops_the_start),
        case!(a_reload_rotates_the_secret_under_a_new_generation).needs(&[Tool::Curl]),
        case!(the_admin_api_cannot_create_an_authority_with_a_credential),
        case!(a_placeholder_in_a_trailer_cuts_the_request_before_the_trailer_leaves),
        case!(a_placeholder_in_a_tunnel_host_is_refused_before_it_is_resolved),
        case!(an_encoded_placeholder_in_its_own_header_is_refused_and_said_so).needs(&[Tool::Curl]),
    ]
}
