//! The review of a whole configuration against another (`mediator diff`): per authority
//! added, removed or changed, with its [`Change`]s; the `[global] deny` list once (it
//! binds every authority); the other sections by fingerprint (they are not grants, and a
//! reload does not apply them). Its [`Outcome`] is what a gate acts on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::change::{Change, Direction, RiskClass};
use super::compare::{compare, compare_global};
use super::exposure::{self, Exposure};
use super::{Reach, Sources};
use crate::config::Config;
use crate::error::PolicyError;
use crate::grant::DenyEntry;

/// One side of a review: a configuration file, or what a running mediator serves.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// The authorities the side defines (a file's, or a running mediator's from its file).
    pub authorities: Vec<Reach>,
    /// Authorities a reload keeps whatever the file says (a running mediator's, created
    /// through the admin API): never reported removed.
    pub kept: Vec<Reach>,
    /// `[global] deny`.
    pub global_deny: Vec<DenyEntry>,
    /// A fingerprint of each section that is not a grant (`upstream`, `resolver`, ...);
    /// `None` when not known (a running mediator does not serve them).
    pub sections: Option<BTreeMap<String, String>>,
    /// The listeners, anonymous admin writes and `[resolver] hosts`, compared one by one;
    /// `None` when not known (a running mediator does not serve them).
    pub exposure: Option<Exposure>,
}

impl Side {
    /// The side a configuration file makes: its authorities (credential sources named,
    /// so that a different secret shows), its global deny list, its sections.
    pub fn of_config(c: &Config) -> Self {
        let mut sections = BTreeMap::new();
        let mut put = |name: &str, value: String| {
            sections.insert(name.to_owned(), value);
        };
        put("listen", format!("{:?}", c.listen));
        put("resolver", format!("{:?}", c.resolver));
        put("upstream", format!("{:?}", c.upstream));
        put("timeouts", format!("{:?}", c.timeouts));
        put("limits", format!("{:?}", c.limits));
        put(
            "log",
            format!("{:?} {:?} {:?}", c.log, c.log_format, c.log_instance),
        );
        put("telemetry", format!("{:?}", c.otlp_endpoint));
        put("tls", format!("{:?}", c.tls));
        put("registry", format!("{:?}", c.registry));
        Self {
            authorities: c
                .authorities
                .iter()
                .map(|a| Reach::of(a, Sources::Shown))
                .collect(),
            kept: Vec::new(),
            global_deny: c.global_deny.clone(),
            sections: Some(sections),
            exposure: Some(Exposure::of(c)),
        }
    }
}

/// How an authority fares in a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Only the new side defines it.
    Added,
    /// Only the old side defines it.
    Removed,
    /// Both define it, differently.
    Changed,
}

/// One authority's part of a review.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorityReview {
    /// Its name.
    pub name: String,
    /// Added, removed or changed.
    pub status: Status,
    /// What changed (for an added authority: all it may reach; for a removed one: all it
    /// could).
    pub changes: Vec<Change>,
}

/// What a review concludes, for a gate: the exit status of `mediator diff` (0, 1, 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing changed.
    Unchanged,
    /// Something changed and nothing widened: narrowed, or words, tokens or sections.
    Narrowed,
    /// Something widened (or may widen).
    Widened,
}

impl Outcome {
    /// `unchanged`, `narrowed` or `widened`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Narrowed => "narrowed",
            Self::Widened => "widened",
        }
    }

    /// The outcome of a list of changes.
    pub fn of<'a>(changes: impl IntoIterator<Item = &'a Change>) -> Self {
        changes
            .into_iter()
            .map(|c| match c.direction {
                Direction::Widened => Self::Widened,
                Direction::Narrowed | Direction::Changed => Self::Narrowed,
            })
            .max()
            .unwrap_or(Self::Unchanged)
    }
}

