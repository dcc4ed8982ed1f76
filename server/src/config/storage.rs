//! How the member keeps its data: `--unsafe-no-fsync`, and the flags that tune etcd's
//! storage (bbolt's batching and freelist, the number of snapshot and WAL files kept, v2's
//! deprecation phase) which cairn's storage has no counterpart for: accepted with their
//! values checked, and logged once as without effect.

use clap::{ArgAction, Args};

use super::value::{bad, go_duration, BadFlag};

/// The flags of this module.
#[derive(Debug, Args)]
pub struct Storage {
    /// Skip every fsync: unsafe, a crash of the machine loses acknowledged writes (for tests).
    #[arg(long, env = "ETCD_UNSAFE_NO_FSYNC", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub unsafe_no_fsync: bool,
    /// bbolt's longest wait before committing (a Go duration); no effect in cairn, whose
    /// writes are durable when answered.
    #[arg(long, env = "ETCD_BACKEND_BATCH_INTERVAL", default_value = "")]
    pub backend_batch_interval: String,
    /// bbolt's most operations before committing; no effect in cairn.
    #[arg(long, env = "ETCD_BACKEND_BATCH_LIMIT", default_value_t = 0)]
    pub backend_batch_limit: i64,
    /// bbolt's freelist type (map or array); no effect in cairn.
    #[arg(long, env = "ETCD_BACKEND_BBOLT_FREELIST_TYPE", default_value = "map")]
    pub backend_bbolt_freelist_type: String,
    /// Snapshot files kept (0 unlimited); no effect in cairn, which keeps one checkpoint.
    #[arg(long, env = "ETCD_MAX_SNAPSHOTS", default_value_t = 5)]
    pub max_snapshots: u64,
    /// WAL files kept (0 unlimited); no effect in cairn, which releases segments once a
    /// checkpoint covers them.
    #[arg(long, env = "ETCD_MAX_WALS", default_value_t = 5)]
    pub max_wals: u64,
    /// The v2 store's deprecation phase; etcd enforces its default whatever is given, and
    /// cairn has no v2 store.
    #[arg(long, env = "ETCD_V2_DEPRECATION", default_value = "write-only")]
    pub v2_deprecation: String,
}

impl Storage {
    /// Checks every value, and logs each one given that changes nothing in cairn.
    pub fn check(&self) -> Result<(), BadFlag> {
        if !self.backend_batch_interval.is_empty() {
            go_duration("backend-batch-interval", &self.backend_batch_interval)?;
        }
        if !matches!(self.backend_bbolt_freelist_type.as_str(), "map" | "array") {
            return Err(bad(
                "backend-bbolt-freelist-type",
                format!("{:?} is neither map nor array", self.backend_bbolt_freelist_type),
            ));
        }
        let phases = ["not-yet", "write-only", "write-only-drop-data", "gone"];
        if !phases.contains(&self.v2_deprecation.as_str()) {
            return Err(bad(
                "v2-deprecation",
                format!("{:?} is none of {}", self.v2_deprecation, phases.join(", ")),
            ));
        }
        let given = [
            ("backend-batch-interval", !self.backend_batch_interval.is_empty()),
            ("backend-batch-limit", self.backend_batch_limit != 0),
            ("backend-bbolt-freelist-type", self.backend_bbolt_freelist_type != "map"),
            ("max-snapshots", self.max_snapshots != 5),
            ("max-wals", self.max_wals != 5),
            ("v2-deprecation", self.v2_deprecation != "write-only"),
        ];
        for (flag, _) in given.into_iter().filter(|(_, g)| *g) {
            tracing::info!(flag, "flag accepted without effect in cairn");
        }
        if self.unsafe_no_fsync {
            tracing::warn!("--unsafe-no-fsync: nothing is fsynced; a crash of the machine loses acknowledged writes");
        }
        Ok(())
    }
}
