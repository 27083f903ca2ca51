//! The parents a router may use: an append-only table (a `Route::Parent` index always
//! names the same parent), the auth each gets from `parent_auth` and the parent
//! credentials file, and that file's reader. Never logs a password.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use policy::config::{Upstream, UpstreamMode};
use policy::upstream::{Credentials, ParentAuth, ParentUrl};
use policy::{Target, parse_authority_form};

use super::{DIRECT, Route, Router};
use crate::error::Error;

/// One parent the router may use (configured, from the environment, or allowed for PAC).
#[derive(Debug, Clone)]
pub(super) struct ParentEntry {
    pub(super) url: ParentUrl,
    pub(super) label: String,
}

/// Most distinct parents a router registers over its life (configuration names a
/// handful; `mode = "system"` re-reads add the ones that changed).
pub(super) const MAX_PARENTS: usize = 256;

/// The parents a router may use, append-only, so that a [`Route::Parent`] index (kept by
/// open connections and their close records) always names the same parent.
pub(super) struct Parents {
    pub(super) slots: Box<[std::sync::OnceLock<ParentEntry>]>,
    /// Serialises registration; the slots are read without it.
    pub(super) adding: Mutex<usize>,
}

impl Parents {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..MAX_PARENTS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            adding: Mutex::new(0),
        }
    }

    pub(super) fn get(&self, i: u16) -> Option<&ParentEntry> {
        self.slots
            .get(usize::from(i))
            .and_then(std::sync::OnceLock::get)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u16, &ParentEntry)> {
        self.slots
            .iter()
            .map_while(std::sync::OnceLock::get)
            .enumerate()
            .filter_map(|(i, p)| u16::try_from(i).ok().map(|i| (i, p)))
    }

    /// The route of `url`, registering it if new (equal scheme, address, credentials and
    /// auth share one entry).
    pub(super) fn add(&self, url: ParentUrl) -> Result<Route, Error> {
        let mut len = self
            .adding
            .lock()
            .map_err(|_| Error::upstream("parent table poisoned"))?;
        if let Some((i, _)) = self.iter().find(|(_, p)| p.url == url) {
            return Ok(Route::Parent(i));
        }
        let i = *len;
        let slot = self.slots.get(i).ok_or_else(|| {
            Error::upstream(format!(
                "more than {MAX_PARENTS} distinct parents since start; restart the mediator"
            ))
        })?;
        let label = format!("parent {url}");
        let _ = slot.set(ParentEntry { url, label });
        *len += 1;
        Ok(Route::Parent(u16::try_from(i).unwrap_or(u16::MAX)))
    }
}

/// A parent credentials file line's auth: `user:password` (Basic) or `negotiate`.
#[derive(Debug, Clone)]
pub(super) enum FileAuth {
    Basic(Credentials),
    Negotiate,
}

impl Router {
    /// `url` with the configured auth (`parent_auth`, then the credentials file) applied
    /// where the URL itself says nothing.
    ///
    /// # Errors
    /// [`Error::Upstream`] when Negotiate (`parent_auth` or the credentials file) meets a
    /// `user:password` (the URL's userinfo, the desktop's, or the credentials file) for
    /// the same HTTP parent: one of them would be ignored, so neither is guessed.
    pub(super) fn with_auth(&self, mut url: ParentUrl) -> Result<ParentUrl, Error> {
        let Some(cfg) = &self.settings else {
            return Ok(url);
        };
        let named = cfg.upstream.parent_auth.get(&url.addr).copied();
        if let Some(auth) = named {
            url.auth = auth;
        }
        match cfg.creds.get(&url.addr) {
            Some(FileAuth::Negotiate) if named.is_none() => {
                url.auth = ParentAuth::Negotiate;
            }
            Some(FileAuth::Basic(c)) if url.credentials.is_none() => {
                url.credentials = Some(c.clone());
            }
            _ => {}
        }
        if !url.scheme.is_http() {
            // Negotiate is an HTTP scheme; a SOCKS5 parent on the same address uses RFC 1929.
            url.auth = ParentAuth::Basic;
        }
        if url.auth == ParentAuth::Negotiate && url.credentials.is_some() {
            return Err(Error::upstream(format!(
                "parent {url}: Negotiate (parent_auth or parent_credentials_file) and a user:password are both configured for it; keep one (Negotiate ignores the password)"
            )));
        }
        Ok(url)
    }

