//! `[[authority.credential]]` (design section 14): a secret the mediator holds and adds
//! on the wire to the one host it belongs to, so that the confined child holds only a
//! placeholder. This file checks the table's shape (the host is terminated, exactly one
//! secret source, the header, the format, the placeholders); it never reads the secret:
//! the mediator loads it afterwards through [`Credential::set_secret`], so the secret's
//! own checks (empty, not a header value) live here too, without I/O.
//!
//! Nothing here puts a secret in a message: [`Secret`] has no `Display`, and its `Debug`
//! prints `<redacted>`.

use crate::error::ValueError;
use std::fmt;
use std::path::PathBuf;

use crate::host::Target;
use crate::pattern::{HostPattern, PatternUse};

/// Where a credential's secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// `secret_file`: a file the mediator reads at start and on every reload; it must not
    /// be readable by others. One trailing line break is not part of the secret.
    File(PathBuf),
    /// `secret_env`: a variable of the mediator's own environment.
    Env(String),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "secret_file {:?}", p.display().to_string()),
            Self::Env(v) => write!(f, "secret_env {v:?}"),
        }
    }
}

/// A loaded secret: bytes that are a valid HTTP field value (RFC 9110 section 5.5:
/// visible ASCII, spaces and tabs inside, no line breaks). Never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The secret's bytes, for the one place that puts them on the wire.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One validated credential of an authority.
#[derive(Debug, Clone)]
pub struct Credential {
    host: HostPattern,
    /// The request header the secret goes in, lowercase (`authorization`).
    header: String,
    /// Where the secret comes from.
    pub source: SecretSource,
    /// `format` split at `{secret}`: what goes before and after the secret.
    format: (String, String),
    /// What the child is given instead of the secret, if anything.
    placeholder: Option<String>,
    /// The variable the shim sets to the placeholder in the child, if any.
    child_env: Option<String>,
    /// Where it was written (`m.toml:31:1: authority "agent-a": credential[1]`), for the
    /// errors of loading its secret.
    pub location: String,
    secret: Secret,
}

impl Credential {
    pub(crate) fn pattern(&self) -> &HostPattern {
        &self.host
    }

    /// The host pattern as written (`api.github.com`).
    pub fn host(&self) -> &str {
        &self.host.source
    }

    /// The header name, lowercase.
    pub fn header(&self) -> &str {
        &self.header
    }

    /// The placeholder the child is given, if any.
    pub fn placeholder(&self) -> Option<&str> {
        self.placeholder.as_deref()
    }

    /// The variable the shim sets to the placeholder, if any.
    pub fn child_env(&self) -> Option<&str> {
        self.child_env.as_deref()
    }

    /// Whether the credential belongs to `target` (its host pattern matches).
    pub fn belongs_to(&self, target: &Target) -> bool {
        self.host.matches(target)
    }

    /// Whether a secret has been loaded ([`Credential::set_secret`]).
    pub fn has_secret(&self) -> bool {
        !self.secret.0.is_empty()
    }

    /// The header value to send: `format` with the secret in place of `{secret}`.
    pub fn header_value(&self) -> Vec<u8> {
        let (before, after) = &self.format;
        let mut v = Vec::with_capacity(before.len() + self.secret.0.len() + after.len());
        v.extend_from_slice(before.as_bytes());
        v.extend_from_slice(&self.secret.0);
        v.extend_from_slice(after.as_bytes());
        v
    }

    /// Sets the secret, as read from its source. One trailing line break (`\n` or
    /// `\r\n`) is removed.
    ///
    /// # Errors
    /// A message (never quoting the secret) when it is empty or not a valid header value.
    pub fn set_secret(&mut self, mut bytes: Vec<u8>) -> Result<(), ValueError> {
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if bytes.is_empty() {
            return Err(ValueError::SecretEmpty(self.source.to_string()));
        }
        if let Some(pos) = bytes
            .iter()
            .position(|&b| !(b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b)))
        {
            return Err(ValueError::SecretByte(self.source.to_string(), pos + 1));
        }
        if bytes.first().is_some_and(u8::is_ascii_whitespace)
            || bytes.last().is_some_and(u8::is_ascii_whitespace)
        {
            return Err(ValueError::SecretSpace(self.source.to_string()));
        }
        self.secret = Secret(bytes);
        Ok(())
    }

    /// Whether the loaded secret and `text` overlap (one contains the other): a
    /// placeholder that does would hand the child the secret, or part of it.
    pub fn secret_overlaps(&self, text: &str) -> bool {
        let (secret, text) = (self.secret.0.as_slice(), text.as_bytes());
        let within = |hay: &[u8], needle: &[u8]| {
            !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
        };
        within(secret, text) || within(text, secret)
    }

    /// Whether the secret is the same as `other`'s (a reload compares them to see a
    /// rotated secret).
    pub fn same_secret(&self, other: &Self) -> bool {
        self.secret == other.secret
    }
}

