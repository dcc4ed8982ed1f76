//! An operator's chores, done under faults as they would be in production: every
//! `--compact-seconds`, history compacted through a random member, at the oldest revision
//! every watcher and the recorder has seen (so none has to resume from a compacted one), and
//! a random member defragmented.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_server::pb::etcdserverpb::{CompactionRequest, DefragmentRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::workload::Shared;

/// What the chores did.
#[derive(Debug, Default)]
pub struct Chores {
    /// Compactions acknowledged.
    pub compactions: usize,
    /// Defragmentations acknowledged.
    pub defrags: usize,
    /// The highest revision a compaction was asked for (acknowledged or not): history after
    /// it is still there once the chores stop.
    pub compacted: i64,
}

/// Does the chores every `every` until `stop`, on the channels of `shared` (its history
/// records no chore); `seen` are the watchers' and the recorder's last revisions.
pub async fn run(shared: Shared, seen: Vec<Arc<AtomicI64>>, every: Duration, seed: u64) -> Chores {
    let Shared { channels, stop, .. } = shared;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut chores = Chores::default();
    loop {
        let due = tokio::time::Instant::now() + every;
        while tokio::time::Instant::now() < due {
            if stop.load(Ordering::Relaxed) {
                return chores;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let target = seen.iter().map(|s| s.load(Ordering::Relaxed)).min().unwrap_or(0);
        if target > chores.compacted {
            chores.compacted = target;
            let member = rng.random_range(0..channels.len());
            let compact = CompactionRequest {
                revision: target,
                physical: false,
            };
            let mut kv = KvClient::new(channels[member].clone());
            let asked = kv.compact(compact);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), asked).await {
                chores.compactions += 1;
            }
        }
        let member = rng.random_range(0..channels.len());
        let mut maintenance = MaintenanceClient::new(channels[member].clone());
        let asked = maintenance.defragment(DefragmentRequest {});
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(30), asked).await {
            chores.defrags += 1;
        }
    }
}
