//! The records the `--report` document (`launch::report`) is made of: the denials seen
//! during a run (from the relay, the embedded mediator's decision log, and capture's stub
//! resolver and CONNECT answers), each also said on stderr as it happens unless
//! `--quiet-denials`, and the tampering the backend undid at exit.
//!
//! Pure data and its output: it imports no module of the shim, so that every part of the
//! shim (relay, embedded mediator, capture, OS backend) can fill it in. It never holds a
//! secret: a denial carries only what the mediator's reply or decision log showed.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// One denial seen during the run, in a mediator reply or in the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub(crate) struct Denial {
    /// The relay: `http` (HTTP CONNECT or absolute-form) or `socks5`. Embedded mode: the
    /// decision's protocol (`connect`, `http`, `socks5` or `tls`). Capture: `connect` (its
    /// CONNECT was refused) or `dns` (the stub resolver answered NXDOMAIN).
    pub(crate) protocol: &'static str,
    /// HTTP status (403, 407, 400, 502, 504), the SOCKS5 reply code, or the DNS RCODE
    /// (3, NXDOMAIN).
    pub(crate) status: u16,
    /// The decision reason (`not_in_allowlist`, ...); `None` when the reply carries none
    /// (SOCKS5).
    pub(crate) reason: Option<String>,
    /// Destination host, from the mediator's JSON body.
    pub(crate) host: Option<String>,
    /// Destination port, from the mediator's JSON body.
    pub(crate) port: Option<u16>,
    /// The mediator's `detail`.
    pub(crate) detail: Option<String>,
    /// The mediator's `hint`: what would make it work, as the client was told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hint: Option<String>,
    /// The operator's own words (a deny entry's `reason`, the grant's
    /// `default_deny_reason`; design section 18), from the mediator's `message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

impl Denial {
    /// The line said on stderr as it happens:
    /// `mediator: denied api.example.com:443 (not_in_allowlist): add ...`.
    pub(crate) fn line(&self) -> String {
        let target = match (&self.host, self.port) {
            (Some(h), Some(p)) if h.contains(':') => format!(" [{h}]:{p}"),
            (Some(h), Some(p)) => format!(" {h}:{p}"),
            (Some(h), None) => format!(" {h}"),
            (None, _) => String::new(),
        };
        let reason = self.reason.as_deref().map_or_else(
            || format!("{} {}", self.protocol, self.status),
            str::to_owned,
        );
        let advice = self
            .hint
            .as_deref()
            .or(self.detail.as_deref())
            .filter(|s| !s.is_empty());
        // The operator's words first: they say why, the hint says what would work.
        let advice = match (self.message.as_deref(), advice) {
            (Some(m), Some(a)) => format!(": {m} ({a})"),
            (Some(m), None) => format!(": {m}"),
            (None, Some(a)) => format!(": {a}"),
            (None, None) => String::new(),
        };
        format!("mediator: denied{target} ({reason}){advice}")
    }
}

/// A denial as the report lists it: once, with how many identical ones the run saw (a
/// client that retries is denied the same way each time).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Counted {
    /// The denial.
    #[serde(flatten)]
    pub(crate) denial: Denial,
    /// How many times it was seen.
    pub(crate) count: u64,
}

/// Most distinct denials a report lists; later new ones are counted in
/// `denials_dropped`, not kept (one already listed only has its count raised).
pub(crate) const MAX_DENIALS: usize = 10_000;

/// Most channel failures a report lists; `channel_errors` counts them all.
pub(crate) const MAX_CHANNEL_FAILURES: usize = 1_000;

/// A connection of the sandbox that could not reach the authority's channel (the
/// mediator socket is gone or not listening, or it closed without an answer): the
/// connection failed, and no mediator decided anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ChannelFailure {
    /// `proxy` (a connection to the sandbox's proxy listener) or `capture` (a captured
    /// connection).
    pub(crate) via: &'static str,
    /// The captured connection's `host:port` (`None` for the proxy: the relay does not
    /// read what the client asks for).
    pub(crate) target: Option<String>,
    /// What failed, as the system said it.
    pub(crate) error: String,
}

