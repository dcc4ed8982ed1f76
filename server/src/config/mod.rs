//! The `cairn` command line: etcd's flags, with etcd's names, meanings and defaults (each also
//! read from its `ETCD_*` environment variable, so an etcd unit file or manifest can point at
//! cairn), and the offline snapshot tools.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::ids;

mod cluster;
mod compat;
pub mod env;
pub mod file;
mod invocation;
mod observability;
mod removed;
mod security;
mod storage;
mod transport;
mod value;
pub use cluster::{valid_peer_url, Cluster, Discovery, DiscoveryClient};
pub use compat::{Compat, CorruptionChecks, DOWNGRADE_CHECK_EVERY, FEATURE_GATES};
pub use invocation::Invocation;
pub use observability::{LogFormat, LogLevel, MetricsLevel, Observability, Rotation, Tracing, JOURNAL};
pub use removed::{Removed, REMOVED};
pub use security::{Security, TlsFiles};
pub use storage::Storage;
pub use transport::{HttpAccess, KeepAlive, Transport};
use value::bad;
pub use value::{go_duration, path, BadFlag};

/// An etcd-compatible key-value store: one member of a Raft group, serving etcd's v3 gRPC API.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, about)]
pub struct Cli {
    /// An offline tool to run instead of the server; `None` runs a member.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's flags, with their defaults and `ETCD_*` variables; parsed with a
    /// subcommand too (the tools log at `--log-level`).
    #[command(flatten)]
    pub flags: Flags,
}

/// Offline tools (etcdutl's).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Restore a snapshot into a new data directory, or describe one.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Check this machine for a member: `cairn check disk`.
    #[command(subcommand)]
    Check(CheckCommand),
}

/// `cairn check`'s checks.
#[derive(Debug, Subcommand)]
pub enum CheckCommand {
    /// Whether a disk is fit for a member's WAL: etcd's fio recipe (2,300-byte writes, each
    /// followed by an fdatasync), a verdict against etcd's guidance (p99 under 10 ms), and
    /// cairn's WAL on the same disk. Exits 1 when the disk is not fit.
    Disk(DiskArgs),
}

/// `cairn check disk`'s arguments.
#[derive(Debug, clap::Args)]
pub struct DiskArgs {
    /// A directory on the disk to check (where the member's WAL would live).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The fdatasync p99 a fit disk stays under (a Go duration; etcd's guidance is 10ms).
    #[arg(long, default_value = "10ms")]
    pub max_p99: String,
    /// Bytes written in all (etcd's recipe: 22 MiB).
    #[arg(long, default_value_t = 22 << 20)]
    pub size: u64,
    /// Bytes per write, each followed by an fdatasync (etcd's recipe: 2,300, about a
    /// Kubernetes object's WAL entry).
    #[arg(long, default_value_t = 2300)]
    pub block_size: u64,
    /// Appender threads for the WAL's group-commit run; 0 skips it.
    #[arg(long, default_value_t = 8)]
    pub appenders: usize,
    /// How long the WAL's group-commit run lasts, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub wal_seconds: f64,
    /// Print one JSON object instead of lines for people.
    #[arg(long)]
    pub json: bool,
}

/// `cairn snapshot`'s tools.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Create a member's data directory from a snapshot (`etcdctl snapshot save`'s file).
    Restore(RestoreArgs),
    /// Print a snapshot's revision, key count and size, after checking it.
    Status(StatusArgs),
}

/// `cairn snapshot restore`'s arguments.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The snapshot file.
    pub file: PathBuf,
    /// The data directory to create (default: ./<name>.cairn).
    // `<name>` is help text (clap turns doc comments into help), not an HTML tag.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_parser = crate::config::path)]
    pub data_dir: Option<PathBuf>,
    /// The restored member's name.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// The new cluster's members, name=peer-URL pairs (default: this member alone).
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// The new cluster's token.
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// The restored member's peer URLs.
    #[arg(long, default_value = "http://localhost:2380")]
    pub initial_advertise_peer_urls: String,
    /// Skip checking the SHA-256 trailer (a file not written by `etcdctl snapshot save`).
    #[arg(long)]
    pub skip_hash_check: bool,
}

/// `cairn snapshot status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The snapshot file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, short = 'w', default_value = "simple", value_parser = ["simple", "json", "table"])]
    pub write_out: String,
}

/// `--initial-cluster-state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterState {
    /// Bootstrap a new cluster.
    New,
    /// Join a cluster that exists (after `etcdctl member add`).
    Existing,
}

/// `--auto-compaction-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompactionMode {
    /// Keep history for a period of time (`--auto-compaction-retention` is a duration).
    Periodic,
    /// Keep the last N revisions (`--auto-compaction-retention` is a count).
    Revision,
}

/// `--logger`: zap, as etcd 3.5 and later take, with their refusals.
fn parse_logger(s: &str) -> Result<String, String> {
    match s {
        "zap" => Ok(s.to_string()),
        "capnslog" => Err("--logger=capnslog is removed in v3.5".into()),
        other => Err(format!("unknown logger option {other:?}")),
    }
}