/// `[[authority.credential]]` as written, each value with what validating it needs.
#[derive(Debug, Default)]
pub(super) struct CredentialSpec {
    pub(super) host: Option<String>,
    pub(super) header: Option<String>,
    pub(super) secret_file: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) format: Option<String>,
    pub(super) placeholder: Option<String>,
    pub(super) child_env: Option<String>,
}

/// Proxy variables the shim sets in the confined child (design section 12), each in upper
/// and lower case except the Docker ones (Docker reads them in upper case only). A
/// `child_env` may not name one, in any case: the shim's value would win.
pub const SHIM_PROXY_VARS: &[&str] = &[
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

/// CA variables the shim sets in the child to the system bundle plus the mediator's CA
/// (when the authority terminates TLS, as every authority with a credential does).
pub const SHIM_CA_BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    "NIX_SSL_CERT_FILE",
    "npm_config_cafile",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "HTTPLIB2_CA_CERTS",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
];

/// CA variables the shim sets in the child to the mediator's CA alone (they add to a
/// tool's own store).
pub const SHIM_CA_EXTRA_VARS: &[&str] = &["NODE_EXTRA_CA_CERTS"];

/// Variables the shim sets in the child, with a CA, to trust files it writes for tools that
/// read no CA variable: the JVM's options (a JKS trust store; the caller's options are
/// kept before it) and wget's startup file.
pub const SHIM_CA_CONFIG_VARS: &[&str] = &["JAVA_TOOL_OPTIONS", "WGETRC"];

/// Variables the shim sets in the child for its private temporary directory and the
/// tools' caches (unless the caller's value names a writable place).
pub const SHIM_SCRATCH_VARS: &[&str] = &[
    "TMPDIR",
    "XDG_CACHE_HOME",
    "PIP_CACHE_DIR",
    "npm_config_cache",
    "GOCACHE",
    "GOMODCACHE",
    "CARGO_HOME",
    "APT_CONFIG",
];

/// Whether the shim sets variable `name` in the child itself (any case): a proxy, CA,
/// trust-file, temporary-directory or cache variable.
fn shim_sets(name: &str) -> bool {
    SHIM_PROXY_VARS
        .iter()
        .chain(SHIM_CA_BUNDLE_VARS)
        .chain(SHIM_CA_EXTRA_VARS)
        .chain(SHIM_CA_CONFIG_VARS)
        .chain(SHIM_SCRATCH_VARS)
        .any(|s| s.eq_ignore_ascii_case(name))
}

/// Headers a credential may not go in: they frame or route the request, or are the
/// mediator's own.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "x-mediator-decision",
];

