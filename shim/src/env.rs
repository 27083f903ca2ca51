//! The confined command's environment: the caller's, minus any proxy variable it had,
//! plus proxy variables pointing at the in-sandbox loopback listener; and, when a CA is to
//! be trusted (`--ca-cert`, or the config's CA for an authority that terminates TLS), the
//! CA variables in place of the caller's.
//!
//! Without a CA the caller's CA variables are left as they are: nothing in the channel
//! changes TLS then, so whatever trust the caller chose still holds.
//!
//! Built as data and handed to `execve`; the shim never mutates its own environment.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// CA variables that name a complete bundle: they point at the system bundle plus the CA.
/// The list lives in the policy crate, whose config refuses a credential `child_env`
/// naming any variable the shim sets.
pub(crate) const CA_BUNDLE_VARS: &[&str] = policy::config::SHIM_CA_BUNDLE_VARS;

/// CA variables that add to the tool's own store: they point at the CA alone.
pub(crate) const CA_EXTRA_VARS: &[&str] = policy::config::SHIM_CA_EXTRA_VARS;

/// The files the CA variables name (see [`crate::ca::TrustFiles`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CaFiles {
    /// The system bundle followed by the CA.
    pub(crate) bundle: PathBuf,
    /// The CA alone.
    pub(crate) ca_only: PathBuf,
    /// The bundle's certificates as a Java KeyStore.
    pub(crate) java: PathBuf,
    /// A wget startup file naming the bundle.
    pub(crate) wgetrc: PathBuf,
}

/// The JVM's options variable: read by every JVM at start (`java`, `javac`, Gradle,
/// Maven), and printed by it on stderr ("Picked up JAVA_TOOL_OPTIONS").
const JAVA_OPTIONS: &str = "JAVA_TOOL_OPTIONS";

/// wget's startup file variable (it replaces `~/.wgetrc`).
const WGETRC: &str = "WGETRC";

/// The CA variables for `files`: [`CA_BUNDLE_VARS`] name the bundle, [`CA_EXTRA_VARS`]
/// the CA alone.
pub(crate) fn ca_vars(files: &CaFiles) -> Vec<(OsString, OsString)> {
    let bundle = CA_BUNDLE_VARS.iter().map(|v| (*v, &files.bundle));
    let extra = CA_EXTRA_VARS.iter().map(|v| (*v, &files.ca_only));
    bundle
        .chain(extra)
        .map(|(k, p)| (OsString::from(k), p.clone().into_os_string()))
        .collect()
}

/// Proxy variables the shim owns (both cases are set where tools read either).
const PROXY_VARS: &[&str] = policy::config::SHIM_PROXY_VARS;

/// The proxy variables for a listener on `127.0.0.1:port`.
///
/// `ALL_PROXY` is `socks5h://` (the channel serves SOCKS5 when the first byte is 0x05, and
/// `socks5h` makes clients send names, not addresses they resolved themselves: the
/// sandbox has no DNS anyway). `NO_PROXY` lists only loopback, which inside the network
/// namespace is the sandbox's own loopback, never the host's.
pub(crate) fn proxy_vars(port: u16) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let mut vars = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &no_proxy),
        ("FTP_PROXY", &http),
        ("GRPC_PROXY", &http),
        ("RSYNC_PROXY", &format!("127.0.0.1:{port}")),
    ] {
        vars.push((name.to_owned(), value.clone()));
        vars.push((name.to_ascii_lowercase(), value.clone()));
    }
    // Docker reads these only in upper case.
    vars.push(("DOCKER_HTTP_PROXY".to_owned(), http.clone()));
    vars.push(("DOCKER_HTTPS_PROXY".to_owned(), http));
    vars
}

