//! etcd's `--grpc-keepalive-min-time`: how often a client may ping, enforced as grpc-go's
//! server enforces its `keepalive.EnforcementPolicy`, with etcd's `PermitWithoutStream`
//! false.
//!
//! A ping that comes sooner than the minimum after the one before is a strike; so is any ping
//! within two hours of the one before while the client has no stream open. A third strike
//! earns a GOAWAY with ENHANCE_YOUR_CALM and the debug data `too_many_pings`, and the
//! connection is closed; grpc-go's client reads that as a sign to ping half as often. The
//! server's sending headers or data forgives: the next ping starts the count again, without
//! being judged itself, so a client's pings that answer the server's traffic (grpc-go's
//! bandwidth estimation) are never held against it.

use std::time::{Duration, Instant};

/// How long a client with no stream open must wait between pings (grpc-go's
/// `defaultPingTimeout`).
pub const IDLE_MIN_TIME: Duration = Duration::from_secs(2 * 60 * 60);
/// The minimum when `--grpc-keepalive-min-time` is 0: grpc-go's default policy.
pub const DEFAULT_MIN_TIME: Duration = Duration::from_secs(5 * 60);
/// Strikes a client may have before the connection is closed.
pub const MAX_STRIKES: u32 = 2;
/// The debug data of the GOAWAY.
pub const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

/// One connection's count of its client's pings.
#[derive(Debug)]
pub struct PingPolicy {
    min_time: Duration,
    last_ping: Option<Instant>,
    strikes: u32,
    /// The server has sent headers or data since the last ping.
    forgiven: bool,
}

/// What a ping earned.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing happens.
    Tolerated,
    /// The client has struck out: a GOAWAY, and the connection closed.
    TooManyPings,
}

impl PingPolicy {
    /// The policy for `--grpc-keepalive-min-time=min_time`.
    pub fn new(min_time: Duration) -> PingPolicy {
        PingPolicy {
            min_time: if min_time.is_zero() { DEFAULT_MIN_TIME } else { min_time },
            last_ping: None,
            strikes: 0,
            forgiven: false,
        }
    }

    /// The server sent headers or data.
    pub fn server_sent(&mut self) {
        self.forgiven = true;
    }

    /// The client pinged at `now`, with `open_streams` streams open.
    pub fn ping(&mut self, now: Instant, open_streams: usize) -> Verdict {
        let last = self.last_ping.replace(now);
        if std::mem::take(&mut self.forgiven) {
            self.strikes = 0;
            return Verdict::Tolerated;
        }
        let min_time = if open_streams == 0 {
            IDLE_MIN_TIME
        } else {
            self.min_time
        };
        if last.is_some_and(|last| now.saturating_duration_since(last) < min_time) {
            self.strikes += 1;
        }
        if self.strikes > MAX_STRIKES {
            Verdict::TooManyPings
        } else {
            Verdict::Tolerated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn pings_sooner_than_the_minimum_strike_and_the_third_strike_closes() {
        let t0 = Instant::now();
        let mut p = PingPolicy::new(5 * S);
        assert_eq!(p.ping(t0, 1), Verdict::Tolerated, "the first ping is never judged");
        assert_eq!(p.ping(t0 + S, 1), Verdict::Tolerated);
        assert_eq!(p.ping(t0 + 2 * S, 1), Verdict::Tolerated);
        assert_eq!(p.ping(t0 + 3 * S, 1), Verdict::TooManyPings);
    }

    #[test]
    fn pings_at_the_minimum_are_never_struck() {
        let t0 = Instant::now();
        let mut p = PingPolicy::new(5 * S);
        for i in 0..100 {
            assert_eq!(p.ping(t0 + 5 * i * S, 1), Verdict::Tolerated);
        }
    }

    #[test]
    fn without_a_stream_open_a_client_may_ping_once_in_two_hours() {
        let t0 = Instant::now();
        let mut p = PingPolicy::new(5 * S);
        let mut at = t0;
        for _ in 0..3 {
            assert_eq!(p.ping(at, 0), Verdict::Tolerated);
            at += 60 * S;
        }
        assert_eq!(p.ping(at, 0), Verdict::TooManyPings);

        let mut p = PingPolicy::new(5 * S);
        for i in 0..5 {
            assert_eq!(p.ping(t0 + i * IDLE_MIN_TIME, 0), Verdict::Tolerated);
        }
    }

    #[test]
    fn the_servers_traffic_forgives_and_the_ping_after_it_is_not_judged() {
        let t0 = Instant::now();
        let mut p = PingPolicy::new(5 * S);
        for i in 0..100 {
            p.server_sent();
            assert_eq!(p.ping(t0 + i * S / 10, 1), Verdict::Tolerated, "ping {i}");
        }
        p.ping(t0 + 11 * S, 1);
        p.ping(t0 + 12 * S, 1);
        p.server_sent();
        assert_eq!(p.ping(t0 + 13 * S, 1), Verdict::Tolerated);
        assert_eq!(p.ping(t0 + 14 * S, 1), Verdict::Tolerated);
        assert_eq!(p.ping(t0 + 15 * S, 1), Verdict::Tolerated);
        assert_eq!(p.ping(t0 + 16 * S, 1), Verdict::TooManyPings);
    }

    #[test]
    fn a_minimum_of_zero_is_grpc_gos_default_of_five_minutes() {
        let t0 = Instant::now();
        let mut p = PingPolicy::new(Duration::ZERO);
        for i in 0..10 {
            assert_eq!(p.ping(t0 + i * DEFAULT_MIN_TIME, 1), Verdict::Tolerated);
        }
        let mut p = PingPolicy::new(Duration::ZERO);
        let pings: Vec<_> = (0..4).map(|i| p.ping(t0 + i * 60 * S, 1)).collect();
        assert_eq!(pings.last(), Some(&Verdict::TooManyPings));
    }
}
