//! KDE's proxy settings: the `[Proxy Settings]` group of `kioslaverc` (KConfig INI,
//! read with `rust-ini`). Files are read highest priority first (the user's, then
//! `/etc/xdg/kioslaverc`); the first that sets a key gives its value. A key's
//! KConfig flags (`httpProxy[$e]`) are ignored.
//!
//! `ProxyType`: 0 no proxy, 1 manual (`httpProxy`, `httpsProxy`, `socksProxy`, each
//! `scheme://host port` or `scheme://host:port`; `NoProxyFor`), 2 a PAC (`Proxy Config
//! Script`), 3 automatic discovery (WPAD: refused), 4 the environment (as `mode = "env"`).
//! `ReversedException = true` (use the proxy *only* for `NoProxyFor`) is refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ini::{Ini, ParseOption};

use super::{Reading, Setting, bypass, from_env, pac_source, parent};
use crate::error::{Error, ErrorCause};
use crate::route::env::EnvProxies;

/// The system-wide defaults file.
pub(crate) const SYSTEM_FILE: &str = "/etc/xdg/kioslaverc";

/// Largest file read, in bytes.
const MAX_FILE: u64 = 1 << 20;

const GROUP: &str = "Proxy Settings";

/// The `[Proxy Settings]` keys of the files, the first file's value winning, and the file
/// each came from. With `named` (the files `kioslaverc_files` names), a missing file or
/// one without a `[Proxy Settings]` group is an error, not "no setting".
fn keys(files: &[PathBuf], named: bool) -> Result<HashMap<String, (String, PathBuf)>, Error> {
    let mut out: HashMap<String, (String, PathBuf)> = HashMap::new();
    for path in files {
        let bad = |why: ErrorCause| {
            Error::upstream_by(format!("KDE proxy settings: {}", path.display()), why)
        };
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => continue,
            Err(e) => return Err(bad(e.into())),
            Ok(m) if m.len() > MAX_FILE => {
                return Err(bad(format!("larger than {MAX_FILE} bytes").into()));
            }
            Ok(_) => {}
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.into()))?;
        merge(&mut out, path, &text, named)?;
    }
    Ok(out)
}

/// Adds the `[Proxy Settings]` keys of `path`'s `text` to `out` where an earlier file did
/// not set them (the first file that sets a key wins).
///
/// # Errors
/// [`Error::Upstream`] naming `path`: the INI parser's message, or (for a file the
/// configuration names) no such group.
pub(crate) fn merge(
    out: &mut HashMap<String, (String, PathBuf)>,
    path: &Path,
    text: &str,
    named: bool,
) -> Result<(), Error> {
    let bad = |why: ErrorCause| {
        Error::upstream_by(format!("KDE proxy settings: {}", path.display()), why)
    };
    let Some(group) = group_keys(text).map_err(|e| bad(e.into()))? else {
        if named {
            return Err(bad(format!(
                "no [{GROUP}] group (kioslaverc_files names it for its proxy settings)"
            )
            .into()));
        }
        return Ok(());
    };
    for (key, value) in group {
        out.entry(key)
            .or_insert_with(|| (value, path.to_path_buf()));
    }
    Ok(())
}

/// The `[Proxy Settings]` keys of one file's text, in file order: each key without its
/// KConfig flags, each value trimmed; `None` when the file has no such group.
///
/// # Errors
/// The INI parser's message.
fn group_keys(text: &str) -> Result<Option<Vec<(String, String)>>, ini::ParseError> {
    let ini = Ini::load_from_str_opt(
        text,
        ParseOption {
            enabled_quote: false,
            enabled_escape: false,
            ..ParseOption::default()
        },
    )?;
    Ok(ini.section(Some(GROUP)).map(|group| {
        group
            .iter()
            .map(|(key, value)| {
                let key = key.split('[').next().unwrap_or_default().trim().to_owned();
                (key, value.trim().to_owned())
            })
            .collect()
    }))
}

