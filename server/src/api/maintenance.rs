//! The Maintenance service: Alarm, Status, Defragment, Hash, HashKV, Snapshot and MoveLeader.

use std::sync::Arc;

use cairn_engine::Alarm;
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};

use crate::api::access;
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::API_VERSION;

/// Bytes per Snapshot response.
const SNAPSHOT_CHUNK: usize = 64 << 10;

/// The Maintenance service over a [`Node`].
#[derive(Debug, Clone)]
pub struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    /// The service for `node`. Once auth is on, Status and listing alarms need an
    /// authenticated caller, everything else an admin.
    pub fn new(node: Arc<Node>) -> MaintenanceService {
        MaintenanceService { node }
    }
}

fn alarm_type(alarm: Alarm) -> pb::AlarmType {
    match alarm {
        Alarm::NoSpace => pb::AlarmType::Nospace,
        Alarm::Corrupt => pb::AlarmType::Corrupt,
    }
}

/// etcd's text for an alarm in `Status.errors`: the `AlarmMember` in protobuf's text format,
/// which leaves out a member ID of 0. etcd 3.5 ends it with a space, 3.7 does not; cairn
/// follows 3.7.
fn alarm_error(member: u64, alarm: Alarm) -> String {
    let name = match alarm {
        Alarm::NoSpace => "NOSPACE",
        Alarm::Corrupt => "CORRUPT",
    };
    match member {
        0 => format!("alarm:{name}"),
        member => format!("memberID:{member} alarm:{name}"),
    }
}

