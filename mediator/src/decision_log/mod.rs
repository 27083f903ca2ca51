//! The decision log (design section 10): one JSON line per decision and one per closed
//! connection, on stdout or appended to a file. Two jobs, two files: `record.rs` is the
//! format (the typed [`Record`] and what it holds), `writer.rs` the one writer thread
//! (queue, stamp, render, reopen, the failure that stops the service).

mod record;
mod stamp;
mod writer;

pub(crate) use record::Line;
pub use record::{CredentialUse, Peer, Record, now_rfc3339};
pub(crate) use stamp::host_name;
pub use writer::{DecisionLog, Reopened, Sink, Tap, check_can_open, open_append};
pub(crate) use writer::{Render, Ship};

#[cfg(test)]
mod tests {

    use policy::{Reason, Verdict};

    use super::*;
    use crate::denial::Cause;
    use crate::vocab::{CloseReason, Event, Protocol};

    fn record(peer: Peer) -> Record {
        Record {
            event: Event::Close,
            ts: "2026-12-04T00:00:00.000Z".into(),
            id: 7,
            conn: 3,
            authority: Some("agent-a".into()),
            channel: peer.channel(),
            peer,
            protocol: Protocol::Tls,
            host: Some("api.test".into()),
            port: Some(443),
            decision: Verdict::Deny,
            reason: Reason::CredentialMisuse,
            rule: Some("allow[1] api.test".into()),
            detail: "a detail".into(),
            hint: String::new(),
            message: None,
            cause: Cause::default(),
            pin: Some("192.0.2.1".into()),
            route: Some("direct".into()),
            dns_ms: Some(1.5),
            connect_ms: Some(0.25),
            bytes_up: Some(10),
            bytes_down: Some(20),
            duration_ms: Some(30),
            close_reason: Some(CloseReason::Shutdown),
            client_tls: None,
            tls_alert: None,
            method: Some("GET".into()),
            path: Some("/x?<redacted>".into()),
            capture: true,
            credential: vec![CredentialUse {
                header: "authorization".into(),
                host: "api.test".into(),
            }],
            upgrade: Some(policy::UpgradeToken::WebSocket),
        }
    }

    /// A line reads back as the record it was written from, for every kind of peer (the
    /// typed records the tests and tools read).
    #[test]
    fn a_line_reads_back_as_its_record() {
        for peer in [
            Peer::Unix {
                pid: Some(42),
                uid: 1000,
                gid: 1000,
            },
            Peer::Tcp("127.0.0.1:4242".parse().unwrap()),
            Peer::Embedded,
        ] {
            let line = serde_json::to_string(&record(peer)).unwrap();
            let back: Record = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
            assert_eq!(back.peer, peer);
        }
        let mut bare = record(Peer::Embedded);
        bare.event = Event::Decision;
        (bare.bytes_up, bare.close_reason, bare.upgrade) = (None, None, None);
        bare.capture = false;
        bare.credential.clear();
        let line = serde_json::to_string(&bare).unwrap();
        assert!(
            !line.contains("capture") && !line.contains("upgrade"),
            "{line}"
        );
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), line);
        assert!(serde_json::from_str::<Record>(&line.replace("\"deny\"", "\"maybe\"")).is_err());
    }
}
