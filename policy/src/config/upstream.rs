//! `[upstream]` (design section 8): how allowed connections are routed, as the validated
//! [`Upstream`] and the check that builds it from the raw table. Parent URLs and PAC
//! sources are parsed here, once, into the types of [`crate::upstream`]; this file never
//! fetches a PAC or connects to a parent.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::raw::RawUpstream;
use super::validate::{MAX_TIMEOUT_SECS, Validator};
use crate::host::{Target, parse_authority_form};
use crate::upstream::{
    PacOnError, PacSource, ParentAuth, ParentSyntax, ParentUrl, parse_pac_source, parse_parent_url,
};

/// `[upstream] mode` (design section 8): how a route is chosen after the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamMode {
    /// Straight to the pinned address (`"direct"`, the default).
    #[default]
    Direct,
    /// The configured `parents`, left to right (`"parent"`).
    Parent,
    /// The mediator's own proxy environment, as curl reads it (`"env"`).
    Env,
    /// A PAC script, per destination (`"pac"`).
    Pac,
    /// What the host's own programs would use (`"system"`): the GNOME (GSettings/dconf)
    /// proxy settings, else KDE's `kioslaverc`, else the environment as [`Self::Env`];
    /// read at start and on SIGHUP.
    System,
}

impl UpstreamMode {
    /// Every mode, in the order the documentation lists them.
    pub const ALL: [Self; 5] = [
        Self::Direct,
        Self::Parent,
        Self::Env,
        Self::Pac,
        Self::System,
    ];

    /// The configuration string: `direct`, `parent`, `env`, `pac` or `system`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Parent => "parent",
            Self::Env => "env",
            Self::Pac => "pac",
            Self::System => "system",
        }
    }

    /// Whether a PAC may be in use (so `allowed_parents` and `pac_fetch_via` apply).
    fn may_use_pac(self) -> bool {
        matches!(self, Self::Pac | Self::System)
    }
}

/// The host's Kerberos credentials for `parent_auth = "negotiate"` (MIT krb5 credential
/// store keys `ccache` and `client_keytab`, with the semantics of `KRB5CCNAME` and
/// `KRB5_CLIENT_KTNAME`). Unset keys leave the library's defaults (those variables of the
/// mediator's environment, then the default ccache).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kerberos {
    /// `kerberos_ccache`: a credential cache name (`FILE:/path`, `DIR:/path`, `KEYRING:...`,
    /// or an absolute path, meaning `FILE:`).
    pub ccache: Option<String>,
    /// `kerberos_keytab`: a client keytab (absolute path or `FILE:/path`) from which
    /// initial credentials (for the ccache's principal, else the keytab's first) are
    /// obtained when the ccache has none or only expired ones.
    pub keytab: Option<String>,
    /// `gssapi_library`: the GSSAPI library to load instead of `libgssapi_krb5.so.2`
    /// from the loader's search path (an absolute path; the file itself is checked when
    /// it is loaded: regular, not writable by group or others).
    pub library: Option<PathBuf>,
}

/// Where `mode = "system"` reads the desktop's proxy settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SystemSources {
    /// `system_user`: read this user's own settings (their dconf user database and
    /// `kioslaverc`) before the system defaults.
    pub user: Option<String>,
    /// `dconf_databases`: the dconf (GVDB) databases to read, highest priority first,
    /// instead of those the dconf profile names.
    pub dconf: Option<Vec<PathBuf>>,
    /// `kioslaverc_files`: the KDE `kioslaverc` files to read, highest priority first,
    /// instead of the user's and `/etc/xdg/kioslaverc`.
    pub kioslaverc: Option<Vec<PathBuf>>,
}

