//! `--admin URL`: what a running mediator serves now, read from its admin API
//! (`GET /v1/authorities`: each authority's `reach` and `origin`, and the `global_deny`
//! list), with the admin token from [`TOKEN_ENV`] when it needs one. One request; any
//! failure is one line naming the API and what to do.

use std::time::Duration;

use policy::config::Config;
use policy::review::{DenyView, Reach, Side, deny_entries};
use serde::Deserialize;

use crate::error::Error;
use crate::service::health::{self, AdminAddr};

/// The environment variable holding the admin API's bearer token.
pub const TOKEN_ENV: &str = "MEDIATOR_ADMIN_TOKEN";

/// The largest listing read, in bytes.
const MAX_LISTING: usize = 64 << 20;

/// How long the request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// `GET /v1/authorities`, the parts read here (the rest is ignored).
#[derive(Debug, Deserialize)]
struct Listing {
    authorities: Vec<Listed>,
    global_deny: Option<Vec<DenyView>>,
}

#[derive(Debug, Deserialize)]
struct Listed {
    name: String,
    origin: String,
    reach: Option<Reach>,
}

/// The authorities a running mediator serves.
#[derive(Debug)]
pub(super) struct Served {
    /// From its configuration file.
    config: Vec<Reach>,
    /// Created through its admin API (a reload keeps them).
    api: Vec<Reach>,
    /// Its `[global] deny`.
    global_deny: Vec<policy::DenyEntry>,
}

impl Served {
    /// The old side of `mediator diff --admin`.
    pub(super) fn side(self) -> Side {
        Side {
            authorities: self.config,
            kept: self.api,
            global_deny: self.global_deny,
            sections: None,
            exposure: None,
        }
    }

    /// A configuration that decides as the running mediator does, for `mediator test
    /// --admin`: every authority it serves (see [`Reach::authority`] for what it lacks).
    pub(super) fn config(self) -> Result<Config, Error> {
        let mut config = policy::config::parse("", "--admin")?;
        for reach in self.config.iter().chain(&self.api) {
            config.authorities.push(reach.authority(&self.global_deny)?);
        }
        config.global_deny = self.global_deny;
        Ok(config)
    }
}

/// Asks the admin API at `url` for its authorities.
///
/// # Errors
/// [`Error::Review`], one line: the API cannot be reached, refuses the token (or needs
/// one), answers otherwise than 200, or serves no grants.
pub(super) fn fetch(url: &str) -> Result<Served, Error> {
    let fail = |what: String| Error::review(format!("--admin {url}: {what}"));
    let addr = admin_addr(url).map_err(|e| fail(crate::error::chain(&e)))?;
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let (status, body) = health::get(
        &addr,
        "/v1/authorities",
        token.as_deref(),
        TIMEOUT,
        MAX_LISTING,
    )
    .map_err(|e| {
        fail(format!(
            "cannot reach the admin API: {}",
            crate::error::chain(&e)
        ))
    })?;
    match status {
        200 => {}
        401 if token.is_some() => {
            return Err(fail(format!(
                "the admin API refused the token in {TOKEN_ENV} (401)"
            )));
        }
        401 => {
            return Err(fail(format!(
                "the admin API needs its token (401): put it in {TOKEN_ENV}"
            )));
        }
        s => {
            let text = String::from_utf8_lossy(&body);
            return Err(fail(format!(
                "GET /v1/authorities answered {s}: {}",
                text.lines().next().unwrap_or_default()
            )));
        }
    }
    let listing: Listing = serde_json::from_slice(&body).map_err(|e| {
        fail(format!(
            "GET /v1/authorities: not the listing expected: {e}"
        ))
    })?;
    let global = listing.global_deny.ok_or_else(|| {
        fail(
            "the admin API serves no grants (no global_deny): a mediator older than this command?"
                .into(),
        )
    })?;
    let mut served = Served {
        config: Vec::new(),
        api: Vec::new(),
        global_deny: deny_entries(&global),
    };
    for a in listing.authorities {
        let reach = a.reach.ok_or_else(|| {
            fail(format!(
                "the admin API serves no grant for authority {:?}: a mediator older than this command?",
                a.name
            ))
        })?;
        if a.origin == "api" {
            served.api.push(reach);
        } else {
            served.config.push(reach);
        }
    }
    Ok(served)
}

/// `http://host:port[/]`, `host:port`, `unix:PATH` or a socket path.
fn admin_addr(url: &str) -> Result<AdminAddr, Error> {
    if url.starts_with("https://") {
        return Err(Error::review(
            "the admin API speaks plain HTTP on loopback or a Unix socket: give http://127.0.0.1:PORT or the socket's path",
        ));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    AdminAddr::parse(rest.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        let tcp = AdminAddr::Tcp("127.0.0.1:9901".parse().unwrap());
        assert_eq!(admin_addr("http://127.0.0.1:9901/").unwrap(), tcp);
        assert_eq!(admin_addr("127.0.0.1:9901").unwrap(), tcp);
        assert_eq!(
            admin_addr("/run/m/admin.sock").unwrap(),
            AdminAddr::Unix("/run/m/admin.sock".into())
        );
        assert!(admin_addr("https://127.0.0.1:9901").is_err());
    }

    #[test]
    fn an_unreachable_admin_api_is_one_line() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = fetch(&format!("http://127.0.0.1:{port}")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "--admin http://127.0.0.1:{port}: cannot reach the admin API: "
            )),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }
}
