//! v3 discovery's registry on the discovery cluster, as etcd 3.6's `v3discovery` lays it out,
//! so that cairn and etcd members can share one discovery service. For a token `t`:
//!
//! ```text
//! /_etcd/registry/t/_config/size       "3"                         written by the operator
//! /_etcd/registry/t/members/<id hex>   "m1=http://10.0.0.1:2380"   one per member that joined
//! ```
//!
//! A member's value is its `--name` with each of its advertised peer URLs, in
//! `--initial-cluster`'s form. The initial cluster is the first `size` registrations in the
//! order they were created (their keys' create revisions), so that members registering at
//! the same moment all agree on who is in and who is left out.
//!
//! Everything here is pure: the client that reads and writes these keys is in `v3.rs`.

use std::time::Duration;

/// Where every token's keys live.
const PREFIX: &str = "/_etcd/registry";

/// Failed requests in a row after which a member gives up on the discovery service. etcd
/// retries (almost) forever; cairn stops where etcd's backoff stops growing (its
/// `maxExponentialRetries`), some eight and a half minutes of waiting, and exits with
/// etcd's "too many retries", for whoever supervises it to start it again.
pub const MAX_RETRIES: u32 = 8;

/// How long to wait before retry number `retries` (1 for the first) after a failed request:
/// etcd's 2, 4, 8 … 256 seconds; `None` past [`MAX_RETRIES`].
pub fn backoff(retries: u32) -> Option<Duration> {
    (1..=MAX_RETRIES)
        .contains(&retries)
        .then(|| Duration::from_secs(1u64 << retries))
}

/// The keys of one token, joined as Go's `path.Join` joins them (a token with slashes or
/// dots names the same keys etcd's would).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// `/_etcd/registry/<token>/_config/size`.
    pub size: String,
    /// `/_etcd/registry/<token>/members`: every key starting with it (no slash added, as in
    /// etcd) is read as a registration.
    pub members: String,
}

impl Keys {
    /// The keys of `token`.
    pub fn new(token: &str) -> Keys {
        Keys {
            size: clean(&format!("{PREFIX}/{token}/_config/size")),
            members: clean(&format!("{PREFIX}/{token}/members")),
        }
    }

    /// The key member `id` registers under: its ID in hex, as etcd's `types.ID` prints it.
    pub fn member(&self, id: u64) -> String {
        clean(&format!("{}/{id:x}", self.members))
    }
}

/// Go's `path.Clean` of a rooted path: no empty or `.` elements, `..` removing the one before.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The end of the range of keys starting with `prefix` (etcd's `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or no prefix): to the end of the key space.
    vec![0]
}

/// Why the size key cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// No size key: the operator has not set the token up (etcd's `ErrSizeNotFound`).
    NotFound,
    /// Not a positive decimal number (etcd's `ErrBadSizeKey`).
    Bad,
}

/// The cluster size the operator wrote, read as Go's `strconv.ParseInt(value, 10, 0)` reads
/// it: a positive decimal number, nothing around it.
pub fn cluster_size(value: Option<&[u8]>) -> Result<usize, SizeError> {
    let value = value.ok_or(SizeError::NotFound)?;
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(SizeError::Bad)
}

/// One member's registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Its key, `<members prefix>/<id hex>`.
    pub key: String,
    /// `name=peer-URL[,name=peer-URL…]`.
    pub value: String,
    /// When the key was created, which orders the members.
    pub create_revision: i64,
}

/// Why a key under the members prefix is not taken as a registration (logged and skipped, as
/// etcd skips it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Not under the members prefix.
    #[error("invalid peer registry key")]
    Key,
    /// Not in `name=URL` form.
    #[error("invalid peer info returned from discovery service")]
    Value,
    /// Seen already.
    #[error("found duplicate peer from discovery service")]
    Duplicate,
}

/// The registrations of one token, oldest first.
#[derive(Clone, Debug)]
pub struct Registrations {
    prefix: String,
    /// Invariant: sorted by create revision (ties keep the order they were added in), each
    /// key once.
    members: Vec<Registration>,
}

impl Registrations {
    /// None yet, under `keys`'s members prefix.
    pub fn new(keys: &Keys) -> Registrations {
        Registrations {
            prefix: keys.members.clone(),
            members: Vec::new(),
        }
    }

    /// Adds the key-value pair read from the discovery cluster, both trimmed of white space as
    /// etcd trims them, if it is a registration.
    pub fn add(&mut self, key: &[u8], value: &[u8], create_revision: i64) -> Result<(), Rejected> {
        let key = String::from_utf8_lossy(key).trim().to_string();
        let value = String::from_utf8_lossy(value).trim().to_string();
        if !key.starts_with(&self.prefix) {
            return Err(Rejected::Key);
        }
        if !value.contains('=') {
            return Err(Rejected::Value);
        }
        if self.members.iter().any(|m| m.key == key) {
            return Err(Rejected::Duplicate);
        }
        let at = self.members.partition_point(|m| m.create_revision <= create_revision);
        self.members.insert(
            at,
            Registration {
                key,
                value,
                create_revision,
            },
        );
        Ok(())
    }

