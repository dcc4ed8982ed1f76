//! An in-process network for the members of a group in one process: examples, and tests that
//! need faults. Messages can be dropped, duplicated, delayed (and so reordered), and links cut
//! to partition the group; a seeded generator makes a run repeatable.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::interface::Transport;
use crate::engine::Inbox;

/// The faults in force.
struct Faults {
    /// Directed links that deliver nothing: (from, to).
    cut: HashSet<(u64, u64)>,
    drop: f64,
    duplicate: f64,
    max_delay: Duration,
    rng: StdRng,
}

struct Net {
    inboxes: RwLock<HashMap<u64, Inbox>>,
    faults: Mutex<Faults>,
    /// Messages to deliver later, to the delivery thread.
    later: Sender<(Instant, u64, Bytes)>,
}

impl Net {
    fn deliver(&self, to: u64, message: &[u8]) {
        if let Some(inbox) = self.inboxes.read().get(&to) {
            // A closed member drops what it is sent, like a crashed one.
            let _ = inbox.deliver(message);
        }
    }
}

/// An in-process network (see the module docs). Cheap to clone; all clones are the same
/// network.
#[derive(Clone)]
pub struct LocalNetwork {
    net: Arc<Net>,
}

impl std::fmt::Debug for LocalNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNetwork").finish_non_exhaustive()
    }
}

/// Delivers delayed messages when they are due, until the network is gone.
fn delivery_loop(net: Weak<Net>, rx: Receiver<(Instant, u64, Bytes)>) {
    let mut heap: BinaryHeap<Reverse<(Instant, u64, u64, Bytes)>> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let wait = heap.peek().map_or(Duration::from_millis(100), |Reverse((due, ..))| {
            due.saturating_duration_since(Instant::now())
        });
        match rx.recv_timeout(wait) {
            Ok((due, to, message)) => {
                seq += 1;
                heap.push(Reverse((due, seq, to, message)));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(net) = net.upgrade() else { return };
        while heap.peek().is_some_and(|Reverse((due, ..))| *due <= Instant::now()) {
            if let Some(Reverse((_, _, to, message))) = heap.pop() {
                net.deliver(to, &message);
            }
        }
    }
}

impl LocalNetwork {
    /// A network with no faults; `seed` drives the random ones set later.
    pub fn new(seed: u64) -> LocalNetwork {
        let (later, rx) = unbounded();
        let net = Arc::new(Net {
            inboxes: RwLock::new(HashMap::new()),
            faults: Mutex::new(Faults {
                cut: HashSet::new(),
                drop: 0.0,
                duplicate: 0.0,
                max_delay: Duration::ZERO,
                rng: StdRng::seed_from_u64(seed),
            }),
            later,
        });
        let weak = Arc::downgrade(&net);
        // Not joined: it ends by itself within 100 ms of the network going (the last handle may
        // be an engine's transport, dropped on any thread, this one included).
        if let Err(e) = crate::thread::start("cairn-local-net", move || delivery_loop(weak, rx)) {
            tracing::error!(error = %e, "no delivery thread: delayed messages are lost");
        }
        LocalNetwork { net }
    }

    /// The transport member `from` sends with.
    pub fn transport(&self, from: u64) -> Arc<dyn Transport> {
        Arc::new(LocalTransport {
            from,
            net: self.net.clone(),
        })
    }

    /// Connects member `id`'s inbox (again, after a restart).
    pub fn attach(&self, id: u64, inbox: Inbox) {
        self.net.inboxes.write().insert(id, inbox);
    }

    /// Disconnects member `id`: messages to it are lost, as if it were down.
    pub fn detach(&self, id: u64) {
        self.net.inboxes.write().remove(&id);
    }

    /// Cuts every link between `side` and the other members of `members`, both ways.
    pub fn partition(&self, side: &[u64], members: &[u64]) {
        let mut faults = self.net.faults.lock();
        for &a in side {
            for &b in members.iter().filter(|m| !side.contains(m)) {
                faults.cut.insert((a, b));
                faults.cut.insert((b, a));
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.net.faults.lock().cut.clear();
    }

    /// Each message is lost with probability `p`.
    pub fn set_drop(&self, p: f64) {
        self.net.faults.lock().drop = p;
    }

    /// Each message is delivered twice with probability `p`.
    pub fn set_duplicate(&self, p: f64) {
        self.net.faults.lock().duplicate = p;
    }

    /// Each message is delayed by a random time up to `max` (so messages are also reordered).
    pub fn set_max_delay(&self, max: Duration) {
        self.net.faults.lock().max_delay = max;
    }
}

struct LocalTransport {
    from: u64,
    net: Arc<Net>,
}

impl Transport for LocalTransport {
    /// Hands the stream straight to the receiver's inbox: a cut link or a member that is down
    /// fails the transfer, and a dropped message drops the whole snapshot.
    fn send_snapshot(&self, to: u64, message: Bytes, data: &mut dyn std::io::Read) -> std::io::Result<()> {
        {
            let mut guard = self.net.faults.lock();
            let f = &mut *guard;
            if f.cut.contains(&(self.from, to)) {
                return Err(std::io::Error::other(format!("the link to member {to} is cut")));
            }
            let drop = f.drop.clamp(0.0, 1.0);
            if drop > 0.0 && f.rng.random_bool(drop) {
                return Err(std::io::Error::other("the snapshot was lost"));
            }
        }
        let inbox = self.net.inboxes.read().get(&to).cloned();
        let inbox = inbox.ok_or_else(|| std::io::Error::other(format!("member {to} is down")))?;
        inbox.deliver_snapshot(&message, data).map_err(std::io::Error::other)
    }

    fn send(&self, to: u64, message: Bytes) {
        let (copies, delays) = {
            let mut guard = self.net.faults.lock();
            let f = &mut *guard;
            let (drop, duplicate) = (f.drop.clamp(0.0, 1.0), f.duplicate.clamp(0.0, 1.0));
            if f.cut.contains(&(self.from, to)) || (drop > 0.0 && f.rng.random_bool(drop)) {
                return;
            }
            let copies = if duplicate > 0.0 && f.rng.random_bool(duplicate) {
                2
            } else {
                1
            };
            let max = f.max_delay;
            let delays: Vec<Duration> = (0..copies)
                .map(|_| {
                    if max.is_zero() {
                        Duration::ZERO
                    } else {
                        max.mul_f64(f.rng.random::<f64>())
                    }
                })
                .collect();
            (copies, delays)
        };
        for delay in delays.into_iter().take(copies) {
            if delay.is_zero() {
                self.net.deliver(to, &message);
            } else {
                let _ = self.net.later.send((Instant::now() + delay, to, message.clone()));
            }
        }
    }
}