/// Validates one credential table (`position`: 1-based, for messages). `terminated`
/// says whether a host pattern is covered by the grant's `tls_terminate`.
#[expect(
    clippy::too_many_lines,
    reason = "every check of one [[authority.credential]] table, each located; ceiling 143 lines"
)]
pub(super) fn build(
    spec: &CredentialSpec,
    position: usize,
    location: String,
    terminated: impl Fn(&HostPattern) -> bool,
) -> Result<Credential, Vec<String>> {
    let mut errors = Vec::new();
    let mut fail = |m: String| errors.push(format!("credential[{position}]: {m}"));
    let host = match spec.host.as_deref() {
        None => {
            fail("missing key \"host\" (the host pattern the secret belongs to)".into());
            None
        }
        Some(h) => match HostPattern::parse("credential host", h, PatternUse::Allow) {
            Ok(p) if !terminated(&p) => {
                fail(format!(
                    "host {h:?} is not covered by tls_terminate: the secret could only be added inside TLS the mediator terminates (it never travels in clear text); add {h:?} to tls_terminate"
                ));
                None
            }
            Ok(p) => Some(p),
            Err(e) => {
                fail(e.to_string());
                None
            }
        },
    };
    let header = match spec.header.as_deref() {
        None => {
            fail("missing key \"header\" (the request header the secret goes in, e.g. \"Authorization\")".into());
            None
        }
        Some(h) if h.is_empty() || !h.bytes().all(is_tchar) => {
            fail(format!(
                "header {h:?} is not a header name (RFC 9110 section 5.1: letters, digits and !#$%&'*+-.^_`|~)"
            ));
            None
        }
        Some(h) if RESERVED_HEADERS.contains(&h.to_ascii_lowercase().as_str()) => {
            fail(format!(
                "header {h:?} frames or routes the request; a credential cannot go in it"
            ));
            None
        }
        Some(h) => Some(h.to_ascii_lowercase()),
    };
    let source = match (&spec.secret_file, &spec.secret_env) {
        (Some(_), Some(_)) => {
            fail("give either secret_file or secret_env, not both".into());
            None
        }
        (None, None) => {
            fail("missing the secret: give secret_file (a path) or secret_env (a variable of the mediator's environment)".into());
            None
        }
        (Some(f), None) if f.is_empty() || !f.starts_with('/') => {
            fail(format!("secret_file {f:?} must be an absolute path"));
            None
        }
        (Some(f), None) => Some(SecretSource::File(PathBuf::from(f))),
        (None, Some(v)) if !is_env_name(v) => {
            fail(format!(
                "secret_env {v:?} is not a variable name (letters, digits and _, not starting with a digit)"
            ));
            None
        }
        (None, Some(v)) => Some(SecretSource::Env(v.clone())),
    };
    let format = {
        let f = spec.format.as_deref().unwrap_or("{secret}");
        let parts: Vec<&str> = f.split("{secret}").collect();
        if parts.len() != 2 {
            fail(format!(
                "format {f:?} must hold {{secret}} exactly once (e.g. \"Bearer {{secret}}\")"
            ));
            None
        } else if !f.bytes().all(|b| b == b' ' || (0x21..0x7f).contains(&b)) {
            fail(format!(
                "format {f:?} may hold only visible ASCII and spaces"
            ));
            None
        } else {
            Some((parts[0].to_owned(), parts[1].to_owned()))
        }
    };
    let placeholder = match spec.placeholder.as_deref() {
        None => None,
        Some(p) if p.len() < 8 || p.len() > 256 => {
            fail(format!(
                "placeholder {p:?} must be 8 to 256 bytes long, so that it cannot occur by chance"
            ));
            None
        }
        Some(p) if !p.bytes().all(|b| (0x21..0x7f).contains(&b)) => {
            fail(format!(
                "placeholder {p:?} may hold only visible ASCII (no spaces)"
            ));
            None
        }
        Some(p) => Some(p.to_owned()),
    };
    let child_env = match spec.child_env.as_deref() {
        None => None,
        Some(_) if spec.placeholder.is_none() => {
            fail("child_env needs a placeholder: it is the value the child is given".into());
            None
        }
        Some(v) if !is_env_name(v) => {
            fail(format!(
                "child_env {v:?} is not a variable name (letters, digits and _, not starting with a digit)"
            ));
            None
        }
        Some(v) if v.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("LD_")) => {
            fail(format!(
                "child_env {v:?} is a dynamic loader variable (LD_*); the child's loader would read the placeholder; name another variable"
            ));
            None
        }
        Some(v) if shim_sets(v) => {
            fail(format!(
                "child_env {v:?} is a variable the shim sets itself (a proxy, CA, temporary-directory or cache variable, in any case), so the child would never get the placeholder; name another variable"
            ));
            None
        }
        Some(v) => Some(v.to_owned()),
    };
    match (host, header, source, format) {
        (Some(host), Some(header), Some(source), Some(format)) if errors.is_empty() => {
            Ok(Credential {
                host,
                header,
                source,
                format,
                placeholder,
                child_env,
                location,
                secret: Secret::default(),
            })
        }
        _ => Err(errors),
    }
}

/// What one authority's credentials may not share, pair by pair: a header on the same
/// host (they would fight over it; a pattern without a port covers every port of that
/// host pattern), a `child_env` (the child gets one value), and placeholders, which must
/// be told apart in any text: none may be a substring of another (nor equal). Returns one
/// message per offending pair and check, with the 1-based position of the later
/// credential of the pair.
pub(super) fn check_pairs(credentials: &[(usize, &Credential)]) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for (i, (pa, a)) in credentials.iter().enumerate() {
        for (pb, b) in &credentials[i + 1..] {
            let (ha, hb) = (&a.host, &b.host);
            if a.header == b.header
                && ha.kind == hb.kind
                && (ha.port == hb.port || ha.port.is_none() || hb.port.is_none())
            {
                errors.push((*pb, format!(
                    "credential[{pb}]: header {:?} on host {:?} is set by credential[{pa}] too (host {:?}); one header of one host holds one secret: remove one of them",
                    b.header, b.host.source, a.host.source
                )));
            }
            if let (Some(x), Some(y)) = (a.child_env(), b.child_env())
                && x == y
            {
                errors.push((*pb, format!(
                    "credential[{pb}]: child_env {y:?} is the child_env of credential[{pa}] too; the child gets one value per variable: name another variable"
                )));
            }
            let (Some(x), Some(y)) = (a.placeholder(), b.placeholder()) else {
                continue;
            };
            if x.contains(y) || y.contains(x) {
                // Neither is quoted: a placeholder written by mistake as the secret must
                // not reach an error text.
                errors.push((*pb, format!(
                    "credential[{pb}]: its placeholder and the placeholder of credential[{pa}]: one is a substring of the other, so a request could not be judged by which it carries; make them distinct"
                )));
            }
        }
    }
    errors
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_env_name(v: &str) -> bool {
    !v.is_empty()
        && !v.as_bytes()[0].is_ascii_digit()
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