    /// Registers a parent (auth and credentials from the configuration where the URL has
    /// none); returns its route.
    pub(super) fn add_parent(&self, url: ParentUrl) -> Result<Route, Error> {
        self.parents.add(self.with_auth(url)?)
    }

    pub(super) fn show(&self, route: Option<Route>) -> &str {
        route.map_or(DIRECT, |r| self.label(r))
    }

    /// The `route` log value: `"direct"` or `"parent http://host:port"` (never credentials).
    pub(crate) fn label(&self, route: Route) -> &str {
        match route {
            Route::Direct => DIRECT,
            Route::Parent(i) => self.parents.get(i).map_or("parent ?", |p| p.label.as_str()),
        }
    }
}

/// Warns about `parent_auth` keys that name no parent where the parents are known from
/// the configuration (`parent` mode: `parents`; `pac` mode: `allowed_parents` and
/// `pac_fetch_via`): most likely a typo of the host or port. In `env` and `system` modes
/// the parents come from outside and may change, so every key may apply.
pub(super) fn warn_unmatched_auth(upstream: &Upstream) {
    let known: Vec<&Target> = match upstream.mode {
        UpstreamMode::Parent => upstream.parents.iter().map(|p| &p.addr).collect(),
        UpstreamMode::Pac => upstream
            .allowed_parents
            .iter()
            .chain(upstream.pac_fetch_via.iter().map(|p| &p.addr))
            .collect(),
        UpstreamMode::Direct | UpstreamMode::Env | UpstreamMode::System => return,
    };
    for addr in upstream.parent_auth.keys() {
        if !known.contains(&addr) {
            tracing::warn!(
                "[upstream] parent_auth names {addr}, which is no parent of mode = \"{}\" (check the host and port)",
                upstream.mode
            );
        }
    }
}

/// Reads `parent_credentials_file`: lines `host:port user:password` or `host:port
/// negotiate` (`#` comments and blank lines ignored).
pub(super) fn read_credentials(path: &Path) -> Result<HashMap<Target, FileAuth>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::upstream_by(
            format!("cannot read parent_credentials_file {}", path.display()),
            e,
        )
    })?;
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let (addr, userpass) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| Error::upstream(format!("{at}: write \"host:port user:password\"")))?;
        let target = parse_authority_form(addr).map_err(|e| Error::upstream_by(at.clone(), e))?;
        if userpass.trim() == "negotiate" {
            out.insert(target, FileAuth::Negotiate);
            continue;
        }
        let (user, pass) = userpass.trim().split_once(':').ok_or_else(|| {
            Error::upstream(format!(
                "{at}: write \"host:port user:password\" or \"host:port negotiate\""
            ))
        })?;
        let creds = Credentials::new(user.to_owned(), pass.to_owned())
            .map_err(|e| Error::upstream_by(at, e))?;
        out.insert(target, FileAuth::Basic(creds));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_append_only_and_bounded() {
        let parents = Parents::new();
        let url = |s: &str| {
            policy::upstream::parse_parent_url(s, policy::upstream::ParentSyntax::Config).unwrap()
        };
        let a = parents.add(url("http://a.corp:1")).unwrap();
        let b = parents.add(url("https://a.corp:1")).unwrap();
        assert_ne!(a, b, "another scheme is another parent");
        assert_eq!(parents.add(url("http://a.corp:1")).unwrap(), a);
        let Route::Parent(i) = b else { panic!() };
        assert_eq!(parents.get(i).unwrap().label, "parent https://a.corp:1");
        for n in 2..MAX_PARENTS {
            parents.add(url(&format!("http://p{n}.corp:1"))).unwrap();
        }
        let e = parents.add(url("http://one-too-many.corp:1")).unwrap_err();
        assert!(e.to_string().contains("restart the mediator"), "{e}");
        assert_eq!(parents.get(i).unwrap().label, "parent https://a.corp:1");
    }
}
