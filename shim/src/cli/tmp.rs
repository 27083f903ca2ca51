//! The private temporary directory's settings: `--tmp-size` (a profile's `tmp_size`) and
//! `--no-tmp` (a profile's `tmp = false`), checked into one [`TmpSize`] or none.

use crate::error::{Error, Result};

/// The private temporary directory: a tmpfs at `/tmp` and `/var/tmp` inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TmpSize(String);

impl TmpSize {
    /// The default bound: half the memory, as the kernel bounds a tmpfs by default.
    pub(crate) const DEFAULT: &'static str = "50%";

    /// A `--tmp-size` value: a positive number of bytes with an optional `k`, `m`, `g` or
    /// `t` suffix (binary multiples, as tmpfs reads them), or a percentage from 1 to 100.
    ///
    /// # Errors
    /// [`Error::Usage`] naming the value and the forms it may take (0 would mean no
    /// bound at all to the kernel, so it is refused).
    pub(crate) fn parse(value: &str) -> Result<Self> {
        let bad = || {
            Error::Usage(format!(
                "--tmp-size {value:?}: give a size such as 512m, 2g or 25% (of the memory); 0 is not a bound"
            ))
        };
        let (digits, percent) = match value.strip_suffix('%') {
            Some(d) => (d, true),
            None => (
                value.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G', 't', 'T']),
                false,
            ),
        };
        if value.len() - digits.len() > 1 || digits.is_empty() || digits.len() > 15 {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        if n == 0 || !digits.bytes().all(|b| b.is_ascii_digit()) || (percent && n > 100) {
            return Err(bad());
        }
        Ok(Self(value.to_ascii_lowercase()))
    }

    /// The private temporary directory of a profile's `tmp` (or `--no-tmp`) and
    /// `--tmp-size`: `None` when it is off.
    ///
    /// # Errors
    /// [`Error::Usage`] for a bad size, or a size for a directory turned off.
    pub(super) fn setting(on: Option<bool>, size: Option<String>) -> Result<Option<Self>> {
        match (on, size) {
            (Some(false), Some(_)) => Err(Error::Usage(
                "tmp = false turns the private temporary directory off; it takes no tmp_size"
                    .into(),
            )),
            (Some(false), None) => Ok(None),
            (_, size) => Self::parse(size.as_deref().unwrap_or(Self::DEFAULT)).map(Some),
        }
    }

    /// The value as tmpfs's `size=` option takes it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}