/// The variables of `files` that depend on what the caller had (`inherited`): the JVM's
/// options (the caller's first, then the trust store: a later `-D` wins), and wget's
/// startup file when the caller has neither `WGETRC` nor a `~/.wgetrc` (which it would
/// replace).
fn ca_config_vars(
    inherited: &[(OsString, OsString)],
    files: &CaFiles,
) -> Vec<(OsString, OsString)> {
    let get = |name: &str| inherited.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let mut java = get(JAVA_OPTIONS).cloned().unwrap_or_default();
    if !java.is_empty() {
        java.push(" ");
    }
    java.push(format!(
        "-Djavax.net.ssl.trustStore={} -Djavax.net.ssl.trustStoreType=JKS -Djavax.net.ssl.trustStorePassword={}",
        files.java.display(),
        crate::jks::PASSWORD
    ));
    let mut vars = vec![(OsString::from(JAVA_OPTIONS), java)];
    let users_wgetrc =
        get("HOME").is_some_and(|h| std::path::Path::new(h).join(".wgetrc").exists());
    if get(WGETRC).is_none() && !users_wgetrc {
        vars.push((WGETRC.into(), files.wgetrc.clone().into_os_string()));
    }
    vars
}

/// Whether the caller's variable `name` is replaced (dropped) by the shim; the CA
/// variables (and the JVM's options, which come back with the trust store) only when the
/// shim sets them (`with_ca`).
fn owned_by_shim(name: &OsStr, with_ca: bool) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let ca = || {
        CA_BUNDLE_VARS
            .iter()
            .chain(CA_EXTRA_VARS)
            .any(|v| v.eq_ignore_ascii_case(name))
            || name == JAVA_OPTIONS
    };
    PROXY_VARS.iter().any(|v| v.eq_ignore_ascii_case(name))
        || crate::handover::LISTEN_VARS.contains(&name)
        || (with_ca && ca())
}

