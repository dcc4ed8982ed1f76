//! The lease workloads: keep-alive storms and mass expiry with probe writers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Conn;
use bytes::Bytes;
use cairn_benches::{payload, ratio, ratio_json, rounded, times_cell, Context, Failure, Percentiles};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse, RangeRequest};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::drive::*;
use crate::keys::*;
use crate::kv::*;
use crate::report::*;
use crate::request::*;
use crate::*;

pub(crate) async fn lease_keepalive(g: &Global, b: &Bench, a: &KeepAliveArgs) -> Result<Report, Failure> {
    let mut report = Report::new("lease-keepalive", g);
    let grants = Grants {
        count: a.leases,
        ttl: a.ttl,
    };
    let ids = grant(g, b, grants, &mut report).await?;
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let renewals = Renewals {
        ids: Arc::new(ids),
        run: Run::start(total, seconds, g.rate),
        timeout: b.timeout,
    };
    let (tally, elapsed) = b
        .drive("lease-keepalive", &renewals.run, g.clients, |c, tally| {
            keepalive_loop(LeaseClient::new(b.channel(c)), renewals.clone(), tally)
        })
        .await?;
    revoke(g, b, &renewals.ids, &mut report).await?;
    report.param("leases", a.leases);
    report.param("ttl", a.ttl);
    report.row("keepalive", tally, elapsed);
    Ok(report.require_success())
}

/// What the clients of lease-keepalive share: the leases they renew, the run, and the
/// per-request timeout.
#[derive(Debug, Clone)]
pub(crate) struct Renewals {
    pub(crate) ids: Arc<Vec<i64>>,
    pub(crate) run: Arc<Run>,
    pub(crate) timeout: Duration,
}

/// One client of lease-keepalive: one keep-alive stream (reopened after an error), one
/// renewal in flight, each of the lease picked by the request's number.
pub(crate) async fn keepalive_loop(mut client: LeaseClient<Conn>, renewals: Renewals, mut tally: Tally) -> Tally {
    let Renewals { ids, run, timeout } = renewals;
    let mut stream = None;
    while let Some(i) = run.next().await {
        // `ids` is not empty (grant fails otherwise).
        let Some(&id) = usize::try_from(i % ids.len() as u64).ok().and_then(|n| ids.get(n)) else {
            break;
        };
        let started = Instant::now();
        let outcome = keep_alive_once(&mut client, &mut stream, id, timeout).await;
        if outcome.is_err() {
            stream = None;
        }
        tally.answered(run.origin(), started.elapsed(), outcome);
        run.done();
    }
    tally
}

pub(crate) type KeepAliveStream = (mpsc::Sender<LeaseKeepAliveRequest>, Streaming<LeaseKeepAliveResponse>);

/// Renews lease `id` over `stream`, opening it first if there is none.
pub(crate) async fn keep_alive_once(
    client: &mut LeaseClient<Conn>,
    stream: &mut Option<KeepAliveStream>,
    id: i64,
    timeout: Duration,
) -> Result<u64, Status> {
    let request = LeaseKeepAliveRequest { id };
    let closed = || Status::unavailable("keep-alive stream closed");
    if let Some((requests, _)) = stream.as_mut() {
        requests.send(request).await.map_err(|_| closed())?;
    } else {
        let (tx, rx) = mpsc::channel(1);
        // Queued before the call: a Go server sends the response headers with a first answer.
        tx.send(request).await.map_err(|_| closed())?;
        let responses = timed(timeout, client.lease_keep_alive(ReceiverStream::new(rx))).await?;
        *stream = Some((tx, responses));
    }
    let Some((_, responses)) = stream.as_mut() else {
        return Err(closed());
    };
    match tokio::time::timeout(timeout, responses.message()).await {
        Ok(Ok(Some(r))) if r.ttl <= 0 => Err(Status::not_found(format!("lease {id:x} not found (TTL 0)"))),
        Ok(Ok(Some(r))) if r.id != id => Err(Status::internal(format!("asked to renew {id:x}, {:x} renewed", r.id))),
        Ok(Ok(Some(_))) => Ok(0),
        Ok(Ok(None)) => Err(closed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(deadline(timeout)),
    }
}

/// What [`grant`] grants: `count` leases of `ttl` seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grants {
    pub(crate) count: u64,
    pub(crate) ttl: i64,
}