impl std::fmt::Display for UpstreamMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[upstream]` (design section 8): how allowed connections are routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// How routes are chosen.
    pub mode: UpstreamMode,
    /// Whether CONNECTs to a parent name the pinned IP (default) or the canonical host.
    pub pin_through_parent: bool,
    /// `mode = "parent"`: the parents, tried left to right on connection-level failure.
    pub parents: Vec<ParentUrl>,
    /// `mode = "pac"`: where the PAC script comes from.
    pub pac: Option<PacSource>,
    /// `mode = "pac"`: the parents (`host:port`, canonical) a PAC may name.
    pub allowed_parents: Vec<Target>,
    /// `parent_retry_secs` (default 30): a parent that failed at the connection level is
    /// skipped for this long.
    pub parent_retry: Duration,
    /// `parent_credentials_file`: lines `host:port user:password` giving credentials for
    /// parents named without userinfo (PAC answers, `allowed_parents`, environment).
    pub parent_credentials_file: Option<PathBuf>,
    /// `pac_cache_secs` (default 300, 0 = no cache): PAC answers are cached per
    /// (scheme, host, port) for this long.
    pub pac_cache: Duration,
    /// `pac_refresh_secs` (default 300, 0 = never): the PAC is fetched again this often;
    /// the last good copy is kept when a fetch fails.
    pub pac_refresh: Duration,
    /// `pac_budget_ms` (default 200): CPU-time budget of one PAC evaluation.
    pub pac_budget: Duration,
    /// `pac_memory_mb` (default 16): memory limit of the PAC engine, in bytes.
    pub pac_memory: usize,
    /// `pac_on_error` (default `"deny"`): what a failed PAC evaluation means.
    pub pac_on_error: PacOnError,
    /// `pac_fetch_via`: a parent through which an `http(s)://` PAC is fetched (never the
    /// PAC's own answer).
    pub pac_fetch_via: Option<ParentUrl>,
    /// `parent_auth`: how to authenticate to a parent, by its canonical `host:port`
    /// (parents not listed: Basic when credentials are configured).
    pub parent_auth: HashMap<Target, ParentAuth>,
    /// `kerberos_ccache`, `kerberos_keytab`.
    pub kerberos: Kerberos,
    /// `mode = "system"`: where the desktop settings are read.
    pub system: SystemSources,
}

impl Default for Upstream {
    /// `mode = "direct"` with the documented defaults.
    fn default() -> Self {
        Self {
            mode: UpstreamMode::Direct,
            pin_through_parent: true,
            parents: Vec::new(),
            pac: None,
            allowed_parents: Vec::new(),
            parent_retry: Duration::from_secs(30),
            parent_credentials_file: None,
            pac_cache: Duration::from_secs(300),
            pac_refresh: Duration::from_secs(300),
            pac_budget: Duration::from_millis(200),
            pac_memory: 16 << 20,
            pac_on_error: PacOnError::Deny,
            pac_fetch_via: None,
            parent_auth: HashMap::new(),
            kerberos: Kerberos::default(),
            system: SystemSources::default(),
        }
    }
}

