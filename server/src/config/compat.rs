//! etcd 3.6's and 3.7's newer flags: `--watch-progress-notify-interval` and
//! `--snapshot-catchup-entries` with their 3.6 `--experimental-*` aliases, `--feature-gates`,
//! the hash checks' flags, the distributed-tracing switches and etcd 3.5's names of the tracing
//! flags (read by `Observability::tracing`), and the flags kubeadm and managed distributions
//! pass that tune what cairn does not have (bbolt): accepted with their types checked, logged
//! as without effect, so an etcd manifest starts cairn unchanged.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;

use super::value::{bad, go_duration, BadFlag};

/// etcd's server feature gates (3.6 and 3.7, `server/features`), with what cairn does with
/// each: all are accepted; the hash checks' two ([`EFFECTIVE_GATES`]) turn them on, and none
/// of the others changes cairn's behaviour, which already is what the gate turns on (or has
/// no such part).
pub const FEATURE_GATES: &[(&str, &str)] = &[
    ("StopGRPCServiceOnDefrag", "cairn serves during defragmentation"),
    ("TxnModeWriteWithSharedBuffer", "a bbolt buffering mode"),
    ("InitialCorruptCheck", "compare hashes with the peers before serving"),
    ("CompactHashCheck", "the leader compares the hashes kept at compactions"),
    ("LeaseCheckpoint", "remaining TTLs are always checkpointed"),
    ("LeaseCheckpointPersist", "remaining TTLs are always checkpointed"),
    ("SetMemberLocalAddr", "peer connections use the system's source address"),
    ("FastLeaseKeepAlive", "keep-alives are served by the leader at once"),
    ("PriorityRequest", "no request priorities"),
];

/// The gates that change what cairn does.
pub const EFFECTIVE_GATES: &[&str] = &["InitialCorruptCheck", "CompactHashCheck"];

/// The flags of this module.
// The hidden flags are documented a group at a time, on the first of each; clap turns doc
// comments into help text, so each is not given one of its own.
#[allow(missing_docs)]
#[derive(Debug, Args)]
pub struct Compat {
    /// How often idle watchers that asked for progress notifications get one (a Go duration).
    #[arg(long, env = "ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub watch_progress_notify_interval: Option<String>,
    /// etcd 3.6's name for --watch-progress-notify-interval.
    #[arg(long, env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", hide = true)]
    pub experimental_watch_progress_notify_interval: Option<String>,
    /// Entries a leader keeps before its latest snapshot for followers that are behind
    /// (default 5000).
    #[arg(long, env = "ETCD_SNAPSHOT_CATCHUP_ENTRIES")]
    pub snapshot_catchup_entries: Option<u64>,
    /// etcd 3.6's name for --snapshot-catchup-entries.
    #[arg(long, env = "ETCD_EXPERIMENTAL_SNAPSHOT_CATCHUP_ENTRIES", hide = true)]
    pub experimental_snapshot_catchup_entries: Option<u64>,
    /// etcd's server feature gates, `Name=true|false,...`; unknown names are refused.
    #[arg(long, env = "ETCD_FEATURE_GATES")]
    pub feature_gates: Option<String>,

    /// Compare this member's hash with its peers' before serving clients, and exit if they
    /// differ (the InitialCorruptCheck feature gate does the same).
    #[arg(long, env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", num_args = 0..=1, default_missing_value = "true")]
    pub experimental_initial_corrupt_check: Option<bool>,
    /// The leader compares the hashes members keep at each compaction, every
    /// --compact-hash-check-time (the CompactHashCheck feature gate does the same).
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub experimental_compact_hash_check_enabled: Option<bool>,