/// Grants the leases of `grants` with all clients; the IDs granted.
pub(crate) async fn grant(g: &Global, b: &Bench, grants: Grants, report: &mut Report) -> Result<Vec<i64>, Failure> {
    let Grants { count, ttl } = grants;
    eprintln!("{TOOL}: granting {count} leases ...");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let run = Run::start(Some(count), None, None);
    let op = Op::Grant {
        ttl,
        granted: Arc::clone(&granted),
    };
    let (tally, elapsed) = b.drive_op("grant", &run, g.clients, op).await?;
    let ids = std::mem::take(&mut *granted.lock());
    if ids.is_empty() {
        return Err(Failure(format!("granting leases: none granted{}", tally.errors_text())));
    }
    report.extra("leases_granted", ids.len());
    report.extra("grant_s", rounded(elapsed.as_secs_f64(), 3));
    report.note(format!(
        "granted {} leases in {:.2} s, {} grants failed{}",
        ids.len(),
        elapsed.as_secs_f64(),
        tally.failed(),
        tally.errors_text()
    ));
    Ok(ids)
}

/// Revokes `ids` with all clients, unmeasured.
pub(crate) async fn revoke(g: &Global, b: &Bench, ids: &[i64], report: &mut Report) -> Result<(), Failure> {
    let run = Run::start(Some(ids.len() as u64), None, None);
    let op = Op::Revoke { leases: ids.to_vec() };
    let (tally, _) = b.drive_op("revoke", &run, g.clients, op).await?;
    if tally.failed() > 0 {
        report.note(format!(
            "revoking the leases: {} of {} failed{}",
            tally.failed(),
            ids.len(),
            tally.errors_text()
        ));
    }
    Ok(())
}

