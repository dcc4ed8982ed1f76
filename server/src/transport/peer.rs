//! The peer transport over gRPC (cairn's own `cairnpeer.Peer` service on the peer URLs): Raft
//! messages as opaque bytes on one long-lived client stream per peer, and snapshots streamed in
//! chunks on a call of their own.
//!
//! Sending never blocks the node thread: each peer has a bounded queue drained by a task that
//! keeps a stream open, reconnecting with a pause after a failure; when the queue is full,
//! messages are dropped (Raft sends again). A message from another cluster is refused. A member
//! joining an existing cluster asks its peers for its ID and the cluster's ([`discover`]).

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use cairn_engine::{Engine, HashKv, Inbox, Transport};
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::api::metrics::{PeerMetrics, PROBE_EVERY};
use crate::pb::peer as pb;
use crate::pb::peer::peer_client::PeerClient;
use crate::pb::peer::peer_server::{Peer, PeerServer};
use crate::transport::tls::Connector;

/// Messages queued for one peer before new ones are dropped.
const QUEUE: usize = 4096;
/// How long a member asked for its hash at a revision it has not applied yet waits for it.
const HASH_CATCH_UP: Duration = Duration::from_secs(2);
/// Pause before reconnecting to a peer that failed.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Bytes per snapshot chunk.
const SNAPSHOT_CHUNK: usize = 1 << 20;
/// The file a member keeps its cluster's ID in, beside the engine's files.
const CLUSTER_ID_FILE: &str = "cluster_id";
/// The file a member that joined an existing cluster keeps its own ID in.
const MEMBER_ID_FILE: &str = "member_id";

/// The cluster's ID: fixed when the cluster is bootstrapped, learned by a member that joins.
#[derive(Debug, Default)]
pub struct ClusterId(AtomicU64);

impl ClusterId {
    /// The ID `id`: the one bootstrapped from the initial members' IDs, or the one a joining
    /// member learned from its peers.
    pub fn new(id: u64) -> ClusterId {
        ClusterId(AtomicU64::new(id))
    }

    /// The ID, as response headers and peer messages carry it.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Whether a message stamped `id` belongs to this cluster.
    fn admit(&self, id: u64) -> bool {
        self.get() == id
    }
}

/// Reads the cluster ID recorded in `dir`, if any.
pub fn load_cluster_id(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(CLUSTER_ID_FILE)).ok()?;
    u64::from_str_radix(text.trim(), 16).ok()
}

/// Records the cluster ID in `dir` (written once, when a member first knows it).
pub fn store_cluster_id(dir: &Path, id: u64) -> std::io::Result<()> {
    write_durably(dir, CLUSTER_ID_FILE, &format!("{id:x}\n"))
}

/// Writes `name` in `dir` whole or not at all, and durably.
fn write_durably(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    // The data directory and what is in it are the member's user's alone, as etcd's (0700,
    // 0600).
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?
        .write_all(text.as_bytes())?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The open engine, as the peer service reaches it.
#[derive(Clone, Debug)]
pub struct Attached {
    inbox: Inbox,
    engine: Weak<Engine>,
}

/// Where received messages go: the engine, once it is open.
pub type InboxSlot = Arc<RwLock<Option<Attached>>>;

struct Shared {
    me: u64,
    cluster: Arc<ClusterId>,
    runtime: tokio::runtime::Handle,
    /// Peer URLs known from the flags, for members the log has not told of yet.
    initial: HashMap<u64, Vec<String>>,
    /// The engine, for members' current peer URLs.
    engine: RwLock<Weak<Engine>>,
    links: Mutex<HashMap<u64, mpsc::Sender<Bytes>>>,
    inbox: InboxSlot,
    /// Dials peers (with the peer port's TLS, for https peer URLs).
    connector: Connector,
    /// Bytes, failures and round trips per peer.
    metrics: PeerMetrics,
}

impl Shared {
    fn peer_urls(&self, id: u64) -> Vec<String> {
        let from_log = self
            .engine
            .read()
            .upgrade()
            .and_then(|e| e.members().list().into_iter().find(|m| m.id == id).map(|m| m.peer_urls));
        match from_log {
            Some(urls) if !urls.is_empty() => urls,
            _ => self.initial.get(&id).cloned().unwrap_or_default(),
        }
    }

    /// The queue to member `to`, starting its sender task the first time.
    fn link(self: &Arc<Self>, to: u64) -> mpsc::Sender<Bytes> {
        let mut links = self.links.lock();
        if let Some(tx) = links.get(&to).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        links.insert(to, tx.clone());
        let shared = Arc::downgrade(self);
        self.runtime.spawn(send_loop(shared.clone(), to, rx));
        self.runtime.spawn(probe_loop(shared, to));
        tx
    }
}

/// A member's peer transport: what it sends with, and where what it receives goes.
#[derive(Clone)]
pub struct PeerNetwork {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PeerNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerNetwork")
            .field("me", &self.shared.me)
            .finish_non_exhaustive()
    }
}