impl Validator<'_> {
    /// Validates `[upstream]`: the mode, the keys that belong to it (a key of another mode
    /// is an error, not ignored), and the tuning values' ranges, in the order the
    /// reference lists them.
    pub(super) fn upstream(&mut self, raw: RawUpstream) -> Upstream {
        let mode = self.upstream_mode(&raw);
        let mut out = Upstream {
            mode,
            pin_through_parent: raw.pin_through_parent.unwrap_or(true),
            ..Upstream::default()
        };
        self.parents(&raw, mode, &mut out);
        self.pac(&raw, mode, &mut out);
        self.system_sources(&raw, mode, &mut out);
        self.parent_auth(&raw, &mut out);
        self.upstream_tuning(&raw, &mut out);
        out
    }

    /// `mode`: one of the contract's names (`direct` when absent).
    fn upstream_mode(&mut self, raw: &RawUpstream) -> UpstreamMode {
        let Some(m) = &raw.mode else {
            return UpstreamMode::Direct;
        };
        if let Some(mode) = UpstreamMode::ALL.iter().find(|v| v.as_str() == m.get_ref()) {
            return *mode;
        }
        self.error(
            Some(m.span()),
            UPSTREAM,
            format!(
                "unknown mode {:?}; expected one of \"direct\", \"parent\", \"env\", \"pac\", \"system\"",
                m.get_ref()
            ),
        );
        UpstreamMode::Direct
    }

    /// `parents`: `mode = "parent"` only, and then required.
    fn parents(&mut self, raw: &RawUpstream, mode: UpstreamMode, out: &mut Upstream) {
        let what = UPSTREAM;
        if mode != UpstreamMode::Parent {
            if let Some(span) = nonempty_list(&raw.parents) {
                self.error(
                    Some(span),
                    what,
                    format!("parents is only used with mode = \"parent\", not \"{mode}\""),
                );
            }
            return;
        }
        let list = raw.parents.as_ref().map(|p| p.get_ref().as_slice());
        if list.is_none_or(<[_]>::is_empty) {
            self.error(
                raw.mode.as_ref().map(Spanned::span),
                what,
                "mode = \"parent\" needs parents = [\"http://host:port\", ...]",
            );
        }
        for p in list.unwrap_or_default() {
            match parse_parent_url(p.get_ref(), ParentSyntax::Config) {
                Ok(url) => out.parents.push(url),
                Err(why) => self.error(
                    Some(p.span()),
                    what,
                    format!("parent {}: {why}", redact(p.get_ref())),
                ),
            }
        }
    }

    /// `pac`: `mode = "pac"` only; `allowed_parents`, `pac_fetch_via`: `"pac"` and
    /// `"system"` (whose settings may name a PAC).
    fn pac(&mut self, raw: &RawUpstream, mode: UpstreamMode, out: &mut Upstream) {
        let what = UPSTREAM;
        if mode == UpstreamMode::Pac {
            match raw.pac.as_ref().filter(|p| !p.get_ref().is_empty()) {
                None => self.error(
                    raw.mode.as_ref().map(Spanned::span),
                    what,
                    "mode = \"pac\" needs pac = \"/path/proxy.pac\" or \"https://host/proxy.pac\"",
                ),
                Some(p) => match parse_pac_source(p.get_ref()) {
                    Ok(src) => out.pac = Some(src),
                    Err(why) => self.error(
                        Some(p.span()),
                        what,
                        format!("pac {:?}: {why}", p.get_ref()),
                    ),
                },
            }
        } else if let Some(span) = nonempty_str(&raw.pac) {
            self.error(
                Some(span),
                what,
                format!("pac is only used with mode = \"pac\", not \"{mode}\""),
            );
        }
        if !mode.may_use_pac() {
            for (key, span) in [
                ("allowed_parents", nonempty_list(&raw.allowed_parents)),
                ("pac_fetch_via", nonempty_str(&raw.pac_fetch_via)),
            ] {
                if let Some(span) = span {
                    self.error(
                        Some(span),
                        what,
                        format!(
                            "{key} is only used with mode = \"pac\" or \"system\", not \"{mode}\""
                        ),
                    );
                }
            }
            return;
        }
        let list = raw.allowed_parents.as_ref().map(|p| p.get_ref().as_slice());
        for p in list.unwrap_or_default() {
            match parse_authority_form(p.get_ref()) {
                Ok(t) => out.allowed_parents.push(t),
                Err(e) => self.error(
                    Some(p.span()),
                    what,
                    format!("allowed_parents entry: {e}; write \"host:port\""),
                ),
            }
        }
        if let Some(v) = &raw.pac_fetch_via {
            match parse_parent_url(v.get_ref(), ParentSyntax::Config) {
                Ok(url)
                    if mode == UpstreamMode::System
                        || matches!(out.pac, Some(PacSource::Url(_))) =>
                {
                    out.pac_fetch_via = Some(url);
                }
                Ok(_) => self.error(
                    Some(v.span()),
                    what,
                    "pac_fetch_via is only used when pac is an http(s):// URL",
                ),
                Err(why) => self.error(
                    Some(v.span()),
                    what,
                    format!("pac_fetch_via {}: {why}", redact(v.get_ref())),
                ),
            }
        }
    }

    /// The tuning values (each in its range), `pac_on_error`, `parent_credentials_file`.
    fn upstream_tuning(&mut self, raw: &RawUpstream, out: &mut Upstream) {
        let what = UPSTREAM;
        let mut range = |v: &Option<Spanned<u64>>, key: &str, min: u64, max: u64| {
            let v = v.as_ref()?;
            let n = *v.get_ref();
            if n < min || n > max {
                self.error(
                    Some(v.span()),
                    what,
                    format!("{key} = {n} is out of range {min}..={max}"),
                );
                return None;
            }
            Some(n)
        };
        let secs = |n: Option<u64>| n.map(Duration::from_secs);
        let max = MAX_TIMEOUT_SECS;
        if let Some(d) = secs(range(&raw.parent_retry_secs, "parent_retry_secs", 0, max)) {
            out.parent_retry = d;
        }
        if let Some(d) = secs(range(&raw.pac_cache_secs, "pac_cache_secs", 0, max)) {
            out.pac_cache = d;
        }
        if let Some(d) = secs(range(&raw.pac_refresh_secs, "pac_refresh_secs", 0, max)) {
            out.pac_refresh = d;
        }
        if let Some(n) = range(&raw.pac_budget_ms, "pac_budget_ms", 1, 10_000) {
            out.pac_budget = Duration::from_millis(n);
        }
        if let Some(n) = range(&raw.pac_memory_mb, "pac_memory_mb", 1, 1024) {
            // At most 1 GiB: fits every usize of 32 bits or more.
            out.pac_memory = usize::try_from(n << 20).unwrap_or(16 << 20);
        }
        if let Some(v) = &raw.pac_on_error {
            match v.get_ref().as_str() {
                "deny" => out.pac_on_error = PacOnError::Deny,
                "direct" => out.pac_on_error = PacOnError::Direct,
                other => self.error(
                    Some(v.span()),
                    what,
                    format!("pac_on_error {other:?}: write \"deny\" or \"direct\""),
                ),
            }
        }
        if let Some(f) = &raw.parent_credentials_file {
            if f.get_ref().starts_with('/') {
                out.parent_credentials_file = Some(PathBuf::from(f.get_ref()));
            } else {
                self.error(
                    Some(f.span()),
                    what,
                    "parent_credentials_file must be an absolute path",
                );
            }
        }
    }
}

