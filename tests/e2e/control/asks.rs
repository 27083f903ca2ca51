//! Asking the host (design section 20): a grant miss of an authority with `ask` is held
//! while the host is asked (`GET /v1/asks`, its event stream, an `ask` endpoint), and
//! each answer has its outcome: `allow_via` judged again in full under the named
//! authority and attributed to it (`asked: {id, from, ms}`), `deny` (`ask_denied` with the
//! host's words), no answer (`ask_timeout`), one request too many (`ask_overloaded`, at
//! once), a client that leaves (its place freed at once, its record says so), the
//! shutdown (`ask_timeout`, never an allow). What may never be asked is refused at once.
//! Bad answers change nothing: 400 (malformed), 404 (unknown id), 409 (ended).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use e2e::ask::{AskEndpoint, AskMode, AskStream};
use e2e::case;
use e2e::harness::Case;
use e2e::socks::{CMD_CONNECT, METHOD_NO_AUTH, REP_NOT_ALLOWED, REP_SUCCEEDED};
use e2e::{
    AuthoritySpec, Fixture, HttpConn, HttpResponse, LOG_TIMEOUT, ORIGIN_HOST, Socks5, SocksTarget,
    check_deny,
};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::support::mediator;

/// Asks the host; its grant misses the origin.
const NARROW: &str = "narrow";
/// Allows the origin.
const WIDE: &str = "wide";
/// Allows something else than the origin.
const OTHER: &str = "other";

fn narrow(ask: &str, extra: &[&str]) -> AuthoritySpec {
    let mut spec = AuthoritySpec::new(NARROW)
        .allow(&["allowed.test"])
        .deny(&["forbidden.test"])
        .allow_private(&["127.0.0.0/8"])
        .raw(&format!("ask = {ask:?}"))
        .raw("default_deny_reason = \"new hosts need the owner's yes\"");
    for line in extra {
        spec = spec.raw(line);
    }
    spec
}

async fn fixture_with(ask: &str, extra: &[&str]) -> Result<Fixture> {
    Fixture::start(
        mediator()
            .admin(true)
            .authority(narrow(ask, extra))
            .authority(
                AuthoritySpec::new(WIDE)
                    .allow(&[ORIGIN_HOST])
                    .allow_private(&["127.0.0.0/8"]),
            )
            .authority(AuthoritySpec::new(OTHER).allow(&["elsewhere.test"])),
    )
    .await
}

async fn fixture() -> Result<Fixture> {
    fixture_with("admin", &[]).await
}

/// A CONNECT to the origin on `authority`'s socket, answered on a task of its own (it is
/// held until the host answers); returns the connection too (a tunnel on `200`).
fn connect_held(fx: &Fixture, authority: &str) -> JoinHandle<Result<(HttpConn, HttpResponse)>> {
    let path = fx.mediator.socket_path(authority);
    let target = fx.origin_target();
    tokio::spawn(async move {
        let mut conn = HttpConn::unix(&path).await?;
        let resp = conn.connect(&target, None).await?;
        Ok((conn, resp))
    })
}

/// The pending question about the origin.
async fn origin_question(fx: &Fixture) -> Result<Value> {
    fx.mediator
        .wait_question(|q| q["host"] == ORIGIN_HOST && q["authority"] == NARROW)
        .await
}

async fn answered_ok(fx: &Fixture, id: &str, body: &str) -> Result<Value> {
    let resp = fx.mediator.answer(id, body).await?;
    ensure!(
        resp.status == 200,
        "{body}: {} {}",
        resp.status,
        resp.text()
    );
    resp.json()
}