/// How a member reaches its peers: the connector it dials them with (TLS or not), and the
/// metrics it counts what it sends in.
pub struct Dialer {
    /// Dials a peer's URL.
    pub connector: Connector,
    /// Counts what goes to each peer.
    pub metrics: PeerMetrics,
}

impl PeerNetwork {
    /// The transport of member `me` of the cluster `cluster`, reaching the `initial` members
    /// at their peer URLs until the log says otherwise, dialing with `dialer`; call within a
    /// tokio runtime.
    pub fn new(me: u64, cluster: Arc<ClusterId>, initial: &[(u64, Vec<String>)], dialer: Dialer) -> PeerNetwork {
        let Dialer { connector, metrics } = dialer;
        PeerNetwork {
            shared: Arc::new(Shared {
                me,
                cluster,
                runtime: tokio::runtime::Handle::current(),
                initial: initial.iter().cloned().collect(),
                engine: RwLock::new(Weak::new()),
                links: Mutex::new(HashMap::new()),
                inbox: Arc::new(RwLock::new(None)),
                connector,
                metrics,
            }),
        }
    }

    /// What the engine sends with.
    pub fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(GrpcTransport {
            shared: self.shared.clone(),
        })
    }

    /// Where the peer service delivers messages.
    pub fn inbox_slot(&self) -> InboxSlot {
        self.shared.inbox.clone()
    }

    /// Connects the open engine: messages are delivered to it from now on.
    pub fn attach(&self, engine: &Arc<Engine>, inbox: Inbox) {
        *self.shared.engine.write() = Arc::downgrade(engine);
        *self.shared.inbox.write() = Some(Attached {
            inbox,
            engine: Arc::downgrade(engine),
        });
        self.shared
            .runtime
            .spawn(reach_every_member(Arc::downgrade(&self.shared)));
    }

    /// Disconnects the engine (it is closing): messages to it are dropped, and the senders
    /// stop.
    pub fn detach(&self) {
        *self.shared.inbox.write() = None;
        self.shared.links.lock().clear();
    }
}

struct GrpcTransport {
    shared: Arc<Shared>,
}

