//! `[upstream] mode = "system"`: the proxy settings the host's own programs would use, read
//! at start and on SIGHUP, in this order: GNOME (`org.gnome.system.proxy`, from dconf
//! databases read as files, no session bus: `gnome`), then KDE (`kioslaverc`:
//! `kde`), then the environment as `mode = "env"` reads it. The first source that holds
//! a setting decides, even when it says "no proxy". A found PAC URL is used as `mode =
//! "pac"` would use it; automatic discovery (WPAD) never is: a source that asks for it is
//! an error, and so is any setting the mediator cannot honour (fail closed: the mediator
//! does not start, a re-read keeps the last good routing).

pub(crate) mod gnome;
pub(crate) mod kde;

use std::path::{Path, PathBuf};

use policy::config::SystemSources;
use policy::upstream::{PacSource, ParentUrl};

use super::env::{EnvProxies, NoProxy};
use crate::error::Error;

/// What a source said, as the router uses it.
#[derive(Debug, Clone)]
pub(crate) enum Setting {
    /// No proxy.
    Direct,
    /// Fixed parents: for tunnels, for plain HTTP, and the hosts that bypass them.
    Manual {
        /// Tunnels (CONNECT, SOCKS5, TLS termination).
        tunnel: Option<Box<ParentUrl>>,
        /// Absolute-form HTTP.
        forward: Option<Box<ParentUrl>>,
        /// Hosts that go direct.
        no_proxy: NoProxy,
    },
    /// A PAC script.
    Pac(PacSource),
}

impl Setting {
    /// Fixed parents (`tunnel` for tunnels, `forward` for absolute-form HTTP) with the
    /// hosts that bypass them; `Direct` when there is neither.
    fn manual(tunnel: Option<ParentUrl>, forward: Option<ParentUrl>, no_proxy: NoProxy) -> Self {
        if tunnel.is_none() && forward.is_none() {
            return Self::Direct;
        }
        Self::Manual {
            tunnel: tunnel.map(Box::new),
            forward: forward.map(Box::new),
            no_proxy,
        }
    }

    /// A desktop's manual proxies: tunnels through the HTTPS proxy, else the HTTP one,
    /// else SOCKS; plain HTTP through the HTTP proxy, else SOCKS.
    fn desktop(
        https: Option<ParentUrl>,
        http: Option<ParentUrl>,
        socks: Option<ParentUrl>,
        no_proxy: NoProxy,
    ) -> Self {
        let tunnel = https.or_else(|| http.clone()).or_else(|| socks.clone());
        Self::manual(tunnel, http.or(socks), no_proxy)
    }
}

/// The outcome of one reading: which source decided, what it said, and the setting.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    /// The source, with the file it was read from: `GNOME (dconf /etc/dconf/db/local)`.
    pub(crate) source: String,
    /// What it said, in its own terms (never a password).
    pub(crate) said: String,
    /// The setting.
    pub(crate) setting: Setting,
    /// Which settings files exist and which are absent: `files found: dconf /a;
    /// absent: kioslaverc /etc/xdg/kioslaverc`.
    pub(crate) files: String,
}

impl std::fmt::Display for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.source, self.said)
    }
}

/// Where the sources are, resolved from `[upstream]`.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    dconf: Vec<PathBuf>,
    kioslaverc: Vec<PathBuf>,
    /// `dconf_databases` was configured: each of its files must exist.
    dconf_named: bool,
    /// `kioslaverc_files` was configured: each must exist and hold `[Proxy Settings]`.
    kioslaverc_named: bool,
}

