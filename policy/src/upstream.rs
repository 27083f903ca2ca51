//! Upstream (routing) values of the configuration (design section 8): parent proxy URLs
//! and PAC sources, parsed once into types that cannot hold a value a request line could
//! be injected through. Pure: no I/O, no environment.
//!
//! A parent is `http://[user:pass@]host:port`, `https://[user:pass@]host:port` (TLS to the
//! parent) or `socks5://[user:pass@]host:port`. The
//! host is canonicalised like every destination (so it holds no CR, LF, NUL, space, `@`,
//! `/`), the port is required, and the credentials are percent-decoded and then refused if
//! they hold any control character, so nothing built from a [`ParentUrl`] can split a
//! request line or header.

use crate::error::UpstreamError;
use std::fmt;
use std::path::PathBuf;

use crate::host::{Target, canonicalize_host, parse_authority_form};

/// The protocol spoken to a parent proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParentScheme {
    /// HTTP/1.1: `CONNECT` for tunnels, absolute-form for plain HTTP (RFC 9110 9.3.6).
    Http,
    /// HTTP/1.1 as [`Self::Http`], inside TLS to the parent (verified against the system
    /// store plus `[tls] extra_ca_files`, SNI = the parent's name).
    Https,
    /// SOCKS5 (RFC 1928), username/password per RFC 1929 when credentials are given.
    Socks5,
}

impl ParentScheme {
    /// `"http"`, `"https"` or `"socks5"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
            Self::Socks5 => "socks5",
        }
    }

    /// Whether the parent speaks HTTP (plain or inside TLS): CONNECT and absolute-form.
    pub fn is_http(self) -> bool {
        matches!(self, Self::Http | Self::Https)
    }

    /// Every scheme, in the order the documentation lists them.
    pub const ALL: [Self; 3] = [Self::Http, Self::Https, Self::Socks5];
}

/// How the mediator authenticates to a parent (`parent_auth`, or a
/// `parent_credentials_file` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ParentAuth {
    /// `Proxy-Authorization: Basic` (RFC 7617) for HTTP parents, RFC 1929 for SOCKS5,
    /// when credentials are configured; nothing otherwise. The default.
    #[default]
    Basic,
    /// `Proxy-Authorization: Negotiate` (SPNEGO/Kerberos, RFC 4559) with the host's
    /// Kerberos credentials, after the parent's `407`. HTTP(S) parents only.
    Negotiate,
}

impl ParentAuth {
    /// `"basic"` or `"negotiate"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Basic => "basic",
            Self::Negotiate => "negotiate",
        }
    }

    /// Parses a `parent_auth` value.
    ///
    /// # Errors
    /// A message saying what to write (NTLM is named as not supported).
    pub fn parse(s: &str) -> Result<Self, UpstreamError> {
        match s {
            "basic" => Ok(Self::Basic),
            "negotiate" => Ok(Self::Negotiate),
            "ntlm" => Err(UpstreamError::Ntlm),
            other => Err(UpstreamError::UnknownAuth(other.to_owned())),
        }
    }
}

/// Credentials for a parent proxy: `Proxy-Authorization: Basic` (RFC 7617) for HTTP
/// parents, RFC 1929 for SOCKS5 parents. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    /// Validates a user name and password: 1..=255 bytes each (RFC 1929 `ULEN`/`PLEN`; an
    /// empty password is allowed for HTTP), no control characters, and no `:` in the
    /// user name (RFC 7617 section 2).
    ///
    /// # Errors
    /// A message saying what is wrong (never echoing the password).
    pub fn new(user: String, password: String) -> Result<Self, UpstreamError> {
        if user.is_empty() || user.len() > 255 {
            return Err(UpstreamError::UserLength);
        }
        if password.len() > 255 {
            return Err(UpstreamError::PasswordLength);
        }
        if user.contains(':') {
            return Err(UpstreamError::UserColon);
        }
        if user.chars().chain(password.chars()).any(char::is_control) {
            return Err(UpstreamError::CredentialControl);
        }
        Ok(Self { user, password })
    }

    /// The user name: 1..=255 bytes, no `:`, no control characters.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password: at most 255 bytes, no control characters. `Debug` never shows it;
    /// callers must not log it either.
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A parent proxy: scheme, canonical `host:port`, optional credentials, how to
/// authenticate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParentUrl {
    /// HTTP, HTTPS or SOCKS5.
    pub scheme: ParentScheme,
    /// The parent's canonical host and port.
    pub addr: Target,
    /// Credentials from the URL's userinfo, if any (used by [`ParentAuth::Basic`]).
    pub credentials: Option<Credentials>,
    /// How to authenticate ([`ParentAuth::Basic`] unless `parent_auth` or the credentials
    /// file says otherwise).
    pub auth: ParentAuth,
}

impl ParentUrl {
    /// A parent without credentials, [`ParentAuth::Basic`].
    pub fn new(scheme: ParentScheme, addr: Target) -> Self {
        Self {
            scheme,
            addr,
            credentials: None,
            auth: ParentAuth::Basic,
        }
    }
}