    /// Bools as Go's flag package reads them (`--flag`, `--flag=true|false`): the two that turn
    /// distributed tracing on, and those of what cairn does not have or always does.
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_enable_lease_checkpoint: Option<bool>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT_PERSIST", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_enable_lease_checkpoint_persist: Option<bool>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_MEMORY_MLOCK", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_memory_mlock: Option<bool>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_TXN_MODE_WRITE_WITH_SHARED_BUFFER", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_txn_mode_write_with_shared_buffer: Option<bool>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_STOP_GRPC_SERVICE_ON_DEFRAG", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_stop_grpc_service_on_defrag: Option<bool>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_DISTRIBUTED_TRACING", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_enable_distributed_tracing: Option<bool>,
    #[arg(long, env = "ETCD_ENABLE_DISTRIBUTED_TRACING", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub enable_distributed_tracing: Option<bool>,
    #[arg(long, env = "ETCD_MEMORY_MLOCK", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub memory_mlock: Option<bool>,

    /// How often the leader compares the latest revision's hash with the members' (a Go
    /// duration; 0, the default, for never).
    #[arg(long, env = "ETCD_CORRUPT_CHECK_TIME")]
    pub corrupt_check_time: Option<String>,
    /// etcd 3.5's name for --corrupt-check-time.
    #[arg(long, env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME", hide = true)]
    pub experimental_corrupt_check_time: Option<String>,
    /// How often the leader compares compaction hashes, once enabled (default 1m).
    #[arg(long, env = "ETCD_COMPACT_HASH_CHECK_TIME")]
    pub compact_hash_check_time: Option<String>,
    /// etcd 3.5's name for --compact-hash-check-time.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_TIME", hide = true)]
    pub experimental_compact_hash_check_time: Option<String>,

    /// Durations: --warning-apply-duration, --downgrade-check-time, and those of what cairn
    /// does not have (bbolt compaction pacing, unary request warnings).
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACTION_SLEEP_INTERVAL", hide = true)]
    pub experimental_compaction_sleep_interval: Option<String>,
    #[arg(long, env = "ETCD_COMPACTION_SLEEP_INTERVAL", hide = true)]
    pub compaction_sleep_interval: Option<String>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_DOWNGRADE_CHECK_TIME", hide = true)]
    pub experimental_downgrade_check_time: Option<String>,
    #[arg(long, env = "ETCD_DOWNGRADE_CHECK_TIME", hide = true)]
    pub downgrade_check_time: Option<String>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_WARNING_APPLY_DURATION", hide = true)]
    pub experimental_warning_apply_duration: Option<String>,
    #[arg(long, env = "ETCD_WARNING_APPLY_DURATION", hide = true)]
    pub warning_apply_duration: Option<String>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_WARNING_UNARY_REQUEST_DURATION", hide = true)]
    pub experimental_warning_unary_request_duration: Option<String>,
    #[arg(long, env = "ETCD_WARNING_UNARY_REQUEST_DURATION", hide = true)]
    pub warning_unary_request_duration: Option<String>,

    /// Numbers and names of what cairn does not have, and etcd 3.5's names of the tracing
    /// flags.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACTION_BATCH_LIMIT", hide = true)]
    pub experimental_compaction_batch_limit: Option<i64>,
    #[arg(long, env = "ETCD_COMPACTION_BATCH_LIMIT", hide = true)]
    pub compaction_batch_limit: Option<i64>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_BOOTSTRAP_DEFRAG_THRESHOLD_MEGABYTES", hide = true)]
    pub experimental_bootstrap_defrag_threshold_megabytes: Option<u64>,
    #[arg(long, env = "ETCD_BOOTSTRAP_DEFRAG_THRESHOLD_MEGABYTES", hide = true)]
    pub bootstrap_defrag_threshold_megabytes: Option<u64>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_DISTRIBUTED_TRACING_SAMPLING_RATE", hide = true)]
    pub experimental_distributed_tracing_sampling_rate: Option<i64>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_DISTRIBUTED_TRACING_ADDRESS", hide = true)]
    pub experimental_distributed_tracing_address: Option<String>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_DISTRIBUTED_TRACING_SERVICE_NAME", hide = true)]
    pub experimental_distributed_tracing_service_name: Option<String>,
    #[arg(long, env = "ETCD_EXPERIMENTAL_DISTRIBUTED_TRACING_INSTANCE_ID", hide = true)]
    pub experimental_distributed_tracing_instance_id: Option<String>,
}

