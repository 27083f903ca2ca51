//! How one request is judged, the same for an absolute-form `http://` request and a
//! request inside a terminated tunnel (design sections 9 and 14), as named steps in this
//! order: [`live`] (its authority still live), [`rules`] (the grant's request rules),
//! [`credentials`] (the authority's placeholders and secrets). [`judge`] runs them and says
//! what may happen next ([`Judged`]).
//!
//! Nothing here needs a connection: no socket, no log line, no wait. The paths write
//! the decision line and answer; `mediator test` can judge a request offline.

use http::{HeaderMap, Uri};
use policy::config::Authority;
use policy::{Decision, RequestFacts, Target, UpgradeToken};

use crate::authorities::LiveSet;
use crate::conn::identify::revoked;
use crate::credential::{self, Headers};
use crate::decision_log::CredentialUse;
use crate::denial::Denial;

/// Where the request travels to its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leg {
    /// In clear text (absolute-form `http://`): a secret is never added, and a placeholder
    /// never passes, not even to its credential's own host.
    Plain,
    /// Inside a terminated tunnel: each credential of the host puts its secret in place.
    Terminated,
}

/// What one request asks, as the rules see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'r> {
    /// The method judged (a protocol switch is judged as the method it stands for).
    pub(crate) method: &'r str,
    /// The request target.
    pub(crate) uri: &'r Uri,
    /// The protocol switch it asks for, if any.
    pub(crate) upgrade: Option<&'r UpgradeToken>,
}

/// What a judged request may do next. Asking the host (design section 20) adds an
/// outcome here: the request held until the host answers.
#[derive(Debug)]
pub(crate) enum Judged {
    /// It may go upstream.
    Allowed {
        /// The request rules' allowing decision (its `rule` is logged); `None` for a
        /// plain request to a host its grant does not allow, whose decision is the
        /// host's own, taken (and denied, with its reason) where the connection is
        /// established.
        decision: Option<Decision>,
        /// The credentials whose secrets were put in place (terminated requests).
        credential: Vec<CredentialUse>,
    },
}

/// Judges one request of `authority` to `target`: [`live`], [`rules`], [`credentials`].
/// On a terminated leg, the secrets of the host's credentials are put into `headers`.
///
/// # Errors
/// The denial of the first step that refuses (to be logged and answered).
pub(crate) fn judge(
    authorities: &LiveSet,
    authority: &Authority,
    target: &Target,
    leg: Leg,
    asked: Asked<'_>,
    headers: &mut HeaderMap,
) -> Result<Judged, Denial> {
    live(authorities, authority)?;
    let decision = rules(authority, target, leg, asked, headers)?;
    let credential = credentials(authority, target, leg, asked.uri, headers)?;
    Ok(Judged::Allowed {
        decision,
        credential,
    })
}

/// Every request, a reused upstream connection's and a long tunnel's included, is judged
/// under a live authority: a revoked or replaced one (a reload that kept the connection
/// moved it to its successor), or one whose reload judged the tunnel no longer allowed,
/// takes no new decision, even while the connection waits for the revoke grace.
///
/// # Errors
/// `unknown_authority`.
pub(crate) fn live(authorities: &LiveSet, authority: &Authority) -> Result<(), Denial> {
    if authorities.is_live(authority) {
        Ok(())
    } else {
        Err(revoked(authority.grant.name()))
    }
}

/// The grant's request rules on method, path, query names, headers and a protocol
/// switch. They narrow a terminated host's plain `http://` requests too (else `POST
/// http://host/admin` would pass a GET-only rule); a plain request to a host the grant
/// does not allow is not judged here (`Ok(None)`): its host decision is taken where the
/// connection is established, with the reason that belongs to it.
///
/// # Errors
/// The rules' denial (`denied_by_rule`, `malformed_target`).
pub(crate) fn rules(
    authority: &Authority,
    target: &Target,
    leg: Leg,
    asked: Asked<'_>,
    headers: &HeaderMap,
) -> Result<Option<Decision>, Denial> {
    if leg == Leg::Plain && !authority.grant.decide(target).is_allow() {
        return Ok(None);
    }
    let headers = Headers(headers);
    let facts = RequestFacts::new(asked.method, asked.uri.path())
        .with_query(asked.uri.query())
        .with_headers(&headers)
        .with_upgrade(asked.upgrade);
    let decision = authority.grant.decide_request(target, &facts);
    if decision.is_allow() {
        Ok(Some(decision))
    } else {
        Err(Denial::from(decision))
    }
}

/// The authority's credentials (design section 14): on a terminated leg each credential
/// of the host sets its header to its secret ([`credential::apply`]); on a plain one none
/// is added ([`credential::check_plain`]). Either way a placeholder left anywhere is
/// refused. Returns the credentials used.
///
/// # Errors
/// `credential_misuse`, naming the credential (never its secret).
pub(crate) fn credentials(
    authority: &Authority,
    target: &Target,
    leg: Leg,
    uri: &Uri,
    headers: &mut HeaderMap,
) -> Result<Vec<CredentialUse>, Denial> {
    match leg {
        Leg::Plain => credential::check_plain(authority, target, uri, headers).map(|()| Vec::new()),
        Leg::Terminated => credential::apply(authority, target, uri, headers),
    }
}

#[cfg(test)]
mod tests {
    // Unit tests of `request::judge`: how a request is judged, on both legs.

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
}
