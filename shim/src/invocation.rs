//! The run's invocation labels (design section 20): a random `invocation` id for this
//! shim run and the host's `--tag KEY=VALUE` pairs, checked once here (the mediator's
//! bounds, `mediator::labels`). They travel outside the sandbox only: the relay and
//! capture put them in a PROXY protocol v2 header before the command's first byte on the
//! authority's socket, and the embedded mediator takes them with each connection, so the
//! command can neither add, change nor remove them.

use std::io::Read;

use mediator::labels::Labels;

use crate::error::{Error, Result};

/// The labels of this run: a fresh invocation id and `tags` (each `KEY=VALUE`).
///
/// # Errors
/// [`Error::Usage`] naming a tag out of bounds; [`Error::Io`] when no random id can be
/// read.
pub(crate) fn labels(tags: &[String]) -> Result<Labels> {
    let id = new_id()?;
    Labels::new(Some(&id), tags.iter().map(String::as_str))
        .map_err(|e| Error::Usage(format!("--tag: {e}")))
}

/// 16 hexadecimal digits from the kernel's random source (`inv-` in front).
fn new_id() -> Result<String> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("read /dev/urandom for the invocation id", e))?;
    Ok(format!(
        "inv-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_has_its_own_id_and_the_tags_given() {
        let a = labels(&["tool=call_1".into()]).unwrap();
        let b = labels(&[]).unwrap();
        let (ia, ib) = (a.invocation.clone().unwrap(), b.invocation.unwrap());
        assert_ne!(ia, ib);
        assert!(ia.starts_with("inv-") && ia.len() == 20, "{ia}");
        assert_eq!(a.tags["tool"], "call_1");
        let e = labels(&["no-equals".into()]).unwrap_err().to_string();
        assert!(e.contains("--tag: ") && e.contains("KEY=VALUE"), "{e}");
    }
}