impl Paths {
    /// The dconf databases and `kioslaverc` files to read: those configured, else the
    /// named user's (`system_user`: `~/.config/dconf/user`, `~/.config/kioslaverc`) and
    /// the system defaults (the databases `/etc/dconf/profile/user` names, else none;
    /// `/etc/xdg/kioslaverc`).
    ///
    /// # Errors
    /// [`Error::Upstream`] when `system_user` does not exist.
    pub(crate) fn of(sources: &SystemSources) -> Result<Self, Error> {
        let home = match &sources.user {
            Some(name) => Some(home_of(name)?),
            None => None,
        };
        let dconf = match &sources.dconf {
            Some(list) => list.clone(),
            None => gnome::profile_databases(Path::new(gnome::PROFILE), home.as_deref()),
        };
        let kioslaverc = match &sources.kioslaverc {
            Some(list) => list.clone(),
            None => home
                .iter()
                .map(|h| h.join(".config/kioslaverc"))
                .chain([PathBuf::from(kde::SYSTEM_FILE)])
                .collect(),
        };
        Ok(Self {
            dconf,
            kioslaverc,
            dconf_named: sources.dconf.is_some(),
            kioslaverc_named: sources.kioslaverc.is_some(),
        })
    }

    /// Which files exist, in words; a file the configuration names that is missing is an
    /// error (fail closed: a deleted database must not silently mean "go direct"). Files
    /// of the default lists may be absent.
    fn survey(&self) -> Result<String, Error> {
        let mut found = Vec::new();
        let mut absent = Vec::new();
        let lists = [
            ("dconf", "dconf_databases", &self.dconf, self.dconf_named),
            (
                "kioslaverc",
                "kioslaverc_files",
                &self.kioslaverc,
                self.kioslaverc_named,
            ),
        ];
        for (kind, key, paths, named) in lists {
            for path in paths {
                match std::fs::metadata(path) {
                    Ok(_) => found.push(format!("{kind} {}", path.display())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => {
                        absent.push(format!("{kind} {}", path.display()));
                    }
                    Err(e) => {
                        return Err(Error::upstream_by(
                            format!(
                                "[upstream] {key} names {}, which cannot be read",
                                path.display()
                            ),
                            e,
                        ));
                    }
                }
            }
        }
        let list = |l: Vec<String>| {
            if l.is_empty() {
                "none".to_owned()
            } else {
                l.join(", ")
            }
        };
        Ok(format!(
            "files found: {}; absent: {}",
            list(found),
            list(absent)
        ))
    }
}

fn home_of(name: &str) -> Result<PathBuf, Error> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(user)) => Ok(user.dir),
        Ok(None) => Err(Error::upstream(format!(
            "system_user {name:?}: no such user"
        ))),
        Err(e) => Err(Error::upstream_by(
            format!("system_user {name:?}: cannot look the user up"),
            e,
        )),
    }
}

