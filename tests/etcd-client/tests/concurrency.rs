//! The etcd-client crate's lock and election APIs against cairn's Lock and Election
//! services, as a Rust program would use them to run one worker at a time or to elect a
//! leader among replicas.

mod common;

use std::time::Instant;

use common::{assert_status, Member, PATIENCE};
use etcd_client::{Client, GetOptions, LockOptions, ProclaimOptions, ResignOptions};
use tonic::Code;

/// Waits until `count` keys are under `prefix` (each contender writes one).
async fn await_contenders(c: &mut Client, prefix: &str, count: i64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let options = GetOptions::new().with_prefix().with_count_only();
        if c.get(prefix, Some(options)).await.unwrap().count() == count {
            return;
        }
        assert!(Instant::now() < deadline, "not {count} contenders under {prefix}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn one_worker_at_a_time_with_lock_and_unlock() {
    let (member, mut c) = Member::start("locks").await;
    let mut other = member.connect(None).await.unwrap();
    let first = c.lease_grant(60, None).await.unwrap().id();
    let held = c.lock("job", Some(LockOptions::new().with_lease(first))).await.unwrap();
    assert_eq!(held.key(), format!("job/{first:x}").as_bytes());

    let second = c.lease_grant(60, None).await.unwrap().id();
    let waiting = tokio::spawn(async move { other.lock("job", Some(LockOptions::new().with_lease(second))).await });
    await_contenders(&mut c, "job/", 2).await;
    assert!(
        !waiting.is_finished(),
        "the second worker waits while the first holds the lock"
    );
    c.unlock(held.key()).await.unwrap();
    let got = tokio::time::timeout(PATIENCE, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(got.key(), format!("job/{second:x}").as_bytes());
    // Revoking the holder's lease releases the lock too.
    c.lease_revoke(second).await.unwrap();
    await_contenders(&mut c, "job/", 0).await;
}

#[tokio::test]
async fn replicas_elect_a_leader_observe_it_and_hand_over() {
    let (member, mut c) = Member::start("elections").await;
    assert_status(c.leader("svc").await, Code::Unknown, "election: no leader");
    let a = c.lease_grant(60, None).await.unwrap().id();
    let won = c.campaign("svc", "replica-a", a).await.unwrap();
    let a_key = won.leader().unwrap().clone();
    assert_eq!(a_key.key(), format!("svc/{a:x}").as_bytes());
    let mut observer = member.connect(None).await.unwrap().observe("svc").await.unwrap();
    let seen = observer.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"replica-a");

    let b = c.lease_grant(60, None).await.unwrap().id();
    let mut other = member.connect(None).await.unwrap();
    let b_campaign = tokio::spawn(async move { other.campaign("svc", "replica-b", b).await });
    await_contenders(&mut c, "svc/", 2).await;
    assert!(!b_campaign.is_finished(), "B waits while A leads");

    c.proclaim("replica-a v2", Some(ProclaimOptions::new().with_leader(a_key.clone())))
        .await
        .unwrap();
    let seen = observer.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"replica-a v2");
    let leader = c.leader("svc").await.unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"replica-a v2");

    c.resign(Some(ResignOptions::new().with_leader(a_key.clone())))
        .await
        .unwrap();
    let b_won = tokio::time::timeout(PATIENCE, b_campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(b_won.leader().unwrap().key(), format!("svc/{b:x}").as_bytes());
    let seen = observer.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"replica-b");
    // The old leader can no longer proclaim.
    assert_status(
        c.proclaim("stale", Some(ProclaimOptions::new().with_leader(a_key)))
            .await,
        Code::Unknown,
        "election: not leader",
    );
}
