//! The confined command's environment: the caller's, minus any proxy or CA variable it
//! had, plus proxy variables pointing at the in-sandbox loopback listener.
//!
//! Built as data and handed to `execve`; the shim never mutates its own environment.

use std::ffi::{OsStr, OsString};

/// Proxy variables the shim owns (both cases are set where tools read either).
const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "FTP_PROXY",
    "GRPC_PROXY",
    "RSYNC_PROXY",
    "DOCKER_HTTP_PROXY",
    "DOCKER_HTTPS_PROXY",
];

/// The proxy variables for a listener on `127.0.0.1:port`.
///
/// `ALL_PROXY` is `socks5h://` (the channel serves SOCKS5 when the first byte is 0x05, and
/// `socks5h` makes clients send names, not addresses they resolved themselves: the
/// sandbox has no DNS anyway). `NO_PROXY` lists only loopback, which inside the network
/// namespace is the sandbox's own loopback, never the host's.
pub fn proxy_vars(port: u16) -> Vec<(String, String)> {
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

/// Whether the caller's variable `name` is replaced (dropped) by the shim.
fn owned_by_shim(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    PROXY_VARS.iter().any(|v| v.eq_ignore_ascii_case(name))
}

/// The full environment for the command: `inherited` without the shim-owned variables,
/// then `proxy_vars(port)`.
pub fn command_env(
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    port: u16,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(k, _)| !owned_by_shim(k))
        .collect();
    env.extend(
        proxy_vars(port)
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn get<'a>(env: &'a [(OsString, OsString)], k: &str) -> Option<&'a OsStr> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_os_str())
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
        let env = command_env(inherited, 4321);
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
        let env = command_env(Vec::new(), 4321);
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
}
