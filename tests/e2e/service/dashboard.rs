//! The shipped dashboard and alert rules ask only for metrics a mediator exports: every
//! `mediator_*` and `process_*` name in `docker/grafana-dashboard.json` and
//! `docker/k8s/deployment/prometheusrule.yaml` is a series of a running mediator's
//! `/metrics` (with the OTLP export and the local registry on, an authority that asks the
//! host, after one decision and one authority created through the admin API).

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use e2e::case;
use e2e::harness::Case;
use e2e::{AuthoritySpec, Fixture, agent_a_spec};

use crate::support::mediator;

/// The metric names `text` mentions: runs of `[a-z0-9_]` that start with `mediator_` or
/// `process_`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
        let start = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        let token = &text[start..i];
        let after_word = start == 0 || !word(bytes[start - 1]);
        if after_word && (token.starts_with("mediator_") || token.starts_with("process_")) {
            names.insert(token.to_owned());
        }
        i += 1;
    }
    names
}

async fn every_metric_the_dashboard_and_alerts_name_is_exported() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = BTreeSet::new();
    for file in [
        "docker/grafana-dashboard.json",
        "docker/k8s/deployment/prometheusrule.yaml",
    ] {
        let found = names_in(&std::fs::read_to_string(root.join(file))?);
        ensure!(
            found.len() >= 5,
            "{file}: too few metric names found: {found:?}"
        );
        names.extend(found);
    }
    // The OTLP export's families exist once an endpoint is configured (a closed port:
    // nothing is sent in this test).
    let closed = e2e::closed_loopback_port()?;
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .authority(agent_a_spec())
            // An authority that asks the host: the ask families have its series.
            .authority(
                AuthoritySpec::new("asking")
                    .allow(&["origin.test"])
                    .raw("ask = \"admin\""),
            )
            .extra_toml(&format!(
                "\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:{closed}\"\n"
            )),
    )
    .await?;
    // One decision and one registry write: their families have series from then on.
    let resp = fx.connect_a("blocked.test:443").await?;
    ensure!(resp.status == 403, "{resp:?}");
    let body = r#"{"name": "agent-c", "allow": ["origin.test"], "generate_token": true}"#;
    let resp = fx
        .mediator
        .admin("POST", "/v1/authorities", Some(body), None)
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let metrics = fx.mediator.metrics().await?;
    let exported: BTreeSet<String> = metrics
        .raw_series()
        .iter()
        .map(|s| s.split('{').next().unwrap_or_default().to_owned())
        .collect();
    let missing: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
    ensure!(
        missing.is_empty(),
        "named by the dashboard or the alerts but not exported: {missing:?}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        every_metric_the_dashboard_and_alerts_name_is_exported
    )]
}
