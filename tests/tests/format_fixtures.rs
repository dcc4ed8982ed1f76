//! Data written by earlier versions opens with this one: `tests/fixtures/format/` holds an
//! engine's data directory (checkpoint, data files, WAL with every kind of request after the
//! checkpoint) and a snapshot, each written once by `src/bin/make-format-fixtures.rs` and never
//! regenerated. Each is opened (on a copy) and must hold exactly what was written: a change to
//! the log, checkpoint or snapshot formats that stops reading them fails here.

use std::path::{Path, PathBuf};

use cairn_engine::offline;
use cairn_engine::{Access, AuthInfo, Engine, RangeRequest};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/format");

/// Every fixture directory, by name.
fn fixtures() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixture in {FIXTURES}");
    dirs
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// What `make-format-fixtures` wrote, checked whole.
fn check(engine: &Engine, what: &str) {
    let all = engine
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..RangeRequest::default()
        })
        .unwrap();
    let kvs: Vec<(String, String, i64)> = all
        .kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key.to_vec()).unwrap(),
                String::from_utf8(kv.value.to_vec()).unwrap(),
                kv.lease,
            )
        })
        .collect();
    let mut expected: Vec<(String, String, i64)> = vec![
        ("app/guarded".into(), "g".into(), 0),
        ("key/00".into(), "v0-again".into(), 0),
        ("key/01".into(), "v1-again".into(), 0),
    ];
    expected.extend((2..19).map(|i| (format!("key/{i:02}"), format!("v{i}"), 0)));
    expected.extend([
        ("key/last".into(), "end".into(), 0),
        ("leased/a".into(), "la".into(), 100),
        ("txn/a".into(), "ta".into(), 0),
        ("txn/b".into(), "tb".into(), 0),
    ]);
    assert_eq!(kvs, expected, "{what}: the keys");
    assert_eq!(engine.current_revision(), 30, "{what}: the revision");
    assert_eq!(engine.status().compacted_revision, 27, "{what}: the compacted revision");
    assert_eq!(engine.leases().list(), vec![100], "{what}: the leases");
    assert_eq!(
        engine.leases().time_to_live(100, true).keys,
        vec![bytes::Bytes::from("leased/a")],
        "{what}: the lease's keys"
    );
    assert!(engine.maintenance().alarms().is_empty(), "{what}: no alarm");
    let (enabled, revision) = engine.server().auth_status();
    assert!(enabled, "{what}: auth enabled");
    assert_eq!(revision, 8, "{what}: the auth revision");
    let auth = engine.server().auth_read(|a| {
        (
            a.user_names(),
            a.role_names(),
            a.is_root("root"),
            a.user("app").map(|u| u.no_password),
            a.permitted(AuthInfo { user: "app", revision }, b"app/x", b"", Access::Write)
                .is_ok(),
            a.permitted(AuthInfo { user: "app", revision }, b"key/00", b"", Access::Read)
                .is_ok(),
        )
    });
    assert_eq!(
        auth,
        (
            vec!["app".to_string(), "root".to_string()],
            vec!["app-rw".to_string(), "root".to_string()],
            true,
            Some(true),
            true,
            false
        ),
        "{what}: the auth store"
    );
}

#[test]
fn every_fixture_data_dir_opens_with_what_was_written() {
    for fixture in fixtures() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        copy_dir(&fixture.join("data"), &dir);
        let engine = Engine::open(&dir, cairn_tests::format_fixture_config()).unwrap();
        check(&engine, &fixture.display().to_string());
        let members = engine.members().list();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].name, "fixture");
        assert_eq!(members[0].client_urls, vec!["http://127.0.0.1:2379".to_string()]);
        assert_eq!(members[0].peer_urls, vec!["http://127.0.0.1:2380".to_string()]);
        // It goes on from there, and reopens from what it wrote itself.
        engine
            .write(cairn_engine::PutRequest {
                key: b"after".to_vec(),
                value: bytes::Bytes::from("x"),
                ..Default::default()
            })
            .unwrap();
        engine.close().unwrap();
        let engine = Engine::open(&dir, cairn_tests::format_fixture_config()).unwrap();
        assert_eq!(engine.current_revision(), 31);
        engine.close().unwrap();
    }
}

#[test]
fn every_fixture_snapshot_restores_what_was_written() {
    for fixture in fixtures() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("restored");
        let mut snapshot = std::fs::File::open(fixture.join("snapshot.cairn")).unwrap();
        offline::restore(&mut snapshot, &dir).unwrap();
        let engine = Engine::open(&dir, cairn_tests::format_fixture_config()).unwrap();
        check(&engine, &format!("{} (snapshot)", fixture.display()));
        engine.close().unwrap();
    }
}
