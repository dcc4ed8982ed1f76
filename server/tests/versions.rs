//! The versions members agree (`cairn_engine::version`, `server/src/job/versions.rs`), seen from
//! outside: `/version`, etcdctl 3.7's `downgrade validate|enable|cancel` with etcd's answers,
//! and a cluster mixing this build with one from before alarms had a member, where the newer
//! member must write only what the older ones decode (tests/upgrade/README.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/process.rs"]
#[allow(dead_code)]
mod process;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{etcdctl_of, http_get, Member};

/// The commit just before alarms were logged with their member (`MemberAlarm`): a build that
/// cannot decode that entry.
const BEFORE_MEMBER_ALARM: &str = "14077359cdbc64eb02daeeb576afb2b0fd6d7a5c";

/// How long the members get to agree (the leader asks every 5 s unless told otherwise).
const AGREEMENT: Duration = Duration::from_secs(30);

fn own() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cairn"))
}

/// The `cairn` binary of an earlier commit, built by tests/upgrade/build.sh (kept once built).
fn build_of(commit: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/upgrade/build.sh");
    let out = Command::new(script).arg(commit).output().unwrap();
    assert!(
        out.status.success(),
        "tests/upgrade/build.sh {commit} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(path.lines().last().unwrap().trim())
}

fn etcdctl37(m: &Member, args: &[&str]) -> Output {
    let bin = process::etcd_tool("etcd-3.7", "etcdctl", "tests/etcd-3.7/build.sh");
    etcdctl_of(&bin, &m.client_url(), args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `/version`'s `cairncluster`.
fn cluster_version(m: &Member) -> String {
    let (status, body) = http_get(m.client_port, "/version").unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["cairncluster"].as_str().unwrap_or_default().to_string()
}

/// Waits until every member's `/version` says the cluster version is `want`.
#[track_caller]
fn await_cluster_version(members: &[Member], want: &str) {
    let deadline = Instant::now() + AGREEMENT;
    loop {
        let seen: Vec<String> = members.iter().map(cluster_version).collect();
        if seen.iter().all(|v| v == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster version is not {want} within {AGREEMENT:?}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_members_agree_their_version_and_etcdctl_downgrades_it_as_etcds() {
    // The leader asks the members every second (etcd's flag; 5 s by default).
    let members = Member::start_cluster(&["v1", "v2", "v3"], &["--downgrade-check-time", "1s"], |_, _, _| {});
    await_cluster_version(&members, "0.2");
    let (_, body) = http_get(members[0].client_port, "/version").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // What clients check stays etcd's; cairn's own versions are beside it.
    assert_eq!(v["etcdserver"], "3.6.0", "{body}");
    assert_eq!(v["cairn"], env!("CARGO_PKG_VERSION"), "{body}");
    assert_eq!(v["cairnstorage"], "0.2", "{body}");

    let m = &members[1];
    let out = etcdctl37(m, &["downgrade", "validate", "0.1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Downgrade validate success, cluster version 0.2.0"),
        "{}",
        text(&out)
    );
    for (target, error) in [
        ("0.0", "etcdserver: invalid downgrade target version"),
        ("0.2", "etcdserver: invalid downgrade target version"),
        ("3.5", "etcdserver: invalid downgrade target version"),
        ("banana", "etcdserver: wrong downgrade target version format"),
    ] {
        let out = etcdctl37(m, &["downgrade", "validate", target]);
        assert!(
            !out.status.success() && text(&out).contains(error),
            "{target}: {}",
            text(&out)
        );
    }
    let out = etcdctl37(m, &["downgrade", "cancel"]);
    assert!(
        text(&out).contains("etcdserver: no inflight downgrade job"),
        "{}",
        text(&out)
    );

    let out = etcdctl37(m, &["downgrade", "enable", "0.1"]);
    assert!(out.status.success(), "{}", text(&out));
    // The leader lowers the cluster version to the target; Status reports the downgrade.
    await_cluster_version(&members, "0.1");
    let status = etcdctl37(&members[2], &["endpoint", "status", "-w", "json"]);
    let status = text(&status);
    assert!(status.contains(r#""storageVersion":"0.1.0""#), "{status}");
    assert!(
        status.contains(r#""downgradeInfo":{"enabled":true,"targetVersion":"0.1.0"}"#),
        "{status}"
    );
    let out = etcdctl37(m, &["downgrade", "enable", "0.1"]);
    assert!(
        text(&out).contains("etcdserver: cluster has a downgrade job in progress"),
        "{}",
        text(&out)
    );
    // Cancelled, the cluster goes back up to what every member runs.
    let out = etcdctl37(m, &["downgrade", "cancel"]);
    assert!(out.status.success(), "{}", text(&out));
    await_cluster_version(&members, "0.2");
}

/// Every member's alarm list, as etcdctl prints it.
fn alarms(members: &[Member]) -> Vec<String> {
    members.iter().map(|m| m.ok(&["alarm", "list"])).collect()
}

/// A cluster of two members on a build from before `MemberAlarm` and one of this build, whose
/// small quota is exceeded: the NOSPACE alarm it raises must reach the older members' state
/// (logged in the form they decode, as the cluster version is below 0.2). Then the older two
/// are upgraded one at a time, the cluster version rises, and the three hold the same data.
#[test]
fn a_member_of_a_newer_release_writes_only_what_older_members_decode() {
    let old = build_of(BEFORE_MEMBER_ALARM);
    let quota: &[&str] = &["--quota-backend-bytes", "1048576"];
    let mut members = Member::start_cluster_of(
        &[("old1", &old, &[]), ("old2", &old, &[]), ("new", own(), quota)],
        |_, _, _| {},
    );
    for (i, m) in members.iter().enumerate() {
        m.ok(&["put", &format!("small/{i}"), "v"]);
    }
    let big = "x".repeat(64 * 1024);
    let new = &members[2];
    let mut refused = None;
    for i in 0..200 {
        let out = new.etcdctl(&["put", &format!("big/{i}"), &big]);
        if !out.status.success() {
            refused = Some(text(&out));
            break;
        }
    }
    let refused = refused.expect("the quota was never exceeded");
    assert!(refused.contains("database space exceeded"), "{refused}");

    // Every member took the alarm into its state: the older ones too.
    let deadline = Instant::now() + AGREEMENT;
    while !alarms(&members).iter().all(|a| a.contains("NOSPACE")) {
        assert!(
            Instant::now() < deadline,
            "not every member holds the alarm: {:?}",
            alarms(&members)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // One alarm each. The older builds hold alarms without a member and list them as their
    // own (memberID: theirs); this build holds it as member 0's, which etcdctl lists bare.
    let lists = alarms(&members);
    assert!(lists.iter().all(|l| l.lines().count() == 1), "{lists:?}");
    // And so refuses writes through any member, as the new one does.
    let out = members[0].etcdctl(&["put", "after", "v"]);
    assert!(text(&out).contains("database space exceeded"), "{}", text(&out));
    assert_eq!(cluster_version(&members[2]), "0.1");

    // Disarmed through an older member, in its form: gone everywhere.
    members[0].ok(&["alarm", "disarm"]);
    let deadline = Instant::now() + AGREEMENT;
    while !alarms(&members).iter().all(String::is_empty) {
        assert!(Instant::now() < deadline, "the alarm stays: {:?}", alarms(&members));
        std::thread::sleep(Duration::from_millis(100));
    }
    members[1].ok(&["put", "after", "v"]);

    // The rolling upgrade: one member at a time.
    for m in members.iter_mut().take(2) {
        assert!(m.stop().success());
        m.restart_as(own());
    }
    await_cluster_version(&members, "0.2");
    members[0].ok(&["put", "upgraded", "v"]);
    assert_same_data(&members);
}

/// The commit of the release this one upgrades from (tests/upgrade/PREVIOUS).
fn previous_release() -> PathBuf {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/upgrade/PREVIOUS");
    build_of(std::fs::read_to_string(file).unwrap().trim())
}

/// The index in `members` of the leader, as the first member's Status names it.
fn leader_index(members: &[Member]) -> usize {
    let status = members[0].json(&["endpoint", "status"]);
    let leader = status[0]["Status"]["leader"].as_u64().unwrap();
    members
        .iter()
        .position(|m| {
            let s = m.json(&["endpoint", "status"]);
            s[0]["Status"]["header"]["member_id"].as_u64() == Some(leader)
        })
        .unwrap()
}

/// The same keys (read linearizably through each member) and the same HashKV at the current
/// revision on every member.
#[track_caller]
fn assert_same_data(members: &[Member]) {
    let keys: Vec<String> = members
        .iter()
        .map(|m| m.ok(&["get", "", "--prefix", "--keys-only", "--consistency=l"]))
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    let revision = members[0].revision();
    let hashes: Vec<String> = members
        .iter()
        .map(|m| {
            let out = m.ok(&["endpoint", "hashkv", &format!("--rev={revision}"), "-w", "json"]);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            v[0]["HashKV"]["hash"].to_string()
        })
        .collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
}

/// From the previous release to this one, one member at a time and the leader last; then back,
/// as etcd 3.6 downgrades: `downgrade enable`, the cluster version lowered, members swapped back
/// one at a time, their data (checkpoints with the agreed versions in their trailer) opened by
/// the older release. Writes go on through every member at every step.
#[test]
fn a_cluster_upgrades_from_the_previous_release_and_downgrades_back() {
    let previous = previous_release();
    let none: &[&str] = &[];
    let mut members = Member::start_cluster_of(
        &[
            ("p1", &previous, none),
            ("p2", &previous, none),
            ("p3", &previous, none),
        ],
        |_, _, _| {},
    );
    let mut written = 0;
    let mut write_through_each = |members: &[Member]| {
        for m in members {
            m.ok(&["put", &format!("k/{written:03}"), "v"]);
            written += 1;
        }
    };
    write_through_each(&members);
    let leader = leader_index(&members);
    let order: Vec<usize> = (0..3).filter(|i| *i != leader).chain([leader]).collect();
    for &i in &order {
        assert!(members[i].stop().success());
        members[i].restart_as(own());
        write_through_each(&members);
    }
    await_cluster_version(&members, "0.2");
    write_through_each(&members);
    assert_same_data(&members);

    let out = etcdctl37(&members[0], &["downgrade", "enable", "0.1"]);
    assert!(out.status.success(), "{}", text(&out));
    await_cluster_version(&members, "0.1");
    for &i in &order {
        assert!(members[i].stop().success());
        members[i].restart_as(&previous);
        write_through_each(&members);
    }
    assert_same_data(&members);
    let all = members[2].ok(&["get", "k/", "--prefix", "--keys-only"]);
    assert_eq!(all.lines().filter(|l| !l.is_empty()).count(), written, "{all}");
}
