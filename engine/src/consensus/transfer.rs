//! Snapshots between members: a follower too far behind for the leader's log is sent the
//! engine's state instead of entries.
//!
//! **Leader.** raft-rs asks the [`super::log::RaftLog`] for a snapshot; it answers with
//! metadata only: the index, term and membership the apply thread last published. When the
//! node thread meets the resulting `MsgSnapshot` in a Ready, [`send`] streams the engine's
//! snapshot (the `format::snapshot` stream) through an OS pipe into
//! [`Transport::send_snapshot`], on threads of its own, and reports the outcome to raft.
//!
//! **Follower.** [`crate::Inbox::deliver_snapshot`] reads the stream into new data files beside
//! the live ones (the engine's `snapshot::Staged`, which this module sees only as a
//! [`super::interface::StagedState`]), holding neither the state lock nor the whole snapshot
//! in memory, then hands the message and the staged state to the node thread. If raft accepts the
//! snapshot, the apply thread swaps the staged state in and checkpoints it, and the node thread
//! restarts its log after the snapshot (a WAL truncation past the end). If not, the staged
//! files are deleted.
//!
//! The data may be newer than its metadata (the leader went on applying while it streamed):
//! the follower's state is then ahead of its raft log, and the apply thread skips the entries
//! it holds already.

use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::Sender;

use super::interface::{Input, Transport};
use crate::error::{Error, Failure, Result};
use crate::thread::Worker;

/// Writes the engine's current state as a snapshot stream; returns its size.
pub(crate) type SnapshotSource = Arc<dyn Fn(&mut dyn std::io::Write) -> Result<u64> + Send + Sync>;

/// Where a snapshot goes and what it is made of: the source writes it, the transport carries it,
/// and the outcome is reported to the node.
pub(crate) struct Route {
    pub(crate) source: SnapshotSource,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) report: Sender<Input>,
}

/// Streams a snapshot to member `to` on a thread of its own (`message` is raft's, without
/// the data), and reports how it went. `None` when the thread could not start (reported as
/// undelivered).
pub(crate) fn send(to: u64, message: Bytes, route: Route) -> Option<Worker> {
    let Route {
        source,
        transport,
        report,
    } = route;
    let failed = report.clone();
    let spawned = crate::thread::start("cairn-snapshot-send", move || {
        let outcome = stream(to, message, source, &*transport);
        match &outcome {
            Ok(size) => tracing::info!(to, bytes = size, "sent a snapshot"),
            Err(e) => tracing::warn!(to, error = %e, "sending a snapshot failed"),
        }
        let _ = report.send(Input::SnapshotSent {
            to,
            delivered: outcome.is_ok(),
        });
    });
    match spawned {
        Ok(worker) => Some(worker),
        Err(e) => {
            tracing::warn!(to, error = %e, "cannot start sending a snapshot");
            let _ = failed.send(Input::SnapshotSent { to, delivered: false });
            None
        }
    }
}

fn stream(to: u64, message: Bytes, source: SnapshotSource, transport: &dyn Transport) -> Result<u64> {
    let (mut reader, mut writer) = std::io::pipe().map_err(|e| Error::Snapshot(Failure::caused_by("pipe", e)))?;
    // The writer end closes when the source returns, which ends the stream.
    let producer = crate::thread::start("cairn-snapshot-write", move || source(&mut writer))?;
    let sent = transport.send_snapshot(to, message, &mut reader);
    // A writer still writing sees the pipe closed and stops.
    drop(reader);
    let produced = producer.join()?;
    sent.map_err(|e| Error::Snapshot(Failure::caused_by(format!("to member {to}"), e)))?;
    produced
}