/// A whole review.
#[derive(Debug, Clone, Serialize)]
pub struct Review {
    /// Widened, narrowed or unchanged.
    pub outcome: Outcome,
    /// The authorities that differ, the new side's order first, then the removed ones.
    pub authorities: Vec<AuthorityReview>,
    /// Changes of `[global] deny` (they bind every authority, those created through the
    /// admin API too).
    pub global: Vec<Change>,
    /// Sections that are not grants and differ.
    pub sections: Vec<Change>,
    /// What the review could not judge, or what a reviewer should know besides.
    pub notes: Vec<String>,
}

impl Review {
    /// Every change of the review.
    pub fn changes(&self) -> impl Iterator<Item = &Change> {
        self.authorities
            .iter()
            .flat_map(|a| &a.changes)
            .chain(&self.global)
            .chain(&self.sections)
    }
}

/// Reviews `new` against `old`.
///
/// # Errors
/// [`PolicyError`] when a side does not validate (a view read from a running mediator
/// that this build refuses).
pub fn diff(old: &Side, new: &Side) -> Result<Review, PolicyError> {
    let mut authorities = Vec::new();
    let mut notes = Vec::new();
    let find = |list: &'_ [Reach], name: &str| list.iter().position(|r| r.name == name);
    for n in &new.authorities {
        let (status, changes) = match find(&old.authorities, &n.name) {
            Some(i) => (
                Status::Changed,
                compare(
                    Some((&old.authorities[i], &old.global_deny)),
                    Some((n, &new.global_deny)),
                )?,
            ),
            None => {
                if find(&old.kept, &n.name).is_some() {
                    notes.push(format!(
                        "authority {:?} is held by the registry (created through the admin API): a reload of this file is refused until it is deleted there (a name is either config or api)",
                        n.name
                    ));
                }
                (Status::Added, compare(None, Some((n, &new.global_deny)))?)
            }
        };
        if !changes.is_empty() || status == Status::Added {
            authorities.push(AuthorityReview {
                name: n.name.clone(),
                status,
                changes,
            });
        }
    }
    for o in &old.authorities {
        if find(&new.authorities, &o.name).is_none() {
            authorities.push(AuthorityReview {
                name: o.name.clone(),
                status: Status::Removed,
                changes: compare(Some((o, &old.global_deny)), None)?,
            });
        }
    }
    let global = compare_global(&old.global_deny, &new.global_deny)?;
    if !old.kept.is_empty() {
        let names: Vec<&str> = old.kept.iter().map(|r| r.name.as_str()).collect();
        notes.push(format!(
            "{} created through the admin API ({}) {} kept by a reload and not compared{}",
            if names.len() == 1 {
                "1 authority"
            } else {
                "authorities"
            },
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" },
            if global.is_empty() {
                ""
            } else {
                "; the [global] changes below apply to them too"
            }
        ));
    }
    let exposed = match (&old.exposure, &new.exposure) {
        (Some(o), Some(n)) => exposure::compare(o, n),
        _ => Vec::new(),
    };
    let sections = match (&old.sections, &new.sections) {
        (Some(o), Some(n)) => exposed.into_iter().chain(sections(o, n)).collect(),
        _ => {
            notes.push(
                "sections other than [global] and [[authority]] are not compared: a running mediator does not serve them (and a reload does not apply them)".to_owned(),
            );
            Vec::new()
        }
    };
    let mut review = Review {
        outcome: Outcome::Unchanged,
        authorities,
        global,
        sections,
        notes,
    };
    review.outcome = Outcome::of(review.changes());
    // An authority added with no reach at all is still a change.
    if review.outcome == Outcome::Unchanged && !review.authorities.is_empty() {
        review.outcome = Outcome::Narrowed;
    }
    Ok(review)
}

/// The sections whose fingerprints differ.
fn sections(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<Change> {
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| old.get(*n) != new.get(*n))
        .map(|n| {
            Change::new(
                RiskClass::Section,
                Direction::Changed,
                format!("[{n}]"),
                format!("[{n}] changed: not a grant; a reload leaves it as it runs, the next start applies it"),
            )
        })
        .collect()
}