/// etcd's server flags.
#[derive(Debug, Args)]
pub struct Flags {
    /// A YAML file with etcd's configuration keys; when given, every other flag and `ETCD_*`
    /// variable is ignored, as etcd ignores them.
    #[arg(long, value_parser = crate::config::path, env = "ETCD_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    /// This member's name in the cluster (the key of its --initial-cluster entry).
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: ./<name>.cairn, or ./<name>.etcd when started as
    /// `etcd`).
    // `<name>` is help text (clap turns doc comments into help), not an HTML tag.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_parser = crate::config::path, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the write-ahead log goes, if not inside --data-dir (a faster disk, say).
    #[arg(long, value_parser = crate::config::path, env = "ETCD_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic (gRPC and HTTP), comma-separated.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_URLS", default_value = "http://127.0.0.1:2379")]
    pub listen_client_urls: String,
    /// This member's client URLs, as told to the rest of the cluster.
    #[arg(long, env = "ETCD_ADVERTISE_CLIENT_URLS", default_value = "http://127.0.0.1:2379")]
    pub advertise_client_urls: String,
    /// URLs to listen on for peer traffic, comma-separated.
    #[arg(long, env = "ETCD_LISTEN_PEER_URLS", default_value = "http://127.0.0.1:2380")]
    pub listen_peer_urls: String,
    /// This member's peer URLs, as told to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://127.0.0.1:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// The initial cluster, name=peer-URL pairs (default: this member alone).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Whether to bootstrap a new cluster or join an existing one.
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", value_enum, default_value = "new")]
    pub initial_cluster_state: ClusterState,
    /// The token that, with the peer URLs, identifies members of the initial cluster.
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_TOKEN", default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// Applied entries between checkpoints (etcd's snapshots).
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 10_000)]
    pub snapshot_count: u64,
    /// Time between a leader's heartbeats, in milliseconds.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time a follower waits for a leader before campaigning, in milliseconds.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Raise the NOSPACE alarm when the backend takes more than this (0: 2 GiB).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: i64,
    /// How auto-compaction's retention is counted.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", value_enum, default_value = "periodic")]
    pub auto_compaction_mode: CompactionMode,
    /// History to keep: a duration for periodic ("1h", "30m", or hours as a bare number), a
    /// revision count for revision. 0 disables auto-compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// The leader promotes a learner once it is in sync (its log 90% of the leader's), as
    /// MemberPromote would (cairn's own; etcd has no such flag).
    #[arg(long, env = "ETCD_AUTO_PROMOTE_LEARNERS", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub auto_promote_learners: bool,
    /// The largest request the server accepts, in bytes.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: u64,
    /// The most operations in one txn.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: u64,
    /// The log level.
    #[arg(long, env = "ETCD_LOG_LEVEL", value_enum, default_value = "info")]
    pub log_level: LogLevel,
    /// The logger: zap, etcd's only one since 3.5 (accepted for etcd's command lines).
    #[arg(long, env = "ETCD_LOGGER", default_value = "zap", value_parser = parse_logger)]
    pub logger: String,
    /// Where logs go, comma-separated: stderr, stdout, default (stderr), systemd/journal
    /// (journald), or file paths (appended to).
    #[arg(long, env = "ETCD_LOG_OUTPUTS", default_value = "default", value_delimiter = ',')]
    pub log_outputs: Vec<String>,
    /// The log format: json (etcd's lines) or console (for people).
    #[arg(long, env = "ETCD_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// TLS on the client and peer ports, and the metrics port.
    #[command(flatten)]
    pub security: Security,
    /// etcd 3.6's and 3.7's newer flags, their `--experimental-*` aliases, and the flags
    /// cairn accepts without effect.
    #[command(flatten)]
    pub compat: Compat,
    /// Serving clients and peers: streams, keep-alives, listeners, CORS.
    #[command(flatten)]
    pub transport: Transport,
    /// Taking part in the cluster: pre-vote, membership checks, recovery, discovery.
    #[command(flatten)]
    pub cluster: Cluster,
    /// Metrics detail, profiles, log rotation, tracing.
    #[command(flatten)]
    pub observability: Observability,
    /// Durability, and etcd's storage tunables cairn has no counterpart for.
    #[command(flatten)]
    pub storage: Storage,
    /// etcd 3.5's v2 flags, refused.
    #[command(flatten)]
    pub removed: Removed,
    /// The name the binary was started as (not a flag: `main` sets it from argv\[0\]); it
    /// decides the data directory's default.
    #[arg(skip)]
    pub invocation: Invocation,
}

/// A comma-separated URL list, each URL once (etcd's unique URLs: kubeadm lists the same
/// URL twice when its advertise address is loopback).
pub fn url_list(flag: &'static str, value: &str) -> Result<Vec<String>, BadFlag> {
    let mut urls: Vec<String> = Vec::new();
    for u in value.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if !urls.iter().any(|seen| seen == u) {
            urls.push(u.to_string());
        }
    }
    if urls.is_empty() {
        return Err(bad(flag, "no URL given"));
    }
    for u in &urls {
        if !valid_peer_url(u) {
            return Err(bad(
                flag,
                format!("{u:?} is not a URL with a scheme, a host and a port"),
            ));
        }
    }
    Ok(urls)
}

