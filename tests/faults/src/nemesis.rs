//! The nemesis: faults at random, one at a time, each healed before the next. Kills restart
//! the member; pauses resume it; network faults are removed.

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_server::pb::etcdserverpb::StatusRequest;
use rand::rngs::StdRng;
use rand::Rng;
use tonic::transport::Channel;

use crate::cluster::Cluster;

/// The kinds of fault, as the report counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    KillLeader,
    KillFollower,
    PauseLeader,
    PauseFollower,
    IsolateLeader,
    IsolateFollower,
    AsymmetricPartition,
    LossyLinks,
    /// A follower down long enough to need a snapshot when it comes back.
    FollowerFarBehind,
    /// A member's disk filled (but for 1 MiB) while large values are written, then emptied.
    DiskFull,
    /// A member's file system frozen (every write to it waits), then thawed: a stalled disk.
    DiskStall,
}

/// The member leading now, as the members' Status says (the first that names itself).
pub async fn leader(channels: &[Channel]) -> Option<usize> {
    for (i, channel) in channels.iter().enumerate() {
        let mut m = MaintenanceClient::new(channel.clone());
        let status = tokio::time::timeout(Duration::from_millis(500), m.status(StatusRequest {})).await;
        if let Ok(Ok(status)) = status {
            let status = status.into_inner();
            if status.header.is_some_and(|h| h.member_id == status.leader) {
                return Some(i);
            }
        }
    }
    None
}

/// What was asked of a member while its disk was stalled.
#[derive(Debug)]
pub struct Stall {
    /// Serializable reads asked, and answered within a second (they need no disk).
    pub reads: (usize, usize),
    /// A write through the member: acknowledged (a follower's stall, with two healthy
    /// members), or the error it was answered with; `Err(None)` if no answer came at all.
    pub write: Result<(), Option<String>>,
}

/// How long a disk stays stalled: longer than a request may take (etcd's and cairn's request
/// timeout is 5 s plus two election timeouts, 7 s here), so a write that needs the disk is
/// answered with the server's timeout while it lasts.
const STALL: Duration = Duration::from_secs(9);

/// The errors etcd answers a write with when it cannot be done in time.
pub const TIMEOUT_ERRORS: &[&str] = &[
    "etcdserver: request timed out",
    "etcdserver: leader changed",
    "etcdserver: no leader",
];

/// Injects one fault of a random kind for a random 1–4 s (a stalled disk: [`STALL`]), then
/// heals it. Returns its kind. `stalled`: what was asked of each member whose disk stalled.
pub async fn one_fault(
    cluster: &mut Cluster,
    channels: &[Channel],
    rng: &mut StdRng,
    stalled: &mut Vec<Stall>,
) -> Result<Kind, String> {
    let size = cluster.members.len();
    let leader = leader(channels).await;
    let follower = |rng: &mut StdRng| loop {
        let i = rng.random_range(0..size);
        if Some(i) != leader {
            return i;
        }
    };
    let kinds = [
        Kind::KillLeader,
        Kind::KillFollower,
        Kind::PauseLeader,
        Kind::PauseFollower,
        Kind::IsolateLeader,
        Kind::IsolateFollower,
        Kind::AsymmetricPartition,
        Kind::LossyLinks,
        Kind::FollowerFarBehind,
        Kind::DiskFull,
        Kind::DiskStall,
    ];
    // The disk faults last, for members with disks of their own.
    let choices = if cluster.has_own_disks() {
        kinds.len()
    } else {
        kinds.len() - 2
    };
    let mut kind = kinds[rng.random_range(0..choices)];
    let target = match (kind, leader) {
        (Kind::KillLeader | Kind::PauseLeader | Kind::IsolateLeader, Some(l)) => l,
        (Kind::KillLeader, None) => {
            kind = Kind::KillFollower;
            follower(rng)
        }
        (Kind::PauseLeader, None) => {
            kind = Kind::PauseFollower;
            follower(rng)
        }
        (Kind::IsolateLeader, None) => {
            kind = Kind::IsolateFollower;
            follower(rng)
        }
        _ => follower(rng),
    };
    let hold = Duration::from_millis(rng.random_range(1000..4000));
    match kind {
        Kind::KillLeader | Kind::KillFollower => {
            cluster.kill(target);
            tokio::time::sleep(hold).await;
            cluster.restart(target)?;
        }
        Kind::DiskFull => {
            // Large values, so a member soon needs space its preallocated files do not have.
            cluster.fill_disk(target, true, 1 << 20)?;
            let writer = tokio::spawn(large_values(channels[leader.unwrap_or(0)].clone(), hold * 2));
            let _ = writer.await;
            cluster.fill_disk(target, false, 0)?;
            // A member that gave up (etcd exits on a full disk) starts again.
            cluster.restart_if_exited(target)?;
        }
        Kind::DiskStall => {
            cluster.freeze_disk(target, true)?;
            let write = tokio::spawn(stalled_write(channels[target].clone()));
            let reads = stalled_reads(channels[target].clone(), STALL).await;
            cluster.freeze_disk(target, false)?;
            let write = write.await.unwrap_or(Err(None));
            stalled.push(Stall { reads, write });
        }
        Kind::FollowerFarBehind => {
            // Down for several seconds of writes: far more than the leader keeps for it
            // (--experimental-snapshot-catchup-entries 100).
            cluster.kill(target);
            tokio::time::sleep(hold * 3).await;
            cluster.restart(target)?;
        }
        Kind::PauseLeader | Kind::PauseFollower => {
            cluster.pause(target, true);
            tokio::time::sleep(hold).await;
            cluster.pause(target, false);
        }
        Kind::IsolateLeader | Kind::IsolateFollower => {
            for other in (0..size).filter(|o| *o != target) {
                cluster.net.drop_from(other, target, None)?;
                cluster.net.drop_from(target, other, None)?;
            }
            tokio::time::sleep(hold).await;
            cluster.net.heal()?;
        }
        Kind::AsymmetricPartition => {
            // The target hears nobody, but the others still hear it.
            for other in (0..size).filter(|o| *o != target) {
                cluster.net.drop_from(other, target, None)?;
            }
            tokio::time::sleep(hold).await;
            cluster.net.heal()?;
        }
        Kind::LossyLinks => {
            let share = rng.random_range(0.2..0.5);
            for other in (0..size).filter(|o| *o != target) {
                cluster.net.drop_from(other, target, Some(share))?;
                cluster.net.drop_from(target, other, Some(share))?;
            }
            tokio::time::sleep(hold).await;
            cluster.net.heal()?;
        }
    }
    Ok(kind)
}

