//! Embedded mode: an in-process mediator (the `mediator` crate's library API) with a
//! one-authority grant built from `--allow`, `--deny` and `--allow-private`, validated by
//! the same `policy` code as `mediator.toml`. Connections from the sandbox's loopback
//! listener are handed to it directly: no socket file exists at all.

use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use policy::EntryKind;

use crate::error::{BadFlag, Error, Result};
use crate::report::Denial;

/// The authority name of the embedded grant (what the decision log shows).
pub(crate) const AUTHORITY: &str = "shim";

/// Build and validate the one-authority mediator configuration.
///
/// # Errors
/// [`Error::Grant`] naming every flag value the policy rejects (`--allow '*.com': ...`);
/// [`Error::Usage`] if the grant they make together is refused.
pub(crate) fn config(
    allow: &[String],
    deny: &[String],
    allow_private: &[String],
) -> Result<policy::config::Config> {
    let problems: Vec<BadFlag> = allow
        .iter()
        .filter_map(|v| check_flag("--allow", v, EntryKind::Allow))
        .chain(
            deny.iter()
                .filter_map(|v| check_flag("--deny", v, EntryKind::Deny)),
        )
        .chain(
            allow_private
                .iter()
                .filter_map(|v| check_flag("--allow-private", v, EntryKind::AllowPrivate)),
        )
        .collect();
    if !problems.is_empty() {
        return Err(Error::Grant(problems));
    }
    let mut authority = toml::Table::new();
    authority.insert("name".into(), AUTHORITY.into());
    let list = |v: &[String]| {
        toml::Value::Array(v.iter().map(|s| toml::Value::String(s.clone())).collect())
    };
    authority.insert("allow".into(), list(allow));
    authority.insert("deny".into(), list(deny));
    authority.insert("allow_private".into(), list(allow_private));
    let mut doc = toml::Table::new();
    doc.insert(
        "authority".into(),
        toml::Value::Array(vec![toml::Value::Table(authority)]),
    );
    let text = toml::to_string(&doc).map_err(|e| Error::Usage(format!("embedded grant: {e}")))?;
    policy::config::parse(&text, "embedded grant (--allow/--deny/--allow-private)")
        .map_err(|e| Error::Usage(e.to_string()))
}

/// `value` of `flag` checked alone, as the grant will parse it.
fn check_flag(flag: &'static str, value: &str, kind: EntryKind) -> Option<BadFlag> {
    let why = policy::check_entry(kind, value).err()?;
    Some(BadFlag {
        flag,
        value: value.to_owned(),
        why,
    })
}

/// A running embedded mediator serving the sandbox's listener.
pub(crate) struct Embedded {
    runtime: tokio::runtime::Runtime,
    running: Arc<mediator::Running>,
    accept: tokio::task::JoinHandle<()>,
    memory: Arc<Mutex<Vec<String>>>,
    log_file: Option<(PathBuf, u64)>,
    /// Connections accepted from the sandbox.
    pub(crate) connections: Arc<AtomicU64>,
}

impl Embedded {
    /// Start the mediator and serve `listener`. Must be called after the sandbox is
    /// cloned (it starts threads).
    ///
    /// `decision_log`: append the decision log to this file (else it is kept in memory
    /// for `--report`).
    ///
    /// # Errors
    /// [`Error::Io`] if the runtime cannot start, [`Error::Channel`] if the mediator
    /// refuses to start (resolver configuration, log file).
    pub(crate) fn start(
        config: policy::config::Config,
        listener: std::net::TcpListener,
        decision_log: Option<&Path>,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mediator")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the embedded mediator's runtime", e))?;
        let memory = Arc::new(Mutex::new(Vec::new()));
        let (sink, log_file) = match decision_log {
            Some(p) => {
                let start = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                (
                    mediator::Sink::File(p.to_owned()),
                    Some((p.to_owned(), start)),
                )
            }
            None => (mediator::Sink::Memory(Arc::clone(&memory)), None),
        };
        let running = runtime
            .block_on(mediator::start(
                config,
                mediator::Options {
                    sink: Some(sink),
                    tap: None,
                },
            ))
            .map_err(|e| Error::Channel {
                path: PathBuf::from("<embedded>"),
                detail: e.to_string(),
            })?;
        let running = Arc::new(running);
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("listener non-blocking", e))?;
        let connections = Arc::new(AtomicU64::new(0));
        let accept = {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::io("listener into the runtime", e))?;
            let running = Arc::clone(&running);
            let connections = Arc::clone(&connections);
            runtime.spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::Relaxed);
                    running.serve_embedded(stream, AUTHORITY);
                }
            })
        };
        Ok(Self {
            runtime,
            running,
            accept,
            memory,
            log_file,
            connections,
        })
    }

    /// Stop (the sandbox is gone, so connections are closing), flush the decision log and
    /// return the denials it recorded during the run.
    pub(crate) fn finish(self) -> Vec<Denial> {
        self.accept.abort();
        let log = self.running.log().clone();
        let _ = self.runtime.block_on(self.accept);
        if let Ok(running) = Arc::try_unwrap(self.running) {
            self.runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(2), running.shutdown()).await;
            });
        }
        log.flush();
        let lines: Vec<String> = match &self.log_file {
            None => self.memory.lock().map(|l| l.clone()).unwrap_or_default(),
            Some((path, offset)) => read_from(path, *offset),
        };
        self.runtime.shutdown_timeout(Duration::from_millis(200));
        lines
            .iter()
            .filter_map(|l| denial_from_log_line(l))
            .collect()
    }
}

