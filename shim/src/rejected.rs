//! What the shim says when a client of the command refuses the certificate the mediator
//! presented for a TLS-terminated host (the client ended its handshake with an alert such
//! as `unknown_ca`, or hung up once it had the certificate, as Node.js does): the
//! mediator's close record says so (`client_tls`, and `tls_alert` when there was one), the
//! embedded mediator's tap or the admin API's `/denials` bring it here, and the run gets one line on stderr
//! saying which client, which host, and what to do, and one report entry (reason
//! `client_rejected_certificate`).
//!
//! The client is named when the run could tell which program held the tunnel: in a run
//! given a CA (the one where termination is expected), the relay and capture note the
//! program behind each tunnel they open ([`Trust::opened`], through the backend's
//! [`ProgramOf`]), and a refusal for that host and port names the last one.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::report::{Denial, Denials};

/// Names the program of the sandbox that holds a TCP connection whose socket, inside,
/// has the local address `client` and the remote address `server` (`npm`, `curl`);
/// `None` when it cannot tell. Called while the connection is open; a backend provides
/// it (`crate::sandbox::Backend::program_of`).
pub(crate) type ProgramOf = fn(client: SocketAddr, server: SocketAddr) -> Option<String>;

/// The report's reason for such an entry (the first word of the mediator's `detail`).
pub(crate) const REASON: &str = mediator::vocab::CLIENT_REJECTED_CERTIFICATE;

/// What the run knows of the CA its command was told to trust, and of the programs
/// behind its tunnels.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust {
    /// The bundle the shim's CA variables name (`SSL_CERT_FILE`, ...), when the run was
    /// given a CA; `None`: no CA variable was set.
    pub(crate) bundle: Option<PathBuf>,
    /// How the backend names the program behind a connection.
    pub(crate) program_of: Option<ProgramOf>,
    /// The programs behind the run's recent tunnels.
    pub(crate) clients: Arc<Clients>,
}

/// How long a tunnel's program is remembered.
const CLIENT_KEEP: Duration = Duration::from_secs(300);
/// Most tunnels remembered.
const CLIENT_MAX: usize = 256;

/// The programs behind the run's recent tunnels, by host and port (the last first).
#[derive(Debug, Default)]
pub(crate) struct Clients(Mutex<VecDeque<(String, u16, String, Instant)>>);

impl Clients {
    fn note(&self, host: &str, port: u16, program: String) {
        let mut list = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if list.len() == CLIENT_MAX {
            list.pop_back();
        }
        list.push_front((host.to_ascii_lowercase(), port, program, Instant::now()));
    }

    fn name_of(&self, host: &str, port: u16) -> Option<String> {
        let mut list = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|(.., at)| at.elapsed() < CLIENT_KEEP);
        list.iter()
            .find(|(h, p, ..)| h.eq_ignore_ascii_case(host) && *p == port)
            .map(|(.., program, _)| program.clone())
    }
}

/// One tunnel whose client refused the mediator's certificate.
#[derive(Debug, Clone)]
pub(crate) struct Rejection {
    /// The tunnel's host.
    pub(crate) host: Option<String>,
    /// The tunnel's port.
    pub(crate) port: Option<u16>,
    /// The alert, by its registry name (`unknown_ca`); `None`: the client hung up without
    /// one (Node.js).
    pub(crate) alert: Option<String>,
    /// The mediator's `detail`.
    pub(crate) detail: String,
    /// The program that refused it (`npm`, `curl`), when known.
    pub(crate) client: Option<String>,
}

impl Rejection {
    /// The close record `rec` (the embedded mediator's, through its tap) of a terminated
    /// tunnel whose client refused the mediator's certificate (its `client_tls` says
    /// so). `None` for any other record.
    pub(crate) fn of_close(rec: &mediator::Record) -> Option<Self> {
        let refused = rec.client_tls?.rejects_certificate();
        (rec.event == mediator::vocab::Event::Close && refused).then(|| Self {
            host: rec.host.clone(),
            port: rec.port,
            alert: rec.tls_alert.map(|a| a.as_str().to_owned()),
            detail: rec.detail.clone(),
            client: None,
        })
    }
}

