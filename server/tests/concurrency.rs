//! etcd's Election and Lock services. One scenario of campaigns, proclamations, observers,
//! resignations, locks, cancelled waiters and expired sessions runs against cairn, a real
//! etcd 3.5.1 and a real etcd 3.7.3, asserting the same answers from each (the differential);
//! then etcdctl's client-side recipes (`etcdctl lock`, `etcdctl elect`) and these services
//! contend for the same names on cairn, each seeing the other's holders and leaders.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/process.rs"]
mod process;

use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest};
use cairn_server::pb::v3electionpb::election_client::ElectionClient;
use cairn_server::pb::v3electionpb::{CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest};
use cairn_server::pb::v3lockpb::lock_client::LockClient;
use cairn_server::pb::v3lockpb::{LockRequest, UnlockRequest};
use common::{Member, PATIENCE};
use tonic::transport::Channel;
use tonic::Code;

/// The error's code and message, for an outcome that must have failed.
#[track_caller]
fn refusal<T: std::fmt::Debug>(outcome: Result<T, tonic::Status>) -> (Code, String) {
    let status = outcome.expect_err("it should have failed");
    (status.code(), status.message().to_string())
}

struct Api {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    election: ElectionClient<Channel>,
    lock: LockClient<Channel>,
}

impl Api {
    fn new(channel: &Channel) -> Api {
        Api {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            election: ElectionClient::new(channel.clone()),
            lock: LockClient::new(channel.clone()),
        }
    }

    async fn grant(&mut self) -> i64 {
        let grant = LeaseGrantRequest { ttl: 300, id: 0 };
        self.lease.lease_grant(grant).await.unwrap().into_inner().id
    }