impl Transport for GrpcTransport {
    fn send(&self, to: u64, message: Bytes) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.shared.link(to).try_send(message) {
            self.shared.metrics.send_failed(to, 1);
            tracing::debug!(to = format_args!("{to:x}"), "peer queue full: dropping a raft message");
        }
    }

    fn send_snapshot(&self, to: u64, message: Bytes, data: &mut dyn Read) -> std::io::Result<()> {
        let urls = self.shared.peer_urls(to);
        let url = urls
            .first()
            .ok_or_else(|| std::io::Error::other(format!("no peer URL known for member {to:x}")))?
            .clone();
        let (tx, rx) = mpsc::channel::<pb::SnapshotChunk>(4);
        let connector = self.shared.connector.clone();
        let call = self.shared.runtime.spawn(async move {
            let mut client = PeerClient::new(connector.channel(&url).await.map_err(std::io::Error::other)?)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            client
                .snapshot(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(|_| ())
                .map_err(|s| std::io::Error::other(s.message().to_string()))
        });
        let cluster_id = self.shared.cluster.get();
        let mut first = Some(message);
        let mut buf = vec![0u8; SNAPSHOT_CHUNK];
        loop {
            let n = read_full(data, &mut buf)?;
            let chunk = pb::SnapshotChunk {
                cluster_id,
                message: first.take().unwrap_or_default(),
                data: Bytes::copy_from_slice(buf.get(..n).unwrap_or_default()),
            };
            if n > 0 && tx.blocking_send(chunk).is_err() {
                break; // the call ended early: its result says why
            }
            if n < buf.len() {
                break;
            }
        }
        drop(tx);
        self.shared
            .runtime
            .block_on(call)
            .map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

/// Reads until `buf` is full or the input ends; returns how much was read.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(buf.get_mut(filled..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Member `to`'s queue, kept by its send loop and lent to one call's stream at a time. Each
/// call takes a new generation; a stream whose generation has passed takes nothing more.
struct Queue {
    rx: Mutex<(mpsc::Receiver<Bytes>, u64)>,
}

/// The messages of one call to a peer, taken straight from its [`Queue`]: no task or channel
/// between the queue and the call.
struct Outgoing {
    queue: Arc<Queue>,
    /// This call's generation: once a newer call has started, this stream ends. hyper may
    /// hold a stream for a while after its call failed, and it must then neither take the
    /// next call's messages nor its wake-up (the queue wakes only the last to poll it).
    generation: u64,
    /// Read for each message: a member that joins learns the cluster's ID after it starts.
    cluster: Arc<ClusterId>,
    from: u64,
    to: u64,
    metrics: PeerMetrics,
    /// The bytes-sent counter to `to`, looked up at the call's first message (a series
    /// appears only once something was sent, as etcd's does).
    sent: Option<prometheus::IntCounter>,
    /// The queue was closed: the network is detached.
    detached: Arc<AtomicBool>,
}

impl tokio_stream::Stream for Outgoing {
    type Item = pb::RaftMessage;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut queue = this.queue.rx.lock();
        let (rx, generation) = &mut *queue;
        if *generation != this.generation {
            return std::task::Poll::Ready(None);
        }
        match std::task::ready!(rx.poll_recv(cx)) {
            Some(message) => {
                let (metrics, to) = (&this.metrics, this.to);
                let sent = this.sent.get_or_insert_with(|| metrics.sent_to(to));
                sent.inc_by(message.len() as u64);
                std::task::Poll::Ready(Some(pb::RaftMessage {
                    cluster_id: this.cluster.get(),
                    message,
                    from: this.from,
                }))
            }
            None => {
                this.detached.store(true, Ordering::Relaxed);
                std::task::Poll::Ready(None)
            }
        }
    }
}

/// Sends member `to`'s queue over a stream to it, reconnecting after failures, until the
/// network is gone or the queue is dropped.
async fn send_loop(shared: Weak<Shared>, to: u64, rx: mpsc::Receiver<Bytes>) {
    let queue = Arc::new(Queue {
        rx: Mutex::new((rx, 0)),
    });
    let detached = Arc::new(AtomicBool::new(false));
    // Drops what queued while the peer could not be reached or the call failed (Raft sends
    // again), counting each as a failed send, and starts the next generation: no stream of
    // an earlier call takes anything after this.
    let drop_queued = |metrics: &PeerMetrics| -> u64 {
        let mut queue = queue.rx.lock();
        let (rx, generation) = &mut *queue;
        *generation += 1;
        let mut dropped = 0;
        while rx.try_recv().is_ok() {
            dropped += 1;
        }
        metrics.send_failed(to, dropped);
        *generation
    };
    loop {
        let (url, cluster, connector, metrics, me) = match shared.upgrade() {
            Some(s) => (
                s.peer_urls(to).first().cloned(),
                s.cluster.clone(),
                s.connector.clone(),
                s.metrics.clone(),
                s.me,
            ),
            None => return,
        };
        let Some(url) = url else {
            tracing::debug!(to = format_args!("{to:x}"), "no peer URL yet");
            tokio::time::sleep(RECONNECT_PAUSE).await;
            drop_queued(&metrics);
            continue;
        };
        let mut client = match connector.channel(&url).await {
            Ok(c) => PeerClient::new(c).max_encoding_message_size(usize::MAX),
            Err(e) => {
                tracing::debug!(to = format_args!("{to:x}"), %url, error = %e, "cannot reach peer");
                tokio::time::sleep(RECONNECT_PAUSE).await;
                drop_queued(&metrics);
                continue;
            }
        };
        let generation = queue.rx.lock().1;
        let outgoing = Outgoing {
            queue: queue.clone(),
            generation,
            cluster,
            from: me,
            to,
            metrics: metrics.clone(),
            sent: None,
            detached: detached.clone(),
        };
        if let Err(status) = client.send(outgoing).await {
            tracing::debug!(to = format_args!("{to:x}"), error = %status.message(), "peer stream ended");
        }
        if detached.load(Ordering::Relaxed) {
            return;
        }
        // What queued meanwhile is dropped and counted as failed, as an unreachable peer's is
        // (etcd_network_peer_sent_failures_total, which the etcdMembersDown alert reads).
        drop_queued(&metrics);
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// Opens a link (and its prober) to every member the log lists, as etcd's transport keeps one
/// to each peer whether or not Raft has a message for it: a follower's round trip to the other
/// followers is measured too. Checks the list every [`PROBE_EVERY`]; ends with the network.
async fn reach_every_member(shared: Weak<Shared>) {
    let mut every = tokio::time::interval(PROBE_EVERY);
    loop {
        every.tick().await;
        let Some(s) = shared.upgrade() else { return };
        let Some(engine) = s.engine.read().upgrade() else {
            return;
        };
        for m in engine.members().list() {
            if m.id != s.me {
                s.link(m.id);
            }
        }
    }
}

/// Probes member `to` every [`PROBE_EVERY`] for the round trip of a call (its member list:
/// small, and answered by every version), over one connection kept open, as etcd's prober
/// does; ends with the network.
async fn probe_loop(shared: Weak<Shared>, to: u64) {
    let mut client: Option<(String, PeerClient<tonic::transport::Channel>)> = None;
    let mut every = tokio::time::interval(PROBE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(s) = shared.upgrade() else { return };
        let Some(url) = s.peer_urls(to).first().cloned() else {
            continue;
        };
        let (connector, metrics) = (s.connector.clone(), s.metrics.clone());
        drop(s);
        if client.as_ref().is_none_or(|(u, _)| *u != url) {
            match connector.lazy_channel(&url) {
                Ok(channel) => client = Some((url, PeerClient::new(channel))),
                Err(_) => continue,
            }
        }
        let Some((_, peer)) = client.as_mut() else { continue };
        let started = std::time::Instant::now();
        let answered = tokio::time::timeout(PROBE_EVERY, peer.members(pb::MembersRequest {})).await;
        if let Ok(Ok(_)) = answered {
            metrics.round_trip(to, started.elapsed());
        }
    }
}

/// Compaction hashes a member keeps (etcd keeps ten too).
const KEPT: usize = 10;

/// The hashes this member took at its latest compactions, oldest first; the peer service
/// answers the leader's compaction check from them.
#[derive(Debug, Default)]
pub struct Kept(Mutex<VecDeque<HashKv>>);

impl Kept {
    /// The hash kept for the compaction at `revision`.
    pub fn get(&self, revision: i64) -> Option<HashKv> {
        self.0.lock().iter().find(|h| h.hash_revision == revision).copied()
    }

    pub(crate) fn newest_revision(&self) -> i64 {
        self.0.lock().back().map_or(0, |h| h.hash_revision)
    }

    pub(crate) fn keep(&self, hash: HashKv) {
        let mut kept = self.0.lock();
        if kept.back().is_some_and(|h| h.hash_revision >= hash.hash_revision) {
            return;
        }
        kept.push_back(hash);
        while kept.len() > KEPT {
            kept.pop_front();
        }
    }

    pub(crate) fn newest_first(&self) -> Vec<HashKv> {
        self.0.lock().iter().rev().copied().collect()
    }
}

/// The peer service: delivers what peers send to the engine.
struct PeerService {
    inbox: InboxSlot,
    cluster: Arc<ClusterId>,
    /// This member's compaction hashes, for the leader's check.
    kept: Arc<Kept>,
    /// Bytes and failures per peer.
    metrics: PeerMetrics,
}

impl PeerService {
    fn engine(&self) -> Result<Arc<Engine>, Status> {
        self.inbox
            .read()
            .as_ref()
            .and_then(|a| a.engine.upgrade())
            .ok_or_else(|| Status::unavailable("etcdserver: server stopped"))
    }
}

fn foreign() -> Status {
    Status::failed_precondition("etcdserver: request cluster ID mismatch")
}

/// The reading end of a snapshot stream, for the engine's blocking install.
struct ChunkReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        let part = self.current.split_to(n);
        if let Some(dst) = out.get_mut(..n) {
            dst.copy_from_slice(&part);
        }
        Ok(n)
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn send(&self, request: Request<Streaming<pb::RaftMessage>>) -> Result<Response<pb::Done>, Status> {
        let mut stream = request.into_inner();
        let mut from = 0;
        while let Some(m) = stream.next().await {
            let m = match m {
                Ok(m) => m,
                Err(status) => {
                    self.metrics.receive_failed(from);
                    return Err(status);
                }
            };
            if !self.cluster.admit(m.cluster_id) {
                return Err(foreign());
            }
            from = m.from;
            self.metrics.received(from, m.message.len());
            // Not open yet (or closing): dropped, as a crashed member would.
            let attached = self.inbox.read().clone();
            if let Some(a) = attached {
                if a.inbox.deliver(&m.message).is_err() {
                    return Err(Status::unavailable("etcdserver: server stopped"));
                }
            }
        }
        Ok(Response::new(pb::Done {}))
    }

    async fn snapshot(&self, request: Request<Streaming<pb::SnapshotChunk>>) -> Result<Response<pb::Done>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("an empty snapshot stream"))??;
        if !self.cluster.admit(first.cluster_id) {
            return Err(foreign());
        }
        let inbox = self
            .inbox
            .read()
            .clone()
            .ok_or_else(|| Status::unavailable("etcdserver: server stopped"))?
            .inbox;
        let (tx, rx) = mpsc::channel(4);
        let message = first.message.clone();
        let install = tokio::task::spawn_blocking(move || {
            let mut reader = ChunkReader {
                rx,
                current: Bytes::new(),
            };
            inbox.deliver_snapshot(&message, &mut reader)
        });
        let mut next = Some(first.data);
        loop {
            if let Some(data) = next.take() {
                if tx.send(data).await.is_err() {
                    break; // the install stopped reading: its result says why
                }
            }
            match stream.next().await {
                Some(Ok(chunk)) => next = Some(chunk.data),
                Some(Err(status)) => return Err(status),
                None => break,
            }
        }
        drop(tx);
        install
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| crate::errors::status(&e))?;
        Ok(Response::new(pb::Done {}))
    }

    async fn members(&self, _request: Request<pb::MembersRequest>) -> Result<Response<pb::MembersResponse>, Status> {
        let engine = self.engine()?;
        let members = engine
            .members()
            .list()
            .into_iter()
            .map(|m| pb::PeerMember {
                id: m.id,
                peer_urls: m.peer_urls,
            })
            .collect();
        Ok(Response::new(pb::MembersResponse {
            cluster_id: self.cluster.get(),
            members,
        }))
    }
    async fn version(&self, _request: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        let engine = self.engine()?;
        Ok(Response::new(pb::VersionResponse {
            member_id: engine.member_id(),
            release: cairn_engine::version::RELEASE.to_string(),
        }))
    }

    async fn hash(&self, request: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        let engine = self.engine()?;
        let request = request.into_inner();
        let hash = match request.compaction {
            true => self
                .kept
                .get(request.revision)
                .ok_or_else(|| Status::not_found("no hash kept for a compaction at that revision"))?,
            false => {
                // A member a little behind the leader's revision catches up for a moment,
                // rather than be left out of the comparison (under steady writes, followers
                // are always a little behind).
                let deadline = tokio::time::Instant::now() + HASH_CATCH_UP;
                while request.revision > engine.current_revision() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let hashing = engine.clone();
                tokio::task::spawn_blocking(move || hashing.maintenance().hash_kv(request.revision))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(|e| crate::errors::status(&e))?
            }
        };
        Ok(Response::new(pb::HashResponse {
            member_id: engine.member_id(),
            revision: engine.current_revision(),
            hash: hash.hash,
            hash_revision: hash.hash_revision,
            compact_revision: hash.compact_revision,
        }))
    }
}

