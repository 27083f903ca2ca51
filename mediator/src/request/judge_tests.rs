//! Unit tests of `request::judge`: how a request is judged, on both legs.

use std::sync::Arc;

use policy::Reason;

use super::*;
use crate::authorities::{Birth, Live, Origin};
use crate::limits::InForce;
use crate::signal::Signals;
use crate::testing;

/// `agent-a`'s table: `api.test` terminated, its `GET /v1/` only, and `plain.test`.
const KEYS: &str = r#"allow = ["api.test", "plain.test"]
tls_terminate = ["api.test"]

[[authority.request_rule]]
host = "api.test"
methods = ["GET"]
path_prefixes = ["/v1/"]"#;

/// A `POST /` whose `Authorization` is `-` (no placeholder).
const POST: (&str, &str, &str) = ("POST", "/", "-");

/// The authority of [`KEYS`] with its secret, and a live set that holds it.
fn live() -> (LiveSet, Arc<Authority>) {
    let (config, authority) = testing::with_secret(&testing::agent_a_config(KEYS));
    let authority = Arc::new(authority);
    let birth = Birth {
        generation: 1,
        origin: Origin::Config,
        created: None,
        expires_at: None,
    };
    let in_force = InForce::derive(&config.limits, 4096, 0);
    let entry = Live::new(
        Arc::clone(&authority),
        birth,
        None,
        &Signals::new(),
        &in_force,
    );
    let set = LiveSet::default();
    set.insert(Arc::new(entry)).unwrap();
    (set, authority)
}

fn target(host: &str) -> Target {
    policy::parse_authority_form(&format!("{host}:443")).unwrap()
}

/// Judges `method uri` with one `Authorization` value on `leg`; the headers after.
fn run(
    set: &LiveSet,
    authority: &Authority,
    leg: Leg,
    host: &str,
    request: (&str, &str, &str),
) -> (Result<Judged, Denial>, HeaderMap) {
    let (method, uri, authorization) = request;
    let uri: Uri = uri.parse().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("authorization", authorization.parse().unwrap());
    let asked = Asked {
        method,
        uri: &uri,
        upgrade: None,
    };
    let judged = judge(set, authority, &target(host), leg, asked, &mut headers);
    (judged, headers)
}

fn reason(judged: Result<Judged, Denial>) -> Reason {
    judged.map(|_| Reason::Allowed).unwrap_or_else(|d| d.reason)
}

#[test]
fn a_request_under_a_revoked_authority_is_refused_on_both_legs() {
    let (_, authority) = live();
    let empty = LiveSet::default();
    for leg in [Leg::Plain, Leg::Terminated] {
        let (judged, _) = run(&empty, &authority, leg, "api.test", ("GET", "/v1/x", "-"));
        assert_eq!(reason(judged), Reason::UnknownAuthority, "{leg:?}");
    }
}

#[test]
fn the_request_rules_narrow_both_legs() {
    let (set, authority) = live();
    for leg in [Leg::Plain, Leg::Terminated] {
        let (ok, _) = run(&set, &authority, leg, "api.test", ("GET", "/v1/x", "-"));
        assert_eq!(reason(ok), Reason::Allowed, "{leg:?}");
        let (post, _) = run(&set, &authority, leg, "api.test", ("POST", "/v1/x", "-"));
        assert_eq!(reason(post), Reason::DeniedByRule, "{leg:?}");
    }
    // A host without rules: allowed, with no rule named.
    let (judged, _) = run(&set, &authority, Leg::Plain, "plain.test", POST);
    let Ok(Judged::Allowed { decision, .. }) = judged else {
        panic!("{judged:?}");
    };
    assert_eq!(decision.and_then(|d| d.rule), None);
}

#[test]
fn a_plain_request_to_a_host_not_allowed_is_left_to_its_host_decision() {
    let (set, authority) = live();
    let (judged, _) = run(&set, &authority, Leg::Plain, "evil.test", POST);
    assert!(
        matches!(judged, Ok(Judged::Allowed { decision: None, .. })),
        "{judged:?}"
    );
}

#[test]
fn a_placeholder_gets_its_secret_only_inside_a_terminated_tunnel() {
    let (set, authority) = live();
    let request = ("GET", "/v1/x", "Bearer mediator:api:agent-a");
    let (judged, headers) = run(&set, &authority, Leg::Terminated, "api.test", request);
    let Ok(Judged::Allowed { credential, .. }) = judged else {
        panic!("{judged:?}");
    };
    assert_eq!(credential.len(), 1);
    assert_eq!(headers["authorization"], "Bearer s3cret");
    // In clear text it never goes out, not even to its own host.
    let (judged, headers) = run(&set, &authority, Leg::Plain, "api.test", request);
    assert_eq!(reason(judged), Reason::CredentialMisuse);
    assert_eq!(headers["authorization"], "Bearer mediator:api:agent-a");
}

#[test]
fn the_rules_judge_the_request_before_its_secrets_are_put_in() {
    let (set, authority) = live();
    let request = ("POST", "/v1/x", "Bearer mediator:api:agent-a");
    let (judged, headers) = run(&set, &authority, Leg::Terminated, "api.test", request);
    assert_eq!(reason(judged), Reason::DeniedByRule);
    assert_eq!(headers["authorization"], "Bearer mediator:api:agent-a");
}
