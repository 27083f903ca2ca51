//! The routing strategy in force: what `[upstream]` (or the environment, or the desktop
//! settings) says, built at start and on a `system` re-read, and the one place that
//! chooses the routes for a target (`Router::plan`, with `select` for the environment's
//! tunnel/forward/`NO_PROXY` rule).

use std::sync::Arc;
use std::time::Duration;

use policy::Target;
use policy::config::UpstreamMode;
use policy::upstream::PacSource;

use super::pac::cache::{PacRouting, refresh};
use super::pac::fetch;
use super::{Route, Router, Via, env, system};
use crate::error::Error;

pub(super) enum Strategy {
    /// `direct`.
    Direct,
    /// `parent`: these routes in order.
    Static(Vec<Route>),
    /// `env` (and a desktop's manual setting): routes for tunnels and for forwarding, and
    /// the hosts that bypass them.
    Env {
        tunnel: Option<Route>,
        forward: Option<Route>,
        no_proxy: env::NoProxy,
    },
    /// `pac` (and a desktop's PAC setting).
    Pac(Arc<PacRouting>),
}

impl Router {
    /// The strategy of a PAC source, with its refresher.
    async fn pac_strategy(
        &self,
        source: PacSource,
    ) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        Ok(match self.pac(source).await? {
            Some((routing, fetcher)) => (Strategy::Pac(Arc::new(routing)), Some(fetcher)),
            None => (Strategy::Direct, None),
        })
    }

    /// Builds the strategy `[upstream]` says (reading the sources `env` and `system`
    /// modes name); a PAC's refresher is returned to be started once installed.
    pub(super) async fn build(&self) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        let Some(cfg) = &self.settings else {
            return Ok((Strategy::Direct, None));
        };
        let upstream = &cfg.upstream;
        match upstream.mode {
            UpstreamMode::Direct => Ok((Strategy::Direct, None)),
            UpstreamMode::Parent => {
                let routes = upstream
                    .parents
                    .iter()
                    .map(|p| self.add_parent(p.clone()))
                    .collect::<Result<_, _>>()?;
                Ok((Strategy::Static(routes), None))
            }
            UpstreamMode::Env => {
                let found = env::EnvProxies::read(&cfg.getenv)?;
                let reading = system::from_env(found, "the environment".into());
                let strategy = self.setting(reading.setting).await?.0;
                tracing::info!("upstream env: {}", self.describe_strategy(&strategy));
                Ok((strategy, None))
            }
            UpstreamMode::Pac => {
                let Some(source) = upstream.pac.clone() else {
                    return Err(Error::upstream("mode = \"pac\" without a pac source"));
                };
                self.pac_strategy(source).await
            }
            UpstreamMode::System => {
                let paths = system::Paths::of(&upstream.system)?;
                let reading = system::read(&paths, &cfg.getenv)?;
                let said = reading.to_string();
                let files = reading.files.clone();
                let (strategy, fetcher) = self.setting(reading.setting).await?;
                let text = format!("{said} -> {} ({files})", self.describe_strategy(&strategy));
                // The start prints it (`system_reading`), a re-read on its own line.
                if let Ok(mut s) = self.system.lock() {
                    *s = Some(text);
                }
                Ok((strategy, fetcher))
            }
        }
    }

    /// The strategy of a desktop or environment setting.
    pub(super) async fn setting(
        &self,
        setting: system::Setting,
    ) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        match setting {
            system::Setting::Direct => Ok((Strategy::Direct, None)),
            system::Setting::Manual {
                tunnel,
                forward,
                no_proxy,
            } => Ok((
                Strategy::Env {
                    tunnel: tunnel.map(|p| self.add_parent(*p)).transpose()?,
                    forward: forward.map(|p| self.add_parent(*p)).transpose()?,
                    no_proxy,
                },
                None,
            )),
            system::Setting::Pac(source) => Box::pin(self.pac_strategy(source)).await,
        }
    }

    /// Makes `strategy` the one in force; a PAC's refresher starts with it and ends when
    /// it is replaced.
    pub(super) fn install(self: &Arc<Self>, strategy: Strategy, fetcher: Option<fetch::Fetcher>) {
        let every = self
            .settings
            .as_ref()
            .map_or(Duration::ZERO, |s| s.upstream.pac_refresh);
        let strategy = Arc::new(strategy);
        if let (Strategy::Pac(routing), Some(fetcher)) = (&*strategy, fetcher)
            && !every.is_zero()
        {
            tokio::spawn(refresh(Arc::downgrade(routing), fetcher, every));
        }
        if let Ok(mut s) = self.strategy.write() {
            *s = strategy;
        }
    }

    /// `mode = "system"`: reads the desktop settings again (SIGHUP) and installs what they
    /// say; a reading that fails keeps the routing in force (and says why). Other modes:
    /// nothing (their settings change with a restart).
    pub fn reread(self: &Arc<Self>) {
        let is_system = self
            .settings
            .as_ref()
            .is_some_and(|s| s.upstream.mode == UpstreamMode::System);
        if !is_system {
            return;
        }
        let router = Arc::clone(self);
        tokio::spawn(async move {
            match router.build().await {
                Ok((strategy, fetcher)) => {
                    router.install(strategy, fetcher);
                    crate::say!(
                        Info,
                        "mediator: upstream system settings re-read: {}",
                        router.system_reading().unwrap_or_default()
                    );
                }
                Err(e) => crate::say!(
                    Warning,
                    "mediator: upstream system settings re-read failed; the routing in force is kept: {e}"
                ),
            }
        });
    }

    /// `mode = "system"`: which source was used, what it said and the routing it gave.
    pub fn system_reading(&self) -> Option<String> {
        self.system.lock().ok().and_then(|s| s.clone())
    }

    /// The routing a strategy gives, in words.
    pub(super) fn describe_strategy(&self, strategy: &Strategy) -> String {
        match strategy {
            Strategy::Direct => "direct".into(),
            Strategy::Static(routes) => routes
                .iter()
                .map(|r| self.label(*r))
                .collect::<Vec<_>>()
                .join(", "),
            Strategy::Env {
                tunnel,
                forward,
                no_proxy,
            } => format!(
                "tunnels via {}, http via {}, no proxy for {no_proxy}",
                self.show(*tunnel),
                self.show(*forward)
            ),
            Strategy::Pac(_) => "the PAC".into(),
        }
    }

    pub(super) fn current(&self) -> Arc<Strategy> {
        match self.strategy.read() {
            Ok(s) => Arc::clone(&s),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The routes to try for `target`, in order.
    ///
    /// # Errors
    /// A detail when the PAC failed and `pac_on_error = "deny"`, or when it named no
    /// usable route.
    // A `String` error: the route failure's `detail`, logged and answered as is; no caller
    // branches on it.
    pub async fn plan(&self, via: Via, target: &Target) -> Result<Arc<[Route]>, String> {
        let strategy = self.current();
        match &*strategy {
            Strategy::Direct => Ok(Arc::from([Route::Direct])),
            Strategy::Static(routes) => Ok(Arc::from(routes.as_slice())),
            Strategy::Env {
                tunnel,
                forward,
                no_proxy,
            } => Ok(Arc::from([select(
                *tunnel, *forward, no_proxy, via, target,
            )
            .unwrap_or(Route::Direct)])),
            Strategy::Pac(p) => self.plan_pac(p, via, target).await,
        }
    }
}

/// The parent a fixed setting (the environment's, a desktop's manual one) gives `target`,
/// or `None` for DIRECT: a `NO_PROXY` match goes direct; otherwise a tunnel takes
/// `tunnel` (`HTTPS_PROXY`, else `ALL_PROXY`) and absolute-form forwarding `forward`
/// (`HTTP_PROXY`, else `ALL_PROXY`), as curl does.
pub(super) fn select<T>(
    tunnel: Option<T>,
    forward: Option<T>,
    no_proxy: &env::NoProxy,
    via: Via,
    target: &Target,
) -> Option<T> {
    if no_proxy.matches(target) {
        None
    } else if via == Via::Tunnel {
        tunnel
    } else {
        forward
    }
}