/// Asks every member of `engine` but `me` one question (`ask`, given a client of its peer URL) all at
/// once, each within the engine's request timeout (etcd's bound too: a partitioned peer must
/// not hold anyone back for long). A member with several peer URLs is asked at the next one
/// if one fails.
pub async fn ask_every_peer<T, F, Fut>(
    engine: &Engine,
    me: u64,
    connector: &Connector,
    ask: F,
) -> Vec<(u64, Result<T, Status>)>
where
    T: Send + 'static,
    F: Fn(PeerClient<tonic::transport::Channel>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T, Status>> + Send,
{
    let patience = engine.server().request_timeout();
    let mut asking = tokio::task::JoinSet::new();
    for member in engine.members().list() {
        if member.id == me {
            continue;
        }
        let (connector, ask) = (connector.clone(), ask.clone());
        asking.spawn(async move {
            let mut answer = Err(Status::unavailable("the member has no peer URL"));
            for url in &member.peer_urls {
                let asked = async {
                    let channel = connector.channel(url).await.map_err(Status::unavailable)?;
                    ask(PeerClient::new(channel)).await
                };
                answer = match tokio::time::timeout(patience, asked).await {
                    Ok(answer) => answer,
                    Err(_) => Err(Status::deadline_exceeded(format!(
                        "{url}: no answer within {patience:?}"
                    ))),
                };
                if answer.is_ok() {
                    break;
                }
            }
            (member.id, answer)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = asking.join_next().await {
        if let Ok(answer) = done {
            answers.push(answer);
        }
    }
    answers
}

/// Asks the members at `peers` who the member at `my_peer_urls` is: its ID (given by `member
/// add`) and the cluster's. Tries each peer in turn until `patience` runs out.
pub async fn discover(
    connector: &Connector,
    peers: &[String],
    my_peer_urls: &[String],
    patience: Duration,
) -> Result<(u64, u64), String> {
    let mut mine = my_peer_urls.to_vec();
    mine.sort();
    let deadline = tokio::time::Instant::now() + patience;
    let mut last_error = String::from("no peer to ask");
    loop {
        for url in peers {
            let answer = match connector.channel(url).await {
                Ok(channel) => PeerClient::new(channel)
                    .members(pb::MembersRequest {})
                    .await
                    .map_err(|s| s.message().to_string()),
                Err(e) => Err(e),
            };
            match answer {
                Ok(r) => {
                    let r = r.into_inner();
                    let found = r.members.iter().find(|m| {
                        let mut theirs = m.peer_urls.clone();
                        theirs.sort();
                        theirs == mine
                    });
                    match found {
                        Some(m) if r.cluster_id != 0 => return Ok((m.id, r.cluster_id)),
                        _ => last_error = format!("{url} knows no member at {mine:?}: add it with `member add` first"),
                    }
                }
                Err(e) => last_error = format!("{url}: {e}"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(last_error);
        }
        tokio::time::sleep(RECONNECT_PAUSE * 5).await;
    }
}

/// Reads the member ID recorded in `dir` (a member that joined an existing cluster).
pub fn load_member_id(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(MEMBER_ID_FILE)).ok()?;
    u64::from_str_radix(text.trim(), 16).ok()
}

/// Records this member's ID in `dir`.
pub fn store_member_id(dir: &Path, id: u64) -> std::io::Result<()> {
    write_durably(dir, MEMBER_ID_FILE, &format!("{id:x}\n"))
}

/// The peer listener's routes.
pub fn router(inbox: InboxSlot, cluster: Arc<ClusterId>, kept: Arc<Kept>, metrics: PeerMetrics) -> axum::Router {
    let service = PeerServer::new(PeerService {
        inbox,
        cluster,
        kept,
        metrics,
    })
    .max_decoding_message_size(usize::MAX)
    .max_encoding_message_size(usize::MAX);
    tonic::service::Routes::new(service).into_axum_router()
}
