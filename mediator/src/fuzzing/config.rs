//! Configuration inputs: `mediator.toml`, the admin API's JSON, KDE's kioslaverc.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Uri;
use policy::canonicalize_host;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::canonical_target;
use super::fixture;
use crate::route::system::kde;

/// The configuration file (`policy::config::parse`), as UTF-8 TOML. Properties: it never
/// panics; a configuration that loads has authorities with distinct names, is no change
/// from itself in `mediator diff`'s review, and each authority's reach (as the admin API
/// serves it) reads back into a grant that is no change from the one it came from.
pub fn config(data: &[u8]) {
    use policy::review::{Outcome, Reach, Side, Sources, compare, diff, global_deny_of};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = policy::config::parse(text, "<fuzz>") {
        let mut names: Vec<&str> = config.authorities.iter().map(|a| a.grant.name()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "duplicate authority names");
        let side = Side::of_config(&config);
        assert_eq!(diff(&side, &side).unwrap().outcome, Outcome::Unchanged);
        for a in &config.authorities {
            let reach = Reach::of(a, Sources::Hidden);
            let served = serde_json::to_string(&reach).unwrap();
            let back: Reach = serde_json::from_str(&served).unwrap();
            let global = global_deny_of(a);
            let changes = compare(Some((&reach, &global)), Some((&back, &global))).unwrap();
            assert!(changes.is_empty(), "{changes:?}");
        }
    }
}

/// The body of `POST /v1/authorities` (`serde_json`, then `Control::create`), against a
/// mediator without a socket directory, with a memory registry. Properties: a created authority is
/// served (a memory registry serves its own node only) under the body's name, and a
/// generated token is the one whose SHA-256 is stored; it is revoked again at once.
pub fn admin_json(data: &[u8]) {
    // The admin API's own reading: strict (a key given twice is refused).
    let Ok(body) = crate::control::body::parse(data) else {
        return;
    };
    let fx = fixture();
    if let Ok(created) = fx.runtime.block_on(fx.control.create(&body)) {
        // A memory registry refuses another node's authority: what it created it serves.
        let Some(live) = &created.live else {
            panic!("created but not served: {created:?}");
        };
        let name = live.authority.grant.name().to_owned();
        assert_eq!(
            body.get("name").and_then(Value::as_str),
            Some(name.as_str())
        );
        if let Some(token) = &created.token {
            let stored = live.authority.token_sha256;
            assert_eq!(stored, Some(Sha256::digest(token.as_bytes()).into()));
        }
        let deleted = fx.runtime.block_on(fx.control.delete(&name)).ok().unwrap();
        assert!(deleted.live.is_some() && deleted.stored);
    }
    fx.forget();
}

/// KDE's proxy settings (`route::system::kde`, one `kioslaverc` text; `ProxyType=4`
/// reads an empty environment). Properties: it never panics, and what it yields is
/// usable as it stands: a parent is a `scheme://host:port` (http, https or socks5) with a
/// canonical host and a port other than 0, whose text parses back to it as a configured
/// parent URL; a PAC is an absolute path or an `http(s)://` URL from which the PAC
/// fetcher takes a canonical host and a port.
pub fn kioslaverc(data: &[u8]) {
    use crate::route::system::Setting;
    use policy::upstream::{PacSource, ParentSyntax, parse_parent_url};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // As `kde::read` takes a file holding the text (named `<kioslaverc>`), without the file.
    let mut keys = std::collections::HashMap::new();
    let path = std::path::Path::new("<kioslaverc>");
    if kde::merge(&mut keys, path, text, false).is_err() {
        return;
    }
    let Ok(Some(reading)) = kde::decide(&keys, &|_: &str| None::<String>) else {
        return;
    };
    match &reading.setting {
        Setting::Direct => {}
        Setting::Manual {
            tunnel, forward, ..
        } => {
            for parent in [tunnel, forward].into_iter().flatten() {
                assert_ne!(parent.addr.port, 0, "{parent}");
                canonical_target(&parent.addr);
                let again = parse_parent_url(&parent.to_string(), ParentSyntax::Config)
                    .unwrap_or_else(|e| panic!("{parent}: {e}"));
                assert_eq!((again.scheme, &again.addr), (parent.scheme, &parent.addr));
            }
        }
        Setting::Pac(PacSource::File(path)) => assert!(path.is_absolute(), "{path:?}"),
        Setting::Pac(PacSource::Url(url)) => {
            let uri: Uri = url.parse().unwrap_or_else(|e| panic!("{url:?}: {e}"));
            assert!(
                matches!(uri.scheme_str(), Some("http" | "https")),
                "{url:?}"
            );
            let authority = uri.authority().expect("a PAC URL has a host");
            canonicalize_host(authority.host()).unwrap_or_else(|e| panic!("{url:?}: {e}"));
            let port = authority.as_str().rsplit_once(':').map(|(_, p)| p);
            if let Some(p) = port.filter(|p| !p.is_empty() && !p.contains(']')) {
                assert!(authority.port_u16().is_some(), "{url:?}: port {p:?}");
            }
        }
    }
}
