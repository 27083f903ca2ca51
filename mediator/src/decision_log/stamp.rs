//! What every line of this process carries besides its record: the instance and the run
//! (design section 19), and on TCP the peer's address.

use std::io::Write as _;
use std::time::SystemTime;

use super::record::Peer;

/// What every line of this process carries besides its record (design section 19):
/// which mediator (`instance`) and which start of it (`run`) wrote it, so that `(run, id)`
/// never repeats across restarts and replicas.
#[derive(Debug)]
pub(super) struct Stamp {
    pub(super) run: String,
    /// `,"instance":"...","run":"..."`, ready to append.
    fields: String,
}

impl Stamp {
    pub(super) fn new(instance: Option<&str>, run: String) -> Self {
        let instance = instance.map_or_else(host_name, str::to_owned);
        let fields = format!(
            ",\"instance\":{},\"run\":{}",
            serde_json::Value::from(instance.as_str()),
            serde_json::Value::from(run.as_str())
        );
        Self { run, fields }
    }

    /// Adds the fields to `line`, one serialised record (a JSON object): `instance`,
    /// `run`, and on TCP the peer's `peer_ip` and `peer_port`.
    pub(super) fn append(&self, line: &mut Vec<u8>, peer: &Peer) {
        if line.last() != Some(&b'}') {
            return;
        }
        line.pop();
        line.extend_from_slice(self.fields.as_bytes());
        if let Peer::Tcp(addr) = peer {
            let _ = write!(
                line,
                ",\"peer_ip\":\"{}\",\"peer_port\":{}",
                addr.ip(),
                addr.port()
            );
        }
        line.push(b'}');
    }
}

/// This host's name (`/proc/sys/kernel/hostname`), or `localhost` when it cannot be read.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// 16 hex digits from the kernel's random source; the time and pid when it cannot be read
/// (a run only has to differ from the others of this instance).
pub(super) fn random_run() -> String {
    use std::io::Read;
    let mut b = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (now as u64 ^ u64::from(std::process::id()).rotate_left(32)).to_be_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
