//! Turning the raw tables of `mediator.toml` into validated values, with every problem
//! located (`FILE:LINE:COL`): the [`Validator`] that collects problems, and the retrying
//! table deserializer. The small sections (`[listen]`, `[resolver]`, `[tls]`,
//! `[timeouts]`, `[limits]`, `[log]`, `[global]`) are checked in `sections.rs`;
//! `[upstream]` and `[[authority]]` have files of their own that build on this one. A check reports and carries on; it never
//! stops at the first problem, and never reads a file or resolves a name.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeValue, ValueDeserializer};

/// Maps byte offsets to `FILE:LINE:COL` (1-based, columns in characters).
pub(super) struct Ctx<'a> {
    text: &'a str,
    origin: &'a str,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(text: &'a str, origin: &'a str) -> Self {
        Self { text, origin }
    }

    /// `ORIGIN:LINE:COL` of the start of `span`; only `ORIGIN` when there is no span.
    pub(super) fn at(&self, span: Option<Range<usize>>) -> String {
        let Some(span) = span else {
            return self.origin.to_owned();
        };
        let mut offset = span.start.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        format!("{}:{line}:{col}", self.origin)
    }
}

/// Collects located problems while raw tables are turned into validated values. Every
/// section method reports what it finds and carries on, so that one run lists every
/// problem of the file.
pub(super) struct Validator<'a> {
    ctx: Ctx<'a>,
    /// Byte offset (for sorting) and message.
    errors: Vec<(usize, String)>,
    /// Policy that cannot do what it says: byte offset and message.
    warnings: Vec<(usize, String)>,
}

/// The largest connection count a limit key takes.
pub(super) const MAX_CONNECTIONS: u32 = 1_000_000;
/// The most idle upstream connections `[limits]` may keep for reuse.
pub(super) const MAX_IDLE_UPSTREAM: u32 = 100_000;

/// Largest timeout accepted, in seconds (one day): keeps deadlines far from `Instant`
/// overflow and catches unit mistakes (milliseconds written as seconds).
pub(super) const MAX_TIMEOUT_SECS: u64 = 86_400;

impl<'a> Validator<'a> {
    pub(super) fn new(ctx: Ctx<'a>) -> Self {
        Self {
            ctx,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Reports a warning (the configuration stays valid), located as [`Self::error`].
    pub(super) fn warn(
        &mut self,
        span: Option<Range<usize>>,
        what: &str,
        message: impl std::fmt::Display,
    ) {
        let offset = span.as_ref().map_or(usize::MAX, |s| s.start);
        let at = self.ctx.at(span);
        self.warnings
            .push((offset, format!("{at}: {what}: {message}")));
    }

    /// The warnings found, in file order.
    pub(super) fn take_warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        w.sort_by_key(|(at, _)| *at);
        w.into_iter().map(|(_, m)| m).collect()
    }

    /// `ORIGIN:LINE:COL` of `span` (see [`Ctx::at`]).
    pub(super) fn at(&self, span: Option<Range<usize>>) -> String {
        self.ctx.at(span)
    }

    /// The problems found, each with the byte offset it was reported at, in file order
    /// (problems found at the same place keep the order found).
    pub(super) fn into_errors(mut self) -> Vec<(usize, String)> {
        self.errors.sort_by_key(|(at, _)| *at);
        self.errors
    }

    /// Reports `message` at `span`, prefixed with `what` (`[listen]`, `authority "a"`;
    /// empty for none).
    pub(super) fn error(
        &mut self,
        span: Option<Range<usize>>,
        what: &str,
        message: impl std::fmt::Display,
    ) {
        let offset = span.as_ref().map_or(usize::MAX, |s| s.start);
        let at = self.ctx.at(span);
        let message = if what.is_empty() {
            format!("{at}: {message}")
        } else {
            format!("{at}: {what}: {message}")
        };
        self.errors.push((offset, message));
    }

    /// Deserializes one table into `T`. On an error, the key it concerns is reported and
    /// dropped and the table tried again, so that every unknown key and every mistyped
    /// value is reported, not only the first. Returns `None` only when an error cannot be
    /// tied to a key.
    pub(super) fn table<'i, T: Deserialize<'i>>(
        &mut self,
        what: &str,
        value: &Spanned<DeValue<'i>>,
    ) -> Option<T> {
        let DeValue::Table(table) = value.get_ref() else {
            self.error(
                Some(value.span()),
                what,
                format!("must be a table, not {}", value.get_ref().type_str()),
            );
            return None;
        };
        let mut table = table.clone();
        loop {
            let attempt = Spanned::new(value.span(), DeValue::Table(table.clone()));
            match T::deserialize(ValueDeserializer::from(attempt)) {
                Ok(t) => return Some(t),
                Err(e) => {
                    let span = e.span();
                    self.error(span.clone().or(Some(value.span())), what, e.message());
                    let culprit = span.and_then(|sp| {
                        table
                            .iter()
                            .find(|(k, v)| covers(&k.span(), &sp) || covers(&v.span(), &sp))
                            .map(|(k, _)| k.get_ref().to_string())
                    });
                    match culprit {
                        Some(key) => {
                            table.remove(key.as_str());
                        }
                        None => return None,
                    }
                }
            }
        }
    }
}

/// Whether `inner` starts inside `outer` (an empty `outer` covers its own start).
pub(super) fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.start < outer.end.max(outer.start + 1)
}

/// SHA-256 of the empty string: a token hash equal to it would let an empty password in.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Parses 64 hex digits (either case) into 32 bytes; `None` for anything else, including
/// the hash of the empty token.
pub(super) fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 || s.eq_ignore_ascii_case(EMPTY_SHA256) {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let hi = char::from(pair[0]).to_digit(16)?;
        let lo = char::from(pair[1]).to_digit(16)?;
        // Two hex digits are at most 255.
        *slot = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}
