//! Tunables of an [`crate::Engine`], with their defaults.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};

/// Configuration of an [`crate::Engine`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The write-ahead log's configuration.
    pub wal: cairn_wal::Config,
    /// Where the WAL's segments live (etcd's `--wal-dir`, for a dedicated disk). Default
    /// `None`: `<dir>/wal`.
    pub wal_dir: Option<std::path::PathBuf>,
    /// A checkpoint is written after this many applied log entries (and on close), and the
    /// log before it released; 0 checkpoints only on close. Default 10,000 (etcd's
    /// `--snapshot-count` default).
    pub checkpoint_entries: u64,
    /// Log entries kept before a checkpoint, so that a follower that far behind is sent
    /// entries rather than a snapshot of the whole state (etcd's
    /// `--experimental-snapshot-catchup-entries`). Default 5,000.
    pub snapshot_catch_up_entries: u64,
    /// The Raft tick (etcd's `--heartbeat-interval`). Default 100 ms.
    pub raft_tick: Duration,
    /// Ticks without a leader before a follower campaigns (etcd's `--election-timeout` is
    /// this times `raft_tick`). Default 10.
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats. Default 1.
    pub heartbeat_ticks: usize,
    /// Raft's pre-vote: a member campaigns only once a quorum would vote for it, so one
    /// coming back from a partition does not depose a healthy leader (etcd's `--pre-vote`).
    /// Default true.
    pub pre_vote: bool,
    /// A member of a group of several starts with its election clock advanced to one tick
    /// short of a timeout, so a new cluster elects sooner (etcd's
    /// `--initial-election-tick-advance`). Default true.
    pub advance_election_ticks: bool,
    /// How long a linearizable read waits for its ReadIndex round and for this member to
    /// apply up to it, and how long opening waits to catch up with the log (etcd's request
    /// timeout). Default 7 s.
    pub request_timeout: Duration,
    /// Bytes each data file is preallocated with (a record larger than this gets a file of its
    /// own size). Between 4 KiB and 1 GiB. Default 64 MiB.
    pub data_file_size: u64,
    /// The saved key index (what opening loads instead of reading every record, see
    /// `mvcc::saved_index`) is rewritten after a checkpoint once the records it does not
    /// cover reach this many bytes and an eighth of those it covers, and on close once they
    /// reach this many: a restart scans at most about that much. `u64::MAX`: never written.
    /// Default 64 MiB.
    pub saved_index_bytes: u64,
    /// Keys whose compacted history is dropped per step; the apply thread takes one step
    /// between requests, so a compaction never holds writes up for long. Default 250.
    pub compaction_batch: usize,
    /// The most operations one Txn may hold (etcd's `--max-txn-ops`). Default 128.
    pub max_txn_ops: usize,
    /// When kept history would grow past this many bytes, the NOSPACE alarm is raised and
    /// writes that add data fail until it is disarmed (etcd's `--quota-backend-bytes`);
    /// 0 disables the quota. Default 2 GiB.
    pub quota_backend_bytes: u64,
    /// Lease grants below this TTL, in seconds, are raised to it (etcd: ceil(1.5 × election
    /// timeout), 2 s by default).
    pub min_lease_ttl: i64,
    /// How long a simple auth token lives unused (etcd's `--auth-token-ttl`). Default 300 s.
    pub simple_token_ttl: Duration,
    /// How often expired leases are looked for; `None` leaves it to explicit
    /// `Leases::expire_now` calls (tests with a manual clock). Default 500 ms.
    pub lease_check_interval: Option<Duration>,
    /// How often the lease checker records remaining TTLs durably (etcd checkpoints every 5
    /// minutes); `None` never does it on its own. Default 5 minutes.
    pub lease_checkpoint_interval: Option<Duration>,
    /// At most this many expired leases are revoked per round, so mass expiry is spread over
    /// many small writes. Default 1000.
    pub lease_revoke_batch: usize,
    /// A round of revokes also stops once its leases hold this many keys (at least one lease
    /// per round): other writes queued behind a round wait for at most this many deletes.
    /// The checker runs rounds back to back until no expired lease is left. Default 1,000.
    pub lease_revoke_keys: usize,
    /// The clock leases expire by. Default: the system's monotonic clock.
    pub clock: Arc<dyn Clock>,
    /// Responses a watcher may have waiting before it falls behind and catches up from
    /// history instead. Default 128.
    pub watch_buffer: usize,
    /// Events read from history per catch-up step of a lagging watcher. Default 1000.
    pub watch_batch: usize,
    /// How often lagging watchers catch up. Default 100 ms.
    pub watch_sync_interval: Duration,
    /// How often watchers that asked for progress notifications get one, if nothing was sent
    /// to them meanwhile (etcd's `--experimental-watch-progress-notify-interval`); `None`
    /// never. Default 10 minutes.
    pub watch_progress_interval: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            wal: cairn_wal::Config::default(),
            wal_dir: None,
            checkpoint_entries: 10_000,
            snapshot_catch_up_entries: 5_000,
            raft_tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 1,
            pre_vote: true,
            advance_election_ticks: true,
            request_timeout: Duration::from_secs(7),
            data_file_size: 64 << 20,
            saved_index_bytes: 64 << 20,
            compaction_batch: 250,
            max_txn_ops: 128,
            quota_backend_bytes: 2 << 30,
            min_lease_ttl: 2,
            simple_token_ttl: Duration::from_secs(300),
            lease_check_interval: Some(Duration::from_millis(500)),
            lease_checkpoint_interval: Some(Duration::from_secs(300)),
            lease_revoke_batch: 1000,
            lease_revoke_keys: 1000,
            clock: Arc::new(SystemClock::default()),
            watch_buffer: 128,
            watch_batch: 1000,
            watch_sync_interval: Duration::from_millis(100),
            watch_progress_interval: Some(Duration::from_secs(600)),
        }
    }
}

impl Config {
    /// Checks every field is in range: a valid `wal`, `data_file_size` between 4 KiB and
    /// 1 GiB, `watch_sync_interval` non-zero, and the batch, buffer, `max_txn_ops` and
    /// `min_lease_ttl` fields at least 1. [`crate::Engine::open`] calls it; a failure is
    /// [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        self.wal.validate().map_err(|e| Error::InvalidConfig(e.to_string()))?;
        if self.lease_revoke_batch == 0 || self.min_lease_ttl < 1 {
            return Err(Error::InvalidConfig(
                "lease_revoke_batch and min_lease_ttl must be at least 1".into(),
            ));
        }
        if self.watch_buffer == 0 || self.watch_batch == 0 || self.watch_sync_interval.is_zero() {
            return Err(Error::InvalidConfig(
                "watch_buffer, watch_batch and watch_sync_interval must be positive".into(),
            ));
        }
        if !(4096..=1 << 30).contains(&self.data_file_size) {
            return Err(Error::InvalidConfig(
                "data_file_size must be between 4 KiB and 1 GiB".into(),
            ));
        }
        if self.raft_tick.is_zero() || self.heartbeat_ticks == 0 {
            return Err(Error::InvalidConfig(
                "raft_tick and heartbeat_ticks must be positive".into(),
            ));
        }
        if self.election_ticks <= self.heartbeat_ticks {
            return Err(Error::InvalidConfig(
                "election_ticks must be more than heartbeat_ticks".into(),
            ));
        }
        if self.compaction_batch == 0 {
            return Err(Error::InvalidConfig("compaction_batch must be at least 1".into()));
        }
        if self.max_txn_ops == 0 {
            return Err(Error::InvalidConfig("max_txn_ops must be at least 1".into()));
        }
        Ok(())
    }
}
