//! Name resolution for the connection path (design section 7).
//!
//! Resolves a canonical host once per connection: IP literals pass through, names are
//! looked up in the static `hosts` map first, then in DNS with hickory-resolver (system
//! configuration or explicit nameservers). Names are always queried fully qualified, so a
//! resolver search list can never turn `intranet` into `intranet.corp.example`. This
//! module never connects anywhere and never hands a name to a socket API: it returns
//! addresses, which the caller must vet with [`policy::Grant::vet`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::rr::Name;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use policy::CanonicalHost;

use crate::error::Error;

/// Why a resolution failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveFailure {
    /// The name does not exist or has no A/AAAA records.
    NoRecords,
    /// No answer within the configured DNS timeout.
    Timeout,
    /// Any other resolver error (server failure, refused, I/O).
    Other(String),
}

impl std::fmt::Display for ResolveFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoRecords => f.write_str("no A/AAAA records (NXDOMAIN or empty answer)"),
            Self::Timeout => f.write_str("DNS timeout"),
            Self::Other(e) => write!(f, "DNS error: {e}"),
        }
    }
}

/// The fully qualified DNS name of a canonical name, built label by label from its ASCII
/// form. The canonicaliser already did IDNA and checked every label (letters, digits,
/// hyphen, underscore: design section 4.1); parsing the text again (IDNA, as hickory's
/// string conversion does) would refuse legal names such as `_dmarc.example.com`.
fn fqdn(name: &str) -> Result<Name, hickory_proto::ProtoError> {
    let mut n = Name::from_labels(name.split('.').map(str::as_bytes))?;
    n.set_fqdn(true);
    Ok(n)
}

/// The mediator's resolver.
#[derive(Debug)]
pub struct Resolver {
    hosts: BTreeMap<String, Vec<IpAddr>>,
    /// `None`: [`Resolver::offline`], which asks no DNS server.
    dns: Option<TokioResolver>,
    timeout: Duration,
}

/// What an offline resolver answers for a name its `hosts` map lacks.
const NOT_STUBBED: &str = "not in the hosts table (this resolver asks no DNS server)";

impl Resolver {
    /// Builds a resolver from `[resolver]`: `nameservers` (`ip:port`, UDP and TCP) or the
    /// system configuration (`/etc/resolv.conf`) when empty; `hosts` consulted first.
    ///
    /// # Errors
    /// [`Error::Resolver`] if the system configuration cannot be read.
    pub fn new(
        nameservers: &[SocketAddr],
        hosts: BTreeMap<String, Vec<IpAddr>>,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if nameservers.is_empty() {
            TokioResolver::builder(provider).map_err(Error::Resolver)?
        } else {
            let servers = nameservers
                .iter()
                .map(|sa| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = sa.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = sa.port();
                    NameServerConfig::new(sa.ip(), true, vec![udp, tcp])
                })
                .collect();
            let config = ResolverConfig::from_parts(None, vec![], servers);
            TokioResolver::builder_with_config(config, provider)
        };
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.timeout = timeout;
        opts.attempts = 1;
        opts.ndots = 0;
        let dns = builder.build().map_err(Error::Resolver)?;
        Ok(Self {
            hosts,
            dns: Some(dns),
            timeout,
        })
    }

    /// A resolver that answers from `hosts` alone and never sends a query: a name
    /// `hosts` lacks fails as a DNS error saying so (`mediator test`, whose expectations
    /// stub resolution so that they run without a network).
    pub fn offline(hosts: BTreeMap<String, Vec<IpAddr>>) -> Self {
        Self {
            hosts,
            dns: None,
            timeout: Duration::ZERO,
        }
    }

    /// Resolves `host` once. Returns the addresses (never empty on success) and the time
    /// spent. IP literals resolve to themselves in no time.
    pub async fn resolve(
        &self,
        host: &CanonicalHost,
    ) -> (Result<Vec<IpAddr>, ResolveFailure>, Duration) {
        let start = Instant::now();
        if let Some(ip) = host.ip() {
            return (Ok(vec![ip]), Duration::ZERO);
        }
        let Some(name) = host.name() else {
            return (Err(ResolveFailure::NoRecords), Duration::ZERO);
        };
        if let Some(addrs) = self.hosts.get(name) {
            return (Ok(addrs.clone()), start.elapsed());
        }
        let Some(dns) = &self.dns else {
            return (
                Err(ResolveFailure::Other(NOT_STUBBED.to_owned())),
                start.elapsed(),
            );
        };
        let fqdn = match fqdn(name) {
            Ok(n) => n,
            Err(e) => {
                return (
                    Err(ResolveFailure::Other(format!(
                        "{name} is not a DNS name: {e}"
                    ))),
                    start.elapsed(),
                );
            }
        };
        let result = match tokio::time::timeout(self.timeout, dns.lookup_ip(fqdn)).await {
            Err(_) => Err(ResolveFailure::Timeout),
            Ok(Err(e)) if e.is_no_records_found() || e.is_nx_domain() => {
                Err(ResolveFailure::NoRecords)
            }
            Ok(Err(e)) => Err(ResolveFailure::Other(e.to_string())),
            Ok(Ok(lookup)) => {
                let addrs: Vec<IpAddr> = lookup.iter().collect();
                if addrs.is_empty() {
                    Err(ResolveFailure::NoRecords)
                } else {
                    Ok(addrs)
                }
            }
        };
        (result, start.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_built_from_their_canonical_labels() {
        for name in [
            "under_score.example.test",
            "_dmarc.example.com",
            "xn--bcher-kva.example",
        ] {
            let n = fqdn(name).unwrap();
            assert!(n.is_fqdn());
            assert_eq!(n.to_ascii(), format!("{name}."));
        }
    }
}
