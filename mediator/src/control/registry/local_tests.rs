//! The local backend on a real directory: durable create-if-absent, damaged records set
//! aside and named, leftovers of a crash removed, one mediator per directory.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use super::*;
use crate::metrics::Metrics;

fn metrics() -> RegistryMetrics {
    RegistryMetrics::new(&Metrics::new().unwrap()).unwrap()
}

fn record(name: &str, allow: &str) -> Record {
    Record {
        name: name.to_owned(),
        created_at: "2026-12-04T10:00:00.000Z".to_owned(),
        expires_at: None,
        authority: json!({ "name": name, "allow": [allow] })
            .as_object()
            .unwrap()
            .clone(),
    }
}

fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o700)).unwrap();
    d
}

#[tokio::test]
async fn a_record_is_created_once_loaded_and_deleted() {
    let d = dir();
    let store = Local::open(d.path(), "n1".into(), metrics()).unwrap();
    assert_eq!(
        store.create(&record("a", "a.test"), 7, None).await.unwrap(),
        7
    );
    assert!(matches!(
        store.create(&record("a", "b.test"), 8, None).await,
        Err(RegistryError::Exists(n)) if n == "a"
    ));
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.records.len(), 1);
    assert_eq!(loaded.records[0].generation, 7);
    assert_eq!(loaded.records[0].record, record("a", "a.test"));
    // Another generation is not removed.
    assert_eq!(store.delete("a", Some(8)).await.unwrap(), None);
    assert_eq!(store.delete("a", Some(7)).await.unwrap(), Some(0));
    assert_eq!(store.delete("a", None).await.unwrap(), None);
    assert!(store.load().await.unwrap().records.is_empty());
    // Nothing but the record ever lived in the directory.
    let left: Vec<_> = fs::read_dir(d.path().join("authorities"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn damaged_records_are_set_aside_and_named_and_the_others_load() {
    let d = dir();
    let store = Local::open(d.path(), "n1".into(), metrics()).unwrap();
    for name in ["good", "flipped", "garbage", "moved"] {
        store
            .create(&record(name, "x.test"), 1, None)
            .await
            .unwrap();
    }
    let records = d.path().join("authorities");
    // One byte of a host changed: still JSON, still a valid grant, but not what was
    // acknowledged. The seal refuses it.
    let path = records.join("flipped.json");
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text.replace("x.test", "y.test")).unwrap();
    fs::write(records.join("garbage.json"), b"{\"format\": 1, \"genera").unwrap();
    // A record under another authority's name.
    fs::rename(records.join("moved.json"), records.join("other.json")).unwrap();
    // A link is never followed.
    std::os::unix::fs::symlink("/etc/hostname", records.join("link.json")).unwrap();
    // A write a crash interrupted: never acknowledged, removed.
    fs::write(records.join(".half.json.123.tmp"), b"{").unwrap();

    let loaded = store.load().await.unwrap();
    let names: Vec<&str> = loaded
        .records
        .iter()
        .map(|s| s.record.name.as_str())
        .collect();
    assert_eq!(names, ["good"]);
    let mut why: Vec<(String, String)> = loaded
        .rejected
        .iter()
        .map(|r| (r.what.clone(), r.why.clone()))
        .collect();
    why.sort();
    assert_eq!(why.len(), 4, "{why:?}");
    let link = why.remove(2);
    assert!(link.0.ends_with("link.json.rejected"), "{link:?}");
    assert!(link.1.contains("not a regular file"), "{link:?}");
    assert!(why[0].0.ends_with("flipped.json.rejected"), "{why:?}");
    assert!(why[0].1.contains("SHA-256 does not match"), "{why:?}");
    assert!(why[1].0.ends_with("garbage.json.rejected"), "{why:?}");
    assert!(why[1].1.contains("not a stored authority"), "{why:?}");
    assert!(why[2].0.ends_with("other.json.rejected"), "{why:?}");
    assert!(why[2].1.contains("stored as \"other\""), "{why:?}");
    assert!(loaded.rejected.iter().all(|r| r.kind == ErrorKind::Damaged));
    assert!(!records.join(".half.json.123.tmp").exists());
    // Set aside, not lost: the files are there to be looked at; the next load is clean.
    assert!(records.join("flipped.json.rejected").exists());
    let again = store.load().await.unwrap();
    assert!(again.rejected.is_empty());
    // A name set aside twice keeps both copies.
    fs::write(records.join("garbage.json"), b"nope").unwrap();
    let third = store.load().await.unwrap();
    assert!(third.rejected[0].what.ends_with("garbage.json.rejected.1"));
}

#[tokio::test]
async fn set_aside_renames_a_record_that_is_not_valid_here() {
    let d = dir();
    let store = Local::open(d.path(), "n1".into(), metrics()).unwrap();
    store.create(&record("a", "x.test"), 1, None).await.unwrap();
    let what = store.set_aside("a").await;
    assert!(what.ends_with("authorities/a.json.rejected"), "{what}");
    assert!(store.load().await.unwrap().records.is_empty());
}

#[tokio::test]
async fn the_start_counter_counts_and_a_damaged_one_stops_the_start() {
    let d = dir();
    {
        let store = Local::open(d.path(), "n1".into(), metrics()).unwrap();
        assert_eq!(store.boot().await.unwrap(), 0);
        assert_eq!(store.boot().await.unwrap(), 1);
    }
    let store = Local::open(d.path(), "n1".into(), metrics()).unwrap();
    assert_eq!(store.boot().await.unwrap(), 2);
    fs::write(d.path().join("boot"), b"x\n").unwrap();
    let e = store.boot().await.unwrap_err().to_string();
    assert!(e.contains("not a number"), "{e}");
}

#[test]
fn one_mediator_per_directory() {
    let d = dir();
    let _first = Local::open(d.path(), "n1".into(), metrics()).unwrap();
    let e = Local::open(d.path(), "n1".into(), metrics()).unwrap_err();
    assert!(matches!(e, RegistryError::Locked { .. }), "{e}");
    assert!(e.to_string().contains("in use by another mediator"), "{e}");
}

#[test]
fn a_directory_others_can_write_is_refused() {
    let d = dir();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let e = Local::open(d.path(), "n1".into(), metrics())
        .unwrap_err()
        .to_string();
    assert!(e.contains("writable by group or others"), "{e}");
}

#[test]
fn a_missing_directory_is_made_private() {
    let d = dir();
    let state = d.path().join("a/b");
    let _store = Local::open(&state, "n1".into(), metrics()).unwrap();
    let mode = fs::metadata(&state).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}
