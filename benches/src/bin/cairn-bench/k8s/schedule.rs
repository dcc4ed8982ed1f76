//! When the k8s workload's writes are due: each kubelet's renewals, spread over the lease
//! period; each pod's 7 writes, spread over its lifetime (resumed part way for the pods alive at
//! the start); and the pods' arrivals, Poisson or even.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::sleep_until;

use super::apiserver::{Apiserver, Change, Kind, Object};
use super::{Arrivals, Names, POD_WRITES};

/// Gaps between pod arrivals, in seconds.
#[derive(Debug)]
pub(crate) struct ArrivalClock {
    rng: StdRng,
    /// Invariant: positive and finite.
    rate: f64,
    kind: Arrivals,
}

impl ArrivalClock {
    /// Gaps of `kind` for `rate` arrivals a second (positive and finite), drawn from `seed`.
    pub(crate) fn new(seed: u64, rate: f64, kind: Arrivals) -> ArrivalClock {
        ArrivalClock {
            rng: StdRng::seed_from_u64(seed),
            rate,
            kind,
        }
    }

    pub(crate) fn gap(&mut self) -> f64 {
        match self.kind {
            Arrivals::Even => 1.0 / self.rate,
            // 1 - u is in (0, 1], so the gap is finite and not negative.
            Arrivals::Poisson => -(1.0 - self.rng.random::<f64>()).ln() / self.rate,
        }
    }
}

/// When write `step` of a pod's life is due, in seconds after the pod arrived.
pub(crate) fn step_offset(step: u32, lifetime: f64) -> f64 {
    lifetime * f64::from(step) / f64::from(POD_WRITES - 1)
}

/// The first write after its creation that a pod which arrived at `arrival` (seconds, before
/// the start when negative) has not made by the start; `None` if it made them all.
pub(crate) fn first_pending_step(arrival: f64, lifetime: f64) -> Option<u32> {
    (1..POD_WRITES).find(|&step| arrival + step_offset(step, lifetime) >= 0.0)
}

/// A kubelet: renews its node `lease` every `period` from `first` until the deadline.
pub(crate) async fn renew_loop(api: Arc<Apiserver>, mut lease: Object, first: Instant, period: Duration) {
    let change = Change::Put(api.lease_value.clone());
    let mut due = first;
    while due < api.deadline {
        sleep_until(due.into()).await;
        api.update(&mut lease, &change, due).await;
        due += period;
    }
}

/// What the pods' lives share: the apiserver they write through, their names, how long they
/// live, and the object they write.
#[derive(Debug)]
pub(crate) struct Pods {
    pub(crate) api: Arc<Apiserver>,
    pub(crate) names: Names,
    pub(crate) lifetime: Duration,
    /// A Pod object, the same for every pod (the stamp makes each write differ).
    pub(crate) value: Bytes,
}

impl Pods {
    /// A pod's life from its first write not made yet: the writes due after `arrival` (seconds
    /// after the start, negative for a pod alive at the start), until the deadline.
    pub(crate) async fn life(self: Arc<Self>, mut pod: Object, arrival: f64) {
        let first = if arrival < 0.0 {
            first_pending_step(arrival, self.lifetime.as_secs_f64())
        } else {
            Some(0)
        };
        let Some(first) = first else {
            return;
        };
        let put = Change::Put(self.value.clone());
        for step in first..POD_WRITES {
            let after_start = arrival + step_offset(step, self.lifetime.as_secs_f64());
            let due = self.api.epoch + Duration::from_secs_f64(after_start.max(0.0));
            if due >= self.api.deadline {
                return;
            }
            sleep_until(due.into()).await;
            let change = if step + 1 == POD_WRITES { &Change::Delete } else { &put };
            self.api.update(&mut pod, change, due).await;
        }
    }

    /// Starts a pod at each arrival from `next` (seconds after the start) until the deadline,
    /// numbered from `first_id`; returns how many it started, once their lives are over.
    pub(crate) async fn arrivals(self: Arc<Self>, mut clock: ArrivalClock, mut next: f64, first_id: u64) -> u64 {
        let mut pods = JoinSet::new();
        let mut id = first_id;
        loop {
            let due = self.api.epoch + Duration::from_secs_f64(next);
            if due >= self.api.deadline {
                break;
            }
            sleep_until(due.into()).await;
            let pod = Object {
                kind: Kind::Pod,
                key: self.names.pod(id),
                rev: 0,
            };
            pods.spawn(Arc::clone(&self).life(pod, next));
            id += 1;
            next += clock.gap();
            // Finished lives are reaped as they go, so the set holds only the live pods.
            while pods.try_join_next().is_some() {}
        }
        while pods.join_next().await.is_some() {}
        id - first_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod alive at the start resumes at its first write due at or after the start.
    #[test]
    fn first_pending_step_resumes_at_the_start() {
        // (arrival, lifetime, first pending step): writes are 1 s apart for a 6 s lifetime.
        let cases = [
            (-0.1, 6.0, Some(1)),
            (-1.0, 6.0, Some(1)),
            (-1.5, 6.0, Some(2)),
            (-5.5, 6.0, Some(6)),
            (-6.0, 6.0, Some(6)),
            (-6.5, 6.0, None),
        ];
        for (arrival, lifetime, want) in cases {
            assert_eq!(first_pending_step(arrival, lifetime), want, "arrival {arrival}");
        }
    }

    /// The last write of a life is due at its end, the first at its start.
    #[test]
    fn steps_span_the_lifetime() {
        assert_eq!(step_offset(0, 6.0), 0.0);
        assert_eq!(step_offset(POD_WRITES - 1, 6.0), 6.0);
    }

    /// Poisson gaps average 1/rate; even gaps are exactly that.
    #[test]
    fn arrival_gaps_average_the_rate() {
        for kind in [Arrivals::Poisson, Arrivals::Even] {
            let mut clock = ArrivalClock {
                rng: StdRng::seed_from_u64(1),
                rate: 40.0,
                kind,
            };
            let n = 100_000;
            let mean = (0..n).map(|_| clock.gap()).sum::<f64>() / f64::from(n);
            assert!((mean - 0.025).abs() < 0.025 * 0.02, "{kind:?}: mean gap {mean}");
        }
    }
}
