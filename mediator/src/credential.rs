//! Credentials held by the mediator (design section 14): loading each secret (from its
//! file, which must not be readable by others, or from the mediator's environment), adding
//! it to the terminated requests of its host ([`apply`], the one path of h1 and h2
//! requests), and refusing a request that carries one of its authority's placeholders
//! anywhere else ([`apply`] for other terminated hosts, [`check_plain`] for plain
//! `http://` forwarding): reason `credential_misuse`.
//!
//! No message built here quotes a secret: errors name the credential's source and
//! location, denials its header and host.

use std::os::unix::fs::PermissionsExt as _;

use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use policy::config::{Authority, Credential, SecretSource};
use policy::{Reason, Target};

use crate::decision_log::CredentialUse;
use crate::denial::Denial;

/// Loads the secret of every credential of `authority`. Each error starts with the
/// credential's location and never holds the secret.
///
/// # Errors
/// Every credential whose secret cannot be read, is in a file readable by others, or is
/// empty or not a header value.
pub(crate) fn load_secrets(authority: &mut Authority) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for credential in &mut authority.credentials {
        if let Err(e) = load_one(credential) {
            errors.push(format!("{}: {e}", credential.location));
        }
    }
    // A placeholder is handed to the child: none may hold a secret or part of one.
    for credential in &authority.credentials {
        for other in &authority.credentials {
            if let Some(p) = other.placeholder()
                && credential.has_secret()
                && credential.secret_overlaps(p)
            {
                errors.push(format!(
                    "{}: a placeholder of this authority ({}) contains this secret or is part of it; a placeholder is what the child is given, so it must share nothing with a secret",
                    credential.location, other.location
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn load_one(credential: &mut Credential) -> Result<(), String> {
    let bytes = match &credential.source {
        SecretSource::File(path) => {
            let shown = path.display();
            let meta = std::fs::metadata(path)
                .map_err(|e| format!("secret_file {shown:?}: cannot read it: {e}"))?;
            if !meta.is_file() {
                return Err(format!("secret_file {shown:?} is not a regular file"));
            }
            let mode = meta.permissions().mode();
            if mode & 0o007 != 0 {
                return Err(format!(
                    "secret_file {shown:?} is readable or writable by others (mode {:04o}); make it 0600 or 0640 (chmod o= {shown:?})",
                    mode & 0o7777
                ));
            }
            std::fs::read(path)
                .map_err(|e| format!("secret_file {shown:?}: cannot read it: {e}"))?
        }
        SecretSource::Env(name) => match std::env::var_os(name) {
            Some(v) => v.into_encoded_bytes(),
            None => {
                return Err(format!(
                    "secret_env {name:?} is not set in the mediator's environment"
                ));
            }
        },
    };
    credential.set_secret(bytes)
}

/// A request's credentials, judged for a terminated request of `authority` to `target`:
/// each credential of that host sets its header to its secret (replacing what the client
/// sent; with a placeholder, only where the client sent the placeholder), and a
/// placeholder anywhere else (another header, the target, a request to another host) is
/// refused. Returns the credentials used, for the request's log line.
///
/// # Errors
/// A `credential_misuse` denial naming the credential (never its secret).
pub(crate) fn apply(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &mut HeaderMap,
) -> Result<Vec<CredentialUse>, Denial> {
    let mut used = Vec::new();
    let mut set: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (i, c) in authority.credentials.iter().enumerate() {
        if !c.belongs_to(target) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(c.header().as_bytes()) else {
            continue;
        };
        let wanted = match c.placeholder() {
            None => true,
            Some(p) => headers
                .get_all(&name)
                .iter()
                .any(|v| contains(v.as_bytes(), p.as_bytes())),
        };
        if !wanted {
            continue;
        }
        // A credential without a loaded secret cannot occur (the loader refuses to start
        // without it); fail closed rather than send the placeholder on.
        if !c.has_secret() {
            return Err(misuse(authority, i, c, target, "its secret is not loaded"));
        }
        let value = HeaderValue::from_bytes(&c.header_value())
            .map_err(|_| misuse(authority, i, c, target, "its secret is not a header value"))?;
        set.push((name, value));
        used.push(CredentialUse {
            header: c.header().to_owned(),
            host: c.host().to_owned(),
        });
    }
    for (name, mut value) in set {
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    // What is left may hold no placeholder: every one that was asked for is replaced.
    find_placeholder(authority, uri, headers).map_or(Ok(used), |(i, c)| {
        Err(misuse(authority, i, c, target, where_sent(c, target)))
    })
}

/// A plain `http://` request of `authority` to `target`: it may carry none of the
/// authority's placeholders, not even to the credential's own host (a secret never
/// travels in clear text, so there it would be forwarded as it is).
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_plain(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Denial> {
    match find_placeholder(authority, uri, headers) {
        None => Ok(()),
        Some((i, c)) => Err(misuse(
            authority,
            i,
            c,
            target,
            "in a plain http:// request, where no secret is ever added",
        )),
    }
}

/// A request's header map as the request rules read it.
pub(crate) struct Headers<'a>(pub(crate) &'a HeaderMap);

impl policy::HeaderLookup for Headers<'_> {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.0
            .get_all(name)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect()
    }
}

fn where_sent(c: &Credential, target: &Target) -> &'static str {
    if c.belongs_to(target) {
        "outside its header"
    } else {
        "to a host it does not belong to"
    }
}

/// The first credential whose placeholder occurs in the request target or a header value
/// (as sent, or percent-decoded).
fn find_placeholder<'a>(
    authority: &'a Authority,
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<(usize, &'a Credential)> {
    // Most authorities hold no placeholder: then nothing is copied or scanned.
    if authority
        .credentials
        .iter()
        .all(|c| c.placeholder().is_none())
    {
        return None;
    }
    let mut texts: Vec<Vec<u8>> = vec![uri.to_string().into_bytes()];
    texts.extend(headers.values().map(|v| v.as_bytes().to_vec()));
    let decoded: Vec<Vec<u8>> = texts
        .iter()
        .filter(|t| t.contains(&b'%'))
        .flat_map(|t| percent_decode(t))
        .collect();
    texts.extend(decoded);
    authority.credentials.iter().enumerate().find(|(_, c)| {
        c.placeholder()
            .is_some_and(|p| texts.iter().any(|t| contains(t, p.as_bytes())))
    })
}

fn misuse(
    authority: &Authority,
    index: usize,
    c: &Credential,
    target: &Target,
    why: &str,
) -> Denial {
    Denial::new(
        Reason::CredentialMisuse,
        format!(
            "the request to {target} carries the placeholder of credential[{}] ({} for {}) of authority \"{}\" {why}",
            index + 1,
            c.header(),
            c.host(),
            authority.grant.name()
        ),
        format!(
            "this placeholder stands for a secret of {} only: send it in the {} header of HTTPS requests to that host, and nowhere else",
            c.host(),
            c.header()
        ),
    )
    .with_rule(Some(format!("credential[{}] {}", index + 1, c.host())))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// `text` with its `%XX` escapes decoded once and, when that still holds a `%`, twice (so
/// that `%2541` is seen too); malformed escapes kept. Both forms are returned: a server
/// may decode once or twice, and the second decoding can destroy what the first revealed
/// (`%25` before hex digits, a placeholder that holds a `%`). Neither is longer than
/// `text`.
pub(crate) fn percent_decode(text: &[u8]) -> Vec<Vec<u8>> {
    fn once(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        let mut i = 0;
        while i < text.len() {
            if text[i] == b'%'
                && let (Some(h), Some(l)) = (
                    text.get(i + 1).and_then(|&b| (b as char).to_digit(16)),
                    text.get(i + 2).and_then(|&b| (b as char).to_digit(16)),
                )
            {
                // Two hex digits make at most 0xff.
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'%'));
                i += 3;
                continue;
            }
            out.push(text[i]);
            i += 1;
        }
        out
    }
    let first = once(text);
    if first.contains(&b'%') {
        let second = once(&first);
        vec![first, second]
    } else {
        vec![first]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["api.test", "other.test"]
tls_terminate = ["api.test", "other.test"]

[[authority.credential]]
host = "api.test"
header = "Authorization"
secret_env = "UNUSED"
format = "Bearer {secret}"
placeholder = "mediator:api:agent-a"
"#;

    fn authority() -> Authority {
        let mut c = policy::config::parse(CONFIG, "m.toml").unwrap();
        let mut a = c.authorities.remove(0);
        a.credentials[0].set_secret(b"s3cret".to_vec()).unwrap();
        a
    }

    fn target(h: &str) -> Target {
        policy::parse_authority_form(&format!("{h}:443")).unwrap()
    }

    #[test]
    fn the_placeholder_is_replaced_in_its_header_only() {
        let a = authority();
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "Bearer mediator:api:agent-a".parse().unwrap(),
        );
        let used = apply(&a, &target("api.test"), &"/x".parse().unwrap(), &mut h).unwrap();
        assert_eq!(h["authorization"], "Bearer s3cret");
        assert_eq!(used[0].header, "authorization");
        // Without the placeholder, nothing is added.
        let mut h = HeaderMap::new();
        let used = apply(&a, &target("api.test"), &"/x".parse().unwrap(), &mut h).unwrap();
        assert!(used.is_empty() && h.is_empty());
    }

    #[test]
    fn a_placeholder_elsewhere_is_misuse() {
        let a = authority();
        for (host, uri, header) in [
            ("other.test", "/x", "Bearer mediator:api:agent-a"),
            ("other.test", "/x?k=mediator%3Aapi%3Aagent-a", "none"),
            ("other.test", "/x?k=mediator%253Aapi%253Aagent-a", "none"),
            ("api.test", "/x?k=mediator:api:agent-a", "none"),
        ] {
            let mut h = HeaderMap::new();
            h.insert("x-other", header.parse().unwrap());
            let e = apply(&a, &target(host), &uri.parse().unwrap(), &mut h).unwrap_err();
            assert_eq!(e.reason, Reason::CredentialMisuse, "{host} {uri}");
            assert!(!e.detail.contains("s3cret") && !e.hint.contains("s3cret"));
            let e = check_plain(&a, &target(host), &uri.parse().unwrap(), &h).unwrap_err();
            assert_eq!(e.reason, Reason::CredentialMisuse);
        }
    }

    #[test]
    fn a_placeholder_is_found_once_decoded_even_where_twice_would_hide_it() {
        // Decoded once, `%25%61%64...` is `%ad...`, the placeholder after a `%`; decoded
        // twice, `%ad` is one byte and the placeholder is gone.
        for (placeholder, uri) in [
            ("ad:api:agent-a", "/x?k=%25%61%64:api:agent-a"),
            ("api%41agent", "/x?k=api%2541agent"),
        ] {
            let text = CONFIG.replace("mediator:api:agent-a", placeholder);
            let mut c = policy::config::parse(&text, "m.toml").unwrap();
            let a = c.authorities.remove(0);
            let e = check_plain(
                &a,
                &target("other.test"),
                &uri.parse().unwrap(),
                &HeaderMap::new(),
            )
            .unwrap_err();
            assert_eq!(e.reason, Reason::CredentialMisuse, "{uri}");
        }
        for text in [&b"%2541"[..], b"%%41%4", b"%zz", b""] {
            assert!(percent_decode(text).iter().all(|d| d.len() <= text.len()));
        }
    }

    #[test]
    fn secret_files_readable_by_others_are_refused() {
        let dir = std::env::temp_dir().join(format!("cred-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "s3cret\n").unwrap();
        let text = CONFIG.replace(
            "secret_env = \"UNUSED\"",
            &format!("secret_file = \"{}\"", path.display()),
        );
        let load = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let mut c = policy::config::parse(&text, "m.toml").unwrap();
            load_secrets(&mut c.authorities[0])
        };
        let e = load(0o644).unwrap_err();
        assert!(
            e[0].contains("readable or writable by others (mode 0644)"),
            "{e:?}"
        );
        assert!(e[0].starts_with("m.toml:10:1: authority \"agent-a\": credential[1]"));
        load(0o600).unwrap();
        std::fs::write(&path, "\n").unwrap();
        let e = load(0o600).unwrap_err();
        assert!(e[0].ends_with("the secret is empty"), "{e:?}");
        // A placeholder that is the secret, holds it, or is part of it: refused, and the
        // error does not quote it.
        for secret in [
            "mediator:api:agent-a",
            "mediator:api",
            "xx-mediator:api:agent-a-yy",
        ] {
            std::fs::write(&path, format!("{secret}\n")).unwrap();
            let e = load(0o600).unwrap_err();
            assert!(
                e.iter()
                    .any(|m| m.contains("must share nothing with a secret")),
                "{e:?}"
            );
            assert!(e.iter().all(|m| !m.contains(secret)), "{e:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
