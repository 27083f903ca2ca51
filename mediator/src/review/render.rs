//! How `mediator diff` shows a review: text for a person (one block per authority, a
//! line per change marked `+` widened, `-` narrowed, `~` changed, its detail below, a
//! summary last), or JSON for a bot (the review as `policy::review` makes it, with the
//! two sides named and the exit status).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use policy::review::{Change, Direction, Outcome, Review, Status};
use serde_json::json;

/// How the two sides are named in the output.
pub(super) struct Labels<'a> {
    /// OLD: a file, or the admin API.
    pub(super) old: &'a str,
    /// NEW: a file.
    pub(super) new: &'a str,
}

/// The review as JSON (one object and a newline).
pub(super) fn json(review: &Review, labels: &Labels<'_>, code: u8) -> String {
    let mut v = serde_json::to_value(review).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        map.insert("old".into(), json!(labels.old));
        map.insert("new".into(), json!(labels.new));
        map.insert("exit".into(), json!(code));
    }
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

/// The review as text.
pub(super) fn text(review: &Review, labels: &Labels<'_>, code: u8) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "old: {}\nnew: {}", labels.old, labels.new);
    for a in &review.authorities {
        let status = match a.status {
            Status::Added => "added",
            Status::Removed => "removed",
            Status::Changed => "changed",
        };
        let _ = writeln!(s, "\nauthority {:?} ({status})", a.name);
        if a.changes.is_empty() {
            let _ = writeln!(s, "  (it reaches nothing)");
        }
        changes(&mut s, &a.changes);
    }
    if !review.global.is_empty() {
        let _ = writeln!(s, "\n[global] (every authority)");
        changes(&mut s, &review.global);
    }
    if !review.sections.is_empty() {
        let _ = writeln!(s, "\nother sections");
        changes(&mut s, &review.sections);
    }
    for note in &review.notes {
        let _ = writeln!(s, "\nnote: {note}");
    }
    let count = |d: Direction| {
        let classes: BTreeSet<&str> = review
            .changes()
            .filter(|c| c.direction == d)
            .map(|c| c.class.as_str())
            .collect();
        let n = review.changes().filter(|c| c.direction == d).count();
        if classes.is_empty() {
            format!("{n} {}", d.as_str())
        } else {
            let list: Vec<&str> = classes.into_iter().collect();
            format!("{n} {} ({})", d.as_str(), list.join(", "))
        }
    };
    let _ = writeln!(
        s,
        "\n{}, {}, {}: {} (exit {code})",
        count(Direction::Widened),
        count(Direction::Narrowed),
        count(Direction::Changed),
        verdict(review)
    );
    s
}

/// The last line's word: the outcome, except that a review with changes and neither a
/// widening nor a narrowing (words, tokens, sections) says so rather than "narrowed"
/// (its exit status is still 1).
fn verdict(review: &Review) -> String {
    let narrowed = review.changes().any(|c| c.direction == Direction::Narrowed);
    if review.outcome == Outcome::Narrowed && !narrowed {
        "CHANGED, NOT WIDENED".to_owned()
    } else {
        review.outcome.as_str().to_uppercase()
    }
}

fn changes(s: &mut String, list: &[Change]) {
    for c in list {
        let mark = match c.direction {
            Direction::Widened => '+',
            Direction::Narrowed => '-',
            Direction::Changed => '~',
        };
        let _ = writeln!(
            s,
            "  {mark} {:<8} {:<15} {}\n      {}",
            c.direction.as_str(),
            c.class.as_str(),
            c.entry,
            c.detail
        );
    }
}