/// Reads the KDE proxy settings; `None` when no file sets `ProxyType`.
///
/// # Errors
/// [`Error::Upstream`]: an unreadable file, WPAD, `ReversedException`, an unknown type, a
/// bad proxy value.
pub(crate) fn read(
    files: &[PathBuf],
    named: bool,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Reading>, Error> {
    decide(&keys(files, named)?, getenv)
}

/// The reading the `[Proxy Settings]` keys `keys` (each with the file it came from) give.
///
/// # Errors
/// As [`read`].
pub(crate) fn decide(
    keys: &HashMap<String, (String, PathBuf)>,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Reading>, Error> {
    let Some((kind, from)) = keys.get("ProxyType") else {
        return Ok(None);
    };
    let source = format!("KDE ({})", from.display());
    let refuse = |why: String| Error::upstream(format!("{source}: {why}"));
    let get = |k: &str| keys.get(k).map(|(v, _)| v.as_str()).unwrap_or_default();
    match kind.as_str() {
        "0" => Ok(Some(Reading {
            source,
            said: "ProxyType=0 (no proxy)".into(),
            setting: Setting::Direct,
            files: String::new(),
        })),
        "1" => {
            if get("ReversedException") == "true" {
                return Err(refuse(
                    "ReversedException=true (a proxy only for the NoProxyFor hosts) is not supported".into(),
                ));
            }
            let mut said = vec!["ProxyType=1 (manual)".to_owned()];
            let mut proxy = |key: &str, scheme: &str| -> Result<_, Error> {
                let value = get(key);
                if value.is_empty() {
                    return Ok(None);
                }
                said.push(format!("{key}={value}"));
                kde_proxy(value, scheme)
                    .map_err(|e| refuse(format!("{key}={value}: {e}")))
            };
            let http = proxy("httpProxy", "http")?;
            let https = proxy("httpsProxy", "http")?;
            let socks = proxy("socksProxy", "socks5")?;
            let no = get("NoProxyFor");
            said.push(format!("NoProxyFor={no}"));
            let no_proxy = bypass(no.split(','));
            let setting = Setting::desktop(https, http, socks, no_proxy);
            Ok(Some(Reading {
                source,
                said: said.join(", "),
                setting,
                files: String::new(),
            }))
        }
        "2" => {
            let url = get("Proxy Config Script");
            let pac = pac_source(url)
                .map_err(|e| refuse(format!("Proxy Config Script={url}: {e}")))?;
            Ok(Some(Reading {
                source,
                said: format!("ProxyType=2 (PAC), Proxy Config Script={url}"),
                setting: Setting::Pac(pac),
                files: String::new(),
            }))
        }
        "3" => Err(refuse(
            "ProxyType=3 is automatic discovery (WPAD), which the mediator never uses; configure a PAC URL (ProxyType=2) or use mode = \"pac\"".into(),
        )),
        "4" => {
            let found = EnvProxies::read(getenv)?;
            Ok(Some(from_env(
                found,
                format!("{source}: ProxyType=4 (environment variables)"),
            )))
        }
        other => Err(refuse(format!("unknown ProxyType={other}"))),
    }
}

/// A KDE proxy value: `scheme://host port`, `scheme://host:port` or `host:port`; `socks`
/// means SOCKS5 as in KIO; `https://` is TLS to the proxy.
fn kde_proxy(
    value: &str,
    default_scheme: &str,
) -> Result<Option<policy::upstream::ParentUrl>, ValueError> {
    let (scheme, rest) = match value.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => (default_scheme.to_owned(), value),
    };
    let scheme = match scheme.as_str() {
        "socks" | "socks5" => "socks5",
        "http" => "http",
        "https" => "https",
        other => return Err(ValueError::Scheme(other.to_owned())),
    };
    let rest = rest.trim().trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(char::is_whitespace) {
        Some((h, p)) => (h.trim(), p.trim()),
        None => match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || rest.starts_with('[') => (h, p),
            _ => return Err(ValueError::NoPort),
        },
    };
    let port: u16 = port
        .parse()
        .map_err(|_| ValueError::Port(port.to_owned()))?;
    if port == 0 || host.is_empty() {
        return Ok(None);
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(Some(parent(scheme, host, port)?))
}

/// Why a KDE proxy value cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum ValueError {
    #[error("unsupported scheme {0:?}")]
    Scheme(String),
    #[error("no port")]
    NoPort,
    #[error("bad port {0:?}")]
    Port(String),
    #[error(transparent)]
    Parent(#[from] policy::UpstreamError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kde_values() {
        let show = |v: &str, s: &str| kde_proxy(v, s).map(|p| p.map(|p| p.to_string()));
        for (value, scheme, parent) in [
            ("http://proxy.corp 8080", "http", "http://proxy.corp:8080"),
            ("https://proxy.corp:8443", "http", "https://proxy.corp:8443"),
            (
                "socks://127.0.0.1 1080",
                "socks5",
                "socks5://127.0.0.1:1080",
            ),
            ("proxy.corp:3128", "http", "http://proxy.corp:3128"),
            ("http://[::1] 3128", "http", "http://[::1]:3128"),
        ] {
            assert_eq!(show(value, scheme), Ok(Some(parent.into())), "{value}");
        }
        assert_eq!(show("http://p 0", "http"), Ok(None));
        assert!(show("ftp://p 21", "http").is_err());
        assert!(show("http://p", "http").is_err());
    }

    #[test]
    fn files_cascade_and_types_decide() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user-kioslaverc");
        let system = dir.path().join("system-kioslaverc");
        std::fs::write(
            &user,
            "[Proxy Settings]\nProxyType=1\nhttpsProxy[$e]=http://tunnel.corp 3128\n",
        )
        .unwrap();
        std::fs::write(
            &system,
            "[Proxy Settings]\nProxyType=0\nhttpProxy=http://plain.corp:8080\nNoProxyFor=.intra.corp,localhost\n",
        )
        .unwrap();
        let none = |_: &str| None;
        let r = read(&[user.clone(), system.clone()], true, &none)
            .unwrap()
            .unwrap();
        assert!(r.source.contains("user-kioslaverc"), "{}", r.source);
        let Setting::Manual {
            tunnel,
            forward,
            no_proxy,
        } = r.setting
        else {
            panic!("{r:?}");
        };
        assert_eq!(tunnel.unwrap().to_string(), "http://tunnel.corp:3128");
        assert_eq!(forward.unwrap().to_string(), "http://plain.corp:8080");
        assert!(no_proxy.matches(&policy::parse_authority_form("a.intra.corp:443").unwrap()));
        let r = read(std::slice::from_ref(&system), true, &none)
            .unwrap()
            .unwrap();
        assert!(matches!(r.setting, Setting::Direct));
        std::fs::write(&user, "[Proxy Settings]\nProxyType=3\n").unwrap();
        let e = crate::error::chain(&read(std::slice::from_ref(&user), true, &none).unwrap_err());
        assert!(e.contains("WPAD"), "{e}");
        std::fs::write(
            &user,
            "[Proxy Settings]\nProxyType=1\nReversedException=true\n",
        )
        .unwrap();
        assert!(read(std::slice::from_ref(&user), true, &none).is_err());
        // A file of a default list without the group sets nothing; a file the configuration
        // names must hold it, and must exist.
        std::fs::write(&user, "[Other]\nProxyType=1\n").unwrap();
        assert!(
            read(std::slice::from_ref(&user), false, &none)
                .unwrap()
                .is_none()
        );
        let e = crate::error::chain(&read(std::slice::from_ref(&user), true, &none).unwrap_err());
        assert!(e.contains("no [Proxy Settings] group"), "{e}");
        std::fs::write(&user, "ProxyType=1\nhttpsProxy=http://tunnel.corp 3128\n").unwrap();
        assert!(read(std::slice::from_ref(&user), true, &none).is_err());
        let missing = dir.path().join("missing");
        assert!(
            read(std::slice::from_ref(&missing), false, &none)
                .unwrap()
                .is_none()
        );
        assert!(read(std::slice::from_ref(&missing), true, &none).is_err());
        let env = |k: &str| (k == "HTTPS_PROXY").then(|| "http://env.corp:1".to_owned());
        std::fs::write(&user, "[Proxy Settings]\nProxyType=4\n").unwrap();
        let r = read(std::slice::from_ref(&user), true, &env)
            .unwrap()
            .unwrap();
        assert!(r.said.contains("http://env.corp:1"), "{}", r.said);
    }
}