pub(crate) async fn lease_expiry(g: &Global, b: &Bench, a: &ExpiryArgs) -> Result<Report, Failure> {
    let mut report = Report::new("lease-expiry", g);
    report.param("leases", a.leases);
    report.param("ttl", a.ttl);
    report.param("keys_per_lease", a.keys_per_lease);
    report.param("val_size", a.val_size);
    let ttl = Duration::from_secs(a.ttl.unsigned_abs());
    let grant_started = Instant::now();
    let grants = Grants {
        count: a.leases,
        ttl: a.ttl,
    };
    let ids = grant(g, b, grants, &mut report).await?;
    let granted = Instant::now();
    // No lease expires before `earliest`; every one has by `latest`.
    let (earliest, latest) = (grant_started + ttl, granted + ttl);

    let prefix = format!("{}expiry/", g.key_prefix);
    let n = (ids.len() as u64).saturating_mul(a.keys_per_lease);
    eprintln!("{TOOL}: attaching {n} keys ...");
    let run = Run::start(Some(n), None, None);
    let op = Op::Attach {
        prefix: prefix.clone(),
        leases: ids,
        per_lease: a.keys_per_lease,
        value: Bytes::from(payload(a.val_size)),
    };
    let (attached, attach_elapsed) = b.drive_op("attach", &run, g.clients, op).await?;
    let attach_done = Instant::now();
    report.extra("keys_attached", attached.ok);
    report.extra("attach_s", rounded(attach_elapsed.as_secs_f64(), 3));
    report.note(format!(
        "attached {} keys in {:.2} s, {} puts failed{}",
        attached.ok,
        attach_elapsed.as_secs_f64(),
        attached.failed(),
        attached.errors_text()
    ));
    if attach_done >= earliest {
        return Err(Failure(format!(
            "granting and attaching took {:.2} s, not less than the {} s TTL: take a longer --ttl or fewer keys",
            attach_done.duration_since(grant_started).as_secs_f64(),
            a.ttl
        )));
    }
    if attached.ok == 0 {
        return Err(Failure(format!(
            "attaching keys: no put succeeded{}",
            attached.errors_text()
        )));
    }

    eprintln!("{TOOL}: probing writes until the keys expire ...");
    let stop = Arc::new(AtomicBool::new(false));
    let probe_prefix = format!("{}probe/", g.key_prefix);
    let probe = Arc::new(Op::Put {
        keys: Keys::new(&probe_prefix, probe_prefix.len() + 6, 1_000_000, true)?,
        value: Bytes::from(payload(a.val_size)),
        stamp: None,
    });
    let probing = Origin::now();
    let probes: Vec<_> = (0..g.clients)
        .map(|c| tokio::spawn(probe_loop(b.requester(c, &probe), c as u64, Arc::clone(&stop))))
        .collect();
    tokio::time::sleep_until(earliest.into()).await;
    let counter = KvClient::new(connect_to(g, 0).await?);
    let keys = Attached {
        prefix: &prefix,
        count: attached.ok,
    };
    let expired = count_down(counter, b, keys, latest + EXPIRY_PATIENCE).await?;
    stop.store(true, Ordering::SeqCst);
    let probing_ended = Instant::now();
    // Writes sent from the last count that found every key until none was left may have met
    // the revocations; the ones sent before are the baseline.
    let window = (
        expired.last_full.unwrap_or(earliest),
        expired.all_gone.unwrap_or(probing_ended),
    );
    let (mut before, mut during) = (Tally::new()?, Tally::new()?);
    for p in probes {
        let samples = p.await.context(|| "a probe writer failed".to_string())?;
        samples.split(window, probing, &mut before, &mut during);
    }
    // The latency log has every probe of either row, counted from when probing began.
    let mut log = before.log.clone();
    log.absorb(during.log.clone());
    report.log = Some(log);

    // Seconds from `from` to `t`, negative if `t` came first.
    let signed = |t: Instant, from: Instant| {
        if t >= from {
            t.duration_since(from).as_secs_f64()
        } else {
            -from.duration_since(t).as_secs_f64()
        }
    };
    let secs = |t: Option<Instant>, from: Instant| t.map_or(Value::Null, |t| Value::from(rounded(signed(t, from), 3)));
    report.extra("first_gone_after_earliest_s", secs(expired.first_gone, earliest));
    report.extra("all_gone_after_earliest_s", secs(expired.all_gone, earliest));
    report.extra("all_gone_after_latest_s", secs(expired.all_gone, latest));
    report.extra("keys_left", expired.left);
    let (d, b) = (Percentiles::of(&during.latency), Percentiles::of(&before.latency));
    let over = |d: Option<u64>, b: Option<u64>| ratio(d? as f64, b? as f64);
    let (p50_ratio, p99_ratio) = (over(d.p50, b.p50), over(d.p99, b.p99));
    report.extra("probe_p50_during_over_before", ratio_json(p50_ratio));
    report.extra("probe_p99_during_over_before", ratio_json(p99_ratio));
    let at = |t: Option<Instant>| t.map_or_else(|| "never".to_string(), |t| format!("{:+.3} s", signed(t, earliest)));
    report.note(format!(
        "leases granted between 0 and {:.3} s; TTL {} s, so they expire from +0 (\"earliest\") to {:+.3} s",
        granted.duration_since(grant_started).as_secs_f64(),
        a.ttl,
        signed(latest, earliest)
    ));
    report.note(format!(
        "keys: last all there at {}, first gone at {}, all gone at {} ({} left at the end)",
        at(expired.last_full),
        at(expired.first_gone),
        at(expired.all_gone),
        expired.left
    ));
    report.note(format!(
        "probe writes: sent in the {:.3} s from the last full count to the last one are \"expiring\", \
         those in the {:.2} s before are \"before\"; expiring over before: p50 {}, p99 {}",
        window.1.saturating_duration_since(window.0).as_secs_f64(),
        window.0.saturating_duration_since(attach_done).as_secs_f64(),
        times_cell(p50_ratio),
        times_cell(p99_ratio)
    ));
    if expired.all_gone.is_none() {
        report.failure = Some(format!(
            "{} of {} keys were still there {} s after the last lease's TTL",
            expired.left,
            attached.ok,
            EXPIRY_PATIENCE.as_secs()
        ));
    } else if before.ok + during.ok == 0 {
        report.failure = Some(format!(
            "no probe write succeeded{}{}",
            before.errors_text(),
            during.errors_text()
        ));
    }
    report.row("probe-expiring", during, window.1.saturating_duration_since(window.0));
    report.row("probe-before", before, window.0.saturating_duration_since(attach_done));
    Ok(report)
}