impl Compat {
    /// The progress notification interval: 10 minutes unless set (etcd's default); `None` for
    /// 0, which turns periodic notifications off.
    pub fn watch_progress_interval(&self) -> Result<Option<Duration>, BadFlag> {
        let given = match (
            &self.watch_progress_notify_interval,
            &self.experimental_watch_progress_notify_interval,
        ) {
            (Some(v), _) => Some(go_duration("watch-progress-notify-interval", v)?),
            (None, Some(v)) => Some(go_duration("experimental-watch-progress-notify-interval", v)?),
            (None, None) => None,
        };
        Ok(match given {
            None => Some(Duration::from_secs(600)),
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
        })
    }

    /// `--warning-apply-duration`, or its 3.6 alias, or etcd's default of 100 ms: requests
    /// slower than this are logged.
    pub fn warning_apply_duration(&self) -> Result<Duration, BadFlag> {
        match (&self.warning_apply_duration, &self.experimental_warning_apply_duration) {
            (Some(v), _) => go_duration("warning-apply-duration", v),
            (None, Some(v)) => go_duration("experimental-warning-apply-duration", v),
            (None, None) => Ok(Duration::from_millis(100)),
        }
    }

    /// How often the leader asks the members their release, to raise the cluster version and
    /// follow a downgrade (`crate::job::versions`; etcd's default, 5 s).
    pub fn downgrade_check_time(&self) -> Result<Duration, BadFlag> {
        match (&self.downgrade_check_time, &self.experimental_downgrade_check_time) {
            (Some(v), _) => go_duration("downgrade-check-time", v),
            (None, Some(v)) => go_duration("experimental-downgrade-check-time", v),
            (None, None) => Ok(DOWNGRADE_CHECK_EVERY),
        }
    }

    /// The hash checks the flags and feature gates turn on; all are off unless asked for, as
    /// in etcd.
    pub fn corruption_checks(&self) -> Result<CorruptionChecks, BadFlag> {
        let gates = self.feature_gates()?;
        let duration = |new: &'static str,
                        new_value: &Option<String>,
                        old: &'static str,
                        old_value: &Option<String>| match (new_value, old_value) {
            (Some(v), _) => go_duration(new, v).map(Some),
            (None, Some(v)) => go_duration(old, v).map(Some),
            (None, None) => Ok(None),
        };
        let latest = duration(
            "corrupt-check-time",
            &self.corrupt_check_time,
            "experimental-corrupt-check-time",
            &self.experimental_corrupt_check_time,
        )?;
        let compaction = duration(
            "compact-hash-check-time",
            &self.compact_hash_check_time,
            "experimental-compact-hash-check-time",
            &self.experimental_compact_hash_check_time,
        )?;
        let compaction_on =
            self.experimental_compact_hash_check_enabled == Some(true) || gates.get("CompactHashCheck") == Some(&true);
        Ok(CorruptionChecks {
            initial: self.experimental_initial_corrupt_check == Some(true)
                || gates.get("InitialCorruptCheck") == Some(&true),
            latest_every: latest.filter(|d| !d.is_zero()),
            compaction_every: match compaction_on {
                true => Some(compaction.filter(|d| !d.is_zero()).unwrap_or(Duration::from_secs(60))),
                false => None,
            },
        })
    }

    /// `--snapshot-catchup-entries`, or its 3.6 alias, or etcd's default of 5000.
    pub fn snapshot_catchup_entries(&self) -> u64 {
        self.snapshot_catchup_entries
            .or(self.experimental_snapshot_catchup_entries)
            .unwrap_or(5000)
    }