async fn allow_via_judges_again_under_the_named_authority_and_is_attributed_to_it() -> Result<()> {
    let fx = fixture().await?;
    let held = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    for (k, v) in [
        ("authority", json!(NARROW)),
        ("protocol", json!("connect")),
        ("reason", json!("not_in_allowlist")),
        ("message", json!("new hosts need the owner's yes")),
        ("timeout_s", json!(30)),
        ("invocation", Value::Null),
        ("tags", json!({})),
    ] {
        ensure!(q[k] == v, "{k} should be {v}: {q}");
    }
    ensure!(q["peer"]["pid"] == json!(std::process::id()), "{q}");
    let id = q["id"].as_str().unwrap_or_default().to_owned();
    let answer = answered_ok(&fx, &id, r#"{"allow_via":"wide"}"#).await?;
    ensure!(
        answer["answered"] == id && answer["via"] == WIDE,
        "{answer}"
    );
    let (mut conn, resp) = held.await??;
    ensure!(resp.status == 200, "{resp:?} {}", resp.text());
    let inner = conn.get(&fx.origin_target(), "/asked", true).await?;
    ensure!(inner.status == 200, "{inner:?}");
    drop(conn);
    let line = fx
        .mediator
        .expect_allow(ORIGIN_HOST, &[("authority", json!(WIDE))])
        .await?;
    let asked = &line["asked"];
    ensure!(
        asked["id"] == id
            && asked["from"] == NARROW
            && asked["outcome"] == "allow_via"
            && asked["ms"].is_u64()
            && asked["by"].as_str().is_some_and(|b| b.starts_with("admin")),
        "{line}"
    );
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    ensure!(
        close["authority"] == WIDE && close["asked"]["from"] == NARROW,
        "{close}"
    );
    // The answer is an audit record; the asker's grant is unchanged: the next miss is
    // asked again.
    fx.mediator
        .expect_log(
            |v| v["event"] == "audit" && v["action"] == "ask_answer",
            &[
                ("result", json!("accepted")),
                ("authority", json!(NARROW)),
                ("ask", json!({"id": id, "host": ORIGIN_HOST, "port": fx.origin.port(), "answer": "allow_via", "via": WIDE})),
            ],
        )
        .await?;
    let again = connect_held(&fx, NARROW);
    let q2 = origin_question(&fx).await?;
    ensure!(q2["id"] != q["id"], "{q2}");
    answered_ok(&fx, q2["id"].as_str().unwrap_or_default(), r#"{"deny":""}"#).await?;
    let (_, resp) = again.await??;
    ensure!(resp.status == 403, "{resp:?}");
    let metrics = fx.mediator.metrics().await?;
    for (outcome, n) in [("allow_via", 1.0), ("deny", 1.0), ("timeout", 0.0)] {
        let got = metrics.get(
            "mediator_asks_total",
            &[("authority", NARROW), ("outcome", outcome)],
        );
        ensure!(
            (got - n).abs() < f64::EPSILON,
            "asks_total {outcome}: {got}"
        );
    }
    ensure!(
        metrics.count("mediator_asks_pending{authority=\"narrow\"}") == 1
            && metrics.get("mediator_asks_pending", &[("authority", NARROW)]) == 0.0,
        "{:?}",
        metrics.raw_series()
    );
    ensure!(
        metrics.get("mediator_ask_answer_duration_seconds_count", &[]) >= 2.0,
        "{:?}",
        metrics.raw_series()
    );
    Ok(())
}

async fn deny_is_ask_denied_with_the_hosts_words() -> Result<()> {
    let fx = fixture().await?;
    let held = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    let id = q["id"].as_str().unwrap_or_default();
    answered_ok(&fx, id, r#"{"deny":"not during the release freeze"}"#).await?;
    let (_, resp) = held.await??;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "ask_denied",
            Some(ORIGIN_HOST),
            &[("authority", json!(NARROW))],
        )
        .await?;
    ensure!(
        denial.body["message"] == "not during the release freeze"
            && denial.line["message"] == "not during the release freeze"
            && denial.line["asked"]["outcome"] == "deny",
        "{} {}",
        denial.body,
        denial.line
    );
    Ok(())
}

async fn no_answer_in_time_is_ask_timeout() -> Result<()> {
    let fx = fixture_with("admin", &["ask_timeout_s = 1"]).await?;
    let started = Instant::now();
    let held = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    let (_, resp) = held.await??;
    ensure!(
        started.elapsed() >= Duration::from_secs(1),
        "answered early"
    );
    let denial = fx
        .mediator
        .expect_deny(&resp, 403, "ask_timeout", Some(ORIGIN_HOST), &[])
        .await?;
    ensure!(
        denial.line["asked"]["outcome"] == "timeout" && denial.line["asked"]["id"] == q["id"],
        "{}",
        denial.line
    );
    // Too late: ended.
    let late = fx
        .mediator
        .answer(
            q["id"].as_str().unwrap_or_default(),
            r#"{"allow_via":"wide"}"#,
        )
        .await?;
    ensure!(late.status == 409, "{late:?}");
    ensure!(fx.mediator.asks().await?.is_empty());
    Ok(())
}

/// One more than `max_pending_asks` is `ask_overloaded` at once (429); another authority
/// is not affected, and the held one is still answered.
async fn one_more_than_max_pending_is_ask_overloaded_at_once() -> Result<()> {
    let fx = fixture_with("admin", &["max_pending_asks = 1"]).await?;
    let first = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    let started = Instant::now();
    let resp = fx.connect_unix(NARROW, &fx.origin_target()).await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 429, "ask_overloaded", Some(ORIGIN_HOST), &[])
        .await?;
    ensure!(
        started.elapsed() < Duration::from_secs(5) && resp.header("retry-after").is_some(),
        "{resp:?}"
    );
    ensure!(
        denial.line["asked"]["outcome"] == "overloaded",
        "{}",
        denial.line
    );
    // Another authority is served meanwhile.
    let other = fx.connect_unix(WIDE, &fx.origin_target()).await?;
    ensure!(other.status == 200, "{other:?}");
    answered_ok(
        &fx,
        q["id"].as_str().unwrap_or_default(),
        r#"{"allow_via":"wide"}"#,
    )
    .await?;
    let (_, resp) = first.await??;
    ensure!(resp.status == 200, "{resp:?}");
    Ok(())
}

/// A client that leaves while held frees its place at once (`max_pending_asks = 1`: the
/// next request is held, not overloaded), and its record says so; both for a connection
/// the front-end reads (CONNECT first) and one hyper serves (absolute-form).
async fn a_client_that_leaves_frees_its_place_and_its_record_says_so() -> Result<()> {
    let fx = fixture_with("admin", &["max_pending_asks = 1"]).await?;
    let t = fx.origin_target();
    for (protocol, head) in [
        (
            "connect",
            format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n"),
        ),
        (
            "http",
            format!("GET http://{t}/left HTTP/1.1\r\nHost: {t}\r\n\r\n"),
        ),
    ] {
        let mut conn = fx.unix_conn(NARROW).await?;
        conn.send(head.as_bytes()).await?;
        let q = fx
            .mediator
            .wait_question(|q| q["protocol"] == protocol)
            .await?;
        drop(conn);
        let line = fx
            .mediator
            .wait_for_log(
                |v| v["event"] == "decision" && v["asked"]["id"] == q["id"],
                LOG_TIMEOUT,
            )
            .await?;
        ensure!(
            line["reason"] == "not_in_allowlist"
                && line["asked"]["outcome"] == "hung_up"
                && line["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("client left")),
            "{line}"
        );
        ensure!(
            fx.mediator.asks().await?.is_empty(),
            "{protocol}: still pending"
        );
        let gone = fx
            .mediator
            .answer(q["id"].as_str().unwrap_or_default(), r#"{"deny":""}"#)
            .await?;
        ensure!(gone.status == 409, "{gone:?}");
    }
    // The place is free: the next one is held, not refused.
    let next = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    answered_ok(&fx, q["id"].as_str().unwrap_or_default(), r#"{"deny":""}"#).await?;
    let (_, resp) = next.await??;
    ensure!(
        resp.status == 403 && check_deny(&resp, 403, "ask_denied").is_ok(),
        "{resp:?}"
    );
    Ok(())
}

/// Bad answers change nothing: malformed (400, the question stays pending), unknown id
/// (404), an `allow_via` grant outside the shim (400); then an `allow_via` naming no live
/// authority denies (`unknown_authority`, 403), and one naming an authority whose grant
/// misses too denies with that authority's reason, never allows.
async fn bad_answers_change_nothing_and_a_wrong_via_never_allows() -> Result<()> {
    let fx = fixture().await?;
    let held = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    let id = q["id"].as_str().unwrap_or_default().to_owned();
    for (body, status) in [
        ("not json", 400),
        (r#"{"allow":"wide"}"#, 400),
        (r#"{"allow_via":"wide","deny":"x"}"#, 400),
        (r#"{"allow_via":{"allow":["origin.test"]}}"#, 400),
        (r#"{"deny":"a\u0007b"}"#, 400),
    ] {
        let resp = fx.mediator.answer(&id, body).await?;
        ensure!(resp.status == status, "{body}: {resp:?} {}", resp.text());
    }
    let unknown = fx.mediator.answer("999999999", r#"{"deny":""}"#).await?;
    ensure!(unknown.status == 404, "{unknown:?}");
    ensure!(
        fx.mediator.asks().await?.len() == 1,
        "the question should still be pending"
    );
    answered_ok(&fx, &id, r#"{"allow_via":"nobody"}"#).await?;
    let (_, resp) = held.await??;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "unknown_authority",
            Some(ORIGIN_HOST),
            &[("authority", json!(NARROW))],
        )
        .await?;
    ensure!(
        denial.line["asked"]["outcome"] == "allow_via",
        "{}",
        denial.line
    );
    // allow_via an authority that does not allow the origin: its own miss, final.
    let held = connect_held(&fx, NARROW);
    let q = fx
        .mediator
        .wait_question(|q| q["host"] == ORIGIN_HOST)
        .await?;
    answered_ok(
        &fx,
        q["id"].as_str().unwrap_or_default(),
        r#"{"allow_via":"other"}"#,
    )
    .await?;
    let (_, resp) = held.await??;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some(ORIGIN_HOST),
            &[("authority", json!(OTHER))],
        )
        .await?;
    ensure!(denial.line["asked"]["from"] == NARROW, "{}", denial.line);
    ensure!(
        fx.mediator.asks().await?.is_empty(),
        "the second miss was asked"
    );
    let refused = fx
        .mediator
        .wait_for_count(
            |v| v["event"] == "audit" && v["action"] == "ask_answer" && v["result"] == "refused",
            6,
            LOG_TIMEOUT,
        )
        .await?;
    ensure!(refused.iter().any(|v| v["status"] == 404), "{refused:?}");
    Ok(())
}

/// What may never be asked is refused at once: a deny rule, a global deny, an address
/// the grant allows by name but whose address class it refuses, a non-public address
/// literal or `localhost` outside the grant, a malformed target.
async fn what_may_never_be_asked_is_refused_at_once() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .global_deny(&["banned.test"])
            .authority(
                AuthoritySpec::new(NARROW)
                    .allow(&["private.test"])
                    .deny(&["forbidden.test"])
                    .raw("ask = \"admin\""),
            ),
    )
    .await?;
    fx.resolve(&["private.test"], "10.0.0.7".parse()?);
    for (target, status, reason) in [
        ("forbidden.test:443", 403, "denied_by_rule"),
        ("banned.test:443", 403, "denied_by_rule"),
        ("private.test:443", 403, "private_address"),
        ("bad..name:443", 400, "malformed_target"),
        // Outside the grant, but an address the address check refuses whatever the grant:
        // a miss all the same, never a question.
        ("10.1.2.3:443", 403, "not_in_allowlist"),
        ("127.0.0.2:80", 403, "not_in_allowlist"),
        ("[::1]:443", 403, "not_in_allowlist"),
        ("localhost:443", 403, "not_in_allowlist"),
        ("db.localhost:443", 403, "not_in_allowlist"),
    ] {
        let resp = fx.connect_unix(NARROW, target).await?;
        check_deny(&resp, status, reason).map_err(|e| anyhow::anyhow!("{target}: {e}"))?;
    }
    ensure!(fx.mediator.asks().await?.is_empty());
    let text = std::fs::read_to_string(fx.mediator.log_path())?;
    ensure!(!text.contains("\"asked\""), "{text}");
    Ok(())
}

/// SOCKS5 and absolute-form HTTP are held too; the event stream shows each question
/// within 100 ms of its request (one run's measure, printed).
async fn socks5_and_absolute_form_are_held_and_the_event_stream_sees_them() -> Result<()> {
    let fx = fixture().await?;
    let mut stream = AskStream::open(&fx.mediator).await?;
    let path = fx.mediator.socket_path(NARROW);
    let port = fx.origin.port();
    let sent = Instant::now();
    let socks = tokio::spawn(async move {
        let mut s = Socks5::new(tokio::net::UnixStream::connect(&path).await?);
        s.greet(&[METHOD_NO_AUTH]).await?;
        let reply = s
            .request(CMD_CONNECT, &SocksTarget::Domain(ORIGIN_HOST.into(), port))
            .await?;
        Ok::<_, anyhow::Error>((s, reply))
    });
    let q = stream.next(Duration::from_secs(5)).await?;
    let seen = sent.elapsed();
    println!("question on the event stream {seen:?} after the SOCKS5 request");
    ensure!(seen < Duration::from_millis(100), "{seen:?}");
    ensure!(q["protocol"] == "socks5" && q["host"] == ORIGIN_HOST, "{q}");
    answered_ok(
        &fx,
        q["id"].as_str().unwrap_or_default(),
        r#"{"allow_via":"wide"}"#,
    )
    .await?;
    let (_s, reply) = socks.await??;
    ensure!(reply.rep == REP_SUCCEEDED, "{reply:?}");
    // Absolute-form, denied by the host: a 403 the HTTP way.
    let mut conn = fx.unix_conn(NARROW).await?;
    let t = fx.origin_target();
    conn.send(format!("GET http://{t}/abs HTTP/1.1\r\nHost: {t}\r\n\r\n").as_bytes())
        .await?;
    let q = stream.next(Duration::from_secs(5)).await?;
    ensure!(q["protocol"] == "http", "{q}");
    answered_ok(
        &fx,
        q["id"].as_str().unwrap_or_default(),
        r#"{"deny":"no"}"#,
    )
    .await?;
    let resp = conn.read_response(false).await?;
    check_deny(&resp, 403, "ask_denied")?;
    // A SOCKS5 request the host denies gets REP 0x02.
    let path = fx.mediator.socket_path(NARROW);
    let socks = tokio::spawn(async move {
        let mut s = Socks5::new(tokio::net::UnixStream::connect(&path).await?);
        s.greet(&[METHOD_NO_AUTH]).await?;
        s.request(CMD_CONNECT, &SocksTarget::Domain(ORIGIN_HOST.into(), port))
            .await
    });
    let q = stream.next(Duration::from_secs(5)).await?;
    answered_ok(&fx, q["id"].as_str().unwrap_or_default(), r#"{"deny":""}"#).await?;
    ensure!(socks.await??.rep == REP_NOT_ALLOWED);
    Ok(())
}

/// An `ask` endpoint's `200` answers; its `202` leaves the question to the admin API.
async fn an_ask_endpoint_answers_or_leaves_it_pending() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let yes = AskEndpoint::start(
        dir.path(),
        "yes",
        AskMode::Answer(json!({"allow_via": WIDE})),
    )?;
    let fx = fixture_with(&yes.endpoint(), &[]).await?;
    let (_, resp) = connect_held(&fx, NARROW).await??;
    ensure!(resp.status == 200, "{resp:?}");
    let posted = yes.questions();
    ensure!(
        posted.len() == 1 && posted[0]["host"] == ORIGIN_HOST,
        "{posted:?}"
    );
    fx.mediator
        .expect_log(
            |v| v["event"] == "audit" && v["action"] == "ask_answer",
            &[
                ("result", json!("accepted")),
                (
                    "actor",
                    json!({"via": "ask_endpoint", "endpoint": yes.endpoint()}),
                ),
            ],
        )
        .await?;
    let later = AskEndpoint::start(dir.path(), "later", AskMode::Pending)?;
    let fx = fixture_with(&later.endpoint(), &[]).await?;
    let held = connect_held(&fx, NARROW);
    let q = origin_question(&fx).await?;
    // The endpoint is sent the question beside its listing: wait for it to arrive.
    let posted = e2e::wait::retry_for(
        Duration::from_secs(5),
        async || Ok((!later.questions().is_empty()).then(|| later.questions())),
        || "the pending endpoint was never sent the question".to_owned(),
    )
    .await?;
    ensure!(posted.len() == 1, "{posted:?}");
    answered_ok(
        &fx,
        q["id"].as_str().unwrap_or_default(),
        r#"{"deny":"later: no"}"#,
    )
    .await?;
    let (_, resp) = held.await??;
    check_deny(&resp, 403, "ask_denied")?;
    Ok(())
}

/// Abuse: one authority floods questions (far more than its `max_pending_asks`, nobody
/// answers) while another authority's allowed traffic goes on: every one of its tunnels
/// is served, none is held, and the flood holds exactly its maximum. (Latency under the
/// flood is measured by `bench/fairness.sh`, scenario `asks`, not here.)
async fn one_authority_flooding_questions_does_not_hold_up_another() -> Result<()> {
    let fx = fixture_with("admin", &["max_pending_asks = 8", "ask_timeout_s = 60"]).await?;
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(connect_held(&fx, NARROW));
    }
    // The eight held, the rest refused at once.
    fx.mediator
        .wait_for_count(|v| v["reason"] == "ask_overloaded", 32, LOG_TIMEOUT)
        .await?;
    ensure!(fx.mediator.asks().await?.len() == 8);
    let started = Instant::now();
    for i in 0..20 {
        let mut conn = fx.unix_conn(WIDE).await?;
        let resp = conn.connect(&fx.origin_target(), None).await?;
        ensure!(resp.status == 200, "tunnel {i}: {resp:?}");
        let inner = conn.get(&fx.origin_target(), "/meanwhile", true).await?;
        ensure!(inner.status == 200, "tunnel {i}: {inner:?}");
    }
    println!(
        "20 tunnels of another authority beside the flood: {:?}",
        started.elapsed()
    );
    ensure!(fx.mediator.asks().await?.len() == 8, "the flood grew");
    for q in fx.mediator.asks().await? {
        answered_ok(&fx, q["id"].as_str().unwrap_or_default(), r#"{"deny":""}"#).await?;
    }
    let mut statuses = Vec::new();
    for task in flood {
        statuses.push(task.await??.1.status);
    }
    statuses.sort_unstable();
    ensure!(
        statuses.iter().filter(|s| **s == 403).count() == 8
            && statuses.iter().filter(|s| **s == 429).count() == 32,
        "{statuses:?}"
    );
    Ok(())
}

/// Inside a terminated tunnel each request is asked about on its own, with the request
/// rule that missed: `POST` where the narrow authority's rules allow only `GET` is held;
/// `allow_via` an authority whose rules allow it sends it on, attributed there; `deny`
/// answers it `ask_denied` inside the tunnel.
async fn a_terminated_request_a_rule_misses_is_held_per_request() -> Result<()> {
    use e2e::mediator::{toml_list, toml_str};
    use e2e::tls::{TestCa, TlsOrigin};
    const API: &str = "api.test";
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = TlsOrigin::start(&test_ca.ca, API).await?;
    let ca_dir = dir.path().join("mediator-ca");
    let narrow = AuthoritySpec::new(NARROW)
        .allow(&[API])
        .allow_private(&["127.0.0.0/8"])
        .token("narrow-token")
        .raw("ask = \"admin\"")
        .raw(&format!("tls_terminate = {}", toml_list(&[API])))
        .raw("\n[[authority.request_rule]]")
        .raw(&format!("host = {}", toml_str(API)))
        .raw("methods = [\"GET\"]")
        .raw("path_prefixes = [\"/\"]");
    let wide = AuthoritySpec::new(WIDE)
        .allow(&[API])
        .allow_private(&["127.0.0.0/8"]);
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .extra_toml(&format!(
                "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
                toml_str(&ca_dir.display().to_string()),
                toml_list(&[test_ca.pem_path.display().to_string()])
            ))
            .authority(narrow)
            .authority(wide),
    )
    .await?;
    fx.dns.set(API, [e2e::LOOPBACK]);
    let ca = ca_dir.join("ca.pem").display().to_string();
    let url = format!("https://{API}:{}/repos/a/issues", origin.port());
    let post = [
        "--cacert",
        ca.as_str(),
        "-X",
        "POST",
        "-d",
        "a=1",
        url.as_str(),
    ];
    for (answer, status) in [
        (r#"{"allow_via":"wide"}"#, 200),
        (r#"{"deny":"read only"}"#, 403),
    ] {
        let client = fx
            .mediator
            .curl_via("http", (NARROW, "narrow-token"), &post);
        let host = async {
            let q = fx
                .mediator
                .wait_question(|q| q["protocol"] == "tls" && q["method"] == "POST")
                .await?;
            ensure!(
                q["host"] == API
                    && q["path"] == "/repos/a/issues"
                    && q["reason"] == "denied_by_rule",
                "{q}"
            );
            answered_ok(&fx, q["id"].as_str().unwrap_or_default(), answer).await
        };
        let (out, answered) = tokio::join!(client, host);
        answered?;
        let out = out?;
        ensure!(out.http_code == status, "{answer}: {out:?}");
    }
    let lines = fx.mediator.decision_lines()?;
    let tls: Vec<&Value> = lines
        .iter()
        .filter(|v| v["event"] == "decision" && v["protocol"] == "tls")
        .collect();
    ensure!(
        tls.iter().any(|v| v["decision"] == "allow"
            && v["authority"] == WIDE
            && v["method"] == "POST"
            && v["asked"]["from"] == NARROW),
        "{tls:?}"
    );
    ensure!(
        tls.iter().any(|v| v["reason"] == "ask_denied"
            && v["authority"] == NARROW
            && v["message"] == "read only"
            && v["rule"].is_string()),
        "{tls:?}"
    );
    Ok(())
}

/// The manual's host loop (`examples/ask-host.py`, docs/control.md) as a person runs it:
/// it shows each question from the event stream and answers what is typed (`y`: via
/// `--via`; `n words`: deny with the words).
async fn the_manuals_host_loop_answers_what_is_typed() -> Result<()> {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;
    let fx = fixture().await?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ask-host.py");
    let admin = fx.mediator.admin_addr()?.to_string();
    let mut host = e2e::Tool::Python
        .command("python3")?
        .arg(&script)
        .args(["--admin", &admin, "--via", WIDE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut typed = host
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let first = connect_held(&fx, NARROW);
    typed.write_all(b"y\n").await?;
    let (_, resp) = first.await??;
    ensure!(resp.status == 200, "{resp:?} {}", resp.text());
    let second = connect_held(&fx, NARROW);
    typed.write_all(b"n not during the freeze\n").await?;
    let (_, resp) = second.await??;
    let body = check_deny(&resp, 403, "ask_denied")?;
    ensure!(body["message"] == "not during the freeze", "{body}");
    // It waits for the next question: stopped, its transcript read.
    drop(typed);
    host.start_kill()?;
    let out = tokio::time::timeout(Duration::from_secs(10), host.wait_with_output()).await??;
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    ensure!(
        said.contains("narrow asks for origin.test:") && said.contains("-> 200"),
        "{said}"
    );
    Ok(())
}

/// A held request is answered `ask_timeout` when the mediator shuts down, never allowed.
async fn the_shutdown_answers_held_requests_ask_timeout() -> Result<()> {
    let mut fx = fixture().await?;
    let held = connect_held(&fx, NARROW);
    origin_question(&fx).await?;
    fx.mediator.terminate().await?;
    let (_, resp) = held.await??;
    let body = check_deny(&resp, 403, "ask_timeout")?;
    ensure!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("shutting down")),
        "{body}"
    );
    Ok(())
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(allow_via_judges_again_under_the_named_authority_and_is_attributed_to_it),
        case!(deny_is_ask_denied_with_the_hosts_words),
        case!(no_answer_in_time_is_ask_timeout),
        case!(one_more_than_max_pending_is_ask_overloaded_at_once),
        case!(a_client_that_leaves_frees_its_place_and_its_record_says_so),
        case!(bad_answers_change_nothing_and_a_wrong_via_never_allows),
        case!(what_may_never_be_asked_is_refused_at_once),
        case!(socks5_and_absolute_form_are_held_and_the_event_stream_sees_them),
        case!(an_ask_endpoint_answers_or_leaves_it_pending),
        case!(the_shutdown_answers_held_requests_ask_timeout),
        case!(one_authority_flooding_questions_does_not_hold_up_another),
        case!(a_terminated_request_a_rule_misses_is_held_per_request).needs(&[e2e::Tool::Curl]),
        case!(the_manuals_host_loop_answers_what_is_typed).needs(&[e2e::Tool::Python]),
    ]
}