/// Large values one disk-full fault writes at most: 64 MiB, over 32 keys, so that what the
/// chores' compactions and defragmentations have not reclaimed yet does not fill the disks for
/// good in a long run.
const LARGE_VALUES: u32 = 128;

/// Writes 512 KiB values to `channel` for `how_long` (at most [`LARGE_VALUES`] of them), under
/// keys apart from the workload's.
async fn large_values(channel: Channel, how_long: Duration) {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest};
    let mut kv = KvClient::new(channel);
    let until = tokio::time::Instant::now() + how_long;
    let mut n = 0u32;
    while tokio::time::Instant::now() < until && n < LARGE_VALUES {
        let put = PutRequest {
            key: format!("large/{}", n % 32).into_bytes().into(),
            value: vec![b'x'; 512 << 10].into(),
            ..Default::default()
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), kv.put(put)).await;
        n += 1;
    }
}

/// A write through a member whose disk was just stalled, given longer than the stall to be
/// answered. Sent again if it never reached the member (the channel's connection had broken,
/// a member restarted by the fault before): that is the client's connection, not an answer.
async fn stalled_write(channel: Channel) -> Result<(), Option<String>> {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest};
    let mut kv = KvClient::new(channel);
    let deadline = tokio::time::Instant::now() + STALL + Duration::from_secs(6);
    loop {
        let put = PutRequest {
            key: b"stalled/write".to_vec().into(),
            value: b"x".to_vec().into(),
            ..Default::default()
        };
        match tokio::time::timeout_at(deadline, kv.put(put)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(status)) if status.message() == "transport error" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(status)) => return Err(Some(status.message().to_string())),
            Err(_) => return Err(None),
        }
    }
}

/// Serializable reads on a member whose disk is stalled, for `how_long`: how many were
/// asked and how many answered within a second (they need no disk).
async fn stalled_reads(channel: Channel, how_long: Duration) -> (usize, usize) {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, RangeRequest};
    let mut kv = KvClient::new(channel);
    let until = tokio::time::Instant::now() + how_long;
    let (mut asked, mut answered) = (0, 0);
    while tokio::time::Instant::now() < until {
        let range = RangeRequest {
            key: b"k/".to_vec().into(),
            range_end: b"k0".to_vec().into(),
            serializable: true,
            count_only: true,
            ..Default::default()
        };
        asked += 1;
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), kv.range(range)).await {
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (asked, answered)
}

/// Faults by kind, for the report.
pub type Injected = BTreeMap<Kind, usize>;
