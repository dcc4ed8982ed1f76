//! Range requests: etcd's `RangeRequest` on top of the store's reads, with sorting and the
//! revision filters.
//!
//! Following etcd: a sort target other than the key with no sort order sorts ascending; when
//! the request sorts or filters, the store is read without a limit and the limit is applied
//! after; `count` is the number of keys in the range at that revision, ignoring the limit and
//! the filters; `more` says keys remain beyond the limit (never for `count_only`, which
//! returns no key-values). Ties sort by key (etcd leaves their
//! order unspecified).

use crate::error::{Error, Result};
use crate::mvcc::store::{KeyValue, ReadOptions, Store, WriteTxn};

/// The direction a range answer is sorted in (etcd's `RangeRequest.SortOrder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    /// Key order; with a sort target other than the key, ascending (as etcd).
    #[default]
    None,
    /// Smallest first.
    Ascend,
    /// Largest first.
    Descend,
}

/// The field a range answer is sorted by (etcd's `RangeRequest.SortTarget`); ties stay in
/// ascending key order, whatever the direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortTarget {
    /// The key, bytewise.
    #[default]
    Key,
    /// [`KeyValue::version`].
    Version,
    /// [`KeyValue::create_revision`].
    Create,
    /// [`KeyValue::mod_revision`].
    Mod,
    /// The value, bytewise.
    Value,
}

/// etcd's `RangeRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// The key read, or the first key of the range; must not be empty.
    pub key: Vec<u8>,
    /// The end of the range, exclusive: empty reads `key` alone, `"\0"` every key from `key`
    /// on (see [`crate::prefix_end`]).
    pub range_end: Vec<u8>,
    /// At most this many keys; 0 for no limit.
    pub limit: i64,
    /// The revision to read at; 0 or less for the current one.
    pub revision: i64,
    /// The direction `kvs` are sorted in.
    pub sort_order: SortOrder,
    /// What `kvs` are sorted by.
    pub sort_target: SortTarget,
    /// Served from this member's state at once, without a ReadIndex round (etcd's
    /// serializable read; it may miss writes other members have applied).
    pub serializable: bool,
    /// Return keys with empty values.
    pub keys_only: bool,
    /// Return only `count`: no key-values, and `more` false.
    pub count_only: bool,
    /// Keep only keys last modified at or after this revision; 0 for no bound.
    pub min_mod_revision: i64,
    /// Keep only keys last modified at or before this revision; 0 for no bound.
    pub max_mod_revision: i64,
    /// Keep only keys created at or after this revision; 0 for no bound.
    pub min_create_revision: i64,
    /// Keep only keys created at or before this revision; 0 for no bound.
    pub max_create_revision: i64,
}

/// etcd's `RangeResponse`, less the header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RangeResponse {
    /// The key-values found, sorted and filtered as asked, at most `limit` of them.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys matched than `limit` let through.
    pub more: bool,
    /// Keys in the range at that revision, ignoring `limit` and the revision filters.
    pub count: i64,
    /// The revision the read was served at.
    pub revision: i64,
}

impl RangeRequest {
    /// Checks the request on its own, as etcd does: a key is given.
    pub fn validate(&self) -> Result<()> {
        match self.key.is_empty() {
            true => Err(Error::EmptyKey),
            false => Ok(()),
        }
    }

