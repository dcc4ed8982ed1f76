//! `make-format-fixtures <out-dir>`: writes an engine's data directory and a snapshot in
//! today's on-disk formats, for `tests/format_fixtures.rs` to open with every later version.
//!
//! ```text
//! cargo run -p cairn-tests --bin make-format-fixtures -- tests/fixtures/format/<name>
//! ```
//!
//! The engine (member 1, alone) logs every kind of request there is: puts (plain, with a lease,
//! with prev_kv), deletes, a nested txn, a compaction, lease grants, a revoke and a checkpoint
//! of remaining TTLs, a member's update and its published attributes, an alarm raised and
//! disarmed, users, roles and permissions, auth enabled, an authentication, and a write guarded
//! by the auth revision. A checkpoint is taken in the middle, so opening replays the log after
//! it: `data/` holds the checkpoint (format 6), the data files and the WAL. `snapshot.cairn` is
//! the engine's snapshot (format 5) at the end. A fixture is committed once and never
//! regenerated: a format change must keep reading it (`tests/fixtures/format/README.md`).

use std::path::Path;
use std::process::ExitCode;

use bytes::Bytes;
use cairn_engine::{
    Access, Alarm, AuthChange, Compare, CompareResult, CompareTarget, DeleteRangeRequest, Engine, Permission,
    PutRequest, RequestOp, TxnRequest,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: make-format-fixtures <out-dir>");
        return ExitCode::from(2);
    };
    match run(Path::new(out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make-format-fixtures: {e}");
            ExitCode::FAILURE
        }
    }
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..PutRequest::default()
    }
}

fn run(out: &Path) -> Result<()> {
    if out.exists() {
        return Err(format!("{} exists: fixtures are written once, never regenerated", out.display()).into());
    }
    let data = out.join("data");
    let engine = Engine::open(&data, cairn_tests::format_fixture_config())?;
    for i in 0..20 {
        engine.write(put(&format!("key/{i:02}"), &format!("v{i}")))?;
    }
    engine.write(PutRequest {
        prev_kv: true,
        ..put("key/00", "v0-again")
    })?;
    engine.write(DeleteRangeRequest {
        key: b"key/19".to_vec(),
        ..DeleteRangeRequest::default()
    })?;
    let leased = engine.leases().grant(100, 3600)?.response.id;
    engine.write(PutRequest {
        lease: leased,
        ..put("leased/a", "la")
    })?;
    let doomed = engine.leases().grant(200, 3600)?.response.id;
    engine.write(PutRequest {
        lease: doomed,
        ..put("doomed/a", "da")
    })?;
    engine.leases().revoke(doomed)?;
    engine.leases().checkpoint_now()?;
    let nested = TxnRequest {
        compare: vec![Compare {
            key: b"key/01".to_vec(),
            range_end: Vec::new(),
            target: CompareTarget::Version(1),
            result: CompareResult::Equal,
        }],
        success: vec![
            RequestOp::Put(put("txn/a", "ta")),
            RequestOp::Txn(TxnRequest {
                success: vec![RequestOp::Put(put("txn/b", "tb"))],
                ..TxnRequest::default()
            }),
        ],
        failure: vec![RequestOp::Put(put("txn/never", "x"))],
    };
    engine.txn(nested)?;
    let compact_at = engine.write(put("key/01", "v1-again"))?.revision;
    engine.compact(compact_at - 1)?;
    engine.maintenance().wait_compacted()?;

    // The middle: a checkpoint; everything after it is replayed from the log on open.
    engine.maintenance().checkpoint()?;

    engine.members().update(1, vec!["http://127.0.0.1:2380".into()])?;
    engine
        .server()
        .member_publish("fixture".into(), vec!["http://127.0.0.1:2379".into()])?;
    engine.maintenance().alarm_activate(0, Alarm::NoSpace)?;
    engine.maintenance().alarm_disarm(0, Alarm::NoSpace)?;
    let changes = [
        AuthChange::UserAdd {
            name: "root".into(),
            password_hash: Some("$2a$04$fixturefixturefixturefuVdTAfg6rjuUfGq3Z6LHYpSF0D.NyCG".into()),
            no_password: false,
        },
        AuthChange::RoleAdd { name: "root".into() },
        AuthChange::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        AuthChange::UserAdd {
            name: "app".into(),
            password_hash: None,
            no_password: true,
        },
        AuthChange::RoleAdd { name: "app-rw".into() },
        AuthChange::RoleGrantPermission {
            name: "app-rw".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"app/".to_vec(),
                range_end: b"app0".to_vec(),
            },
        },
        AuthChange::UserGrantRole {
            user: "app".into(),
            role: "app-rw".into(),
        },
        AuthChange::Enable,
    ];
    for change in changes {
        engine.server().auth_change_async(change, None)?.wait()?;
    }
    let (_, revision) = engine.server().auth_status();
    engine
        .server()
        .authenticate_async("root".into(), "fixturetokenabcd".into(), revision)?
        .wait()?;
    engine
        .server()
        .write_async_as(put("app/guarded", "g"), Some(revision))?
        .wait()?;
    engine.write(put("key/last", "end"))?;

    let mut snapshot = std::fs::File::create(out.join("snapshot.cairn"))?;
    engine.maintenance().snapshot(&mut snapshot)?;
    snapshot.sync_all()?;
    engine.close()?;
    println!("wrote {}", out.display());
    Ok(())
}