    /// Waits until `count` keys are under `prefix`.
    async fn await_count(&mut self, prefix: &str, count: i64) {
        let deadline = Instant::now() + PATIENCE;
        let end = format!("{}0", prefix.trim_end_matches('/'));
        loop {
            let got = self
                .kv
                .range(RangeRequest {
                    key: prefix.to_string().into_bytes().into(),
                    range_end: end.clone().into_bytes().into(),
                    count_only: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if got.count == count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not {count} keys under {prefix} within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `key` exists (`present`) or not: an event another task causes.
    async fn await_key(&mut self, key: &[u8], present: bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let got = self
                .kv
                .range(RangeRequest {
                    key: key.to_vec().into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if got.kvs.is_empty() != present {
                return;
            }
            assert!(Instant::now() < deadline, "{key:?} not {present} within {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn contender(name: &str, lease: i64) -> Vec<u8> {
    format!("{name}/{lease:x}").into_bytes()
}

/// The scenario, on one server: every assertion holds for each of them.
async fn elections_and_locks(server: &str, channel: &Channel) {
    let mut api = Api::new(channel);
    let at = |what: &str| format!("{server}: {what}");

    // No one has campaigned.
    let none = api.election.leader(LeaderRequest { name: "e".into() }).await;
    assert_eq!(
        refusal(none),
        (Code::Unknown, "election: no leader".into()),
        "{}",
        at("leader")
    );

    // A campaigns and leads at once.
    let a = api.grant().await;
    let campaign = CampaignRequest {
        name: "e".into(),
        lease: a,
        value: "a".into(),
    };
    let won = api.election.campaign(campaign).await.unwrap().into_inner();
    let a_key = won.leader.clone().unwrap();
    assert_eq!(
        a_key.key.as_ref(),
        contender("e", a).as_slice(),
        "{}",
        at("campaign key")
    );
    assert_eq!(
        (a_key.name.as_ref(), a_key.lease),
        (b"e".as_slice(), a),
        "{}",
        at("campaign")
    );
    assert_eq!(
        a_key.rev,
        won.header.unwrap().revision,
        "{}",
        at("leader key's revision")
    );
    let leader = api
        .election
        .leader(LeaderRequest { name: "e".into() })
        .await
        .unwrap()
        .into_inner();
    let kv = leader.kv.unwrap();
    assert_eq!(
        (kv.value.as_ref(), kv.lease, kv.create_revision),
        (b"a".as_slice(), a, a_key.rev)
    );

    // An observer sees A, then each value A proclaims.
    let mut observed = api
        .election
        .observe(LeaderRequest { name: "e".into() })
        .await
        .unwrap()
        .into_inner();
    let first = observed.message().await.unwrap().unwrap();
    assert_eq!(first.kv.unwrap().value.as_ref(), b"a", "{}", at("observed first"));

    // B campaigns and waits behind A.
    let b = api.grant().await;
    let mut b_election = api.election.clone();
    let b_campaign = tokio::spawn(async move {
        let campaign = CampaignRequest {
            name: "e".into(),
            lease: b,
            value: "b".into(),
        };
        b_election.campaign(campaign).await
    });
    api.await_key(&contender("e", b), true).await;
    assert!(!b_campaign.is_finished(), "{}", at("B waits while A leads"));

    let proclaim = |leader: &LeaderKey, value: &str| ProclaimRequest {
        leader: Some(leader.clone()),
        value: value.to_string().into_bytes().into(),
    };
    api.election.proclaim(proclaim(&a_key, "a2")).await.unwrap();
    let next = observed.message().await.unwrap().unwrap();
    assert_eq!(
        next.kv.unwrap().value.as_ref(),
        b"a2",
        "{}",
        at("observed proclamation")
    );

    // Proclaiming with a key that is not the leader's, or without one.
    let stale = LeaderKey {
        rev: a_key.rev + 1000,
        ..a_key.clone()
    };
    let not_leader = api.election.proclaim(proclaim(&stale, "x")).await;
    assert_eq!(
        refusal(not_leader),
        (Code::Unknown, "election: not leader".into()),
        "{}",
        at("stale")
    );
    let missing = (Code::Unknown, "\"leader\" field must be provided".to_string());
    let no_key = api.election.proclaim(ProclaimRequest::default()).await;
    assert_eq!(refusal(no_key), missing, "{}", at("proclaim without a leader"));
    let no_key = api.election.resign(ResignRequest::default()).await;
    assert_eq!(refusal(no_key), missing, "{}", at("resign without a leader"));
    // A stale resignation deletes nothing.
    api.election
        .resign(ResignRequest { leader: Some(stale) })
        .await
        .unwrap();
    assert!(
        !b_campaign.is_finished(),
        "{}",
        at("a stale resignation changes nothing")
    );

    // A resigns: B leads, and the observer follows.
    api.election
        .resign(ResignRequest {
            leader: Some(a_key.clone()),
        })
        .await
        .unwrap();
    let b_won = tokio::time::timeout(PATIENCE, b_campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_inner();
    let b_key = b_won.leader.unwrap();
    assert_eq!(b_key.key.as_ref(), contender("e", b).as_slice(), "{}", at("B's key"));
    let next = observed.message().await.unwrap().unwrap();
    assert_eq!(next.kv.unwrap().value.as_ref(), b"b", "{}", at("observed B"));
    api.election
        .resign(ResignRequest { leader: Some(b_key) })
        .await
        .unwrap();
    let none = api.election.leader(LeaderRequest { name: "e".into() }).await;
    assert_eq!(
        refusal(none),
        (Code::Unknown, "election: no leader".into()),
        "{}",
        at("all resigned")
    );

    // Locks: A holds "l"; asking again with A's lease returns the same key at once.
    let lock = |lease| LockRequest {
        name: "l".into(),
        lease,
    };
    let held = api.lock.lock(lock(a)).await.unwrap().into_inner();
    assert_eq!(held.key.as_ref(), contender("l", a).as_slice(), "{}", at("lock key"));
    let again = api.lock.lock(lock(a)).await.unwrap().into_inner();
    assert_eq!(again.key, held.key, "{}", at("the same lease holds it already"));

    // B waits behind A, and gets it when A unlocks.
    let mut b_locks = api.lock.clone();
    let b_lock = tokio::spawn(async move { b_locks.lock(lock(b)).await });
    api.await_key(&contender("l", b), true).await;
    assert!(!b_lock.is_finished(), "{}", at("B waits while A holds"));
    api.lock.unlock(UnlockRequest { key: held.key.clone() }).await.unwrap();
    let b_held = tokio::time::timeout(PATIENCE, b_lock)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(b_held.key.as_ref(), contender("l", b).as_slice(), "{}", at("B holds"));

    // C gives up waiting (its call is cancelled): its key is withdrawn.
    let c = api.grant().await;
    let mut c_locks = api.lock.clone();
    let c_lock = tokio::spawn(async move { c_locks.lock(lock(c)).await });
    api.await_key(&contender("l", c), true).await;
    c_lock.abort();
    api.await_key(&contender("l", c), false).await;

    // D's lease is revoked while it waits: once B unlocks, D learns its session expired.
    let d = api.grant().await;
    let mut d_locks = api.lock.clone();
    let d_lock = tokio::spawn(async move { d_locks.lock(lock(d)).await });
    api.await_key(&contender("l", d), true).await;
    api.lease.lease_revoke(LeaseRevokeRequest { id: d }).await.unwrap();
    api.lock.unlock(UnlockRequest { key: b_held.key }).await.unwrap();
    let expired = tokio::time::timeout(PATIENCE, d_lock).await.unwrap().unwrap();
    assert_eq!(
        refusal(expired),
        (Code::Unknown, "mutex: session is expired".into()),
        "{}",
        at("expired session")
    );

    // A lease that does not exist; and no lease: a new one of 60 s, not kept alive.
    let unknown = api.lock.lock(lock(0x5eed)).await;
    assert_eq!(
        refusal(unknown),
        (Code::Unknown, "etcdserver: requested lease not found".into()),
        "{}",
        at("unknown lease")
    );
    let own = api.lock.lock(lock(0)).await.unwrap().into_inner();
    let key = String::from_utf8(own.key.to_vec()).unwrap();
    let lease = i64::from_str_radix(key.strip_prefix("l/").unwrap(), 16).unwrap();
    let ttl = api
        .lease
        .lease_time_to_live(LeaseTimeToLiveRequest { id: lease, keys: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (ttl.granted_ttl, ttl.keys.len()),
        (60, 1),
        "{}",
        at("a lock's own lease")
    );
}

#[tokio::test]
async fn elections_and_locks_answer_as_etcds_do() {
    let (servers, _processes) = process::cairn_and_etcds().await;
    for (name, channel) in &servers {
        elections_and_locks(name, channel).await;
    }
}

/// etcdctl's client-side recipes and cairn's services on the same names: a lock held by
/// `etcdctl lock` holds off the Lock service and the other way round; a leader elected
/// through the Election service is seen by `etcdctl elect --listen`, and `etcdctl elect`
/// takes over when it resigns.
#[tokio::test]
async fn etcdctl_recipes_and_the_services_see_each_other() {
    let member = Member::start("recipes", &[]);
    let channel = Channel::from_shared(member.client_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut api = Api::new(&channel);

    // etcdctl holds "shared"; the service waits until etcdctl lets go (on SIGTERM).
    let mut cli_lock = member.etcdctl_lines(&["lock", "shared"]);
    let cli_key = cli_lock.until_match(|l| l.starts_with("shared/")).pop().unwrap();
    let lease = api.grant().await;
    let mut locks = api.lock.clone();
    let svc_lock = tokio::spawn(async move {
        locks
            .lock(LockRequest {
                name: "shared".into(),
                lease,
            })
            .await
    });
    api.await_key(&contender("shared", lease), true).await;
    assert!(
        !svc_lock.is_finished(),
        "the service waits while etcdctl holds the lock"
    );
    cli_lock.terminate();
    let held = tokio::time::timeout(PATIENCE, svc_lock)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(held.key.as_ref(), contender("shared", lease).as_slice());
    api.await_key(cli_key.as_bytes(), false).await;

    // Now the service holds it: etcdctl waits, and gets it on Unlock.
    let mut cli_lock = member.etcdctl_lines(&["lock", "shared"]);
    api.await_count("shared/", 2).await;
    api.lock.unlock(UnlockRequest { key: held.key }).await.unwrap();
    let got = cli_lock.until_match(|l| l.starts_with("shared/")).pop().unwrap();
    assert_ne!(got.as_bytes(), contender("shared", lease).as_slice());
    cli_lock.terminate();

    // The service elects a leader; etcdctl's observer sees it, etcdctl's candidate waits.
    let leader = api
        .election
        .campaign(CampaignRequest {
            name: "choice".into(),
            lease,
            value: "service".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .leader
        .unwrap();
    let mut listener = member.etcdctl_lines(&["elect", "--listen", "choice"]);
    listener.until("service");
    let mut candidate = member.etcdctl_lines(&["elect", "choice", "cli"]);
    api.await_count("choice/", 2).await;
    // The service resigns: etcdctl's candidate leads, and both etcdctl and the service say so.
    api.election
        .resign(ResignRequest { leader: Some(leader) })
        .await
        .unwrap();
    candidate.until("cli");
    listener.until("cli");
    let now = api
        .election
        .leader(LeaderRequest { name: "choice".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.kv.unwrap().value.as_ref(), b"cli");
}
