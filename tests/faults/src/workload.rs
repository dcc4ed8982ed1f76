//! The workload: clients on random members doing linearizable reads, writes and
//! compare-and-set on a few keys, each call recorded (what was asked, what came back, when)
//! for the linearizability check. Every call has a timeout; a write that timed out or failed
//! is indeterminate (it may have taken effect), a read that did is left out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::request_op::Request as Op;
use cairn_server::pb::etcdserverpb::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use cairn_tests::linearizability::{Input, Operation, Output};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

/// How long one call may take before it counts as timed out.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The keys the clients work on: `count` of them, new ones every `epoch` (so that each key's
/// history, which the linearizability search walks whole, stays short in a long run; keys
/// are independent, so checking each on its own is checking all).
#[derive(Debug, Clone)]
pub struct Keys {
    pub count: usize,
    pub epoch: Duration,
}

impl Keys {
    /// Key `k` of the epoch `now` (microseconds from the history's start) falls in.
    pub fn key(&self, now: u64, k: usize) -> String {
        let epoch = now / u64::try_from(self.epoch.as_micros()).unwrap_or(u64::MAX).max(1);
        format!("k/{epoch}/{k}")
    }

    /// Every key of every epoch up to `now`.
    pub fn all(&self, now: u64) -> Vec<String> {
        let last = now / u64::try_from(self.epoch.as_micros()).unwrap_or(u64::MAX).max(1);
        (0..=last)
            .flat_map(|e| (0..self.count).map(move |k| format!("k/{e}/{k}")))
            .collect()
    }
}

/// What every client records, against one clock.
#[derive(Debug)]
pub struct History {
    start: Instant,
    /// `start` on the wall clock, for finding a report's times in the members' logs.
    pub started: std::time::SystemTime,
    ops: Mutex<Vec<Operation>>,
    /// Every error a member answered a client's call with: "code: message" and how often.
    refusals: Mutex<BTreeMap<String, usize>>,
}

impl History {
    pub fn new() -> Arc<History> {
        Arc::new(History {
            start: Instant::now(),
            started: std::time::SystemTime::now(),
            ops: Mutex::new(Vec::new()),
            refusals: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn record(&self, op: Operation) {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push(op);
    }

    pub fn operations(&self) -> Vec<Operation> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts a member's error answer (a timeout of the client's own is not one).
    pub fn refused(&self, status: &tonic::Status) {
        let what = format!("{:?}: {}", status.code(), status.message());
        *self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(what)
            .or_default() += 1;
    }

    /// A call's answer within its timeout: the response, or `None` for a timeout or an error
    /// (counted).
    pub fn answered<T>(&self, answer: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> Option<T> {
        match answer {
            Ok(Ok(response)) => Some(response),
            Ok(Err(status)) => {
                self.refused(&status);
                None
            }
            Err(_) => None,
        }
    }

    /// The error answers counted by [`History::refused`].
    pub fn refusals(&self) -> BTreeMap<String, usize> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What the run's clients share: a channel per member, the history their calls are recorded
/// in, and the flag that stops them.
#[derive(Debug, Clone)]
pub struct Shared {
    pub channels: Vec<Channel>,
    pub history: Arc<History>,
    pub stop: Arc<AtomicBool>,
}

/// One client's calls on `keys`, until `stop`.
pub async fn client(id: usize, shared: Shared, keys: Keys, seed: u64) {
    let Shared {
        channels,
        history,
        stop,
    } = shared;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seq = 0u64;
    let mut last_read: Vec<Option<String>> = vec![None; keys.count];
    let mut epoch_key = String::new();
    while !stop.load(Ordering::Relaxed) {
        let member = rng.random_range(0..channels.len());
        let k = rng.random_range(0..keys.count);
        let key = keys.key(history.now(), k);
        if keys.key(history.now(), 0) != epoch_key {
            // A new epoch: nothing read of its keys yet.
            epoch_key = keys.key(history.now(), 0);
            last_read.iter_mut().for_each(|v| *v = None);
        }
        let mut kv = KvClient::new(channels[member].clone());
        let roll = rng.random_range(0..10);
        let input = if roll < 4 {
            Input::Get { key }
        } else if roll < 8 {
            seq += 1;
            Input::Put {
                key,
                value: format!("{id}.{seq}"),
            }
        } else {
            seq += 1;
            Input::Cas {
                key,
                expected: last_read[k].clone(),
                new: format!("{id}.{seq}"),
            }
        };
        let call = history.now();
        let output = call_once(&mut kv, &input, &history).await;
        let ret = history.now();
        if let (Input::Get { .. }, Output::Value(v)) = (&input, &output) {
            last_read[k] = v.clone();
        }
        history.record(Operation {
            client: id,
            input,
            output,
            call,
            ret,
        });
    }
}

/// One linearizable read of `key` on `channel`, recorded (the final reads after healing).
pub async fn read(id: usize, channel: Channel, key: String, history: &History) -> Output {
    let mut kv = KvClient::new(channel);
    let input = Input::Get { key };
    let call = history.now();
    let output = call_once(&mut kv, &input, history).await;
    let ret = history.now();
    history.record(Operation {
        client: id,
        input,
        output: output.clone(),
        call,
        ret,
    });
    output
}

async fn call_once(kv: &mut KvClient<Channel>, input: &Input, history: &History) -> Output {
    let answer = tokio::time::timeout(CALL_TIMEOUT, async {
        match input {
            Input::Get { key } => {
                let range = RangeRequest {
                    key: key.clone().into_bytes().into(),
                    ..Default::default()
                };
                let got = kv
                    .range(range)
                    .await
                    .map_err(|e| history.refused(&e))
                    .ok()?
                    .into_inner();
                let value = got
                    .kvs
                    .first()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                Some(Output::Value(value))
            }
            Input::Put { key, value } => {
                kv.put(put(key, value)).await.map_err(|e| history.refused(&e)).ok()?;
                Some(Output::Ok)
            }
            Input::Cas { key, expected, new } => {
                let compare = match expected {
                    None => Compare {
                        result: CompareResult::Equal as i32,
                        target: CompareTarget::Create as i32,
                        key: key.clone().into_bytes().into(),
                        target_union: Some(TargetUnion::CreateRevision(0)),
                        ..Default::default()
                    },
                    Some(value) => Compare {
                        result: CompareResult::Equal as i32,
                        target: CompareTarget::Value as i32,
                        key: key.clone().into_bytes().into(),
                        target_union: Some(TargetUnion::Value(value.clone().into_bytes().into())),
                        ..Default::default()
                    },
                };
                let txn = TxnRequest {
                    compare: vec![compare],
                    success: vec![RequestOp {
                        request: Some(Op::RequestPut(put(key, new))),
                    }],
                    failure: Vec::new(),
                };
                let answer = kv.txn(txn).await.map_err(|e| history.refused(&e)).ok()?.into_inner();
                Some(Output::Swapped(answer.succeeded))
            }
        }
    })
    .await;
    answer.ok().flatten().unwrap_or(Output::Unknown)
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.to_string().into_bytes().into(),
        value: value.to_string().into_bytes().into(),
        ..Default::default()
    }
}