/// The denials of one run, as they are seen (from the relay's threads or the embedded
/// mediator's connections): at most [`MAX_DENIALS`] kept, the rest counted.
#[derive(Debug, Default)]
pub(crate) struct Denials {
    kept: Mutex<Kept>,
    dropped: AtomicU64,
    /// Say each denial on stderr as it is recorded.
    live: bool,
    /// The lines said in the last [`REPEAT_WINDOW`] (at most [`RECENT_LINES`]), so that a
    /// client that tries a name's IPv4 and then its IPv6 address is told once.
    recent: Mutex<VecDeque<(String, Instant)>>,
    /// Connections that could not reach the channel (at most [`MAX_CHANNEL_FAILURES`]).
    failures: Mutex<Vec<ChannelFailure>>,
}

/// The distinct denials kept, in the order first seen, and where each is.
#[derive(Debug, Default)]
struct Kept {
    list: Vec<Counted>,
    index: std::collections::HashMap<Denial, usize>,
}

/// A line said again within this time is not said again.
const REPEAT_WINDOW: Duration = Duration::from_secs(2);
/// Most recent lines remembered for that.
const RECENT_LINES: usize = 32;

impl Denials {
    /// An empty list; with `live`, each denial is also said on stderr when it is recorded
    /// (the command's stderr: it is the shim's).
    pub(crate) fn new(live: bool) -> Self {
        Self {
            live,
            ..Self::default()
        }
    }

    /// Records one denial.
    pub(crate) fn push(&self, d: Denial) {
        let line = d.line();
        self.push_with_line(d, line);
    }

    /// Records one entry, said on stderr as `line` (the client's refusal of the
    /// mediator's certificate is said in the shim's words, not as a denial).
    pub(crate) fn push_with_line(&self, d: Denial, line: String) {
        if self.live {
            self.say(line);
        }
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&at) = kept.index.get(&d) {
            if let Some(c) = kept.list.get_mut(at) {
                c.count += 1;
            }
        } else if kept.list.len() < MAX_DENIALS {
            let at = kept.list.len();
            kept.index.insert(d.clone(), at);
            kept.list.push(Counted {
                denial: d,
                count: 1,
            });
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a connection that could not reach the channel `channel` (a socket path or
    /// `embedded`), and says it on stderr, whatever `live` is (it is not a denial to be
    /// quieted: nothing decided), at most once per [`REPEAT_WINDOW`] for the same error.
    pub(crate) fn channel_failed(&self, channel: &str, f: ChannelFailure) {
        self.say(format!(
            "shim: cannot reach the channel {channel} ({}): the command's connections fail until a mediator serves it",
            f.error
        ));
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failures.len() < MAX_CHANNEL_FAILURES {
            failures.push(f);
        }
    }

    /// The channel failures kept, in order.
    pub(crate) fn take_failures(&self) -> Vec<ChannelFailure> {
        std::mem::take(
            &mut *self
                .failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Print `line` on stderr unless it was printed within [`REPEAT_WINDOW`].
    fn say(&self, line: String) {
        let now = Instant::now();
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|(_, at)| now.duration_since(*at) < REPEAT_WINDOW);
        if recent.iter().any(|(l, _)| *l == line) {
            return;
        }
        eprintln!("{line}");
        if recent.len() == RECENT_LINES {
            recent.pop_front();
        }
        recent.push_back((line, now));
    }

    /// The distinct denials kept, in the order first seen, with their counts, and how
    /// many more distinct ones were seen.
    pub(crate) fn take(&self) -> (Vec<Counted>, u64) {
        let kept = std::mem::take(
            &mut *self
                .kept
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        (kept.list, self.dropped.load(Ordering::Relaxed))
    }
}

/// Serialises a path as a JSON string, its bytes that are not UTF-8 each replaced by
/// U+FFFD: a file name is any bytes but `/` and NUL, and one the command chose must never
/// make a record or the report unwritable (serde refuses such a `Path`).
pub(crate) fn lossy_path<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&path.to_string_lossy())
}

/// One path the command created that would have run code on the host, renamed aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Tampering {
    /// Where it appeared.
    #[serde(serialize_with = "lossy_path")]
    pub(crate) path: PathBuf,
    /// Where the shim moved it.
    #[serde(serialize_with = "lossy_path")]
    pub(crate) quarantined_as: PathBuf,
    /// What it would have done.
    pub(crate) kind: TamperKind,
}

/// What a path the command created would have done on the host (the `kind` of a
/// `tampering` entry in the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TamperKind {
    /// A `.git/commondir`: git on the host would use another repository (and its config).
    GitCommondir,
    /// A shell startup file or per-user tool config of the mandatory deny set (`.zshrc`,
    /// `.bash_profile`, `.gitconfig`, `.ssh`, ...), or a link on the way to one, in a
    /// writable root: a shell or tool started there on the host would run it.
    DenySet,
}

