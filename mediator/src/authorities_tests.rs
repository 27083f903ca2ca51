//! Unit tests of `authorities`: the successor chain a reload leaves behind.

use std::sync::Arc;

use super::*;
use crate::limits::InForce;
use crate::signal::Signals;

const CONFIG: &str = r#"
[[authority]]
name = "agent-a"
allow = ["api.test"]
"#;

/// A fresh entry of the same authority, as a reload re-creates it.
fn generation(n: u64) -> Arc<Live> {
    let mut config = policy::config::parse(CONFIG, "m.toml").unwrap();
    let authority = Arc::new(config.authorities.remove(0));
    let birth = Birth {
        generation: n,
        origin: Origin::Config,
        created: None,
        expires_at: None,
    };
    let in_force = InForce::derive(&config.limits, 4096, 0);
    Arc::new(Live::new(
        authority,
        birth,
        None,
        &Signals::new(),
        &in_force,
    ))
}

/// Re-creates `old` as `new`, the way `control` does: successor first, then the swap.
fn reload(set: &LiveSet, old: &Arc<Live>, new: &Arc<Live>) {
    set.succeed(&old.authority, new);
    set.swap(old, Arc::clone(new)).unwrap();
}

/// A set whose first generation was reloaded as a second one: the set, both entries,
/// and the grant a connection of the first generation holds (nothing else).
fn reloaded_once() -> (LiveSet, Arc<Live>, Arc<Live>, Arc<Authority>) {
    let set = LiveSet::default();
    let first = generation(1);
    set.insert(Arc::clone(&first)).unwrap();
    let held = Arc::clone(&first.authority);
    let second = generation(2);
    reload(&set, &first, &second);
    (set, first, second, held)
}

#[test]
fn a_connection_two_reloads_old_finds_the_newest_entry_after_the_middle_one_is_gone() {
    let (set, first, second, held) = reloaded_once();
    drop(first);
    let third = generation(3);
    reload(&set, &second, &third);
    // Nothing holds the middle generation any more: no connection, not the map.
    drop(second);
    let current = set.current_of(&held).expect("the newest generation");
    assert_eq!(current.generation, 3);
}

#[test]
fn a_revoked_successor_leaves_the_old_grant_with_no_entry() {
    let (set, _first, second, held) = reloaded_once();
    assert_eq!(set.current_of(&held).unwrap().generation, 2);
    drop(set.remove("agent-a"));
    drop(second);
    assert!(set.current_of(&held).is_none());
}