impl fmt::Display for ParentUrl {
    /// `scheme://host:port`, never the credentials (this is what logs show).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.addr)
    }
}

/// How strictly [`parse_parent_url`] reads its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentSyntax {
    /// `mediator.toml`: the scheme and the port are required.
    Config,
    /// Proxy environment variables as curl reads them: no scheme means `http`,
    /// `socks5h` is `socks5`, and a missing port is 1080 (curl's default proxy port; 443
    /// for `https://`).
    Environment,
}

/// curl's default proxy port, used for environment values without a port.
const DEFAULT_ENV_PORT: u16 = 1080;

/// Parses a parent proxy URL (`http://[user:pass@]host:port`, `https://...`,
/// `socks5://...`); a trailing `/` is accepted. The userinfo is percent-decoded (RFC 3986
/// section 2.1).
///
/// # Errors
/// A message naming what is wrong: unknown or unsupported scheme (SOCKS4 is not
/// supported), a path or query, a bad host or port, bad credentials.
/// Messages never contain the password.
pub fn parse_parent_url(input: &str, syntax: ParentSyntax) -> Result<ParentUrl, UpstreamError> {
    let lenient = syntax == ParentSyntax::Environment;
    let (scheme, rest) = match input.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None if lenient => ("http".to_owned(), input),
        None => {
            return Err(UpstreamError::NoScheme);
        }
    };
    let scheme = match scheme.as_str() {
        "http" => ParentScheme::Http,
        "socks5" => ParentScheme::Socks5,
        "socks5h" if lenient => ParentScheme::Socks5,
        "https" => ParentScheme::Https,
        "socks" | "socks4" | "socks4a" => {
            return Err(UpstreamError::Socks4);
        }
        other => {
            return Err(UpstreamError::UnknownScheme(other.to_owned()));
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(UpstreamError::ParentPath);
    }
    let (userinfo, hostport) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let addr = match parse_authority_form(hostport) {
        Ok(t) => t,
        Err(_) if lenient && !hostport.is_empty() && !has_port(hostport) => {
            let port = if scheme == ParentScheme::Https {
                443
            } else {
                DEFAULT_ENV_PORT
            };
            parse_authority_form(&format!("{hostport}:{port}"))?
        }
        Err(e) => return Err(e.into()),
    };
    let credentials = match userinfo {
        None => None,
        Some(u) => {
            let (user, password) = u.split_once(':').unwrap_or((u, ""));
            Some(Credentials::new(
                percent_decode(user).ok_or(UpstreamError::UserEncoding)?,
                percent_decode(password).ok_or(UpstreamError::PasswordEncoding)?,
            )?)
        }
    };
    Ok(ParentUrl {
        scheme,
        addr,
        credentials,
        auth: ParentAuth::Basic,
    })
}

/// Whether `host[:port]` / `[v6][:port]` carries a port.
fn has_port(hostport: &str) -> bool {
    match hostport.rsplit_once(']') {
        Some((_, after)) => after.starts_with(':'),
        None => hostport.matches(':').count() == 1,
    }
}

/// Decodes `%XX` escapes (RFC 3986 section 2.1); `None` when a `%` is not followed by two
/// ASCII hex digits (`%+f`, `%zz`, a trailing `%`) or the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode(bytes)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// Where a PAC script comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacSource {
    /// An absolute file path, re-read on every refresh.
    File(PathBuf),
    /// An `http://` or `https://` URL (TLS verified), fetched directly or through
    /// `pac_fetch_via`.
    Url(String),
}

/// Parses `pac`: an absolute path, or an `http://` / `https://` URL with a host.
///
/// # Errors
/// A message saying what to write instead.
pub fn parse_pac_source(input: &str) -> Result<PacSource, UpstreamError> {
    let lower = input.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        let after = &input[input.find("://").map_or(0, |i| i + 3)..];
        let authority = after.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.is_empty() || authority.contains('@') {
            return Err(UpstreamError::PacHost);
        }
        // A URL is ASCII: an international host is written as its A-label (`xn--`).
        if let Some(c) = input.chars().find(|c| !c.is_ascii()) {
            return Err(UpstreamError::PacCharacter(c));
        }
        // An IPv6 host is bracketed in a URL (RFC 3986 section 3.2.2): `a::9999` is no
        // host a URI parser reads, though it is an IPv6 address.
        if !authority.starts_with('[') && authority.matches(':').count() > 1 {
            return Err(UpstreamError::PacAuthority(authority.to_owned()));
        }
        if input.chars().any(|c| c.is_control() || c == ' ') {
            return Err(UpstreamError::PacControl);
        }
        // After the authority: RFC 3986's path, query and fragment characters only
        // (unreserved, sub-delims, ":", "@", "/", "?", "#" and "%" of an escape), so the
        // fetcher reads the URL exactly as it was checked.
        let rest = &after[authority.len()..];
        if let Some(c) = rest
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/?#%".contains(*c)))
        {
            return Err(UpstreamError::PacCharacter(c));
        }
        // The host (and port) the fetcher connects to: a port it could not read would
        // otherwise fall back to the scheme's default.
        let host_ok = if has_port(authority) {
            parse_authority_form(authority).is_ok()
        } else {
            canonicalize_host(authority).is_ok()
        };
        if !host_ok {
            return Err(UpstreamError::PacAuthority(authority.to_owned()));
        }
        return Ok(PacSource::Url(input.to_owned()));
    }
    if input.contains("://") {
        return Err(UpstreamError::PacScheme);
    }
    if !input.starts_with('/') {
        return Err(UpstreamError::PacPath);
    }
    Ok(PacSource::File(PathBuf::from(input)))
}