impl TamperKind {
    /// Why it matters, for the warning.
    fn why(self) -> &'static str {
        match self {
            Self::GitCommondir => "it would change which repository git uses on the host",
            Self::DenySet => {
                "it is in the mandatory deny set: a shell or tool on the host would run it"
            }
        }
    }
}

/// `text` with its control characters escaped (`\n` as `\u{a}`, ESC as `\u{1b}`): a
/// file name the command chose stays one line on the operator's terminal and cannot
/// drive it.
pub(crate) fn on_one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Say on stderr what was moved aside, one line per path (whether or not `--report` is on).
pub(crate) fn warn_tampering(moved: &[Tampering]) {
    for t in moved {
        eprintln!(
            "shim: tampering: the command created {} ({}); moved it to {}",
            on_one_line(&t.path.display().to_string()),
            t.kind.why(),
            on_one_line(&t.quarantined_as.display().to_string())
        );
    }
}

/// The host uid and gid a command runs as: outside the sandbox, whatever it is inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct RunsAs {
    /// The uid.
    pub(crate) uid: u32,
    /// The gid.
    pub(crate) gid: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_is_one_line_an_agent_can_act_on() {
        let d = Denial {
            protocol: "connect",
            status: 403,
            reason: Some("not_in_allowlist".into()),
            host: Some("api.example.com".into()),
            port: Some(443),
            detail: Some("api.example.com is not allowed".into()),
            hint: Some("add --allow api.example.com:443 to the shim command".into()),
            message: None,
        };
        assert_eq!(
            d.line(),
            "mediator: denied api.example.com:443 (not_in_allowlist): add --allow api.example.com:443 to the shim command"
        );
        let socks = Denial {
            protocol: "socks5",
            status: 2,
            reason: None,
            host: None,
            port: None,
            detail: Some("SOCKS5 REP 0x02".into()),
            hint: None,
            message: None,
        };
        assert_eq!(socks.line(), "mediator: denied (socks5 2): SOCKS5 REP 0x02");
        let v6 = Denial {
            host: Some("::1".into()),
            ..d
        };
        assert!(v6.line().starts_with("mediator: denied [::1]:443 "));
    }

    #[test]
    fn denials_beyond_the_bound_are_counted_not_kept() {
        let denials = Denials::default();
        let one = Denial {
            protocol: "http",
            status: 403,
            reason: None,
            host: None,
            port: None,
            detail: None,
            hint: None,
            message: None,
        };
        for i in 0..MAX_DENIALS + 3 {
            denials.push(Denial {
                port: u16::try_from(i).ok(),
                ..one.clone()
            });
        }
        // An identical one, even beyond the bound, raises the count of the one listed.
        denials.push(Denial {
            port: Some(0),
            ..one
        });
        let (kept, dropped) = denials.take();
        assert_eq!((kept.len(), dropped), (MAX_DENIALS, 3));
        assert_eq!(kept[0].count, 2);
        assert_eq!(kept[1].count, 1);
    }

    #[test]
    fn identical_denials_are_listed_once_with_a_count() {
        let denials = Denials::default();
        let d = |host: &str| Denial {
            protocol: "connect",
            status: 403,
            reason: Some("not_in_allowlist".into()),
            host: Some(host.into()),
            port: Some(443),
            detail: None,
            hint: Some(format!("add --allow {host}:443 to the shim command")),
            message: None,
        };
        for host in ["a.test", "b.test", "a.test", "a.test", "b.test", "c.test"] {
            denials.push(d(host));
        }
        let (kept, dropped) = denials.take();
        let got: Vec<(&str, u64)> = kept
            .iter()
            .map(|c| (c.denial.host.as_deref().unwrap_or(""), c.count))
            .collect();
        assert_eq!(got, [("a.test", 3), ("b.test", 2), ("c.test", 1)]);
        assert_eq!(dropped, 0);
    }
}
