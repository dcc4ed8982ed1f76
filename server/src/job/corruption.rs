//! Divergence detection, as etcd does it: members that applied the same log hold the same
//! history, so at the same revision (and the same compaction) their hashes must be equal. A
//! member whose files were changed behind its back, or that applied something the others did
//! not, is found by comparing them. All three checks are off unless asked for, as in etcd:
//!
//! - **Initial** (`--experimental-initial-corrupt-check`, the `InitialCorruptCheck` gate):
//!   before it serves clients, a member compares its hash at its current revision with each
//!   peer's at the same revision, and exits with "found data inconsistency with peers" if one
//!   differs. Peers that cannot answer, or compacted elsewhere, are skipped.
//! - **Latest revision** (`--corrupt-check-time`, 3.5's `--experimental-corrupt-check-time`):
//!   the leader, every period, compares its hash at its current revision with the members'.
//!   Costly (each member hashes its whole history; cairn reads it a chunk at a time, so writes
//!   go on), and blind to members behind the leader's revision.
//! - **Compaction** (`--experimental-compact-hash-check-enabled`, the `CompactHashCheck`
//!   gate; every `--compact-hash-check-time`, default 1m): every member hashes its keys and
//!   values as of each compaction soon after applying it and keeps the last ten; the leader
//!   compares the newest one the members share. Cheap, and it also covers members behind.
//!   Unlike etcd's, which hashes the history between two compactions, cairn's covers the
//!   state at the compaction: history a compaction drops is not compared.
//!
//! A mismatch raises the CORRUPT alarm for each member whose hash is not the one most of the
//! members compared hold (for member 0, meaning any, when no hash has a majority of them). Then, as in etcd, nothing
//! that writes is applied anywhere ("etcdserver: corrupt cluster"); unlike etcd, the member
//! named also refuses reads, rather than answer from data known to be wrong. An operator
//! rebuilds the member and disarms the alarm (docs/reliability.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_engine::{Alarm, HashKv};
use tonic::{Code, Status};

use crate::api::node::Node;
use crate::config::CorruptionChecks as Checks;
use crate::pb::peer as pb;
use crate::transport::peer::Kept;
use crate::transport::tls::Connector;

/// How often a member looks for a compaction it has not hashed yet.
const RECORD_EVERY: Duration = Duration::from_secs(1);

/// A peer's answer, or why there is none.
type Answer = Result<pb::HashResponse, Status>;

/// Asks every other member for its hash at `revision` (of its history, or kept at that
/// compaction), all at once.
async fn ask_peers(node: &Node, connector: &Connector, revision: i64, compaction: bool) -> Vec<(u64, Answer)> {
    crate::transport::peer::ask_every_peer(&node.engine, node.member_id, connector, move |mut client| async move {
        client
            .hash(pb::HashRequest { revision, compaction })
            .await
            .map(tonic::Response::into_inner)
    })
    .await
}

/// The members whose hash differs from the one more than half of them hold; member 0 (any)
/// if the hashes differ and none has a majority.
fn verdict(hashes: &[(u64, u32)]) -> Vec<u64> {
    let mut counts = BTreeMap::new();
    for (_, hash) in hashes {
        *counts.entry(*hash).or_insert(0usize) += 1;
    }
    if counts.len() <= 1 {
        return Vec::new();
    }
    match counts.iter().find(|(_, n)| **n * 2 > hashes.len()) {
        Some((right, _)) => hashes.iter().filter(|(_, h)| h != right).map(|(m, _)| *m).collect(),
        None => vec![0],
    }
}

/// Compares `mine` with the peers' answers at the same revisions: the members (this one
/// first) and their hashes, for [`verdict`]. Peers that could not answer, or hashed
/// something else (compacted at another revision, still behind), are logged and left out.
fn comparable(node: &Node, mine: &HashKv, answers: Vec<(u64, Answer)>) -> Vec<(u64, u32)> {
    let mut hashes = vec![(node.member_id, mine.hash)];
    for (peer, answer) in answers {
        match answer {
            Ok(r) if r.hash_revision == mine.hash_revision && r.compact_revision == mine.compact_revision => {
                if r.hash != mine.hash {
                    tracing::error!(
                        peer = format_args!("{peer:x}"),
                        revision = mine.hash_revision,
                        compact_revision = mine.compact_revision,
                        hash = mine.hash,
                        peer_hash = r.hash,
                        "a peer's hash differs from this member's at the same revision"
                    );
                }
                hashes.push((peer, r.hash));
            }
            Ok(r) => tracing::info!(
                peer = format_args!("{peer:x}"),
                revision = mine.hash_revision,
                compact_revision = mine.compact_revision,
                peer_hash_revision = r.hash_revision,
                peer_compact_revision = r.compact_revision,
                "cannot compare hashes with a peer that hashed other revisions"
            ),
            // Compacted past the revision, or still behind it; or no hash kept for that
            // compaction: nothing is wrong.
            Err(s) if matches!(s.code(), Code::OutOfRange | Code::NotFound) => tracing::debug!(
                peer = format_args!("{peer:x}"),
                revision = mine.hash_revision,
                error = %s.message(),
                "cannot compare hashes with a peer at this revision"
            ),
            Err(s) => {
                tracing::warn!(peer = format_args!("{peer:x}"), error = %s.message(), "cannot compare hashes with a peer")
            }
        }
    }
    hashes
}