impl Trust {
    /// A tunnel to `host:port` was opened for the sandbox's connection whose socket,
    /// inside, is `client` -> `server`: in a run given a CA, notes the program behind it.
    /// Reads `/proc` (a few milliseconds): call it where a short wait does no harm.
    pub(crate) fn opened(&self, host: &str, port: u16, client: SocketAddr, server: SocketAddr) {
        let (Some(_), Some(program_of)) = (&self.bundle, self.program_of) else {
            return;
        };
        if let Some(program) = program_of(client, server) {
            self.clients.note(host, port, program);
        }
    }

    /// Records `r` in the run's report and says it on stderr (unless `--quiet-denials`).
    pub(crate) fn rejected(&self, denials: &Denials, mut r: Rejection) {
        if r.client.is_none()
            && let (Some(host), Some(port)) = (&r.host, r.port)
        {
            r.client = self.clients.name_of(host, port);
        }
        let advice = self.advice(r.client.as_deref());
        let line = self.line(&r, &advice);
        denials.push_with_line(
            Denial {
                protocol: "tls",
                status: 0,
                reason: Some(REASON.to_owned()),
                host: r.host,
                port: r.port,
                detail: Some(r.detail),
                hint: Some(advice),
                message: None,
            },
            line,
        );
    }

    /// The line: `shim: npm does not trust the mediator's CA: it refused the certificate
    /// for registry.npmjs.org:443 (TLS alert unknown_ca); ...`.
    fn line(&self, r: &Rejection, advice: &str) -> String {
        let who = r.client.as_deref().map_or_else(
            || "a client of the command".to_owned(),
            crate::report::on_one_line,
        );
        let target = match (r.host.as_deref(), r.port) {
            (Some(h), Some(p)) if h.contains(':') => format!(" for [{h}]:{p}"),
            (Some(h), Some(p)) => format!(" for {h}:{p}"),
            (Some(h), None) => format!(" for {h}"),
            (None, _) => String::new(),
        };
        let how = r.alert.as_deref().map_or_else(
            || "it hung up during the TLS handshake, without an alert".to_owned(),
            |a| format!("TLS alert {}", crate::report::on_one_line(a)),
        );
        format!(
            "shim: {who} does not trust the mediator's CA: it refused the certificate{target} ({how}); {advice}"
        )
    }

    /// What to do, for `client` (its program name) when known.
    fn advice(&self, client: Option<&str>) -> String {
        let Some(bundle) = &self.bundle else {
            return "the run has no CA to give it: pass --ca-cert with the mediator's CA (`mediator ca-cert --config F` prints it), or --config F --authority A, which finds it".to_owned();
        };
        let own = client.and_then(own_setting).unwrap_or(
            "a client with a CA setting of its own (a config file, a --cacert flag) reads that instead: point it at the bundle",
        );
        format!(
            "the shim's CA variables (SSL_CERT_FILE and the others, docs/tls.md) name the bundle {} with the mediator's CA; {own}",
            bundle.display()
        )
    }
}

