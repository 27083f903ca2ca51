//! The stub resolver inside the sandbox (design section 15): A and AAAA for any name get
//! a synthetic address of this run ([`super::names`]), so that the child never learns a
//! real address and every connection to the name comes back to the shim. In embedded
//! mode a name that no `--allow` entry matches gets NXDOMAIN at once, recorded for
//! `--report` with its reason. `localhost` and the names under it are the sandbox's own
//! loopback (RFC 6761 section 6.3): `127.0.0.1` and `::1`, in either mode, never a
//! denial. Other query types get NOTIMP (RFC 1035 section 4.1.1).
//!
//! Names go through the policy canonicaliser before they are mapped; a name it refuses
//! gets NXDOMAIN. It never resolves anything for real and never forwards a query.

use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

use super::addrs::Addresses;
use super::names::Names;
use crate::control::Binding;
use crate::report::{Denial, Denials};

/// TTL of a synthetic answer, in seconds: the mapping holds for the whole run.
const TTL: u32 = 300;

/// Most names whose NXDOMAIN is recorded (the first time each); later ones are answered
/// the same but not recorded again.
const MAX_RECORDED: usize = 4096;

/// The stub resolver of one run.
pub(crate) struct Stub {
    addrs: Addresses,
    names: Arc<Names>,
    /// Embedded mode: the binding whose grant names are checked against (a rebind
    /// changes it for the next query).
    grant: Option<Arc<Binding>>,
    denials: Arc<Denials>,
    recorded: Mutex<HashSet<String>>,
}

impl Stub {
    /// A stub answering from `names`; with `grant`, names outside the grant it is bound
    /// to get NXDOMAIN.
    pub(crate) fn new(
        addrs: Addresses,
        names: Arc<Names>,
        grant: Option<Arc<Binding>>,
        denials: Arc<Denials>,
    ) -> Self {
        Self {
            addrs,
            names,
            grant,
            denials,
            recorded: Mutex::new(HashSet::new()),
        }
    }

