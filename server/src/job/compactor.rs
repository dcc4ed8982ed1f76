//! Auto-compaction (etcd's `--auto-compaction-mode` and `--auto-compaction-retention`), run by
//! the leader only.
//!
//! - periodic: every tenth of the retention period (at most every hour), compact to the
//!   revision that was current one retention period ago;
//! - revision: every 5 minutes, compact to the current revision less the retention.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::node::Node;
use crate::config::{self, CompactionMode};

/// How often revision mode compacts (etcd's).
const REVISION_INTERVAL: Duration = Duration::from_secs(300);

/// Runs until cancelled; returns at once when auto-compaction is off.
pub async fn run(node: Arc<Node>, mode: CompactionMode, retention: String) {
    match mode {
        CompactionMode::Periodic => {
            let Ok(Some(period)) = config::retention_period(&retention) else {
                return;
            };
            periodic(node, period).await;
        }
        CompactionMode::Revision => {
            let Ok(keep) = retention.trim().parse::<i64>() else {
                return;
            };
            if keep <= 0 {
                return;
            }
            let mut ticker = tokio::time::interval(REVISION_INTERVAL);
            loop {
                ticker.tick().await;
                let target = node.engine.current_revision() - keep;
                compact(&node, target).await;
            }
        }
    }
}

async fn periodic(node: Arc<Node>, period: Duration) {
    let step = (period / 10).clamp(Duration::from_millis(100), Duration::from_secs(3600));
    // (when, the revision then), oldest first.
    let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
    let mut ticker = tokio::time::interval(step);
    loop {
        ticker.tick().await;
        let now = Instant::now();
        samples.push_back((now, node.engine.current_revision()));
        let mut target = None;
        while let Some((when, rev)) = samples.front().copied() {
            if now.duration_since(when) < period {
                break;
            }
            target = Some(rev);
            samples.pop_front();
        }
        if let Some(rev) = target {
            compact(&node, rev).await;
        }
    }
}

async fn compact(node: &Arc<Node>, revision: i64) {
    let leading = node.engine.leader() == Some(node.member_id);
    if !leading || revision <= node.engine.status().compacted_revision || revision <= 1 {
        return;
    }
    match node.blocking(move |e| e.compact(revision)).await {
        Ok(_) => tracing::info!(revision, "auto-compacted"),
        Err(e) => tracing::warn!(revision, error = %e.message(), "auto-compaction failed"),
    }
}
