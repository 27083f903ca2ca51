//! The SNI rule (design section 6): the server names a TLS ClientHello carries (RFC 6066
//! section 3) must agree with the host a tunnel was granted for. One rule, applied by the
//! SNI gate of every tunnel and by TLS termination alike, so no path can be laxer than the
//! other.
//!
//! - A name target needs exactly one SNI host name, equal to it after canonicalisation:
//!   no SNI could carry any name inside the encrypted stream (domain fronting).
//! - An IP-literal target allows no SNI (clients send none for addresses), or one equal
//!   to the same literal.
//! - More than one host name is refused (RFC 6066 allows one per name type).

use std::fmt;

use crate::host::{Target, canonicalize_host};

/// Why a ClientHello's server names do not fit the tunnel's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SniMismatch {
    /// No SNI, but the tunnel is to a name.
    Missing {
        /// The tunnel's canonical host.
        target: String,
    },
    /// One SNI, naming another host.
    Other {
        /// The SNI, canonicalised.
        sni: String,
        /// The tunnel's canonical host.
        target: String,
    },
    /// The SNI is not a valid host name.
    Invalid(String),
    /// More than one host name.
    Several(usize),
}

impl fmt::Display for SniMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { target } => {
                write!(f, "the ClientHello has no SNI; the tunnel is to {target}")
            }
            Self::Other { sni, target } => {
                write!(f, "SNI {sni} does not match the tunnel host {target}")
            }
            Self::Invalid(why) => write!(f, "SNI is not a valid host: {why}"),
            Self::Several(n) => write!(f, "the ClientHello names {n} servers; one is allowed"),
        }
    }
}

/// Applies the SNI rule to the host names of one ClientHello for a tunnel to `target`.
///
/// # Errors
/// [`SniMismatch`] saying what does not fit.
pub fn check_sni<S: AsRef<str>>(names: &[S], target: &Target) -> Result<(), SniMismatch> {
    match names {
        [] if target.host.ip().is_some() => Ok(()),
        [] => Err(SniMismatch::Missing {
            target: target.host.as_text(),
        }),
        [one] => match canonicalize_host(one.as_ref()) {
            Ok(h) if h == target.host => Ok(()),
            Ok(h) => Err(SniMismatch::Other {
                sni: h.as_text(),
                target: target.host.as_text(),
            }),
            Err(e) => Err(SniMismatch::Invalid(e.to_string())),
        },
        _ => Err(SniMismatch::Several(names.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::parse_authority_form;

    #[test]
    fn one_rule_for_names_and_literals() {
        let name = parse_authority_form("api.example.com:443").unwrap();
        let ip = parse_authority_form("203.0.113.7:443").unwrap();
        let none: [&str; 0] = [];
        let rows: [(&[&str], &Target, Result<(), &str>); 8] = [
            (&["api.example.com"], &name, Ok(())),
            (&["API.Example.COM."], &name, Ok(())),
            (&none, &name, Err("has no SNI")),
            (&["evil.example"], &name, Err("does not match")),
            (&["bad host"], &name, Err("not a valid host")),
            (
                &["api.example.com", "b.example"],
                &name,
                Err("names 2 servers"),
            ),
            (&none, &ip, Ok(())),
            (&["203.0.113.7"], &ip, Ok(())),
        ];
        for (names, target, want) in rows {
            let got = check_sni(names, target);
            match (want, got) {
                (Ok(()), Ok(())) => {}
                (Err(text), Err(e)) => assert!(e.to_string().contains(text), "{names:?}: {e}"),
                (want, got) => panic!("{names:?} -> {target}: want {want:?}, got {got:?}"),
            }
        }
    }
}