    /// `--feature-gates` parsed; an unknown gate or a value other than true/false is refused,
    /// as etcd refuses it.
    pub fn feature_gates(&self) -> Result<BTreeMap<&'static str, bool>, BadFlag> {
        let mut gates = BTreeMap::new();
        let Some(value) = &self.feature_gates else {
            return Ok(gates);
        };
        for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, on)) = pair.split_once('=') else {
                return Err(bad("feature-gates", format!("missing bool value for {pair}")));
            };
            let Some((known, _)) = FEATURE_GATES.iter().find(|(g, _)| *g == name.trim()) else {
                return Err(bad(
                    "feature-gates",
                    format!("unrecognized feature gate: {}", name.trim()),
                ));
            };
            let on = on.trim().parse::<bool>().map_err(|_| {
                bad(
                    "feature-gates",
                    format!("invalid value of {known}={on}, err: not a bool"),
                )
            })?;
            gates.insert(*known, on);
        }
        Ok(gates)
    }

    /// Checks every value, and logs each flag given that changes nothing in cairn.
    pub fn check(&self) -> Result<(), BadFlag> {
        self.watch_progress_interval()?;
        self.warning_apply_duration()?;
        self.downgrade_check_time()?;
        self.corruption_checks()?;
        for (name, on) in self.feature_gates()? {
            if EFFECTIVE_GATES.contains(&name) {
                continue;
            }
            let why = FEATURE_GATES.iter().find(|(g, _)| *g == name).map_or("", |(_, w)| *w);
            tracing::info!(gate = name, enabled = on, "feature gate accepted without effect: {why}");
        }
        let durations = [
            (
                "experimental-compaction-sleep-interval",
                &self.experimental_compaction_sleep_interval,
            ),
            ("compaction-sleep-interval", &self.compaction_sleep_interval),
            (
                "experimental-warning-unary-request-duration",
                &self.experimental_warning_unary_request_duration,
            ),
            ("warning-unary-request-duration", &self.warning_unary_request_duration),
        ];
        for (flag, value) in durations {
            if let Some(v) = value {
                go_duration(flag, v)?;
                tracing::info!(flag, value = %v, "flag accepted without effect in cairn");
            }
        }
        let others = [
            (
                "experimental-enable-lease-checkpoint",
                self.experimental_enable_lease_checkpoint.is_some(),
            ),
            (
                "experimental-enable-lease-checkpoint-persist",
                self.experimental_enable_lease_checkpoint_persist.is_some(),
            ),
            ("experimental-memory-mlock", self.experimental_memory_mlock.is_some()),
            ("memory-mlock", self.memory_mlock.is_some()),
            (
                "experimental-txn-mode-write-with-shared-buffer",
                self.experimental_txn_mode_write_with_shared_buffer.is_some(),
            ),
            (
                "experimental-stop-grpc-service-on-defrag",
                self.experimental_stop_grpc_service_on_defrag.is_some(),
            ),
            (
                "experimental-compaction-batch-limit",
                self.experimental_compaction_batch_limit.is_some(),
            ),
            ("compaction-batch-limit", self.compaction_batch_limit.is_some()),
            (
                "experimental-bootstrap-defrag-threshold-megabytes",
                self.experimental_bootstrap_defrag_threshold_megabytes.is_some(),
            ),
            (
                "bootstrap-defrag-threshold-megabytes",
                self.bootstrap_defrag_threshold_megabytes.is_some(),
            ),
        ];
        for (flag, _) in others.into_iter().filter(|(_, given)| *given) {
            tracing::info!(flag, "flag accepted without effect in cairn");
        }
        Ok(())
    }
}