/// One member of `--initial-cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialMember {
    /// The member's name (`--name` on that member).
    pub name: String,
    /// Its peer URLs, every one given for its name.
    pub peer_urls: Vec<String>,
    /// Its ID, derived from its peer URLs and `--initial-cluster-token` ([`ids::member_id`]).
    pub id: u64,
}

/// The attributes (name and peer URLs) each initial member starts with, by ID.
pub fn initial_attributes(members: &[InitialMember]) -> BTreeMap<u64, cairn_engine::MemberAttributes> {
    members
        .iter()
        .map(|m| {
            let attributes = cairn_engine::MemberAttributes {
                name: m.name.clone(),
                ..cairn_engine::MemberAttributes::with_peer_urls(m.peer_urls.clone())
            };
            (m.id, attributes)
        })
        .collect()
}

/// Parses `--initial-cluster` (`name=url,name=url,…`; a name may repeat for several URLs).
pub fn initial_cluster(value: &str, token: &str) -> Result<Vec<InitialMember>, BadFlag> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, url)) = pair.split_once('=') else {
            return Err(bad("initial-cluster", format!("{pair:?} is not name=URL")));
        };
        let url = url_list("initial-cluster", url)?;
        by_name.entry(name.to_string()).or_default().extend(url);
    }
    if by_name.is_empty() {
        return Err(bad("initial-cluster", "no member given"));
    }
    let members: Vec<InitialMember> = by_name
        .into_iter()
        .map(|(name, peer_urls)| InitialMember {
            id: ids::member_id(&peer_urls, token, None),
            name,
            peer_urls,
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for m in &members {
        for u in &m.peer_urls {
            if !seen.insert(u.clone()) {
                return Err(bad("initial-cluster", format!("{u} is given for two members")));
            }
        }
    }
    Ok(members)
}

/// Parses `--auto-compaction-retention` for periodic mode: "1h", "30m", "90s", or a bare
/// number of hours (etcd's convention); zero disables.
pub fn retention_period(value: &str) -> Result<Option<Duration>, BadFlag> {
    let v = value.trim();
    let parsed = if let Ok(hours) = v.parse::<f64>() {
        Some(hours * 3600.0)
    } else {
        let (number, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad("auto-compaction-retention", format!("{v:?} is not a duration"))),
        };
        number.parse::<f64>().ok().map(|n| n * scale)
    };
    match parsed {
        Some(secs) if secs.is_finite() && secs >= 0.0 => Ok((secs > 0.0).then(|| Duration::from_secs_f64(secs))),
        _ => Err(bad("auto-compaction-retention", format!("{v:?} is not a duration"))),
    }
}

impl Flags {
    /// The data directory: `--data-dir`, or `<name>.cairn` (`<name>.etcd` when started as
    /// `etcd`, as etcd's default).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from(format!("{}.{}", self.name, self.invocation.data_dir_extension())))
    }

    /// The dedicated WAL directory, if one is given (an empty value is none, as in etcd).
    pub fn wal_dir(&self) -> Option<PathBuf> {
        self.wal_dir.clone().filter(|d| !d.as_os_str().is_empty())
    }

    /// Checks the timing flags as etcd does.
    pub fn check_timing(&self) -> Result<(), BadFlag> {
        if self.heartbeat_interval == 0 {
            return Err(bad("heartbeat-interval", "must be positive"));
        }
        if self.election_timeout < 5 * self.heartbeat_interval {
            return Err(bad(
                "election-timeout",
                format!(
                    "{} ms should be at least 5 times --heartbeat-interval ({} ms)",
                    self.election_timeout, self.heartbeat_interval
                ),
            ));
        }
        if self.election_timeout > 50_000 {
            return Err(bad("election-timeout", "is too long (at most 50000 ms)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_cluster_parses_as_etcds() {
        let members = initial_cluster("a=http://10.0.0.1:2380,b=http://10.0.0.2:2380", "t").unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(members[0].name, "a");
        assert_ne!(members[0].id, members[1].id);
        assert!(initial_cluster("a", "t").is_err());
        assert!(initial_cluster("a=http://x:1,b=http://x:1", "t").is_err());
        assert!(initial_cluster("a=notaurl", "t").is_err());
    }

    #[test]
    fn a_url_given_twice_is_listened_on_once_as_etcd_does() {
        let urls = url_list(
            "listen-client-urls",
            "http://127.0.0.1:2379, http://127.0.0.1:2379,http://10.0.0.1:2379",
        );
        assert_eq!(urls.unwrap(), ["http://127.0.0.1:2379", "http://10.0.0.1:2379"]);
    }

    #[test]
    fn retention_reads_etcds_forms() {
        assert_eq!(retention_period("0").unwrap(), None);
        assert_eq!(retention_period("1").unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(retention_period("30m").unwrap(), Some(Duration::from_secs(1800)));
        assert_eq!(retention_period("5s").unwrap(), Some(Duration::from_secs(5)));
        assert!(retention_period("soon").is_err());
        assert!(retention_period("-1").is_err());
    }
}
