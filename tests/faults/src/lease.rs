//! Leases under faults: a client grants a lease on a random member, attaches a key to it,
//! keeps it alive for a few seconds through random members, then stops and reads the key
//! until it is gone. The check: no lease expires before its TTL has passed since the last
//! keep-alive that was acknowledged (counted from when that keep-alive was sent), and every
//! lease does expire once kept alive no more.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use crate::workload::{History, Shared, CALL_TIMEOUT};

/// The TTL the leases are granted with, in seconds.
const TTL: i64 = 4;
/// How long after its TTL a lease no longer kept alive must be gone (a leader change gives
/// leases their whole TTL again, as etcd does).
const EXPIRY_BOUND: Duration = Duration::from_secs(30);

/// What the lease clients saw.
#[derive(Debug, Default)]
pub struct Leases {
    pub granted: usize,
    pub keep_alives: usize,
    pub expired: usize,
    pub violations: Vec<String>,
}

/// One lease client until `stop`: grant, attach, keep alive, let expire, again.
pub async fn client(shared: Shared, seed: u64, seen: Arc<Mutex<Leases>>) {
    let Shared {
        channels,
        history,
        stop,
    } = shared;
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let pick = |rng: &mut StdRng| {
            let i = rng.random_range(0..channels.len());
            (i, channels[i].clone())
        };
        let grant = LeaseGrantRequest { ttl: TTL, id: 0 };
        let (member, channel) = pick(&mut rng);
        let asked = history.now();
        let granted = tokio::time::timeout(CALL_TIMEOUT, LeaseClient::new(channel).lease_grant(grant)).await;
        let Some(granted) = history.answered(granted) else {
            continue;
        };
        let id = granted.into_inner().id;
        // What happened to this lease, for a violation's report: (time, what).
        let mut timeline = vec![(asked, format!("granted by m{member}"))];
        // The grant's call time is the lease's first "keep-alive": its TTL runs from no
        // earlier than that.
        let mut last_ack = asked;
        let key = format!("lease/{id:x}");
        let put = PutRequest {
            key: key.clone().into_bytes().into(),
            value: b"held".to_vec().into(),
            lease: id,
            ..Default::default()
        };
        let put = tokio::time::timeout(CALL_TIMEOUT, KvClient::new(pick(&mut rng).1).put(put)).await;
        if history.answered(put).is_none() {
            continue;
        }
        seen.lock().unwrap_or_else(|e| e.into_inner()).granted += 1;
        let keep_for = Duration::from_millis(rng.random_range(2000..6000));
        let started = tokio::time::Instant::now();
        while started.elapsed() < keep_for && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let sent = history.now();
            let (member, channel) = pick(&mut rng);
            let ttl = keep_alive(channel, id, &history).await;
            timeline.push((sent, format!("keep-alive through m{member}: {ttl:?}")));
            if ttl.is_some_and(|ttl| ttl > 0) {
                last_ack = sent;
                seen.lock().unwrap_or_else(|e| e.into_inner()).keep_alives += 1;
            }
        }
        // Kept alive no more: it must last until last_ack + TTL, and then go.
        let earliest = last_ack + u64::try_from(TTL).unwrap_or(0) * 1_000_000;
        let latest = earliest + u64::try_from(EXPIRY_BOUND.as_micros()).unwrap_or(u64::MAX);
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let range = RangeRequest {
                key: key.clone().into_bytes().into(),
                ..Default::default()
            };
            let (member, channel) = pick(&mut rng);
            let read = tokio::time::timeout(CALL_TIMEOUT, KvClient::new(channel).range(range)).await;
            let returned = history.now();
            if let Some(read) = history.answered(read) {
                if read.into_inner().kvs.is_empty() {
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if returned < earliest {
                        timeline.push((returned, format!("read through m{member}: gone")));
                        let timeline: Vec<String> = timeline
                            .iter()
                            .map(|(at, what)| format!("{:.2} s {what}", *at as f64 / 1e6))
                            .collect();
                        seen.violations.push(format!(
                            "lease {id:x}: its key was gone {:.2} s before its TTL ran out after the last acknowledged keep-alive ({})",
                            (earliest - returned) as f64 / 1e6,
                            timeline.join(", ")
                        ));
                    }
                    seen.expired += 1;
                    break;
                }
            }
            if returned > latest {
                seen.lock().unwrap_or_else(|e| e.into_inner()).violations.push(format!(
                    "lease {id:x}: its key still there {EXPIRY_BOUND:?} after its TTL ran out"
                ));
                break;
            }
        }
    }
}

/// One keep-alive through `channel`: the TTL answered (0 for a lease that is gone).
async fn keep_alive(channel: Channel, id: i64, history: &History) -> Option<i64> {
    let answer = tokio::time::timeout(CALL_TIMEOUT, async move {
        let request = tokio_stream::once(LeaseKeepAliveRequest { id });
        let mut stream = LeaseClient::new(channel).lease_keep_alive(request).await?.into_inner();
        Ok(stream.message().await?.map(|r| r.ttl))
    })
    .await;
    history.answered(answer).flatten()
}