    /// The response to the DNS message `query` (RFC 1035 wire format, without the TCP
    /// length prefix), or `None` when it is not even a header (nothing to answer).
    pub(crate) fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let Ok(msg) = Message::from_vec(query) else {
            let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        };
        let id = msg.metadata.id;
        if msg.metadata.message_type != MessageType::Query {
            return None;
        }
        let mut resp = Message::response(id, msg.metadata.op_code);
        resp.metadata.recursion_desired = msg.metadata.recursion_desired;
        resp.metadata.recursion_available = true;
        resp.metadata.authoritative = true;
        resp.metadata.response_code = self.fill(&msg, &mut resp);
        resp.to_vec().ok()
    }

    fn fill(&self, msg: &Message, resp: &mut Message) -> ResponseCode {
        if msg.metadata.op_code != OpCode::Query {
            return ResponseCode::NotImp;
        }
        let [q] = msg.queries.as_slice() else {
            return ResponseCode::FormErr;
        };
        resp.add_query(q.clone());
        if q.query_class != DNSClass::IN {
            return ResponseCode::NotImp;
        }
        let qtype = q.query_type;
        if qtype != RecordType::A && qtype != RecordType::AAAA {
            return ResponseCode::NotImp;
        }
        let ascii = q.name.to_ascii();
        let text = ascii.strip_suffix('.').unwrap_or(&ascii);
        let Ok(host) = policy::canonicalize_host(text) else {
            return ResponseCode::NXDomain;
        };
        if host.ip().is_some() {
            return ResponseCode::NXDomain;
        }
        let host_text = host.as_text();
        if host_text == "localhost" || host_text.ends_with(".localhost") {
            let rdata = if qtype == RecordType::A {
                RData::A(A(Ipv4Addr::LOCALHOST))
            } else {
                RData::AAAA(AAAA(Ipv6Addr::LOCALHOST))
            };
            resp.add_answer(Record::from_rdata(q.name.clone(), TTL, rdata));
            return ResponseCode::NoError;
        }
        if let Some(grant) = self.grant.as_ref().and_then(|b| b.grant()) {
            // Any port: the mediator decides the port when the connection comes.
            let target = policy::Target { host, port: 443 };
            let d = grant.decide(&target);
            if d.reason == policy::Reason::NotInAllowlist {
                self.record(&host_text, &d.detail);
                return ResponseCode::NXDomain;
            }
        }
        let Some(i) = self.names.index(&host_text) else {
            return ResponseCode::ServFail;
        };
        let rdata = if qtype == RecordType::A {
            RData::A(A(self.addrs.synthetic_v4(i)))
        } else {
            RData::AAAA(AAAA(self.addrs.synthetic_v6(i)))
        };
        resp.add_answer(Record::from_rdata(q.name.clone(), TTL, rdata));
        ResponseCode::NoError
    }

    /// Record the first NXDOMAIN of `host` (a resolver asks for A and AAAA, and retries).
    fn record(&self, host: &str, detail: &str) {
        let mut seen = self
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= MAX_RECORDED || !seen.insert(host.to_owned()) {
            return;
        }
        drop(seen);
        self.denials.push(Denial {
            protocol: "dns",
            status: 3,
            reason: Some(policy::Reason::NotInAllowlist.as_str().to_owned()),
            host: Some(host.to_owned()),
            port: None,
            detail: Some(format!("{detail}: the stub resolver answered NXDOMAIN")),
            hint: Some(format!("add --allow {host} to the shim command")),
            message: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    use super::*;
    use crate::control::Bound;

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0x1234;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        m.to_vec().unwrap()
    }

    fn ask(stub: &Stub, name: &str, qtype: RecordType) -> Message {
        Message::from_vec(&stub.answer(&query(name, qtype)).unwrap()).unwrap()
    }

    fn stub(grant: Option<&[&str]>) -> (Stub, Arc<Denials>) {
        let grant = grant.map(|allow| {
            let spec = policy::GrantSpec {
                name: "shim".into(),
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                advice: policy::Advice::ShimFlags,
                ..policy::GrantSpec::default()
            };
            Arc::new(Binding::new(Bound::Embedded {
                authority: "shim".into(),
                grant: Arc::new(policy::Grant::new(&spec, &[]).unwrap()),
            }))
        });
        let denials = Arc::new(Denials::default());
        let s = Stub::new(
            Addresses::generate(),
            Arc::new(Names::default()),
            grant,
            Arc::clone(&denials),
        );
        (s, denials)
    }

    #[test]
    fn a_and_aaaa_get_synthetic_addresses_of_one_canonical_name() {
        let (s, _) = stub(None);
        let a = ask(&s, "Origin.Test.", RecordType::A);
        assert_eq!(a.metadata.id, 0x1234);
        assert_eq!(a.metadata.response_code, ResponseCode::NoError);
        let RData::A(A(v4)) = a.answers[0].data else {
            panic!("{a:?}")
        };
        assert_eq!(v4.octets()[..2], [198, 18]);
        let aaaa = ask(&s, "origin.test", RecordType::AAAA);
        let RData::AAAA(AAAA(v6)) = aaaa.answers[0].data else {
            panic!("{aaaa:?}")
        };
        assert_eq!(s.addrs.index_of(v4.into()), s.addrs.index_of(v6.into()));
        assert_eq!(s.names.host(0).as_deref(), Some("origin.test"));
    }

    #[test]
    fn other_types_are_notimp_and_bad_names_nxdomain() {
        let (s, _) = stub(None);
        let mx = ask(&s, "origin.test", RecordType::MX);
        assert_eq!(mx.metadata.response_code, ResponseCode::NotImp);
        let bad = ask(&s, "*.test", RecordType::A);
        assert!(
            matches!(
                bad.metadata.response_code,
                ResponseCode::NXDomain | ResponseCode::FormErr
            ),
            "{bad:?}"
        );
        let ip = ask(&s, "127.0.0.1", RecordType::A);
        assert_eq!(ip.metadata.response_code, ResponseCode::NXDomain);
        // Garbage with an id gets FORMERR; less than a header gets nothing.
        let r = Message::from_vec(&s.answer(&[0xab, 0xcd, 0xff]).unwrap()).unwrap();
        assert_eq!(
            (r.metadata.id, r.metadata.response_code),
            (0xabcd, ResponseCode::FormErr)
        );
        assert!(s.answer(&[1]).is_none());
    }

    #[test]
    fn localhost_is_the_sandboxs_loopback_and_never_a_denial() {
        let (s, denials) = stub(Some(&["origin.test:8080"]));
        let a = ask(&s, "localhost.", RecordType::A);
        assert_eq!(a.answers[0].data, RData::A(A(Ipv4Addr::LOCALHOST)));
        let aaaa = ask(&s, "db.localhost", RecordType::AAAA);
        assert_eq!(aaaa.answers[0].data, RData::AAAA(AAAA(Ipv6Addr::LOCALHOST)));
        assert!(denials.take().0.is_empty());
        assert_eq!(s.names.host(0), None);
    }

    #[test]
    fn embedded_names_outside_the_grant_are_nxdomain_and_recorded_once() {
        let (s, denials) = stub(Some(&["origin.test:8080", "*.allowed.test"]));
        let ok = ask(&s, "origin.test", RecordType::A);
        assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
        let ok = ask(&s, "x.allowed.test", RecordType::AAAA);
        assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
        for t in [RecordType::A, RecordType::AAAA] {
            let no = ask(&s, "elsewhere.test", t);
            assert_eq!(no.metadata.response_code, ResponseCode::NXDomain);
            assert!(no.answers.is_empty());
        }
        let (kept, _) = denials.take();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let d = &kept[0].denial;
        assert_eq!(
            (d.protocol, d.status, d.reason.as_deref(), d.host.as_deref()),
            ("dns", 3, Some("not_in_allowlist"), Some("elsewhere.test"))
        );
        assert_eq!(
            d.hint.as_deref(),
            Some("add --allow elsewhere.test to the shim command")
        );
    }
}
