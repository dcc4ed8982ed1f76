//! Writing cairn's state as an etcd database: the bbolt file `etcdctl snapshot save` gets from
//! etcd, which `etcdutl snapshot status` checks and `etcdutl snapshot restore` turns into an
//! etcd member serving the same keys, revisions, leases, users and roles.
//!
//! Buckets, in name order: `alarm` (empty), `auth`, `authRoles`, `authUsers`, `cluster`
//! (empty: no cluster version, so that every etcd from 3.5 on starts from it), `key` (every
//! revision in history: main and sub big-endian around `_`, `t` after a delete; values
//! `mvccpb.KeyValue`), `lease`, `members`, `members_removed` (empty), `meta` (the consistent
//! index and term, and the compacted revision as both the scheduled and the finished
//! compaction; no storage version, as an etcd 3.5 file has none).

use std::fs::File;

use prost::Message;

use super::bbolt::write::DbWriter;
use super::pb;
use crate::auth::Access;
use crate::error::{Error, Failure, Result};
use crate::format::snapshot::SnapshotMeta;
use crate::mvcc::store::Chunk;

fn io(e: std::io::Error) -> Error {
    Error::Snapshot(Failure::caused_by("write the etcd database", e))
}

/// A `key` bucket key.
fn revision_key(main: i64, sub: i64, tombstone: bool) -> RevisionKey {
    let mut bytes = [0u8; 18];
    let parts = main
        .to_be_bytes()
        .into_iter()
        .chain([b'_'])
        .chain(sub.to_be_bytes())
        .chain([b't']);
    for (slot, b) in bytes.iter_mut().zip(parts) {
        *slot = b;
    }
    RevisionKey {
        bytes,
        len: if tombstone { 18 } else { 17 },
    }
}

/// A `key` bucket key, on the stack.
struct RevisionKey {
    bytes: [u8; 18],
    len: usize,
}

impl std::ops::Deref for RevisionKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// An etcd database being written: the buckets before `key` are written at the start, the
/// history is added a chunk at a time, the rest at the end.
#[derive(Debug)]
pub(crate) struct EtcdExport {
    db: DbWriter,
    meta: SnapshotMeta,
    /// The key-value being written, and its encoding.
    kv: pb::KeyValue,
    encoded: Vec<u8>,
}

impl EtcdExport {
    /// Starts the database in `file` (empty) for the state `meta` describes.
    pub(crate) fn begin(file: File, meta: SnapshotMeta) -> Result<EtcdExport> {
        let mut db = DbWriter::create(file).map_err(io)?;
        db.bucket(b"alarm").map_err(io)?;
        let auth = &meta.auth;
        db.bucket(b"auth").map_err(io)?;
        db.put(b"authEnabled", &[u8::from(auth.enabled())]).map_err(io)?;
        db.put(b"authRevision", &auth.revision().to_be_bytes()).map_err(io)?;
        db.bucket(b"authRoles").map_err(io)?;
        for name in auth.role_names() {
            let Some(role) = auth.role(&name) else { continue };
            let value = pb::Role {
                name: name.clone().into_bytes(),
                key_permission: role
                    .permissions
                    .iter()
                    .map(|p| pb::Permission {
                        perm_type: match p.access {
                            Access::Read => 0,
                            Access::Write => 1,
                            Access::ReadWrite => 2,
                        },
                        key: p.key.clone(),
                        range_end: p.range_end.clone(),
                    })
                    .collect(),
            };
            db.put(name.as_bytes(), &value.encode_to_vec()).map_err(io)?;
        }
        db.bucket(b"authUsers").map_err(io)?;
        for name in auth.user_names() {
            let Some(user) = auth.user(&name) else { continue };
            let value = pb::User {
                name: name.clone().into_bytes(),
                password: user.password_hash.clone().unwrap_or_default().into_bytes(),
                roles: user.roles.clone(),
                options: user.no_password.then_some(pb::UserOptions { no_password: true }),
            };
            db.put(name.as_bytes(), &value.encode_to_vec()).map_err(io)?;
        }
        db.bucket(b"cluster").map_err(io)?;
        db.bucket(b"key").map_err(io)?;
        Ok(EtcdExport {
            db,
            meta,
            kv: pb::KeyValue::default(),
            encoded: Vec::new(),
        })
    }

    /// Adds records of history, in revision order.
    pub(crate) fn records(&mut self, chunk: &Chunk) -> Result<()> {
        for r in chunk.records() {
            let r = r?;
            let tombstone = r.is_tombstone();
            // One KeyValue and one buffer for them all: their allocations are reused.
            let kv = &mut self.kv;
            kv.clear();
            kv.key.extend_from_slice(r.key);
            if !tombstone {
                kv.create_revision = r.created.main;
                kv.mod_revision = r.rev.main;
                kv.version = r.version;
                kv.value.extend_from_slice(r.value);
                kv.lease = r.lease;
            }
            self.encoded.clear();
            kv.encode(&mut self.encoded)
                .map_err(|e| Error::Snapshot(Failure::caused_by("encode a key-value", e)))?;
            self.db
                .put(&revision_key(r.rev.main, r.rev.sub, tombstone), &self.encoded)
                .map_err(io)?;
        }
        Ok(())
    }

    /// Writes the buckets after `key` and the metas; returns the file and its length.
    pub(crate) fn finish(mut self) -> Result<(File, u64)> {
        let db = &mut self.db;
        let meta = &self.meta;
        db.bucket(b"lease").map_err(io)?;
        let mut leases = meta.leases.clone();
        leases.sort_by_key(|l| l.id as u64);
        for l in &leases {
            let value = pb::Lease {
                id: l.id,
                ttl: l.ttl,
                remaining_ttl: l.remaining_ttl,
            };
            db.put(&(l.id as u64).to_be_bytes(), &value.encode_to_vec())
                .map_err(io)?;
        }
        db.bucket(b"members").map_err(io)?;
        let membership = &meta.membership;
        let mut ids: Vec<u64> = membership.voters.iter().chain(&membership.learners).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut members: Vec<(String, u64)> = ids.iter().map(|id| (format!("{id:x}"), *id)).collect();
        members.sort();
        for (key, id) in members {
            let a = membership.attributes.get(&id).cloned().unwrap_or_default();
            // etcd's member JSON: isLearner, name and clientURLs only when set.
            let mut value = serde_json::Map::new();
            value.insert("id".into(), id.into());
            value.insert("peerURLs".into(), a.peer_urls.into());
            if membership.learners.contains(&id) {
                value.insert("isLearner".into(), true.into());
            }
            if !a.name.is_empty() {
                value.insert("name".into(), a.name.into());
            }
            if !a.client_urls.is_empty() {
                value.insert("clientURLs".into(), a.client_urls.into());
            }
            let value = serde_json::Value::Object(value);
            db.put(key.as_bytes(), value.to_string().as_bytes()).map_err(io)?;
        }
        db.bucket(b"members_removed").map_err(io)?;
        db.bucket(b"meta").map_err(io)?;
        db.put(b"consistent_index", &meta.applied_index.to_be_bytes())
            .map_err(io)?;
        if meta.compacted > 0 {
            let compacted = revision_key(meta.compacted, 0, false);
            db.put(b"finishedCompactRev", &compacted).map_err(io)?;
            db.put(b"scheduledCompactRev", &compacted).map_err(io)?;
        }
        if meta.applied_term > 0 {
            db.put(b"term", &meta.applied_term.to_be_bytes()).map_err(io)?;
        }
        self.db.finish().map_err(io)
    }
}