fn read_from(path: &Path, offset: u64) -> Vec<String> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.seek(std::io::SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    std::io::BufReader::new(f)
        .lines()
        .map_while(std::result::Result::ok)
        .collect()
}

/// A denial from one decision-log line (design section 10), `None` for other lines.
pub(crate) fn denial_from_log_line(line: &str) -> Option<Denial> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v.get("event")?.as_str()? != "decision" || v.get("decision")?.as_str()? != "deny" {
        return None;
    }
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    // The protocol as the decision log names it (`connect` for an HTTP CONNECT).
    let protocol = match v.get("protocol").and_then(|p| p.as_str()) {
        Some("socks5") => "socks5",
        Some("connect") => "connect",
        Some("tls") => "tls",
        _ => "http",
    };
    // The status the client got: the mediator derives it from the reason alone.
    let reason = v.get("reason").and_then(|r| r.as_str());
    let status = policy::decision::Reason::ALL
        .iter()
        .find(|r| Some(r.as_str()) == reason)
        .map_or(403, |r| {
            let d = mediator::Denial::new(*r, "", "");
            if protocol == "socks5" {
                u16::from(d.socks_rep())
            } else {
                d.http_status()
            }
        });
    Some(Denial {
        protocol,
        status,
        reason: s("reason"),
        host: s("host"),
        port: v
            .get("port")
            .and_then(|p| p.as_u64())
            .and_then(|p| u16::try_from(p).ok()),
        detail: s("detail"),
        hint: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_build_a_valid_one_authority_grant() {
        let c = config(
            &["example.com".into(), "*.example.org:443".into()],
            &[],
            &["127.0.0.1/32".into()],
        )
        .unwrap();
        assert_eq!(c.authorities.len(), 1);
    }

    #[test]
    fn bad_patterns_are_rejected_with_the_entry() {
        let e = config(&["*.com".into()], &[], &[]).unwrap_err().to_string();
        assert!(e.contains("*.com"), "{e}");
    }

    #[test]
    fn each_bad_value_is_named_with_its_flag_not_a_toml_position() {
        let e = config(
            &["ok.example".into(), "*.com".into()],
            &["a..b".into()],
            &["10.0.0.1/8".into()],
        )
        .unwrap_err()
        .to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 3, "{e}");
        assert!(
            lines[0].starts_with("--allow '*.com': ") && lines[0].contains("public suffix"),
            "{e}"
        );
        assert!(lines[1].starts_with("--deny 'a..b': "), "{e}");
        assert!(
            lines[2].starts_with("--allow-private '10.0.0.1/8': CIDR has host bits set"),
            "{e}"
        );
        // Nothing of the TOML document the grant is built as, nor the entry said twice.
        for noise in ["embedded grant", "invalid ", ":2:", "authority \"shim\""] {
            assert!(!e.contains(noise), "{noise:?} in {e}");
        }
    }

    #[test]
    fn a_value_with_a_quote_is_quoted_the_shell_way() {
        let e = config(&["it's".into()], &[], &[]).unwrap_err().to_string();
        assert!(e.starts_with(r"--allow 'it'\''s': "), "{e}");
    }

    #[test]
    fn denial_lines_are_recognised() {
        let line = r#"{"event":"decision","ts":"t","id":1,"conn":1,"authority":"shim","channel":"embedded","peer":{},"protocol":"connect","host":"evil.example","port":443,"decision":"deny","reason":"not_in_allowlist","detail":"d"}"#;
        let d = denial_from_log_line(line).unwrap();
        assert_eq!(d.reason.as_deref(), Some("not_in_allowlist"));
        assert_eq!(d.port, Some(443));
        assert_eq!((d.protocol, d.status, d.hint), ("connect", 403, None));
        assert!(denial_from_log_line(&line.replace("\"deny\"", "\"allow\"")).is_none());
    }
}
