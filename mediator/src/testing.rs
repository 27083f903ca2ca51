//! What the crate's unit tests and the fuzz targets share: a mediator's state built from
//! the default configuration through the production constructors. Compiled for tests and
//! the `fuzzing` feature only; nothing here is a hook in a production path.

// Test support: a setup failure must fail the test (or the fuzz run).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use policy::OwnAddrs;

use crate::decision_log::DecisionLog;
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::resolve::Resolver;
use crate::route::Router;
use crate::serving::Serving;
use crate::shared::{Parts, Shared};

/// A mediator's shared state for unit tests: the default configuration, no authority,
/// direct routing, a resolver that is never asked, the decision log kept in `lines`. Also
/// the mediator of the fuzz targets (`crate::fuzzing`).
pub(crate) fn shared(lines: Arc<std::sync::Mutex<Vec<String>>>) -> Arc<Shared> {
    use crate::decision_log::Sink;
    let config = policy::config::parse("", "<test>").unwrap();
    // A discard port on loopback: nothing here resolves a name.
    let nameserver = "127.0.0.1:9".parse().unwrap();
    let resolver = || Resolver::new(&[nameserver], Default::default(), config.timeouts.dns);
    Arc::new(Shared::new(Parts {
        metrics: Metrics::new().unwrap(),
        resolver: resolver().unwrap(),
        router: Arc::new(
            Router::assemble(
                &config.upstream,
                &[],
                Arc::new(resolver().unwrap()),
                &config.timeouts,
                |_| None,
            )
            .unwrap(),
        ),
        tls: None,
        log: DecisionLog::open(Sink::Memory(lines)).unwrap(),
        own: OwnAddrs::default(),
        timeouts: config.timeouts,
        limits: config.limits,
        limiter: Arc::new(Limiter::new(crate::limits::InForce::derive(
            &config.limits,
            4096,
            0,
        ))),
        serving: Serving::start(1).unwrap(),
        boot: 0,
    }))
}

/// An environment of fixed `pairs` (name, value), as the readers of variables take one:
/// the value of the first pair called `name`, if any.
#[cfg(test)]
pub(crate) fn env<T: From<&'static str>>(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<T> {
    move |name| {
        pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| T::from(v))
    }
}

/// The target `host:port` (authority-form, as `CONNECT` names it).
#[cfg(test)]
pub(crate) fn target(authority_form: &str) -> policy::Target {
    policy::parse_authority_form(authority_form).unwrap()
}

/// A new temporary directory holding one file, `name`, with `contents`: the directory
/// (removed when dropped) and the file's path.
#[cfg(test)]
pub(crate) fn file_in_temp_dir(
    name: &str,
    contents: impl AsRef<[u8]>,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

/// The configuration text of one authority, `agent-a` (`[tls] ca_dir = "/tmp/ca"`), whose
/// table holds `keys` (its `allow`, `tls_terminate`, any rules) and one credential: on
/// `api.test`, `Authorization: Bearer {secret}` where the placeholder
/// `mediator:api:agent-a` stands, the secret read from `UNUSED` (or given:
/// [`with_secret`]).
#[cfg(test)]
pub(crate) fn agent_a_config(keys: &str) -> String {
    format!(
        r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
{keys}

[[authority.credential]]
host = "api.test"
header = "Authorization"
secret_env = "UNUSED"
format = "Bearer {{secret}}"
placeholder = "mediator:api:agent-a"
"#
    )
}

/// The configuration `text` parsed, its first authority taken out of it.
#[cfg(test)]
pub(crate) fn first_authority(text: &str) -> (policy::config::Config, policy::config::Authority) {
    let mut config = policy::config::parse(text, "m.toml").unwrap();
    let authority = config.authorities.remove(0);
    (config, authority)
}

/// [`first_authority`] of `text`, its first credential holding the secret `s3cret`.
#[cfg(test)]
pub(crate) fn with_secret(text: &str) -> (policy::config::Config, policy::config::Authority) {
    let (config, mut authority) = first_authority(text);
    authority.credentials[0]
        .set_secret(b"s3cret".to_vec())
        .unwrap();
    (config, authority)
}