/// What `count_down` saw.
#[derive(Debug)]
pub(crate) struct Expiry {
    /// When the last count that found every key was sent.
    pub(crate) last_full: Option<Instant>,
    /// When the first count that found fewer was answered.
    pub(crate) first_gone: Option<Instant>,
    /// When the count that found none was answered.
    pub(crate) all_gone: Option<Instant>,
    /// Keys left at the last successful count.
    pub(crate) left: i64,
}

/// The keys attached to the leases: `count` of them, under `prefix`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attached<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) count: u64,
}

/// Counts the `keys` left every `EXPIRY_POLL` until none is left or `until`, over `kv` (a
/// connection of its own, so that the probes' connections carry only their writes).
pub(crate) async fn count_down(
    mut kv: KvClient<Conn>,
    b: &Bench,
    keys: Attached<'_>,
    until: Instant,
) -> Result<Expiry, Failure> {
    let Attached { prefix, count } = keys;
    let bar = spinner(b.shown, "keys left");
    let request = RangeRequest {
        key: Bytes::copy_from_slice(prefix.as_bytes()),
        range_end: prefix_end(prefix.as_bytes()),
        count_only: true,
        ..RangeRequest::default()
    };
    let mut expiry = Expiry {
        last_full: None,
        first_gone: None,
        all_gone: None,
        left: i64::try_from(count).unwrap_or(i64::MAX),
    };
    let mut last_error = None;
    while Instant::now() < until {
        let sent = Instant::now();
        match timed(b.timeout, kv.range(request.clone())).await {
            Ok(r) => {
                let now = Instant::now();
                expiry.left = r.count;
                bar.set_message(format!("{} keys left", r.count));
                if u64::try_from(r.count).unwrap_or(0) >= count {
                    expiry.last_full = Some(sent);
                } else if expiry.first_gone.is_none() {
                    expiry.first_gone = Some(now);
                }
                if r.count == 0 {
                    expiry.all_gone = Some(now);
                    break;
                }
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    bar.finish_and_clear();
    if expiry.all_gone.is_none() {
        if let Some(e) = last_error {
            eprintln!("{TOOL}: the last failed count of the keys left: {e}");
        }
    }
    Ok(expiry)
}

/// What a lease-expiry probe writer saw, by send time: sorted into before and during the
/// expiry once its window is known.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    pub(crate) ok: Vec<(Instant, Duration)>,
    pub(crate) failed: Vec<(Instant, Status)>,
}

impl Samples {
    /// Adds the samples sent before `window` to `before`, those inside it to `during`, and
    /// logs their answers counting from `origin`.
    pub(crate) fn split(self, window: (Instant, Instant), origin: Origin, before: &mut Tally, during: &mut Tally) {
        for (sent, took) in self.ok {
            let tally = if sent < window.0 {
                &mut *before
            } else if sent <= window.1 {
                &mut *during
            } else {
                continue;
            };
            tally.log.push(origin, sent + took, took);
            tally.record(took, Ok(0));
        }
        for (sent, e) in self.failed {
            if sent < window.0 {
                before.error(&e);
            } else if sent <= window.1 {
                during.error(&e);
            }
        }
    }
}

/// A lease-expiry probe writer: puts its own key, one at a time, until `stop`.
pub(crate) async fn probe_loop(mut r: Requester, c: u64, stop: Arc<AtomicBool>) -> Samples {
    let mut samples = Samples::default();
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        match r.call(c).await {
            Ok(_) => samples.ok.push((sent, sent.elapsed())),
            Err(e) => samples.failed.push((sent, e)),
        }
    }
    samples
}