    /// How many members registered.
    #[allow(clippy::len_without_is_empty)] // emptiness is never asked
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether `size` members registered before the one with key `own` (or, if it has not
    /// registered, whether `size` members did at all): there is no room for it (etcd's
    /// `ErrFullCluster`).
    pub fn full(&self, size: usize, own: &str) -> bool {
        let ahead = self.members.iter().take_while(|m| m.key != own).count();
        ahead >= size
    }

    /// The initial cluster the first `size` registrations make, in `--initial-cluster`'s form.
    pub fn initial_cluster(&self, size: usize) -> String {
        let values: Vec<&str> = self.members.iter().take(size).map(|m| m.value.as_str()).collect();
        values.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_etcds() {
        let k = Keys::new("t0k3n");
        assert_eq!(k.size, "/_etcd/registry/t0k3n/_config/size");
        assert_eq!(k.members, "/_etcd/registry/t0k3n/members");
        assert_eq!(
            k.member(0x8e9e05c52164694d),
            "/_etcd/registry/t0k3n/members/8e9e05c52164694d"
        );
        assert_eq!(k.member(0xab), "/_etcd/registry/t0k3n/members/ab");
        // path.Join cleans what it joins.
        assert_eq!(Keys::new("a//b/./c/").size, "/_etcd/registry/a/b/c/_config/size");
        assert_eq!(Keys::new("a/../b").members, "/_etcd/registry/b/members");
    }

    #[test]
    fn a_prefix_ends_where_etcds_clients_end_it() {
        assert_eq!(prefix_end(b"/a"), b"/b");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn the_size_is_a_positive_decimal_as_strconv_reads_it() {
        type Case<'a> = (Option<&'a [u8]>, Result<usize, SizeError>);
        let table: [Case<'_>; 9] = [
            (Some(b"3"), Ok(3)),
            (Some(b"+5"), Ok(5)),
            (Some(b"0"), Err(SizeError::Bad)),
            (Some(b"-1"), Err(SizeError::Bad)),
            (Some(b" 3"), Err(SizeError::Bad)),
            (Some(b"3\n"), Err(SizeError::Bad)),
            (Some(b"three"), Err(SizeError::Bad)),
            (Some(b"99999999999999999999"), Err(SizeError::Bad)),
            (None, Err(SizeError::NotFound)),
        ];
        for (value, want) in table {
            assert_eq!(cluster_size(value), want, "{value:?}");
        }
    }

    #[test]
    fn retries_back_off_as_etcds_do_and_stop_where_etcds_backoff_stops_growing() {
        let waits: Vec<u64> = (1..=MAX_RETRIES).filter_map(backoff).map(|d| d.as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256]);
        assert_eq!(backoff(0), None);
        assert_eq!(backoff(MAX_RETRIES + 1), None);
    }

    fn registrations(entries: &[(&str, &str, i64)]) -> Registrations {
        let mut r = Registrations::new(&Keys::new("t"));
        for (id, value, revision) in entries {
            r.add(
                format!("/_etcd/registry/t/members/{id}").as_bytes(),
                value.as_bytes(),
                *revision,
            )
            .unwrap();
        }
        r
    }

    #[test]
    fn members_are_ordered_by_when_they_registered_and_the_first_size_make_the_cluster() {
        // Read back in key order; ordered by create revision.
        let r = registrations(&[
            ("a", "m3=http://c:2380", 9),
            ("b", "m1=http://a:2380", 4),
            ("c", " m2=http://b:2380\n", 6),
            ("d", "late=http://d:2380", 12),
        ]);
        assert_eq!(
            r.initial_cluster(3),
            "m1=http://a:2380,m2=http://b:2380,m3=http://c:2380"
        );
        assert_eq!(
            r.initial_cluster(9),
            "m1=http://a:2380,m2=http://b:2380,m3=http://c:2380,late=http://d:2380"
        );
    }

    #[test]
    fn what_is_not_a_registration_is_rejected_as_etcd_rejects_it() {
        let mut r = registrations(&[("a", "m1=http://a:2380", 4)]);
        assert_eq!(
            r.add(b"/_etcd/registry/u/members/a", b"x=http://x:1", 5),
            Err(Rejected::Key)
        );
        assert_eq!(
            r.add(b"/_etcd/registry/t/members/b", b"http://x:1", 5),
            Err(Rejected::Value)
        );
        assert_eq!(r.add(b"/_etcd/registry/t/members/b", b"", 5), Err(Rejected::Value));
        assert_eq!(
            r.add(b"/_etcd/registry/t/members/a", b"m1=http://a:2380", 4),
            Err(Rejected::Duplicate)
        );
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn the_cluster_is_full_for_a_member_with_size_registrations_ahead_of_it() {
        // etcd's checkCluster: the members registered before this one, or all of them if it has
        // not registered.
        let r = registrations(&[("a", "m1=h", 1), ("b", "m2=h", 2), ("c", "m3=h", 3)]);
        let key = |id: &str| format!("/_etcd/registry/t/members/{id}");
        let table = [
            (3, "a", false),
            (3, "c", false),
            (3, "new", true),
            (4, "new", false),
            (2, "c", true),
            (2, "b", false),
            (1, "b", true),
            (1, "a", false),
        ];
        for (size, own, full) in table {
            assert_eq!(r.full(size, &key(own)), full, "size {size}, member {own}");
        }
        assert!(!Registrations::new(&Keys::new("t")).full(1, &key("a")));
    }
}