/// What to do when a PAC evaluation fails (exception, CPU or memory budget exceeded, not a
/// string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacOnError {
    /// Refuse the connection (`upstream_failure`). The default: fail closed.
    Deny,
    /// Connect directly.
    Direct,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_urls() {
        let p =
            parse_parent_url("http://u%40x:p%3Aw@Proxy.Corp:8080/", ParentSyntax::Config).unwrap();
        assert_eq!(p.scheme, ParentScheme::Http);
        assert_eq!(p.to_string(), "http://proxy.corp:8080");
        let c = p.credentials.as_ref().unwrap();
        assert_eq!((c.user(), c.password()), ("u@x", "p:w"));
        assert!(!format!("{p:?}").contains("p:w"));
        let p = parse_parent_url("https://u:p@Proxy.Corp:8443", ParentSyntax::Config).unwrap();
        assert_eq!(p.scheme, ParentScheme::Https);
        assert_eq!(p.to_string(), "https://proxy.corp:8443");
        assert_eq!(p.auth, ParentAuth::Basic);
        let p = parse_parent_url("socks5://[::1]:1080", ParentSyntax::Config).unwrap();
        assert_eq!(p.to_string(), "socks5://[::1]:1080");
        for bad in [
            "proxy:8080",
            "socks4://proxy:1080",
            "ftp://proxy:21",
            "http://proxy",
            "http://proxy:8080/path",
            "http://proxy:8080?x",
            "http://pro xy:8080",
            "http://a%0d%0ab:c@proxy:8080",
            "http://a:b%00@proxy:8080",
            "http://a:b%zz@proxy:8080",
            // A sign is no hex digit (u8::from_str_radix would take "+f").
            "http://a:b%+f@proxy:8080",
            "http://a%-1:b@proxy:8080",
            "http://a:b%4@proxy:8080",
            "http://:pw@proxy:8080",
            "http://proxy\r\nX: y:8080",
            "socks5h://proxy:1080",
        ] {
            let e = parse_parent_url(bad, ParentSyntax::Config);
            assert!(e.is_err(), "{bad}: {e:?}");
            assert!(!e.unwrap_err().to_string().contains("b%00"), "{bad}");
        }
        let env = |s| parse_parent_url(s, ParentSyntax::Environment).map(|p| p.to_string());
        assert_eq!(env("proxy.corp:3128").unwrap(), "http://proxy.corp:3128");
        assert_eq!(env("http://proxy.corp").unwrap(), "http://proxy.corp:1080");
        assert_eq!(
            env("socks5h://127.0.0.1:9").unwrap(),
            "socks5://127.0.0.1:9"
        );
        assert_eq!(env("http://[::1]").unwrap(), "http://[::1]:1080");
        assert!(env("socks4://p:1").is_err());
        assert_eq!(env("https://p.corp").unwrap(), "https://p.corp:443");
    }

    #[test]
    fn parent_auth_values() {
        assert_eq!(ParentAuth::parse("negotiate"), Ok(ParentAuth::Negotiate));
        assert_eq!(ParentAuth::parse("basic"), Ok(ParentAuth::Basic));
        assert!(
            ParentAuth::parse("ntlm")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
        assert!(ParentAuth::parse("Negotiate").is_err());
    }

    #[test]
    fn pac_sources() {
        assert_eq!(
            parse_pac_source("/etc/p.pac"),
            Ok(PacSource::File("/etc/p.pac".into()))
        );
        assert!(matches!(
            parse_pac_source("https://wpad.corp/p.pac"),
            Ok(PacSource::Url(_))
        ));
        for bad in [
            "p.pac",
            "file:///etc/p.pac",
            "https:///p.pac",
            "http://u:p@h/p.pac",
            "http://h/p pac",
            "http://[/p.pac",
            "http://h:99999/p.pac",
            "http://h:8o/p.pac",
            "http://%41/p.pac",
            // Found by the kioslaverc fuzz target: not a URI the fetcher could read.
            "http://wett/5<s]",
            "http://h/p.pac\"",
            "http://h/{p}.pac",
            "http://a::9999/p",
            "http://wpad.corp\u{28f}\u{44f}ac/p.pac",
            "http://b\u{fc}cher.example/p.pac",
            "http://::1/p.pac",
        ] {
            assert!(parse_pac_source(bad).is_err(), "{bad}");
        }
        for good in [
            "http://[::1]:8080/p.pac",
            "https://Wpad.Corp:8443/p.pac?x=1",
            "http://h/a%20b/p.pac;v=1#top",
            "http://h",
        ] {
            assert!(parse_pac_source(good).is_ok(), "{good}");
        }
    }
}