/// The initial check: `Err` (etcd's message) if a peer's hash at this member's current
/// revision differs from its own.
pub async fn initial_check(node: &Arc<Node>, connector: &Connector) -> Result<(), String> {
    let mine = node
        .blocking(|e| e.maintenance().hash_kv(0))
        .await
        .map_err(|s| format!("hashing this member's data: {}", s.message()))?;
    let answers = ask_peers(node, connector, mine.hash_revision, false).await;
    let hashes = comparable(node, &mine, answers);
    if hashes.iter().any(|(_, h)| *h != mine.hash) {
        return Err(format!("{:x} found data inconsistency with peers", node.member_id));
    }
    tracing::info!(
        revision = mine.hash_revision,
        peers = hashes.len() - 1,
        "initial corruption check passed: this member's hash matches its peers'"
    );
    Ok(())
}

/// The periodic checks `checks` asks for, run until the task is dropped; every member keeps
/// its compaction hashes in `kept`, the leader compares.
pub async fn run(node: Arc<Node>, connector: Connector, checks: Checks, kept: Arc<Kept>) {
    let latest = async {
        let Some(every) = checks.latest_every else {
            return std::future::pending().await;
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if node.engine.leader() == Some(node.member_id) {
                check_latest(&node, &connector).await;
            }
        }
    };
    let compactions = async {
        let Some(every) = checks.compaction_every else {
            return std::future::pending().await;
        };
        let mut record = tokio::time::interval(RECORD_EVERY);
        let mut compare = tokio::time::interval(every);
        for ticks in [&mut record, &mut compare] {
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        compare.tick().await;
        loop {
            tokio::select! {
                _ = record.tick() => keep_compaction_hash(&node, &kept).await,
                _ = compare.tick() => {
                    if node.engine.leader() == Some(node.member_id) {
                        check_compactions(&node, &connector, &kept).await;
                    }
                }
            }
        }
    };
    tokio::join!(latest, compactions);
}

/// The leader's latest-revision check.
async fn check_latest(node: &Arc<Node>, connector: &Connector) {
    let mine = match node.blocking(|e| e.maintenance().hash_kv(0)).await {
        Ok(h) => h,
        Err(s) => return tracing::warn!(error = %s.message(), "corruption check: cannot hash this member's data"),
    };
    let answers = ask_peers(node, connector, mine.hash_revision, false).await;
    let hashes = comparable(node, &mine, answers);
    raise(node, &hashes, mine.hash_revision).await;
}

/// Hashes the latest compaction if this member has not yet.
async fn keep_compaction_hash(node: &Arc<Node>, kept: &Kept) {
    let compacted = node.engine.status().compacted_revision;
    if compacted == 0 || compacted <= kept.newest_revision() {
        return;
    }
    match node.blocking(|e| e.maintenance().compaction_hash()).await {
        Ok(Some(hash)) => kept.keep(hash),
        Ok(None) => {}
        Err(s) => tracing::warn!(error = %s.message(), revision = compacted, "cannot hash a compaction"),
    }
}

/// The leader's compaction check: the newest compaction some peer kept a hash of too.
async fn check_compactions(node: &Arc<Node>, connector: &Connector, kept: &Kept) {
    for mine in kept.newest_first() {
        let answers = ask_peers(node, connector, mine.hash_revision, true).await;
        let hashes = comparable(node, &mine, answers);
        if hashes.len() > 1 {
            raise(node, &hashes, mine.hash_revision).await;
            return;
        }
    }
}

/// Raises CORRUPT for the members [`verdict`] finds, unless it already is.
async fn raise(node: &Arc<Node>, hashes: &[(u64, u32)], revision: i64) {
    let raised = node.engine.maintenance().alarms();
    for member in verdict(hashes) {
        if raised.contains(&(member, Alarm::Corrupt)) {
            continue;
        }
        tracing::error!(
            member = format_args!("{member:x}"),
            revision,
            "a member's data differs from the others': raising the CORRUPT alarm"
        );
        if let Err(s) = node
            .blocking(move |e| e.maintenance().alarm_activate(member, Alarm::Corrupt))
            .await
        {
            tracing::warn!(error = %s.message(), "cannot raise the CORRUPT alarm; will try again at the next check");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_members_apart_from_the_majority_are_the_corrupt_ones() {
        assert!(verdict(&[(1, 7), (2, 7), (3, 7)]).is_empty());
        assert_eq!(verdict(&[(1, 7), (2, 9), (3, 7)]), vec![2]);
        assert_eq!(verdict(&[(1, 9), (2, 7), (3, 7)]), vec![1], "the leader itself");
        assert_eq!(
            verdict(&[(1, 7), (2, 7), (3, 9), (4, 7)]),
            vec![3],
            "one of five did not answer"
        );
        assert_eq!(verdict(&[(1, 7), (2, 9)]), vec![0], "no majority: any member");
        assert!(verdict(&[(1, 7)]).is_empty());
    }

    #[test]
    fn a_member_keeps_its_last_ten_compaction_hashes() {
        let kept = Kept::default();
        let at = |revision: i64| HashKv::new(revision as u32, revision, revision);
        for revision in 1..=12 {
            kept.keep(at(revision));
        }
        kept.keep(at(5));
        assert_eq!(kept.newest_revision(), 12);
        assert!(kept.get(2).is_none());
        assert_eq!(kept.get(3), Some(at(3)));
        let newest: Vec<i64> = kept.newest_first().iter().map(|h| h.hash_revision).collect();
        assert_eq!(newest, (3..=12).rev().collect::<Vec<_>>());
    }
}
