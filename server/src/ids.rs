//! Member and cluster IDs, derived as etcd derives them: a member's from its peer URLs and the
//! cluster token (and, for a member added later, the time), the cluster's from its initial
//! members. Hashes differ from etcd's (SHA-256 rather than SHA-1), so IDs do too; only their
//! stability and uniqueness matter.

use sha2::{Digest, Sha256};

fn first_u64(hash: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    for (b, h) in bytes.iter_mut().zip(hash) {
        *b = *h;
    }
    // 0 means "no member" to Raft: never hand it out.
    u64::from_be_bytes(bytes).max(1)
}

/// The ID of a member reached at `peer_urls` in the cluster named `token`; `now` (Unix
/// seconds) distinguishes a member added later from an earlier one at the same URLs.
pub fn member_id(peer_urls: &[String], token: &str, now: Option<u64>) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut h = Sha256::new();
    h.update(urls.concat().as_bytes());
    h.update(token.as_bytes());
    if let Some(now) = now {
        h.update(now.to_be_bytes());
    }
    first_u64(&h.finalize())
}

/// The ID of a cluster whose initial members are `members`.
pub fn cluster_id(members: &[u64]) -> u64 {
    let mut ids = members.to_vec();
    ids.sort_unstable();
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_be_bytes());
    }
    first_u64(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = vec!["http://10.0.0.1:2380".to_string()];
        let b = vec!["http://10.0.0.2:2380".to_string()];
        assert_eq!(member_id(&a, "etcd-cluster", None), member_id(&a, "etcd-cluster", None));
        assert_ne!(member_id(&a, "etcd-cluster", None), member_id(&b, "etcd-cluster", None));
        assert_ne!(member_id(&a, "etcd-cluster", None), member_id(&a, "other", None));
        assert_ne!(
            member_id(&a, "etcd-cluster", None),
            member_id(&a, "etcd-cluster", Some(1))
        );
        assert_eq!(cluster_id(&[1, 2]), cluster_id(&[2, 1]));
        assert_ne!(cluster_id(&[1, 2]), cluster_id(&[1, 3]));
    }
}