    /// One key.
    pub fn key(key: impl Into<Vec<u8>>) -> RangeRequest {
        RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        }
    }

    /// Every key starting with `prefix` (etcdctl's `--prefix`).
    pub fn prefix(prefix: &[u8]) -> RangeRequest {
        RangeRequest {
            key: prefix.to_vec(),
            range_end: crate::mvcc::index::prefix_end(prefix),
            ..RangeRequest::default()
        }
    }

    /// Every key (etcd's `key = range_end = "\0"`).
    pub fn all() -> RangeRequest {
        RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..RangeRequest::default()
        }
    }

    /// The same request, read at `revision` (0 or less: the current one).
    pub fn at_revision(self, revision: i64) -> RangeRequest {
        RangeRequest { revision, ..self }
    }

    fn filters(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }

    fn keep(&self, kv: &KeyValue) -> bool {
        let within = |v: i64, min: i64, max: i64| (min == 0 || v >= min) && (max == 0 || v <= max);
        within(kv.mod_revision, self.min_mod_revision, self.max_mod_revision)
            && within(kv.create_revision, self.min_create_revision, self.max_create_revision)
    }

    fn sort_order(&self) -> SortOrder {
        match (self.sort_order, self.sort_target) {
            (SortOrder::None, SortTarget::Key) => SortOrder::None,
            (SortOrder::None, _) => SortOrder::Ascend,
            (order, _) => order,
        }
    }

    /// Whether every key of the range is read before the limit is applied: when an order is
    /// asked for (other than ascending keys, the store's own) or filters apply. As in etcd, an
    /// order left unset with another target reads only the first `limit` keys, in key order,
    /// and sorts those.
    fn reads_all(&self) -> bool {
        let key_order = matches!(
            (self.sort_order, self.sort_target),
            (SortOrder::None, _) | (SortOrder::Ascend, SortTarget::Key)
        );
        !key_order || self.filters()
    }

    fn read_options(&self) -> ReadOptions {
        let limit = usize::try_from(self.limit).unwrap_or(0);
        ReadOptions {
            revision: self.revision,
            // One more than the limit, as etcd: the extra key says whether there are `more`.
            limit: if self.reads_all() || limit == 0 {
                0
            } else {
                limit.saturating_add(1)
            },
            // Sorting by value needs the values: they are dropped after the sort instead.
            keys_only: self.keys_only && self.sort_target != SortTarget::Value,
            count_only: self.count_only && !self.filters(),
        }
    }

    fn finish(&self, result: crate::mvcc::store::RangeResult) -> RangeResponse {
        let mut kvs = result.kvs;
        if self.filters() {
            kvs.retain(|kv| self.keep(kv));
        }
        let order = self.sort_order();
        if order != SortOrder::None && !(order == SortOrder::Ascend && self.sort_target == SortTarget::Key) {
            // A stable sort of key-ordered results: ties stay in key order, ascending, in
            // either direction (etcd sorts with a reversed comparison, not a reversed list).
            let descend = order == SortOrder::Descend;
            let directed = |o: std::cmp::Ordering| if descend { o.reverse() } else { o };
            match self.sort_target {
                SortTarget::Key => kvs.sort_by(|a, b| directed(a.key.cmp(&b.key))),
                SortTarget::Version => kvs.sort_by(|a, b| directed(a.version.cmp(&b.version))),
                SortTarget::Create => kvs.sort_by(|a, b| directed(a.create_revision.cmp(&b.create_revision))),
                SortTarget::Mod => kvs.sort_by(|a, b| directed(a.mod_revision.cmp(&b.mod_revision))),
                SortTarget::Value => kvs.sort_by(|a, b| directed(a.value.cmp(&b.value))),
            }
        }
        let limit = usize::try_from(self.limit).unwrap_or(0);
        let mut more = limit != 0 && kvs.len() > limit;
        if more {
            kvs.truncate(limit);
        }
        if self.keys_only {
            for kv in &mut kvs {
                kv.value = bytes::Bytes::new();
            }
        }
        if self.count_only {
            // etcd decides `more` from the key-values returned, and returns none.
            kvs.clear();
            more = false;
        }
        RangeResponse {
            kvs,
            more,
            count: i64::try_from(result.count).unwrap_or(i64::MAX),
            revision: result.revision,
        }
    }

    /// Serves the request from the store.
    pub fn apply(&self, store: &Store) -> Result<RangeResponse> {
        let result = store.range(&self.key, &self.range_end, self.read_options())?;
        Ok(self.finish(result))
    }

    /// Serves the request inside a write request, seeing its earlier writes.
    pub(crate) fn apply_in(&self, txn: &WriteTxn<'_>) -> Result<RangeResponse> {
        let result = txn.range(&self.key, &self.range_end, self.read_options())?;
        Ok(self.finish(result))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn store() -> Store {
        // Keys a..e; values descend as keys ascend; "c" is put three times.
        let mut store = Store::new();
        for (key, value) in [("a", "5"), ("b", "4"), ("c", "3"), ("d", "2"), ("e", "1")] {
            let mut w = store.write();
            w.put(key.as_bytes(), Bytes::from(value), 0).unwrap();
            w.end();
        }
        for _ in 0..2 {
            let mut w = store.write();
            w.put(b"c", Bytes::from("3"), 0).unwrap();
            w.end();
        }
        store
    }

    fn keys(resp: &RangeResponse) -> String {
        resp.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    #[test]
    fn builders_name_etcds_key_ranges() {
        assert_eq!(
            (RangeRequest::key("k").key, RangeRequest::key("k").range_end),
            (b"k".to_vec(), vec![])
        );
        let p = RangeRequest::prefix(b"a/");
        assert_eq!((p.key, p.range_end), (b"a/".to_vec(), b"a0".to_vec()));
        let all = RangeRequest::all().at_revision(7);
        assert_eq!((all.key, all.range_end, all.revision), (vec![0], vec![0], 7));
    }

    #[test]
    fn sorting_filters_and_limits_follow_etcd() {
        let store = store();
        let all = RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            ..RangeRequest::default()
        };
        // (request, keys returned, more, count)
        let cases: Vec<(RangeRequest, &str, bool, i64)> = vec![
            (all.clone(), "abcde", false, 5),
            (
                RangeRequest {
                    limit: 2,
                    ..all.clone()
                },
                "ab",
                true,
                5,
            ),
            (
                RangeRequest {
                    sort_order: SortOrder::Descend,
                    limit: 2,
                    ..all.clone()
                },
                "ed",
                true,
                5,
            ),
            (
                RangeRequest {
                    sort_target: SortTarget::Value,
                    ..all.clone()
                },
                "edcba",
                false,
                5,
            ),
            (
                RangeRequest {
                    sort_target: SortTarget::Version,
                    sort_order: SortOrder::Descend,
                    limit: 1,
                    ..all.clone()
                },
                "c",
                true,
                5,
            ),
            (
                RangeRequest {
                    sort_target: SortTarget::Mod,
                    sort_order: SortOrder::Ascend,
                    ..all.clone()
                },
                "abdec",
                false,
                5,
            ),
            (
                RangeRequest {
                    min_mod_revision: 4,
                    ..all.clone()
                },
                "cde",
                false,
                5,
            ),
            (
                RangeRequest {
                    max_create_revision: 3,
                    limit: 1,
                    ..all.clone()
                },
                "a",
                true,
                5,
            ),
            (
                RangeRequest {
                    count_only: true,
                    limit: 1,
                    ..all.clone()
                },
                "",
                false,
                5,
            ),
            (
                RangeRequest {
                    count_only: true,
                    min_mod_revision: 6,
                    ..all.clone()
                },
                "",
                false,
                5,
            ),
            (
                RangeRequest {
                    revision: 3,
                    ..all.clone()
                },
                "ab",
                false,
                2,
            ),
        ];
        for (i, (req, expected, more, count)) in cases.into_iter().enumerate() {
            let resp = req.apply(&store).unwrap();
            assert_eq!(
                (keys(&resp).as_str(), resp.more, resp.count),
                (expected, more, count),
                "case {i}: {req:?}"
            );
        }
    }
}
