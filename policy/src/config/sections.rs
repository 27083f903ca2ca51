//! The checks of the small sections of `mediator.toml`: `[listen]`, `[resolver]`, `[tls]`,
//! `[timeouts]`, `[limits]`, `[log]`, the telemetry keys and `[global]`, each on the
//! [`Validator`] that collects and locates their problems (`validate.rs`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::raw::{RawGlobal, RawLimits, RawListen, RawLog, RawResolver, RawTimeouts, RawTls};
use super::validate::{
    MAX_CONNECTIONS, MAX_IDLE_UPSTREAM, MAX_TIMEOUT_SECS, Validator, parse_sha256,
};
use super::{Limits, Listen, Log, Resolver, Timeouts, Tls};
use crate::host::canonicalize_host;
use crate::pattern::{HostPattern, PatternUse};

impl Validator<'_> {
    pub(super) fn listen(&mut self, raw: RawListen) -> Option<Listen> {
        let what = "[listen]";
        let socket_dir = raw.socket_dir.and_then(|d| {
            if d.get_ref().is_empty() {
                self.error(
                    Some(d.span()),
                    what,
                    "socket_dir is empty; omit it for no Unix sockets",
                );
                None
            } else {
                Some(PathBuf::from(d.into_inner()))
            }
        });
        let mut addr = |v: Option<Spanned<String>>, key: &str, loopback_only: bool| {
            let v = v?;
            match v.get_ref().parse::<SocketAddr>() {
                Ok(a) if loopback_only && !a.ip().is_loopback() => {
                    self.error(
                        Some(v.span()),
                        what,
                        format!("{key} {:?} is not a loopback address; the admin API must not be reachable from other hosts", v.get_ref()),
                    );
                    None
                }
                Ok(a) => Some(a),
                Err(_) => {
                    self.error(
                        Some(v.span()),
                        what,
                        format!("{key} {:?} is not an ip:port address (write \"127.0.0.1:3128\" or \"[::1]:3128\")", v.get_ref()),
                    );
                    None
                }
            }
        };
        let tcp_span = raw.tcp.as_ref().map(Spanned::span);
        let tcp = addr(raw.tcp, "tcp", false);
        let admin = addr(raw.admin, "admin", true);
        if let Some(a) = tcp.filter(|a| !a.ip().is_loopback()) {
            self.warn(
                tcp_span,
                what,
                format!("tcp = \"{a}\" is not a loopback address: every host that can reach it may try tokens (the listener is meant for this host's processes)"),
            );
        }
        let admin_socket = raw
            .admin_socket
            .and_then(|p| self.admin_socket(p, socket_dir.as_deref()));
        let admin_token_sha256 = raw.admin_token_sha256.and_then(|t| match parse_sha256(t.get_ref()) {
            Some(bytes) => Some(bytes),
            None => {
                self.error(
                    Some(t.span()),
                    what,
                    "admin_token_sha256 must be 64 hex digits (the SHA-256 of a non-empty admin token); omit it for no token",
                );
                None
            }
        });
        Some(Listen {
            socket_dir,
            tcp,
            admin,
            admin_socket,
            admin_token_sha256,
            admin_allow_anonymous_writes: raw.admin_allow_anonymous_writes.unwrap_or(false),
        })
    }

    /// `[listen] admin_socket`: an absolute path that is not inside `socket_dir`, so it
    /// can never be taken for (or replaced by) an authority's channel socket.
    fn admin_socket(&mut self, p: Spanned<String>, socket_dir: Option<&Path>) -> Option<PathBuf> {
        let what = "[listen]";
        let path = PathBuf::from(p.get_ref());
        if !path.is_absolute() {
            self.error(
                Some(p.span()),
                what,
                format!("admin_socket {:?} must be an absolute path", p.get_ref()),
            );
            return None;
        }
        if socket_dir.is_some_and(|d| path.starts_with(d)) {
            self.error(
                Some(p.span()),
                what,
                format!("admin_socket {:?} is inside socket_dir; the admin API needs a socket of its own, never a channel's", p.get_ref()),
            );
            return None;
        }
        Some(path)
    }

    pub(super) fn resolver(&mut self, raw: RawResolver) -> Resolver {
        let what = "[resolver]";
        let mut out = Resolver::default();
        for ns in raw.nameservers.unwrap_or_default() {
            match ns.get_ref().parse::<SocketAddr>() {
                Ok(a) => out.nameservers.push(a),
                Err(_) => self.error(
                    Some(ns.span()),
                    what,
                    format!(
                        "nameserver {:?} is not an ip:port address (write \"127.0.0.1:53\")",
                        ns.get_ref()
                    ),
                ),
            }
        }
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        // File order, so that a duplicate is reported at its second spelling.
        let mut hosts: Vec<_> = raw.hosts.unwrap_or_default().into_iter().collect();
        hosts.sort_by_key(|(key, _)| key.span().start);
        for (key, addrs) in hosts {
            let name = match canonicalize_host(key.get_ref()) {
                Ok(h) => match h.name() {
                    Some(n) => n.to_owned(),
                    None => {
                        self.error(
                            Some(key.span()),
                            what,
                            format!(
                                "hosts key {:?} is an IP address; keys must be names",
                                key.get_ref()
                            ),
                        );
                        continue;
                    }
                },
                Err(e) => {
                    self.error(Some(key.span()), what, format!("hosts key: {e}"));
                    continue;
                }
            };
            if let Some(first) = seen.get(&name) {
                let first = self.at(Some(first.clone()));
                self.error(
                    Some(key.span()),
                    what,
                    format!(
                        "hosts key {:?} is the same host as the key at {first}",
                        key.get_ref()
                    ),
                );
                continue;
            }
            seen.insert(name.clone(), key.span());
            if addrs.is_empty() {
                self.error(
                    Some(key.span()),
                    what,
                    format!("hosts entry {:?} has no addresses", key.get_ref()),
                );
                continue;
            }
            let mut ips = Vec::with_capacity(addrs.len());
            for a in &addrs {
                match a.get_ref().parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => self.error(
                        Some(a.span()),
                        what,
                        format!(
                            "hosts entry {:?}: {:?} is not an IP address",
                            key.get_ref(),
                            a.get_ref()
                        ),
                    ),
                }
            }
            out.hosts.insert(name, ips);
        }
        out
    }

    pub(super) fn tls(&mut self, raw: RawTls) -> Tls {
        let what = "[tls]";
        let mut path = |s: Spanned<String>, key: &str| {
            if s.get_ref().is_empty() {
                self.error(Some(s.span()), what, format!("{key} is empty"));
                None
            } else {
                Some(PathBuf::from(s.into_inner()))
            }
        };
        let ca_dir = raw.ca_dir.and_then(|d| path(d, "ca_dir"));
        let extra_ca_files = raw
            .extra_ca_files
            .unwrap_or_default()
            .into_iter()
            .filter_map(|f| path(f, "extra_ca_files entry"))
            .collect();
        Tls {
            ca_dir,
            extra_ca_files,
        }
    }

    pub(super) fn timeouts(&mut self, raw: &RawTimeouts) -> Timeouts {
        let mut secs = |v: &Option<Spanned<u64>>, key: &str, default: u64, min: u64| {
            let Some(v) = v else {
                return Duration::from_secs(default);
            };
            let n = *v.get_ref();
            if n < min || n > MAX_TIMEOUT_SECS {
                self.error(
                    Some(v.span()),
                    "[timeouts]",
                    format!(
                        "{key} = {n} is out of range; give whole seconds {min}..={MAX_TIMEOUT_SECS}"
                    ),
                );
                return Duration::from_secs(default);
            }
            Duration::from_secs(n)
        };
        Timeouts {
            request_head: secs(&raw.request_head, "request_head", 10, 1),
            dns: secs(&raw.dns, "dns", 5, 1),
            connect: secs(&raw.connect, "connect", 10, 1),
            idle_tunnel: secs(&raw.idle_tunnel, "idle_tunnel", 300, 1),
            shutdown_grace: secs(&raw.shutdown_grace, "shutdown_grace", 10, 0),
            revoke_grace: secs(&raw.revoke_grace, "revoke_grace", 5, 0),
            watchdog: secs(&raw.watchdog, "watchdog", 2, 1),
            idle_upstream: secs(&raw.idle_upstream, "idle_upstream", 4, 1),
        }
    }

    pub(super) fn limits(&mut self, raw: &RawLimits) -> Limits {
        // hyper's HTTP/1 server cannot buffer less than 8 KiB.
        const MIN: u64 = 8192;
        const MAX: u64 = 1 << 20;
        let mut request_head_bytes = 65536;
        if let Some(v) = &raw.request_head_bytes {
            let n = *v.get_ref();
            if (MIN..=MAX).contains(&n) {
                // MAX fits every usize of 32 bits or more.
                request_head_bytes = usize::try_from(n).unwrap_or(65536);
            } else {
                self.error(
                    Some(v.span()),
                    "[limits]",
                    format!("request_head_bytes = {n} is out of range {MIN}..={MAX}"),
                );
            }
        }
        let mut count = |key: &str, v: &Option<Spanned<i64>>| {
            self.count(v, "[limits]", key, MAX_CONNECTIONS).unwrap_or(0)
        };
        Limits {
            request_head_bytes,
            max_connections: count("max_connections", &raw.max_connections),
            authority_connections: count("authority_connections", &raw.authority_connections),
            unidentified_connections: count(
                "unidentified_connections",
                &raw.unidentified_connections,
            ),
            idle_upstream_connections: self
                .count(
                    &raw.idle_upstream_connections,
                    "[limits]",
                    "idle_upstream_connections",
                    MAX_IDLE_UPSTREAM,
                )
                .unwrap_or(256),
            authority_idle_upstream_connections: self
                .count(
                    &raw.authority_idle_upstream_connections,
                    "[limits]",
                    "authority_idle_upstream_connections",
                    MAX_IDLE_UPSTREAM,
                )
                .unwrap_or(32),
        }
    }

    /// A count key in `0..=max`, or `None` (with an error when it is out of range).
    pub(super) fn count(
        &mut self,
        v: &Option<Spanned<i64>>,
        what: &str,
        key: &str,
        max: u32,
    ) -> Option<u32> {
        let v = v.as_ref()?;
        let n = *v.get_ref();
        match u32::try_from(n).ok().filter(|&n| n <= max) {
            Some(n) => Some(n),
            None => {
                self.error(
                    Some(v.span()),
                    what,
                    format!("{key} = {n} is out of range 0..={max}"),
                );
                None
            }
        }
    }

    pub(super) fn log(&mut self, raw: RawLog) -> (Log, Option<String>, super::LogFormat) {
        let format = match raw.format {
            None => super::LogFormat::Native,
            Some(f) => match super::LogFormat::ALL
                .into_iter()
                .find(|x| x.as_str() == f.get_ref())
            {
                Some(x) => x,
                None => {
                    self.error(
                        Some(f.span()),
                        "[log]",
                        format!("format {:?}: write \"native\" or \"ocsf\"", f.get_ref()),
                    );
                    super::LogFormat::Native
                }
            },
        };
        let instance = raw.instance.and_then(|i| {
            let text = i.get_ref();
            let ok = !text.is_empty()
                && text.len() <= 253
                && text.bytes().all(|b| b.is_ascii_graphic());
            if ok {
                Some(i.into_inner())
            } else {
                self.error(
                    Some(i.span()),
                    "[log]",
                    "instance is 1 to 253 printable ASCII characters without spaces (e.g. the host name, or \"mediator-eu-1\")",
                );
                None
            }
        });
        let log = match raw.decisions {
            None => Log::Stdout,
            Some(d) if d.get_ref() == "stdout" => Log::Stdout,
            Some(d) if d.get_ref().is_empty() => {
                self.error(
                    Some(d.span()),
                    "[log]",
                    "decisions is empty; write \"stdout\" or a file path",
                );
                Log::Stdout
            }
            Some(d) => Log::File(PathBuf::from(d.into_inner())),
        };
        (log, instance, format)
    }

    /// `[telemetry]`: the OTLP/HTTP endpoint, `http://host:port[/path]`.
    pub(super) fn telemetry(
        &mut self,
        raw: super::raw::RawTelemetry,
    ) -> Option<super::OtlpEndpoint> {
        let url = raw.otlp_endpoint?;
        let text = url.get_ref();
        let parsed = text.strip_prefix("http://").and_then(|rest| {
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, ""),
            };
            let ok = !authority.is_empty()
                && !authority.contains('@')
                && authority.bytes().all(|b| b.is_ascii_graphic())
                && path.bytes().all(|b| b.is_ascii_graphic());
            ok.then(|| super::OtlpEndpoint {
                authority: if authority
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                    && !authority.ends_with(']')
                {
                    authority.to_owned()
                } else {
                    format!("{authority}:4318")
                },
                path: if path.is_empty() || path == "/" {
                    "/v1/logs".to_owned()
                } else {
                    path.to_owned()
                },
            })
        });
        if parsed.is_none() {
            self.error(
                Some(url.span()),
                "[telemetry]",
                format!(
                    "otlp_endpoint {text:?} is not an OTLP/HTTP URL: write \"http://host:port\" (records are POSTed to /v1/logs unless the URL has a path)"
                ),
            );
        }
        parsed
    }

    /// Validates the global deny list; returns only the valid entries (the invalid ones
    /// are reported here, once, not again for every authority).
    pub(super) fn global(&mut self, raw: RawGlobal) -> Vec<crate::grant::DenyEntry> {
        let mut out = Vec::new();
        for entry in raw.deny.unwrap_or_default() {
            let span = entry.span();
            let entry = entry.into_inner().0;
            if let Err(e) = HostPattern::parse("global deny", &entry.host, PatternUse::Deny) {
                self.error(Some(span), "[global]", e);
                continue;
            }
            if let Some(Err(why)) = entry.reason.as_deref().map(crate::check_operator_reason) {
                self.error(
                    Some(span),
                    "[global]",
                    format!(
                        "invalid reason of global deny entry {:?}: {why}",
                        entry.host
                    ),
                );
                continue;
            }
            out.push(entry);
        }
        out
    }
}