/// Where `[upstream]` errors are located.
const UPSTREAM: &str = "[upstream]";

/// The span of a list that is set and not empty.
fn nonempty_list(l: &Option<Spanned<Vec<Spanned<String>>>>) -> Option<std::ops::Range<usize>> {
    l.as_ref()
        .filter(|p| !p.get_ref().is_empty())
        .map(Spanned::span)
}

/// The span of a string that is set and not empty.
fn nonempty_str(v: &Option<Spanned<String>>) -> Option<std::ops::Range<usize>> {
    v.as_ref()
        .filter(|p| !p.get_ref().is_empty())
        .map(Spanned::span)
}

impl Validator<'_> {
    /// `system_user`, `dconf_databases`, `kioslaverc_files`: `mode = "system"` only.
    fn system_sources(&mut self, raw: &RawUpstream, mode: UpstreamMode, out: &mut Upstream) {
        let what = "[upstream]";
        if mode != UpstreamMode::System {
            let spans = [
                ("system_user", raw.system_user.as_ref().map(Spanned::span)),
                (
                    "dconf_databases",
                    raw.dconf_databases.as_ref().map(Spanned::span),
                ),
                (
                    "kioslaverc_files",
                    raw.kioslaverc_files.as_ref().map(Spanned::span),
                ),
            ];
            for (key, span) in spans {
                if let Some(span) = span {
                    self.error(
                        Some(span),
                        what,
                        format!("{key} is only used with mode = \"system\", not \"{mode}\""),
                    );
                }
            }
            return;
        }
        if let Some(u) = &raw.system_user {
            let name = u.get_ref();
            let ok = !name.is_empty()
                && name.len() <= 32
                && !name.starts_with('-')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if ok {
                out.system.user = Some(name.clone());
            } else {
                self.error(
                    Some(u.span()),
                    what,
                    format!("system_user {name:?} is not a user name"),
                );
            }
        }
        let mut paths = |list: &Option<Spanned<Vec<Spanned<String>>>>, key: &str| {
            let list = list.as_ref()?;
            let mut out = Vec::new();
            for p in list.get_ref() {
                if p.get_ref().starts_with('/') {
                    out.push(PathBuf::from(p.get_ref()));
                } else {
                    self.error(
                        Some(p.span()),
                        what,
                        format!("{key} entry {:?} must be an absolute path", p.get_ref()),
                    );
                }
            }
            Some(out)
        };
        out.system.dconf = paths(&raw.dconf_databases, "dconf_databases");
        out.system.kioslaverc = paths(&raw.kioslaverc_files, "kioslaverc_files");
    }

    /// `parent_auth = { "host:port" = "negotiate" }`, then the `kerberos_*` keys and
    /// `gssapi_library`.
    fn parent_auth(&mut self, raw: &RawUpstream, out: &mut Upstream) {
        let what = UPSTREAM;
        let mut entries: Vec<_> = raw.parent_auth.iter().flatten().collect();
        entries.sort_by_key(|(k, _)| k.span().start);
        for (key, value) in entries {
            let target = match parse_authority_form(key.get_ref()) {
                Ok(t) => t,
                Err(e) => {
                    self.error(
                        Some(key.span()),
                        what,
                        format!("parent_auth key: {e}; write \"host:port\""),
                    );
                    continue;
                }
            };
            match ParentAuth::parse(value.get_ref()) {
                Ok(auth) => {
                    let socks = out
                        .parents
                        .iter()
                        .any(|p| p.addr == target && !p.scheme.is_http());
                    if auth == ParentAuth::Negotiate && socks {
                        self.error(
                            Some(value.span()),
                            what,
                            format!(
                                "parent_auth for {target}: \"negotiate\" is for http:// and https:// parents, not socks5://"
                            ),
                        );
                    }
                    if out.parent_auth.insert(target.clone(), auth).is_some() {
                        self.error(
                            Some(key.span()),
                            what,
                            format!("parent_auth names {target} twice"),
                        );
                    }
                }
                Err(why) => self.error(Some(value.span()), what, format!("parent_auth: {why}")),
            }
        }
        for p in &mut out.parents {
            if let Some(auth) = out.parent_auth.get(&p.addr) {
                p.auth = *auth;
            }
        }
        if let Some(via) = &mut out.pac_fetch_via
            && let Some(auth) = out.parent_auth.get(&via.addr)
        {
            via.auth = *auth;
        }
        self.kerberos(raw, out);
    }

    /// `kerberos_ccache`, `kerberos_keytab`, `gssapi_library`.
    fn kerberos(&mut self, raw: &RawUpstream, out: &mut Upstream) {
        let what = UPSTREAM;
        let text = |v: &Option<Spanned<String>>, key: &str, this: &mut Self| -> Option<String> {
            let v = v.as_ref()?;
            let s = v.get_ref();
            if s.is_empty() || s.chars().any(char::is_control) {
                this.error(
                    Some(v.span()),
                    what,
                    format!("{key} must be non-empty, without control characters"),
                );
                return None;
            }
            Some(s.clone())
        };
        if let Some(c) = text(&raw.kerberos_ccache, "kerberos_ccache", self) {
            // "TYPE:residual" or an absolute path (FILE:).
            let typed = c
                .split_once(':')
                .is_some_and(|(t, _)| !t.is_empty() && t.bytes().all(|b| b.is_ascii_uppercase()));
            if typed || c.starts_with('/') {
                out.kerberos.ccache = Some(c);
            } else {
                self.error(
                    raw.kerberos_ccache.as_ref().map(Spanned::span),
                    what,
                    "kerberos_ccache: write a ccache name (\"FILE:/path\", \"DIR:/path\", \"KEYRING:persistent:1000\") or an absolute path",
                );
            }
        }
        if let Some(k) = text(&raw.kerberos_keytab, "kerberos_keytab", self) {
            if k.starts_with('/') || k.starts_with("FILE:/") {
                out.kerberos.keytab = Some(k);
            } else {
                self.error(
                    raw.kerberos_keytab.as_ref().map(Spanned::span),
                    what,
                    "kerberos_keytab: write an absolute path (or \"FILE:/path\")",
                );
            }
        }
        if let Some(l) = text(&raw.gssapi_library, "gssapi_library", self) {
            if l.starts_with('/') {
                out.kerberos.library = Some(PathBuf::from(l));
            } else {
                self.error(
                    raw.gssapi_library.as_ref().map(Spanned::span),
                    what,
                    "gssapi_library: write an absolute path (loading a library runs its code: never from the search path or the working directory)",
                );
            }
        }
    }
}

/// A parent URL for an error message: the password (if any) replaced by `***`.
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let shown = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    };
    format!("{shown:?}")
}