/// How often the leader asks the members their release, unless --downgrade-check-time says (etcd's default
/// for it; its version monitor runs every 4 s).
pub const DOWNGRADE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The divergence checks the flags turn on ([`Compat::corruption_checks`]; `corruption` runs them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorruptionChecks {
    /// Compare with the peers before serving.
    pub initial: bool,
    /// How often the leader compares the latest revision's hashes.
    pub latest_every: Option<Duration>,
    /// How often the leader compares compaction hashes (`None`: members keep none).
    pub compaction_every: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        compat: Compat,
    }

    fn parse(args: &[&str]) -> Result<Compat, clap::Error> {
        Only::try_parse_from(std::iter::once("cairn").chain(args.iter().copied())).map(|o| o.compat)
    }

    #[test]
    fn the_progress_interval_takes_go_durations_under_either_name() {
        let c = parse(&["--watch-progress-notify-interval=5s"]).unwrap();
        assert_eq!(c.watch_progress_interval().unwrap(), Some(Duration::from_secs(5)));
        let c = parse(&["--experimental-watch-progress-notify-interval", "1m30s"]).unwrap();
        assert_eq!(c.watch_progress_interval().unwrap(), Some(Duration::from_secs(90)));
        let c = parse(&[]).unwrap();
        assert_eq!(c.watch_progress_interval().unwrap(), Some(Duration::from_secs(600)));
        let c = parse(&["--watch-progress-notify-interval=0s"]).unwrap();
        assert_eq!(c.watch_progress_interval().unwrap(), None);
        let c = parse(&["--watch-progress-notify-interval=soon"]).unwrap();
        assert!(c.watch_progress_interval().is_err());
    }

    #[test]
    fn feature_gates_known_to_etcd_are_accepted_and_unknown_ones_refused() {
        let c = parse(&["--feature-gates=InitialCorruptCheck=true,StopGRPCServiceOnDefrag=false"]).unwrap();
        let gates = c.feature_gates().unwrap();
        assert_eq!(gates.get("InitialCorruptCheck"), Some(&true));
        assert_eq!(gates.get("StopGRPCServiceOnDefrag"), Some(&false));
        let e = parse(&["--feature-gates=Teleport=true"])
            .unwrap()
            .feature_gates()
            .unwrap_err();
        assert_eq!(e.to_string(), "--feature-gates: unrecognized feature gate: Teleport");
        assert!(parse(&["--feature-gates=InitialCorruptCheck=maybe"])
            .unwrap()
            .feature_gates()
            .is_err());
        assert!(parse(&["--feature-gates=InitialCorruptCheck"])
            .unwrap()
            .feature_gates()
            .is_err());
    }

    #[test]
    fn kubeadms_flags_are_accepted_and_checked() {
        let c = parse(&[
            "--experimental-initial-corrupt-check=true",
            "--experimental-watch-progress-notify-interval=5s",
            "--experimental-snapshot-catchup-entries=100",
            "--experimental-compact-hash-check-enabled",
            "--experimental-corrupt-check-time=3m",
        ])
        .unwrap();
        assert!(c.check().is_ok());
        assert_eq!(c.snapshot_catchup_entries(), 100);
        assert!(parse(&["--experimental-corrupt-check-time=3 minutes"])
            .unwrap()
            .check()
            .is_err());
        assert!(parse(&["--experimental-initial-corrupt-check=yes"]).is_err());
    }

    #[test]
    fn hash_checks_are_off_unless_a_flag_or_a_gate_turns_them_on() {
        let checks = |args: &[&str]| parse(args).unwrap().corruption_checks().unwrap();
        let none = checks(&[]);
        assert!(!none.initial && none.latest_every.is_none() && none.compaction_every.is_none());
        let old = checks(&[
            "--experimental-initial-corrupt-check",
            "--experimental-corrupt-check-time=3m",
            "--experimental-compact-hash-check-enabled=true",
        ]);
        assert!(old.initial);
        assert_eq!(old.latest_every, Some(Duration::from_secs(180)));
        assert_eq!(
            old.compaction_every,
            Some(Duration::from_secs(60)),
            "etcd's default period"
        );
        let new = checks(&[
            "--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true",
            "--corrupt-check-time=0s",
            "--compact-hash-check-time=10s",
            "--experimental-compact-hash-check-time=20s",
        ]);
        assert!(new.initial);
        assert_eq!(new.latest_every, None, "0 turns the periodic check off");
        assert_eq!(
            new.compaction_every,
            Some(Duration::from_secs(10)),
            "the newer name wins"
        );
        let period_alone = checks(&["--compact-hash-check-time=10s"]);
        assert_eq!(
            period_alone.compaction_every, None,
            "a period does not turn the check on"
        );
        assert!(parse(&["--corrupt-check-time=often"])
            .unwrap()
            .corruption_checks()
            .is_err());
    }
}
