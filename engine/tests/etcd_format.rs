//! etcd's snapshot format both ways, within cairn: a state exported as an etcd database
//! (`Maintenance::snapshot_etcd`) restores (`offline::import_etcd`) to the same
//! history, compaction, leases, users and roles. etcd's own tools read the same files in
//! `server/tests/etcd_export.rs`.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;

use cairn_engine::offline;
use cairn_engine::{
    Access, AuthChange, Config, DeleteRangeRequest, Engine, MemberAttributes, Permission, PutRequest, RangeRequest,
};

/// A key-value as read: key, value, create and mod revisions, version, lease.
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

fn everything(engine: &Engine, at: i64) -> Vec<Kv> {
    let r = engine.range(&RangeRequest::all().at_revision(at)).unwrap();
    r.kvs
        .into_iter()
        .map(|kv| {
            (
                kv.key.to_vec(),
                kv.value.to_vec(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                kv.lease,
            )
        })
        .collect()
}

#[test]
fn a_state_exported_in_etcds_format_restores_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path().join("source"), Config::default()).unwrap();
    for i in 0..300 {
        engine.put(format!("k{:02}", i % 23), format!("v{i}")).unwrap();
        if i % 13 == 4 {
            engine.delete(format!("k{:02}", (i + 5) % 23)).unwrap();
        }
    }
    let compacted = engine.current_revision() - 100;
    engine.compact(compacted).unwrap();
    engine.maintenance().wait_compacted().unwrap();
    let lease = engine.leases().grant(0, 600).unwrap().response.id;
    engine.write(PutRequest::new("leased", "x").with_lease(lease)).unwrap();
    engine.write(DeleteRangeRequest::key("k00")).unwrap();
    for change in [
        AuthChange::UserAdd {
            name: "alice".into(),
            password_hash: Some("$2b$04$hash".into()),
            no_password: false,
        },
        AuthChange::RoleAdd { name: "app".into() },
        AuthChange::RoleGrantPermission {
            name: "app".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"app/".to_vec(),
                range_end: b"app0".to_vec(),
            },
        },
        AuthChange::UserGrantRole {
            user: "alice".into(),
            role: "app".into(),
        },
    ] {
        engine.server().auth_change_async(change, None).unwrap().wait().unwrap();
    }
    let file = std::fs::File::create_new(dir.path().join("snap.db")).unwrap();
    let (_, len) = engine.maintenance().snapshot_etcd(file).unwrap();
    assert_eq!(len % 4096, 0);

    let members = BTreeMap::from([(7u64, MemberAttributes::with_peer_urls(vec!["http://new:2380".into()]))]);
    let restored_dir = dir.path().join("restored");
    offline::import_etcd(&dir.path().join("snap.db"), &restored_dir, &members, true).unwrap();
    let restored = Engine::builder(&restored_dir).member(7).open().unwrap();
    let current = engine.current_revision();
    assert_eq!(restored.current_revision(), current);
    assert_eq!(restored.status().compacted_revision, compacted);
    for at in [compacted, compacted + 1, (compacted + current) / 2, current] {
        assert_eq!(everything(&restored, at), everything(&engine, at), "at revision {at}");
    }
    assert_eq!(restored.leases().list(), vec![lease]);
    assert_eq!(restored.server().lease_keys(lease), engine.server().lease_keys(lease));
    assert_eq!(restored.server().auth_status(), engine.server().auth_status());
    assert!(restored.server().auth_read(|a| a.has_role("alice", "app")));
    assert_eq!(
        restored.server().auth_read(|a| a.role("app").cloned()),
        engine.server().auth_read(|a| a.role("app").cloned())
    );
    assert_eq!(
        restored.maintenance().hash_kv(0).unwrap().hash,
        engine.maintenance().hash_kv(0).unwrap().hash
    );
}
