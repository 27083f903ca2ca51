//! A PAC in use: fetched and checked at start (with `allowed_parents` registered for it),
//! refreshed in the background, evaluated per destination and its answers cached per
//! (use, target) under the script generation that computed them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use policy::Target;
use policy::upstream::{PacOnError, PacSource, ParentScheme, ParentUrl};

use super::answer::pac_url;
use super::{Pac, fetch};
use crate::error::{Error, ErrorCause};
use crate::route::{Route, Router, Via};

/// Most PAC answers kept in the cache; a full cache drops expired entries, then all.
pub(in crate::route) const PAC_CACHE_ENTRIES: usize = 4096;

/// PAC evaluation threads.
pub(in crate::route) const PAC_WORKERS: usize = 2;

/// Cached PAC answers: per (use, target), until when, the script generation they were
/// computed under, and the routes.
pub(in crate::route) type PacCache = HashMap<(Via, Target), (Instant, u64, Arc<[Route]>)>;

pub(in crate::route) struct PacRouting {
    pub(in crate::route) pac: Arc<Pac>,
    /// The routes of `allowed_parents` (each scheme), the only parents this script may
    /// name: the parent table also holds parents of earlier readings, which a PAC must
    /// never reach.
    pub(in crate::route) allowed: Vec<Route>,
    pub(in crate::route) cache: Mutex<PacCache>,
    pub(in crate::route) ttl: Duration,
    pub(in crate::route) on_error: PacOnError,
}

impl Router {
    /// Fetches and checks a PAC, with `allowed_parents` registered for it; `None` for a
    /// router without settings (it connects directly).
    pub(in crate::route) async fn pac(
        &self,
        source: PacSource,
    ) -> Result<Option<(PacRouting, fetch::Fetcher)>, Error> {
        let Some(cfg) = &self.settings else {
            return Ok(None);
        };
        let upstream = &cfg.upstream;
        let mut allowed = Vec::new();
        for parent in &upstream.allowed_parents {
            for scheme in ParentScheme::ALL {
                allowed.push(self.add_parent(ParentUrl::new(scheme, parent.clone()))?);
            }
        }
        let via = upstream
            .pac_fetch_via
            .clone()
            .map(|via| self.with_auth(via))
            .transpose()?;
        let fetcher = fetch::Fetcher::new(
            source.clone(),
            via,
            &cfg.extra_ca_files,
            Arc::clone(&self.resolver),
            cfg.connect_timeout,
            self.tls.clone(),
        )?;
        let script = fetcher.fetch().await.map_err(|e| {
            Error::upstream_by(
                format!("no usable PAC at start: {}", show_source(&source)),
                ErrorCause::inner(e),
            )
        })?;
        let limits = super::Limits {
            cpu: upstream.pac_budget,
            memory: upstream.pac_memory,
            dns_timeout: cfg.dns_timeout,
        };
        let env = super::HelperEnv {
            resolver: Arc::clone(&self.resolver),
            handle: tokio::runtime::Handle::current(),
        };
        let engine = Pac::start(script, limits, env, PAC_WORKERS)
            .await
            .map_err(|e| {
                Error::upstream_by(
                    format!("no usable PAC at start: {}", show_source(&source)),
                    ErrorCause::inner(e),
                )
            })?;
        let routing = PacRouting {
            pac: Arc::new(engine),
            allowed,
            cache: Mutex::new(HashMap::new()),
            ttl: upstream.pac_cache,
            on_error: upstream.pac_on_error,
        };
        Ok(Some((routing, fetcher)))
    }

    // A `String` error: [`Router::plan`]'s detail (see there).
    pub(in crate::route) async fn plan_pac(
        &self,
        p: &PacRouting,
        via: Via,
        target: &Target,
    ) -> Result<Arc<[Route]>, String> {
        let key = (via, target.clone());
        // Read before evaluating: an answer computed while a new script is installed is
        // tagged with the old generation and never served after the change.
        let generation = p.pac.generation();
        if !p.ttl.is_zero()
            && let Ok(cache) = p.cache.lock()
            && let Some((expires, made_under, routes)) = cache.get(&key)
            && *expires > Instant::now()
            && *made_under == generation
        {
            return Ok(Arc::clone(routes));
        }
        let url = pac_url(via, target);
        let host = target.host.as_text();
        let routes: Result<Arc<[Route]>, String> = match p.pac.find(&url, &host).await {
            Ok(answer) => {
                tracing::debug!(url = %url, answer = %answer, "PAC answered");
                let routes = self.routes_from_answer(&p.allowed, &answer, &url);
                if routes.is_empty() {
                    Err(format!(
                        "the PAC answered {:?} for {url}: no usable route (parents must be in allowed_parents)",
                        answer.chars().take(200).collect::<String>()
                    ))
                } else {
                    Ok(Arc::from(routes))
                }
            }
            Err(e) => {
                tracing::warn!(url = %url, "PAC evaluation failed: {e}");
                match p.on_error {
                    PacOnError::Direct => Ok(Arc::from([Route::Direct])),
                    PacOnError::Deny => Err(format!("{e} (pac_on_error = \"deny\")")),
                }
            }
        };
        if !p.ttl.is_zero()
            && let (Ok(routes), Ok(mut cache)) = (&routes, p.cache.lock())
        {
            if cache.len() >= PAC_CACHE_ENTRIES {
                let now = Instant::now();
                cache.retain(|_, (expires, made_under, _)| {
                    *expires > now && *made_under == generation
                });
                if cache.len() >= PAC_CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(
                key,
                (Instant::now() + p.ttl, generation, Arc::clone(routes)),
            );
        }
        routes
    }
}

pub(in crate::route) fn show_source(src: &PacSource) -> String {
    match src {
        PacSource::File(p) => p.display().to_string(),
        PacSource::Url(u) => u.clone(),
    }
}

/// Re-fetches the PAC every `every`; a good new script replaces the old one (answers
/// cached under the old one are no longer served), a failed fetch or a bad script keeps
/// the last good copy. Ends when the PAC is no longer in use (the router dropped, or a
/// re-read installed another routing).
pub(in crate::route) async fn refresh(
    routing: std::sync::Weak<PacRouting>,
    fetcher: fetch::Fetcher,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(p) = routing.upgrade() else {
            return;
        };
        match fetcher.fetch().await {
            Ok(script) => match p.pac.install(script).await {
                Ok(true) => {
                    // Cached answers of the old script are ignored from now on (they
                    // carry its generation) and dropped when the cache fills.
                    tracing::info!("PAC refreshed from {}", fetcher.source());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    "PAC refresh from {}: new script refused ({e}); keeping the last good copy",
                    fetcher.source()
                ),
            },
            Err(e) => tracing::warn!(
                "PAC refresh from {} failed ({e}); keeping the last good copy",
                fetcher.source()
            ),
        }
    }
}
