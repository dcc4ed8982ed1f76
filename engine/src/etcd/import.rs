//! Reading an etcd database into cairn's state: a snapshot `etcdctl snapshot save` wrote (its
//! SHA-256 trailer checked), or a stopped member's `member/snap/db`. The whole history since
//! etcd's last compaction comes across with its revisions exactly, and the leases and the auth
//! store with it; the membership is the new cluster's.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use prost::Message;
use sha2::{Digest, Sha256};

use super::bbolt::read::Db;
use super::bbolt::BoltError;
use super::pb;
use crate::auth::{Access, AuthStore, Permission, Role, User};
use crate::backend::record::Record;
use crate::error::{Error, Failure, Result};
use crate::lease::lessor::LeaseRecord;
use crate::revision::Revision;

/// What an etcd database holds besides its history.
#[derive(Debug)]
pub(crate) struct Imported {
    /// The revision the store is at: the newest in history, or a compaction's if later.
    pub(crate) current: i64,
    /// The revision compacted up to.
    pub(crate) compacted: i64,
    pub(crate) leases: Vec<LeaseRecord>,
    pub(crate) auth: AuthStore,
}

fn bad(what: impl Into<String>) -> Error {
    Error::Snapshot(Failure::new(what))
}

impl From<BoltError> for Error {
    fn from(e: BoltError) -> Error {
        Error::Snapshot(Failure::caused_by("the etcd database", e))
    }
}

/// Whether `file` is a bbolt database (etcd's format): a meta page's magic at byte 16.
pub(crate) fn is_etcd_db(file: &mut File) -> Result<bool> {
    let mut head = [0u8; 20];
    match file.read_exact(&mut head) {
        Ok(()) => Ok(head.get(16..20) == Some(&super::bbolt::MAGIC.to_le_bytes()[..])),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(Error::Snapshot(Failure::caused_by("read the snapshot", e))),
    }
}

/// An etcd database open for reading, while another thread checks its SHA-256 trailer.
pub(crate) struct Opened {
    pub(crate) db: Db,
    /// The trailer's check, running; `None` when skipped.
    check: Option<crate::thread::Worker<Result<()>>>,
}

impl Opened {
    /// Waits for the trailer's check and returns `outcome` (what reading the database gave),
    /// unless the trailer does not match: that is the error then, whatever reading found, since
    /// it tells why.
    pub(crate) fn checked<T>(self, outcome: Result<T>) -> Result<T> {
        if let Some(check) = self.check {
            check.join()??;
        }
        outcome
    }
}

/// Opens an etcd database. A snapshot ends with a SHA-256 of the rest (its length is then 32
/// past a multiple of 512, as etcd tells): it must match, unless `skip_hash_check`; it is
/// checked on another thread while the caller reads, and [`Opened::checked`] gives the
/// verdict. A file without one (a member's `member/snap/db`) needs `skip_hash_check`, as with
/// etcdutl.
pub(crate) fn open(path: &Path, skip_hash_check: bool) -> Result<Opened> {
    let io = |e| Error::Snapshot(Failure::caused_by(format!("read {}", path.display()), e));
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let trailer = len % 512 == 32;
    if !trailer && !skip_hash_check {
        return Err(bad(
            "the snapshot has no SHA-256 trailer (a member's db file needs --skip-hash-check)",
        ));
    }
    let check = if trailer && !skip_hash_check {
        let hashed = file.try_clone().map_err(io)?;
        let path = path.to_path_buf();
        let check = crate::thread::start("cairn-snapshot-hash", move || check_trailer(&hashed, len - 32, &path))?;
        Some(check)
    } else {
        None
    };
    Ok(Opened {
        db: Db::open(file)?,
        check,
    })
}

/// Checks that the 32 bytes at `len` are the SHA-256 of the `len` before them.
fn check_trailer(file: &File, len: u64, path: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let io = |e| Error::Snapshot(Failure::caused_by(format!("read {}", path.display()), e));
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from((len - at).min(buf.len() as u64)).unwrap_or(buf.len());
        let chunk = buf.get_mut(..n).unwrap_or_default();
        file.read_exact_at(chunk, at).map_err(io)?;
        hash.update(&*chunk);
        at += n as u64;
    }
    let mut expected = [0u8; 32];
    file.read_exact_at(&mut expected, len).map_err(io)?;
    let got = hash.finalize();
    if got.as_slice() != expected {
        return Err(bad(format!(
            "the snapshot's SHA-256 does not match its content: expected {}, got {}",
            hex(&expected),
            hex(&got)
        )));
    }
    Ok(())
}