/// The CA setting a known client reads before (or instead of) the variables the shim
/// sets, by its program name.
fn own_setting(client: &str) -> Option<&'static str> {
    Some(match client {
        "npm" | "npx" | "node" | "yarn" | "pnpm" => {
            "npm's own `cafile` setting (npm config get cafile) wins over NODE_EXTRA_CA_CERTS: run npm with --cafile \"$SSL_CERT_FILE\""
        }
        "pip" | "pip3" | "python" | "python3" | "uv" => {
            "pip's own `cert` setting (pip config list) wins over the variables: run pip with --cert \"$SSL_CERT_FILE\""
        }
        "curl" => "curl reads CURL_CA_BUNDLE unless --cacert or a .curlrc `cacert` says otherwise",
        "git" => "git reads GIT_SSL_CAINFO unless its config's http.sslCAInfo says otherwise",
        "cargo" => "cargo reads CARGO_HTTP_CAINFO unless its config's http.cainfo says otherwise",
        "java" => {
            "the JVM reads no CA variable: give it a trust store with the mediator's CA (-Djavax.net.ssl.trustStore)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(client: Option<&str>) -> Rejection {
        Rejection {
            host: Some("registry.npmjs.org".into()),
            port: Some(443),
            alert: Some("unknown_ca".into()),
            detail: "client_rejected_certificate: ...".into(),
            client: client.map(str::to_owned),
        }
    }

    /// Whether the first kept denial's hint says `text`.
    fn hint_says(kept: &[crate::report::Counted], text: &str) -> bool {
        kept[0]
            .denial
            .hint
            .as_deref()
            .is_some_and(|h| h.contains(text))
    }

    #[test]
    fn the_line_names_the_client_the_host_the_alert_and_what_to_do() {
        let trust = Trust {
            bundle: Some("/tmp/shim-ca/bundle.pem".into()),
            ..Trust::default()
        };
        let r = rejection(Some("npm"));
        let line = trust.line(&r, &trust.advice(Some("npm")));
        assert!(
            line.starts_with("shim: npm does not trust the mediator's CA: it refused the certificate for registry.npmjs.org:443 (TLS alert unknown_ca); the shim's CA variables"),
            "{line}"
        );
        assert!(line.contains("/tmp/shim-ca/bundle.pem"), "{line}");
        assert!(line.contains("--cafile"), "{line}");
        let generic = trust.line(&rejection(None), &trust.advice(None));
        assert!(
            generic.starts_with("shim: a client of the command does not trust"),
            "{generic}"
        );
        assert!(generic.contains("a CA setting of its own"), "{generic}");
        // Without a CA the run has nothing to give the client: say how to give one.
        let none = Trust::default().advice(Some("npm"));
        assert!(none.contains("--ca-cert"), "{none}");
    }

    #[test]
    fn a_close_record_whose_client_refused_the_certificate_is_a_rejection() {
        use mediator::vocab::{ClientTlsEnd, Event, TlsAlert};
        let line = r#"{"event":"close","ts":"2026-12-01T00:00:00.000Z","id":3,"conn":1,"authority":"agent","channel":"embedded","peer":{},"protocol":"connect","host":"api.test","port":443,"decision":"allow","reason":"allowed","rule":"api.test","detail":"client_rejected_certificate: ...","pin":"127.0.0.1","route":"direct","dns_ms":null,"connect_ms":null,"close_reason":"error","client_tls":"rejected_certificate","tls_alert":"unknown_ca"}"#;
        let mut rec: mediator::Record = serde_json::from_str(line).unwrap();
        let r = Rejection::of_close(&rec).unwrap();
        assert_eq!(
            (r.host.as_deref(), r.port, r.alert.as_deref()),
            (Some("api.test"), Some(443), Some("unknown_ca"))
        );
        // Node.js hangs up without an alert: a rejection all the same, said so.
        (rec.client_tls, rec.tls_alert) = (Some(ClientTlsEnd::ClosedAfterCertificate), None);
        let r = Rejection::of_close(&rec).unwrap();
        let line = Trust::default().line(&r, "x");
        assert!(
            line.contains("(it hung up during the TLS handshake, without an alert)"),
            "{line}"
        );
        (rec.client_tls, rec.tls_alert) =
            (Some(ClientTlsEnd::Alert), Some(TlsAlert::ProtocolVersion));
        assert!(Rejection::of_close(&rec).is_none());
        (rec.client_tls, rec.event) = (Some(ClientTlsEnd::RejectedCertificate), Event::Decision);
        assert!(Rejection::of_close(&rec).is_none());
        (rec.client_tls, rec.event) = (None, Event::Close);
        assert!(Rejection::of_close(&rec).is_none());
    }

    #[test]
    fn a_refusal_names_the_program_noted_for_its_tunnel() {
        fn npm(_: SocketAddr, _: SocketAddr) -> Option<String> {
            Some("npm".into())
        }
        let trust = Trust {
            bundle: Some("/b.pem".into()),
            program_of: Some(npm),
            ..Trust::default()
        };
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        trust.opened("Registry.npmjs.org", 443, addr, addr);
        let denials = Denials::new(false);
        trust.rejected(&denials, rejection(None));
        let (kept, _) = denials.take();
        assert!(hint_says(&kept, "--cafile"));
        // Without a CA nothing is looked up.
        let bare = Trust {
            program_of: Some(npm),
            ..Trust::default()
        };
        bare.opened("registry.npmjs.org", 443, addr, addr);
        assert_eq!(bare.clients.name_of("registry.npmjs.org", 443), None);
    }

    #[test]
    fn a_rejection_is_one_report_entry() {
        let denials = Denials::new(false);
        Trust::default().rejected(&denials, rejection(Some("curl")));
        let (kept, _) = denials.take();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].denial.reason.as_deref(), Some(REASON));
        assert_eq!(
            (kept[0].denial.protocol, kept[0].denial.host.as_deref()),
            ("tls", Some("registry.npmjs.org"))
        );
        assert!(hint_says(&kept, "--ca-cert"));
    }
}