type SnapshotStream = super::ResponseStream<pb::SnapshotResponse>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, request: Request<pb::AlarmRequest>) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        let caller = self.node.caller(&request).await?;
        let r = request.into_inner();
        if r.action == AlarmAction::Get as i32 {
            access::authenticated(&self.node.engine, caller.as_ref())?;
        } else {
            access::admin(&self.node.engine, caller.as_ref())?;
        }
        let alarm = match pb::AlarmType::try_from(r.alarm) {
            Ok(pb::AlarmType::Nospace) => Some(Alarm::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(Alarm::Corrupt),
            _ => None,
        };
        // The member the alarm is for, as given: etcd stores an alarm activated for member 0
        // under 0.
        let member = r.member_id;
        let report = |alarms: Vec<(u64, Alarm)>| -> Vec<pb::AlarmMember> {
            alarms
                .into_iter()
                .map(|(member_id, a)| pb::AlarmMember {
                    member_id,
                    alarm: alarm_type(a) as i32,
                })
                .collect()
        };
        let alarms = match (AlarmAction::try_from(r.action), alarm) {
            (Ok(AlarmAction::Get), _) => report(self.node.engine.maintenance().alarms()),
            (Ok(AlarmAction::Activate), Some(a)) => {
                self.node
                    .blocking(move |e| e.maintenance().alarm_activate(member, a))
                    .await?;
                report(vec![(member, a)])
            }
            (Ok(AlarmAction::Deactivate), Some(a)) => {
                let raised = self.node.engine.maintenance().alarms().contains(&(member, a));
                self.node
                    .blocking(move |e| e.maintenance().alarm_disarm(member, a))
                    .await?;
                report(if raised { vec![(member, a)] } else { Vec::new() })
            }
            // Activating or deactivating "no alarm" changes nothing.
            (Ok(_), None) => Vec::new(),
            (Err(_), _) => return Err(Status::invalid_argument("etcdserver: unknown alarm action")),
        };
        Ok(Response::new(pb::AlarmResponse {
            header: Some(self.node.current_header()),
            alarms,
        }))
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::authenticated(&self.node.engine, caller.as_ref())?;
        let e = &self.node.engine;
        let status = e.status();
        let versions = e.server().versions();
        let errors = e
            .maintenance()
            .alarms()
            .into_iter()
            .map(|(member, a)| alarm_error(member, a))
            .collect();
        Ok(Response::new(pb::StatusResponse {
            header: Some(self.node.current_header()),
            version: API_VERSION.to_string(),
            db_size: i64::try_from(status.size).unwrap_or(i64::MAX),
            leader: status.leader.unwrap_or(0),
            raft_index: status.commit_index,
            raft_term: status.term,
            raft_applied_index: status.applied_index,
            errors,
            db_size_in_use: i64::try_from(status.size_in_use).unwrap_or(i64::MAX),
            is_learner: status.is_learner,
            // cairn's own: the forms its data is written in (`cairn_engine::version`).
            storage_version: full(versions.cluster()),
            db_size_quota: i64::try_from(self.node.limits.quota_backend_bytes).unwrap_or(i64::MAX),
            downgrade_info: Some(pb::DowngradeInfo {
                enabled: versions.downgrade.is_some(),
                target_version: versions.downgrade.map(full).unwrap_or_default(),
            }),
        }))
    }

    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        self.node.blocking(|e| e.maintenance().defragment()).await?;
        // No header, as etcd (3.4 to 3.7) answers.
        Ok(Response::new(pb::DefragmentResponse { header: None }))
    }

    async fn hash(&self, request: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        // etcd hashes its whole backend file; cairn hashes the history kept (what HashKV at the
        // current revision covers), which members agree on just the same.
        let hash = self.node.blocking(|e| e.maintenance().hash_kv(0)).await?;
        Ok(Response::new(pb::HashResponse {
            header: Some(self.node.header(hash.hash_revision)),
            hash: hash.hash,
        }))
    }

    async fn hash_kv(&self, request: Request<pb::HashKvRequest>) -> Result<Response<pb::HashKvResponse>, Status> {
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        let revision = request.into_inner().revision;
        let hash = self.node.blocking(move |e| e.maintenance().hash_kv(revision)).await?;
        Ok(Response::new(pb::HashKvResponse {
            header: Some(self.node.current_header()),
            hash: hash.hash,
            // etcd reports -1 for a store never compacted.
            compact_revision: if hash.compact_revision == 0 {
                -1
            } else {
                hash.compact_revision
            },
            hash_revision: hash.hash_revision,
        }))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(&self, request: Request<pb::SnapshotRequest>) -> Result<Response<SnapshotStream>, Status> {
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || {
            let header = node.current_header();
            let started = std::time::Instant::now();
            // etcd's format, as etcd sends it: the database, then its SHA-256.
            let finished = etcd_snapshot(&node.engine).and_then(|(file, len)| {
                tracing::info!(bytes = len, written_in = ?started.elapsed(), "sending a snapshot to a client");
                let mut out = SnapshotSender::new(tx.clone(), header, len);
                out.send_file(file, len).map_err(|e| {
                    cairn_engine::Error::Snapshot(cairn_engine::Failure::caused_by("send the snapshot", e))
                })?;
                out.finish()?;
                tracing::info!(bytes = len, took = ?started.elapsed(), "sent a snapshot to a client");
                Ok(())
            });
            if let Err(e) = finished {
                let _ = tx.blocking_send(Err(crate::errors::status(&e)));
            }
        });
        let stream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(Response::new(super::leader_bound(
            &self.node,
            request.metadata(),
            stream,
        )))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        let target = request.into_inner().target_id;
        self.node.blocking(move |e| e.members().move_leader(target)).await?;
        // No header, as etcd (3.4 to 3.7) answers.
        Ok(Response::new(pb::MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        request: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        use crate::api::downgrade::{validate, Refusal};
        use pb::downgrade_request::DowngradeAction;
        access::admin(&self.node.engine, self.node.caller(&request).await?.as_ref())?;
        let request = request.into_inner();
        let agreed = self.node.engine.server().versions();
        match DowngradeAction::try_from(request.action) {
            Ok(DowngradeAction::Validate) => {
                validate(&agreed, &request.version).map_err(|r| r.status())?;
            }
            Ok(DowngradeAction::Enable) => {
                let target = validate(&agreed, &request.version).map_err(|r| r.status())?;
                tracing::info!(target = %target, "enabling a downgrade");
                self.node
                    .blocking(move |e| e.server().set_downgrade(Some(target)))
                    .await?;
            }
            Ok(DowngradeAction::Cancel) => {
                if agreed.downgrade.is_none() {
                    return Err(Refusal::NoneInProgress.status());
                }
                tracing::info!("cancelling the downgrade");
                self.node.blocking(|e| e.server().set_downgrade(None)).await?;
            }
            Err(_) => return Err(Status::invalid_argument("etcdserver: unknown downgrade action")),
        }
        Ok(Response::new(pb::DowngradeResponse {
            header: Some(self.node.current_header()),
            version: full(agreed.cluster()),
        }))
    }
}

/// A release line as etcd writes versions in Status and Downgrade answers: `0.2.0`.
fn full(v: cairn_engine::version::Version) -> String {
    format!("{v}.0")
}

/// A snapshot of `engine` in etcd's format, in a file of its own beside the data (unlinked at
/// once: it goes when the handle does); the file, read from its start, and its length.
fn etcd_snapshot(engine: &cairn_engine::Engine) -> cairn_engine::Result<(std::fs::File, u64)> {
    use std::io::Seek;
    let io = |e| cairn_engine::Error::Snapshot(cairn_engine::Failure::caused_by("a file for the snapshot", e));
    let path = engine.dir().join(format!(
        "snapshot-{:x}.tmp",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io)?;
    std::fs::remove_file(&path).map_err(io)?;
    let (mut file, len) = engine.maintenance().snapshot_etcd(file)?;
    file.rewind().map_err(io)?;
    Ok((file, len))
}

/// Turns the engine's snapshot stream into Snapshot responses, as etcd sends them: the data,
/// zero padding to a multiple of 512 bytes, then the SHA-256 of everything before it (so the
/// total size is 32 more than a multiple of 512, which etcd's tools check for).
struct SnapshotSender {
    tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
    header: Option<pb::ResponseHeader>,
    buffer: Vec<u8>,
    hash: Sha256,
    written: u64,
    /// What the snapshot is expected to take, for `remaining_bytes` (its size is known only at
    /// the end).
    estimate: u64,
}

impl SnapshotSender {
    fn new(
        tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
        header: pb::ResponseHeader,
        estimate: u64,
    ) -> SnapshotSender {
        SnapshotSender {
            tx,
            header: Some(header),
            buffer: Vec::with_capacity(SNAPSHOT_CHUNK),
            hash: Sha256::new(),
            written: 0,
            estimate,
        }
    }

    fn send(&mut self, blob: Vec<u8>, remaining: u64) -> std::io::Result<()> {
        let message = pb::SnapshotResponse {
            header: self.header.take(),
            remaining_bytes: remaining,
            blob: blob.into(),
            version: API_VERSION.to_string(),
        };
        self.tx
            .blocking_send(Ok(message))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }

    fn send_buffer(&mut self) -> std::io::Result<()> {
        let blob = std::mem::replace(&mut self.buffer, Vec::with_capacity(SNAPSHOT_CHUNK));
        self.written += blob.len() as u64;
        // Never 0 before the last response.
        let remaining = self.estimate.saturating_sub(self.written).max(1);
        self.send(blob, remaining)
    }

    /// Sends the first `len` bytes of `file`, read a chunk at a time straight into the
    /// response, but for the last chunk, which [`SnapshotSender::finish`] sends.
    fn send_file(&mut self, mut file: std::fs::File, len: u64) -> std::io::Result<()> {
        use std::io::Read;
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left.min(SNAPSHOT_CHUNK as u64)).unwrap_or(SNAPSHOT_CHUNK);
            self.buffer.resize(n, 0);
            file.read_exact(&mut self.buffer)?;
            self.hash.update(&self.buffer);
            left -= n as u64;
            if left > 0 {
                self.send_buffer()?;
            }
        }
        Ok(())
    }

    /// Pads, appends the hash and sends the last response.
    fn finish(mut self) -> cairn_engine::Result<()> {
        let size = self.written + self.buffer.len() as u64;
        let padding = (512 - size % 512) % 512;
        let zeros = vec![0u8; usize::try_from(padding).unwrap_or(0)];
        self.hash.update(&zeros);
        self.buffer.extend_from_slice(&zeros);
        let digest = std::mem::take(&mut self.hash).finalize();
        self.buffer.extend_from_slice(&digest);
        let blob = std::mem::take(&mut self.buffer);
        self.send(blob, 0)
            .map_err(|e| cairn_engine::Error::Snapshot(cairn_engine::Failure::caused_by("send the last chunk", e)))
    }
}