/// Reads the sources in order; the first that holds a setting decides.
///
/// # Errors
/// [`Error::Upstream`] naming the source and the file: a file `dconf_databases` or
/// `kioslaverc_files` names that is missing, an unreadable or malformed file, a setting
/// that cannot be honoured (WPAD, an unsupported proxy type, a bad host or port).
pub(crate) fn read(
    paths: &Paths,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Result<Reading, Error> {
    let files = paths.survey()?;
    let reading = if let Some(r) = gnome::read(&paths.dconf)? {
        r
    } else if let Some(r) = kde::read(&paths.kioslaverc, paths.kioslaverc_named, getenv)? {
        r
    } else {
        from_env(EnvProxies::read(getenv)?, "the environment".to_owned())
    };
    Ok(Reading { files, ..reading })
}

/// `mode = "system"` without starting anything (`mediator check`, `explain`): which source
/// decided, what it said, and the routing it gives.
///
/// # Errors
/// [`Error::Upstream`], as when the mediator reads the settings at start.
pub fn summary(
    sources: &SystemSources,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Error> {
    let reading = read(&Paths::of(sources)?, getenv)?;
    let routing = match &reading.setting {
        Setting::Direct => "direct".to_owned(),
        Setting::Manual {
            tunnel,
            forward,
            no_proxy,
        } => {
            let show = |p: &Option<Box<ParentUrl>>| {
                p.as_ref()
                    .map_or_else(|| "direct".to_owned(), |p| format!("parent {p}"))
            };
            format!(
                "tunnels via {}, http via {}, no proxy for {no_proxy}",
                show(tunnel),
                show(forward)
            )
        }
        Setting::Pac(PacSource::File(p)) => format!("the PAC {}", p.display()),
        Setting::Pac(PacSource::Url(u)) => format!("the PAC {u}"),
    };
    Ok(format!("{reading} -> {routing} ({})", reading.files))
}

/// A reading of the proxy environment (`mode = "env"` semantics).
pub(crate) fn from_env(found: EnvProxies, source: String) -> Reading {
    let tunnel = found.https.clone().or_else(|| found.all.clone());
    let forward = found.http.clone().or_else(|| found.all.clone());
    let show = |p: &Option<ParentUrl>| p.as_ref().map_or("-".to_owned(), ToString::to_string);
    let said = format!(
        "HTTPS_PROXY={} HTTP_PROXY={} ALL_PROXY={} NO_PROXY={}",
        show(&found.https),
        show(&found.http),
        show(&found.all),
        found.no_proxy
    );
    let setting = Setting::manual(tunnel, forward, found.no_proxy);
    Reading {
        source,
        said,
        setting,
        files: String::new(),
    }
}

/// `host:port` of a desktop setting as a parent URL of `scheme` (`http`, `https`,
/// `socks5`), with the environment's leniency (a missing scheme is `scheme`).
///
/// # Errors
/// The parser's message.
pub(crate) fn parent(
    scheme: &str,
    host: &str,
    port: u16,
) -> Result<ParentUrl, policy::UpstreamError> {
    let host = host.trim();
    let bare = host.split_once("://").map_or(host, |(_, h)| h);
    let bare = bare.trim_end_matches('/');
    let authority = if bare.contains(':') && !bare.starts_with('[') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    };
    policy::upstream::parse_parent_url(
        &format!("{scheme}://{authority}"),
        policy::upstream::ParentSyntax::Config,
    )
}

/// A desktop's bypass list (GNOME `ignore-hosts`, KDE `NoProxyFor`) as a `NO_PROXY`:
/// `*.example.com` and `.example.com` both mean the domain and every name below it.
pub(crate) fn bypass<'a>(entries: impl IntoIterator<Item = &'a str>) -> NoProxy {
    let list: Vec<&str> = entries
        .into_iter()
        .map(str::trim)
        .map(|e| e.strip_prefix('*').unwrap_or(e))
        .filter(|e| !e.is_empty())
        .collect();
    NoProxy::parse(&list.join(","))
}

/// A PAC location of a desktop setting: an `http(s)://` URL or a `file://` URL/absolute
/// path.
///
/// # Errors
/// What is wrong with it.
pub(crate) fn pac_source(url: &str) -> Result<PacSource, policy::UpstreamError> {
    let url = url.trim();
    let path = url.strip_prefix("file://").unwrap_or(url);
    policy::upstream::parse_pac_source(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desktop_values_become_parents() {
        assert_eq!(
            parent("http", "proxy.corp.example", 8080)
                .unwrap()
                .to_string(),
            "http://proxy.corp.example:8080"
        );
        assert_eq!(
            parent("https", "https://Proxy.Corp/", 8443)
                .unwrap()
                .to_string(),
            "https://proxy.corp:8443"
        );
        assert_eq!(
            parent("socks5", "::1", 1080).unwrap().to_string(),
            "socks5://[::1]:1080"
        );
        assert!(parent("http", "bad host", 1).is_err());
        let np = bypass(["*.corp.example", " localhost", "10.0.0.0/8", ""]);
        let t = |s: &str| policy::parse_authority_form(s).unwrap();
        assert!(np.matches(&t("a.corp.example:443")));
        assert!(np.matches(&t("corp.example:443")));
        assert!(np.matches(&t("localhost:80")));
        assert!(np.matches(&t("10.1.1.1:80")));
        assert!(!np.matches(&t("example.com:80")));
        assert_eq!(
            pac_source("file:///etc/proxy.pac").unwrap(),
            PacSource::File("/etc/proxy.pac".into())
        );
        assert!(matches!(
            pac_source("http://wpad.corp/p.pac"),
            Ok(PacSource::Url(_))
        ));
    }
}