/// The full environment for the command: `inherited` without the shim-owned variables
/// (and those of `last`, in any case), then `proxy_vars(port)`, then `ca_vars` of `ca` if
/// any, then `last` (the temporary directory's and caches' variables).
pub(crate) fn command_env(
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    port: u16,
    ca: Option<&CaFiles>,
    last: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let replaced = |k: &OsStr| {
        last.iter().any(|(n, _)| {
            n.as_encoded_bytes()
                .eq_ignore_ascii_case(k.as_encoded_bytes())
        })
    };
    let inherited: Vec<(OsString, OsString)> = inherited.into_iter().collect();
    let config = ca.map(|files| ca_config_vars(&inherited, files));
    let mut env: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(k, _)| !owned_by_shim(k, ca.is_some()) && !replaced(k))
        .collect();
    env.extend(
        proxy_vars(port)
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    if let Some(files) = ca {
        env.extend(ca_vars(files));
    }
    env.extend(config.into_iter().flatten());
    env.extend(last.iter().cloned());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> CaFiles {
        CaFiles {
            bundle: "/t/bundle.pem".into(),
            ca_only: "/t/ca.pem".into(),
            java: "/t/truststore.jks".into(),
            wgetrc: "/t/wgetrc".into(),
        }
    }

    fn get<'a>(env: &'a [(OsString, OsString)], k: &str) -> Option<&'a OsStr> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_os_str())
    }

    #[test]
    fn the_jvm_keeps_the_callers_options_and_wget_its_own_file() {
        let inherited = vec![
            (OsString::from(JAVA_OPTIONS), OsString::from("-Xmx1g")),
            (OsString::from(WGETRC), OsString::from("/caller/wgetrc")),
        ];
        let env = command_env(inherited, 1, Some(&files()), &[]);
        assert_eq!(
            get(&env, JAVA_OPTIONS).unwrap(),
            "-Xmx1g -Djavax.net.ssl.trustStore=/t/truststore.jks -Djavax.net.ssl.trustStoreType=JKS -Djavax.net.ssl.trustStorePassword=changeit"
        );
        assert_eq!(env.iter().filter(|(k, _)| k == JAVA_OPTIONS).count(), 1);
        assert_eq!(get(&env, WGETRC).unwrap(), "/caller/wgetrc");
        let env = command_env(Vec::new(), 1, Some(&files()), &[]);
        assert_eq!(get(&env, WGETRC).unwrap(), "/t/wgetrc");
        // Without a CA, both are the caller's.
        let env = command_env(
            vec![(OsString::from(JAVA_OPTIONS), OsString::from("-Xmx1g"))],
            1,
            None,
            &[],
        );
        assert_eq!(get(&env, JAVA_OPTIONS).unwrap(), "-Xmx1g");
        assert!(get(&env, WGETRC).is_none());
    }

    #[test]
    fn the_last_variables_replace_the_callers_in_any_case() {
        let inherited = vec![
            (OsString::from("tmpdir"), OsString::from("/caller")),
            (OsString::from("PATH"), OsString::from("/bin")),
        ];
        let last = [(OsString::from("TMPDIR"), OsString::from("/tmp"))];
        let env = command_env(inherited, 1, None, &last);
        assert!(get(&env, "tmpdir").is_none());
        assert_eq!(get(&env, "TMPDIR").unwrap(), "/tmp");
        assert_eq!(get(&env, "PATH").unwrap(), "/bin");
    }

    #[test]
    fn caller_proxy_variables_are_replaced_not_duplicated() {
        let inherited = vec![
            (OsString::from("PATH"), OsString::from("/bin")),
            (
                OsString::from("https_proxy"),
                OsString::from("http://evil:1"),
            ),
            (
                OsString::from("Http_Proxy"),
                OsString::from("http://evil:2"),
            ),
        ];
        let env = command_env(inherited, 4321, None, &[]);
        assert_eq!(get(&env, "PATH").unwrap(), "/bin");
        assert_eq!(env.iter().filter(|(k, _)| k == "https_proxy").count(), 1);
        assert!(
            env.iter()
                .all(|(_, v)| !v.to_string_lossy().contains("evil"))
        );
        assert!(get(&env, "Http_Proxy").is_none());
    }

    #[test]
    fn every_proxy_variable_points_at_the_listener() {
        let env = command_env(Vec::new(), 4321, None, &[]);
        for k in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "GRPC_PROXY",
            "FTP_PROXY",
            "DOCKER_HTTP_PROXY",
            "DOCKER_HTTPS_PROXY",
        ] {
            assert_eq!(get(&env, k).unwrap(), "http://127.0.0.1:4321", "{k}");
        }
        assert_eq!(get(&env, "ALL_PROXY").unwrap(), "socks5h://127.0.0.1:4321");
        assert_eq!(get(&env, "all_proxy").unwrap(), "socks5h://127.0.0.1:4321");
        assert_eq!(get(&env, "RSYNC_PROXY").unwrap(), "127.0.0.1:4321");
        assert_eq!(get(&env, "no_proxy").unwrap(), "localhost,127.0.0.1,::1");
    }

    #[test]
    fn ca_variables_replace_the_callers_only_with_a_ca() {
        let inherited = || {
            vec![
                (
                    OsString::from("SSL_CERT_FILE"),
                    OsString::from("/caller.pem"),
                ),
                (
                    OsString::from("NODE_EXTRA_CA_CERTS"),
                    OsString::from("/caller-extra.pem"),
                ),
            ]
        };
        let env = command_env(inherited(), 1, None, &[]);
        assert_eq!(get(&env, "SSL_CERT_FILE").unwrap(), "/caller.pem");
        assert!(get(&env, "CURL_CA_BUNDLE").is_none());
        let files = files();
        let env = command_env(inherited(), 1, Some(&files), &[]);
        for k in CA_BUNDLE_VARS {
            assert_eq!(get(&env, k).unwrap(), "/t/bundle.pem", "{k}");
            assert_eq!(env.iter().filter(|(n, _)| n == k).count(), 1, "{k}");
        }
        assert_eq!(get(&env, "NODE_EXTRA_CA_CERTS").unwrap(), "/t/ca.pem");
        assert_eq!(
            env.iter()
                .filter(|(n, _)| n == "NODE_EXTRA_CA_CERTS")
                .count(),
            1
        );
    }

    /// The config refuses a credential `child_env` naming one of the policy crate's lists:
    /// every variable the shim sets must be on them.
    #[test]
    fn every_variable_the_shim_sets_is_one_a_child_env_may_not_name() {
        let files = files();
        let listed = |name: &str| {
            PROXY_VARS
                .iter()
                .chain(CA_BUNDLE_VARS)
                .chain(CA_EXTRA_VARS)
                .chain(policy::config::SHIM_CA_CONFIG_VARS)
                .any(|v| v.eq_ignore_ascii_case(name))
        };
        for (k, _) in command_env(Vec::new(), 1, Some(&files), &[]) {
            assert!(listed(k.to_str().unwrap()), "{k:?}");
        }
    }
}