/// The hash `etcdutl snapshot status` prints: a CRC-32C of each bucket's name followed by its
/// keys and values, bucket after bucket and key after key in order.
pub(crate) fn status_hash(db: &Db) -> Result<u32> {
    let mut crc = 0u32;
    for (name, root) in db.buckets()? {
        crc = crc32c::crc32c_append(crc, &name);
        db.for_each(&root, |k, v| {
            crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, k), v);
            Ok::<_, Error>(())
        })?;
    }
    Ok(crc)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `key` bucket key: main and sub revision, big-endian around `_`, then `t` for a delete.
fn revision_key(key: &[u8]) -> Option<(Revision, bool)> {
    let main = i64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    if key.get(8) != Some(&b'_') {
        return None;
    }
    let sub = i64::from_be_bytes(key.get(9..17)?.try_into().ok()?);
    let tombstone = match key.get(17..) {
        Some([]) => false,
        Some([b't']) => true,
        _ => return None,
    };
    (main >= 0 && sub >= 0).then_some((Revision::new(main, sub), tombstone))
}

/// Calls `each` with every revision in the database's history, in order, and returns the rest
/// of its state.
pub(crate) fn read(db: &Db, mut each: impl FnMut(Record<'_>) -> Result<()>) -> Result<Imported> {
    let buckets: BTreeMap<Vec<u8>, _> = db.buckets()?.into_iter().collect();
    let get = |name: &str| buckets.get(name.as_bytes());

    // Compaction: 17-byte revision keys in `meta`.
    let (mut finished, mut scheduled) = (0i64, 0i64);
    if let Some(meta) = get("meta") {
        db.for_each(meta, |k, v| {
            let rev = revision_key(v).map_or(0, |(rev, _)| rev.main);
            match k {
                b"finishedCompactRev" => finished = rev,
                b"scheduledCompactRev" => scheduled = rev,
                _ => {}
            }
            Ok::<_, Error>(())
        })?;
    }
    let compacted = finished.max(scheduled);
    // A compaction that finished leaves each key at most one revision at or before it: its
    // last put if it lives, or (etcd 3.6 and later) the tombstone that ended it, whose puts are
    // gone. Such a tombstone deletes nothing. One that did not finish may have left whole
    // generations behind, and then the keys are tracked to tell.
    let finished_cleanly = scheduled <= finished;

    let mut last: Option<Revision> = None;
    // Keys with a live generation, up to the compacted revision, after a compaction that did
    // not finish. Every tombstone past the compaction ends a generation whose put is in the
    // file, since a compaction keeps each live key's last put, so from the first revision past
    // it on no key is tracked.
    let mut live: foldhash::HashSet<Vec<u8>> = foldhash::HashSet::default();
    let mut kv = pb::KeyValue::default();
    if let Some(keys) = get("key") {
        db.for_each(keys, |k, v| {
            let (rev, tombstone) =
                revision_key(k).ok_or_else(|| bad(format!("a key bucket entry {} is not a revision", hex(k))))?;
            if last.is_some_and(|l| rev <= l) {
                return Err(bad(format!("revision {rev} is out of order")));
            }
            last = Some(rev);
            let compacted_away = rev.main <= compacted;
            if tombstone && compacted_away && finished_cleanly {
                return Ok(());
            }
            let tracked = compacted_away && !finished_cleanly;
            if !tracked && !live.is_empty() {
                live = foldhash::HashSet::default();
            }
            // One KeyValue for them all: decoding into it reuses its buffers.
            kv.clear();
            kv.merge(v).map_err(|e| {
                Error::Snapshot(Failure::caused_by(format!("revision {rev}'s value does not decode"), e))
            })?;
            if kv.key.is_empty() {
                return Err(bad(format!("revision {rev} has an empty key")));
            }
            if tombstone {
                if tracked && !live.remove(&kv.key) {
                    return Ok(());
                }
                return each(Record {
                    rev,
                    created: Revision::default(),
                    version: 0,
                    lease: 0,
                    key: &kv.key,
                    value: &[],
                });
            }
            if kv.version < 1 || kv.create_revision < 1 {
                return Err(bad(format!(
                    "revision {rev} has version {} and create revision {}",
                    kv.version, kv.create_revision
                )));
            }
            each(Record {
                rev,
                created: Revision::new(kv.create_revision, 0),
                version: kv.version,
                lease: kv.lease,
                key: &kv.key,
                value: &kv.value,
            })?;
            if tracked && !live.contains(&kv.key) {
                live.insert(kv.key.clone());
            }
            Ok(())
        })?;
    }

    let mut leases = Vec::new();
    if let Some(bucket) = get("lease") {
        db.for_each(bucket, |_, v| {
            let l =
                pb::Lease::decode(v).map_err(|e| Error::Snapshot(Failure::caused_by("a lease does not decode", e)))?;
            leases.push(LeaseRecord {
                id: l.id,
                ttl: l.ttl,
                remaining_ttl: l.remaining_ttl,
            });
            Ok::<_, Error>(())
        })?;
    }
    let auth = read_auth(db, get("auth"), get("authUsers"), get("authRoles"))?;
    let newest = last.map_or(0, |l| l.main);
    Ok(Imported {
        current: newest.max(compacted).max(1),
        compacted,
        leases,
        auth,
    })
}

fn read_auth(
    db: &Db,
    auth: Option<&super::bbolt::BucketRoot>,
    users: Option<&super::bbolt::BucketRoot>,
    roles: Option<&super::bbolt::BucketRoot>,
) -> Result<AuthStore> {
    let (mut enabled, mut revision) = (false, 1u64);
    if let Some(bucket) = auth {
        db.for_each(bucket, |k, v| {
            match k {
                b"authEnabled" => enabled = v == [1],
                b"authRevision" => {
                    revision = v.try_into().map(u64::from_be_bytes).unwrap_or(revision);
                }
                _ => {}
            }
            Ok::<_, Error>(())
        })?;
    }
    let mut user_map = BTreeMap::new();
    if let Some(bucket) = users {
        db.for_each(bucket, |_, v| {
            let u =
                pb::User::decode(v).map_err(|e| Error::Snapshot(Failure::caused_by("a user does not decode", e)))?;
            let name = String::from_utf8_lossy(&u.name).into_owned();
            let mut roles = u.roles;
            roles.sort();
            let user = User {
                name: name.clone(),
                password_hash: (!u.password.is_empty()).then(|| String::from_utf8_lossy(&u.password).into_owned()),
                no_password: u.options.is_some_and(|o| o.no_password),
                roles,
            };
            user_map.insert(name, user);
            Ok::<_, Error>(())
        })?;
    }
    let mut role_map = BTreeMap::new();
    if let Some(bucket) = roles {
        db.for_each(bucket, |_, v| {
            let r =
                pb::Role::decode(v).map_err(|e| Error::Snapshot(Failure::caused_by("a role does not decode", e)))?;
            let name = String::from_utf8_lossy(&r.name).into_owned();
            let mut permissions: Vec<Permission> = r
                .key_permission
                .into_iter()
                .map(|p| Permission {
                    access: match p.perm_type {
                        0 => Access::Read,
                        1 => Access::Write,
                        _ => Access::ReadWrite,
                    },
                    key: p.key,
                    range_end: p.range_end,
                })
                .collect();
            permissions.sort_by(|a, b| a.key.cmp(&b.key));
            role_map.insert(name.clone(), Role { name, permissions });
            Ok::<_, Error>(())
        })?;
    }
    Ok(AuthStore::load(enabled, revision, user_map, role_map))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost::Message;

    use super::super::bbolt::write::DbWriter;
    use super::*;
    use crate::{Engine, MemberAttributes, RangeRequest};

    fn rev_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&sub.to_be_bytes());
        if tombstone {
            k.push(b't');
        }
        k
    }

    /// A `key` bucket value for a delete: the key alone.
    fn tombstone(key: &str) -> Vec<u8> {
        pb::KeyValue {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A `key` bucket value: `key` at `[create, modified, version]`, holding `value`.
    fn kv(key: &str, [create, modified, version]: [i64; 3], value: &str, lease: i64) -> Vec<u8> {
        pb::KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            version,
            value: value.as_bytes().to_vec(),
            lease,
        }
        .encode_to_vec()
    }

    /// An etcd database as etcd lays it out: history compacted at 3, a delete, a lease with a
    /// key, a user and a role; with etcdctl's SHA-256 trailer.
    fn etcd_snapshot(path: &Path) {
        let mut db = DbWriter::create(File::create_new(path).unwrap()).unwrap();
        db.bucket(b"auth").unwrap();
        db.put(b"authEnabled", &[0]).unwrap();
        db.put(b"authRevision", &7u64.to_be_bytes()).unwrap();
        db.bucket(b"authRoles").unwrap();
        let role = pb::Role {
            name: b"app".to_vec(),
            key_permission: vec![pb::Permission {
                perm_type: 2,
                key: b"app/".to_vec(),
                range_end: b"app0".to_vec(),
            }],
        };
        db.put(b"app", &role.encode_to_vec()).unwrap();
        db.bucket(b"authUsers").unwrap();
        let user = pb::User {
            name: b"alice".to_vec(),
            password: b"$2a$10$hash".to_vec(),
            roles: vec!["app".into()],
            options: None,
        };
        db.put(b"alice", &user.encode_to_vec()).unwrap();
        db.bucket(b"key").unwrap();
        // "kept" put at 2 (its last put before the compaction) and deleted at 5.1, after it.
        db.put(&rev_key(2, 0, false), &kv("kept", [2, 2, 1], "k1", 0)).unwrap();
        // a@2 (compacted away in etcd: only a@3 is kept), b@4 in a txn with c@4.1, delete b@5,
        // a@6 with the lease.
        db.put(&rev_key(3, 0, false), &kv("a", [2, 3, 2], "a2", 0)).unwrap();
        // The tombstone that ended "gone" at the compaction, its puts compacted away (etcd 3.6+
        // keeps it): it deletes nothing.
        db.put(&rev_key(3, 1, true), &tombstone("gone")).unwrap();
        db.put(&rev_key(4, 0, false), &kv("b", [4, 4, 1], "b1", 0)).unwrap();
        db.put(&rev_key(4, 1, false), &kv("c", [4, 4, 1], "c1", 0)).unwrap();
        db.put(&rev_key(5, 0, true), &tombstone("b")).unwrap();
        db.put(&rev_key(5, 1, true), &tombstone("kept")).unwrap();
        db.put(&rev_key(6, 0, false), &kv("a", [2, 6, 3], "a3", 42)).unwrap();
        db.bucket(b"lease").unwrap();
        let lease = pb::Lease {
            id: 42,
            ttl: 600,
            remaining_ttl: 0,
        };
        db.put(&42i64.to_be_bytes(), &lease.encode_to_vec()).unwrap();
        db.bucket(b"meta").unwrap();
        db.put(b"consistent_index", &12u64.to_be_bytes()).unwrap();
        db.put(b"finishedCompactRev", &rev_key(3, 0, false)).unwrap();
        db.put(b"scheduledCompactRev", &rev_key(3, 0, false)).unwrap();
        let (file, len) = db.finish().unwrap();
        let bytes = std::fs::read(path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &Sha256::digest(&bytes), len).unwrap();
    }

    #[test]
    fn an_etcd_snapshot_restores_with_its_revisions_leases_and_users() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("snap.db");
        etcd_snapshot(&snap);
        assert!(crate::offline::is_etcd(&snap).unwrap());
        let members = BTreeMap::from([(1u64, MemberAttributes::with_peer_urls(vec!["http://m1:2380".into()]))]);
        let data = dir.path().join("member");
        crate::offline::import_etcd(&snap, &data, &members, false).unwrap();
        let engine = Engine::builder(&data).member(1).open().unwrap();
        assert_eq!(engine.current_revision(), 6);
        assert_eq!(engine.status().compacted_revision, 3);
        let all = engine.range(&RangeRequest::all()).unwrap();
        let got: Vec<(String, i64, i64, i64, i64)> = all
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into(),
                    kv.create_revision,
                    kv.mod_revision,
                    kv.version,
                    kv.lease,
                )
            })
            .collect();
        assert_eq!(got, [("a".into(), 2, 6, 3, 42), ("c".into(), 4, 4, 1, 0)]);
        // History since the compaction: b and kept existed at 4.
        let at4 = engine.range(&RangeRequest::all().at_revision(4)).unwrap();
        let at4: Vec<(&[u8], &[u8])> = at4.kvs.iter().map(|kv| (&kv.key[..], &kv.value[..])).collect();
        assert_eq!(
            at4,
            [(&b"a"[..], &b"a2"[..]), (b"b", b"b1"), (b"c", b"c1"), (b"kept", b"k1")]
        );
        assert!(matches!(
            engine.range(&RangeRequest::key("a").at_revision(2)),
            Err(Error::Compacted { .. })
        ));
        assert_eq!(engine.server().lease_keys(42), vec![bytes::Bytes::from_static(b"a")]);
        let (enabled, revision) = engine.server().auth_status();
        assert_eq!((enabled, revision), (false, 7));
        assert!(engine.server().auth_read(|a| a.has_role("alice", "app")));
        // The new cluster takes writes at the next revision.
        assert_eq!(engine.put("d", "x").unwrap(), 7);
        engine.close().unwrap();
    }

    /// A compaction that did not finish (scheduled, never finished) may leave whole
    /// generations before its revision: a tombstone there ends one when its put is in the file,
    /// and deletes nothing when the put was compacted away.
    #[test]
    fn an_unfinished_compaction_leaves_generations_that_still_count() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("member-db");
        let mut db = DbWriter::create(File::create_new(&snap).unwrap()).unwrap();
        db.bucket(b"key").unwrap();
        db.put(&rev_key(2, 0, false), &kv("half", [2, 2, 1], "h1", 0)).unwrap();
        db.put(&rev_key(2, 1, false), &kv("kept", [2, 2, 1], "k1", 0)).unwrap();
        db.put(&rev_key(3, 0, true), &tombstone("half")).unwrap();
        db.put(&rev_key(3, 1, true), &tombstone("gone")).unwrap();
        db.put(&rev_key(5, 0, false), &kv("new", [5, 5, 1], "n1", 0)).unwrap();
        db.bucket(b"meta").unwrap();
        db.put(b"scheduledCompactRev", &rev_key(4, 0, false)).unwrap();
        db.finish().unwrap();
        let members = BTreeMap::from([(1u64, MemberAttributes::default())]);
        let data = dir.path().join("member");
        crate::offline::import_etcd(&snap, &data, &members, true).unwrap();
        let engine = Engine::builder(&data).member(1).open().unwrap();
        assert_eq!((engine.current_revision(), engine.status().compacted_revision), (5, 4));
        let all = engine.range(&RangeRequest::all()).unwrap();
        let keys: Vec<&[u8]> = all.kvs.iter().map(|kv| &kv.key[..]).collect();
        assert_eq!(keys, [&b"kept"[..], b"new"]);
        engine.close().unwrap();
    }

    #[test]
    fn a_damaged_or_unverifiable_snapshot_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("snap.db");
        etcd_snapshot(&snap);
        let members = BTreeMap::from([(1u64, MemberAttributes::default())]);
        let mut bytes = std::fs::read(&snap).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        let bad = dir.path().join("bad.db");
        std::fs::write(&bad, &bytes).unwrap();
        let data = dir.path().join("m");
        let err = crate::offline::import_etcd(&bad, &data, &members, false).unwrap_err();
        assert!(err.to_string().contains("SHA-256"), "{err}");
        assert!(!data.join("data").exists());
        // Without its trailer: refused unless told to skip the check (a member's db file).
        let db_only = dir.path().join("db");
        let clean = std::fs::read(&snap).unwrap();
        std::fs::write(&db_only, &clean[..clean.len() - 32]).unwrap();
        assert!(crate::offline::import_etcd(&db_only, &data, &members, false).is_err());
        crate::offline::import_etcd(&db_only, &data, &members, true).unwrap();
    }
}
