//! cairn driven end to end by the real etcdctl (3.4, Debian's `etcd-client`), each test on its
//! own single-member cluster: put, get and del with their flags, with revisions and versions
//! checked exactly; `txn -i`; compaction; watch; leases; the member, endpoint, alarm, defrag
//! and move-leader commands; snapshot save, `cairn snapshot status` and `cairn snapshot
//! restore` into a member that serves the same data; requests refused for their size, their
//! number of operations or an unknown lease, after which the member still serves; the HTTP
//! endpoints; and a graceful stop on SIGTERM that keeps every key. The expected outputs are
//! what etcd 3.4 answers to the same commands.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{b64, fails, json, kv_list, kvs, ok, Kv, Member};
use serde_json::Value;

/// Where a key is in the history: its create revision, its last mod revision and its version.
#[derive(Clone, Copy)]
struct Revisions(i64, i64, i64);

fn kv(key: &str, value: &str, Revisions(create, modified, version): Revisions) -> Kv {
    Kv {
        key: key.to_string(),
        value: value.to_string(),
        create,
        modified,
        version,
        lease: 0,
    }
}

/// The lease ID in `lease grant`'s output, `lease <16 hex digits> granted with TTL(<n>s)`.
fn granted_lease(output: &str, ttl: i64) -> String {
    let id = output
        .strip_prefix("lease ")
        .and_then(|rest| rest.strip_suffix(&format!(" granted with TTL({ttl}s)\n")))
        .unwrap_or_else(|| panic!("unexpected lease grant output: {output:?}"));
    assert_eq!(id.len(), 16, "{output:?}");
    id.to_string()
}

#[test]
fn put_with_prev_kv_ignore_value_ignore_lease_and_lease() {
    let m = Member::start("put", &[]);
    assert_eq!(m.revision(), 1, "a fresh store is at revision 1");

    assert_eq!(m.ok(&["put", "a", "1"]), "OK\n");
    assert_eq!(m.ok(&["put", "a", "2", "--prev-kv"]), "OK\na\n1\n");
    assert_eq!(
        m.ok(&["put", "fresh", "x", "--prev-kv"]),
        "OK\n",
        "no previous kv to print"
    );
    let a = m.json(&["get", "a"]);
    assert_eq!(a["header"]["revision"], 4);
    assert_eq!(kv_list(&a), vec![kv("a", "2", Revisions(2, 3, 2))]);

    // --ignore-value: a new revision and version, the value kept.
    assert_eq!(m.ok(&["put", "a", "--ignore-value"]), "OK\n");
    assert_eq!(kv_list(&m.json(&["get", "a"])), vec![kv("a", "2", Revisions(2, 5, 3))]);
    m.fails(&["put", "missing", "--ignore-value"], "etcdserver: key not found");

    // --lease attaches; --ignore-lease keeps the lease while changing the value; a plain put
    // detaches.
    let id = granted_lease(&m.ok(&["lease", "grant", "100"]), 100);
    let lease = u64::from_str_radix(&id, 16).unwrap();
    assert_eq!(m.revision(), 5, "granting a lease writes no key");
    assert_eq!(m.ok(&["put", "l", "v1", &format!("--lease={id}")]), "OK\n");
    let expected = Kv {
        lease,
        ..kv("l", "v1", Revisions(6, 6, 1))
    };
    assert_eq!(kv_list(&m.json(&["get", "l"])), vec![expected]);
    assert_eq!(m.ok(&["put", "l", "v2", "--ignore-lease"]), "OK\n");
    let expected = Kv {
        lease,
        ..kv("l", "v2", Revisions(6, 7, 2))
    };
    assert_eq!(kv_list(&m.json(&["get", "l"])), vec![expected]);
    assert_eq!(m.ok(&["put", "l", "v3"]), "OK\n");
    assert_eq!(kv_list(&m.json(&["get", "l"])), vec![kv("l", "v3", Revisions(6, 8, 3))]);
    m.fails(&["put", "missing", "v", "--ignore-lease"], "etcdserver: key not found");
    m.fails(
        &["put", "x", "y", "--lease=1234"],
        "etcdserver: requested lease not found",
    );

    // Refused puts write nothing.
    assert_eq!(m.revision(), 8);
    assert_eq!(m.ok(&["get", "missing"]), "");
}

#[test]
fn get_with_prefix_from_key_limit_rev_sort_and_output_options() {
    let m = Member::start("get", &[]);
    for (key, value) in [
        ("k1", "v1"),
        ("k2", "v2"),
        ("k3", "v3"),
        ("k4", "v4"),
        ("k2", "v2b"),
        ("other", "o"),
    ] {
        m.ok(&["put", key, value]);
    }
    // Revisions: k1 2, k2 3 then 6, k3 4, k4 5, other 7.
    assert_eq!(m.ok(&["get", "k", "--prefix"]), "k1\nv1\nk2\nv2b\nk3\nv3\nk4\nv4\n");
    assert_eq!(
        m.ok(&["get", "k1", "k3"]),
        "k1\nv1\nk2\nv2b\n",
        "range end is exclusive"
    );
    assert_eq!(
        m.ok(&["get", "k3", "--from-key", "--keys-only"]),
        "k3\n\nk4\n\nother\n\n"
    );
    assert_eq!(m.ok(&["get", "k2", "--print-value-only"]), "v2b\n");
    assert_eq!(m.ok(&["get", "k2", "--consistency=s"]), "k2\nv2b\n");

    let all = m.json(&["get", "", "--prefix"]);
    assert_eq!(all["header"]["revision"], 7);
    assert_eq!(all["count"], 5);
    assert_eq!(
        kv_list(&all),
        vec![
            kv("k1", "v1", Revisions(2, 2, 1)),
            kv("k2", "v2b", Revisions(3, 6, 2)),
            kv("k3", "v3", Revisions(4, 4, 1)),
            kv("k4", "v4", Revisions(5, 5, 1)),
            kv("other", "o", Revisions(7, 7, 1)),
        ]
    );

    // --limit: `count` is every key in the range, `more` says some were left out.
    let limited = m.json(&["get", "k", "--prefix", "--limit=2"]);
    assert_eq!(
        kv_list(&limited),
        vec![kv("k1", "v1", Revisions(2, 2, 1)), kv("k2", "v2b", Revisions(3, 6, 2))]
    );
    assert_eq!(limited["count"], 4);
    assert_eq!(limited["more"], true);
    let unlimited = m.json(&["get", "k", "--prefix", "--limit=4"]);
    assert_eq!(
        unlimited["more"],
        Value::Null,
        "nothing left out: more is false (omitted)"
    );

    // --count-only arrived in etcdctl 3.5; with 3.4, `count` is checked through --limit above.
    let help = String::from_utf8_lossy(&m.etcdctl(&["get", "--help"]).stdout).into_owned();
    if help.contains("--count-only") {
        let counted = m.json(&["get", "k", "--prefix", "--count-only"]);
        assert_eq!(counted["count"], 4);
        assert_eq!(counted["kvs"], Value::Null);
    }

    let keys_only = m.json(&["get", "k", "--prefix", "--keys-only"]);
    let keys: Vec<String> = kvs(&keys_only).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["k1", "k2", "k3", "k4"]);
    assert!(
        keys_only["kvs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|kv| kv["value"].is_null()),
        "--keys-only returns no values: {keys_only}"
    );

    // --rev reads history.
    assert_eq!(m.ok(&["get", "k2", "--rev=3"]), "k2\nv2\n");
    assert_eq!(m.ok(&["get", "k2", "--rev=2"]), "", "k2 did not exist yet");
    assert_eq!(
        m.ok(&["get", "k", "--prefix", "--keys-only", "--rev=4"]),
        "k1\n\nk2\n\nk3\n\n"
    );
    m.fails(
        &["get", "k2", "--rev=8"],
        "etcdserver: mvcc: required revision is a future revision",
    );

    // --sort-by / --order.
    let sorted = |args: &[&str]| -> String {
        let mut all = vec!["get", "k", "--prefix", "--print-value-only"];
        all.extend_from_slice(args);
        m.ok(&all)
    };
    assert_eq!(sorted(&["--sort-by=MODIFY", "--order=DESCEND"]), "v2b\nv4\nv3\nv1\n");
    assert_eq!(sorted(&["--sort-by=CREATE", "--order=DESCEND"]), "v4\nv3\nv2b\nv1\n");
    assert_eq!(sorted(&["--sort-by=KEY", "--order=DESCEND"]), "v4\nv3\nv2b\nv1\n");
    assert_eq!(sorted(&["--sort-by=VALUE", "--order=ASCEND"]), "v1\nv2b\nv3\nv4\n");
    assert_eq!(sorted(&["--sort-by=VERSION", "--order=DESCEND", "--limit=1"]), "v2b\n");
    assert_eq!(sorted(&["--order=DESCEND"]), "v4\nv3\nv2b\nv1\n", "by key unless told");

    assert_eq!(m.revision(), 7, "reads write nothing");
}

#[test]
fn del_single_prefix_from_key_and_prev_kv() {
    let m = Member::start("del", &[]);
    for (key, value) in [
        ("a", "1"),
        ("b", "2"),
        ("c/1", "3"),
        ("c/2", "4"),
        ("d", "5"),
        ("e", "6"),
    ] {
        m.ok(&["put", key, value]);
    }
    assert_eq!(m.revision(), 7);

    assert_eq!(m.ok(&["del", "a"]), "1\n");
    assert_eq!(m.revision(), 8);
    assert_eq!(m.ok(&["del", "a"]), "0\n");
    assert_eq!(m.revision(), 8, "a delete that deletes nothing writes no revision");

    assert_eq!(m.ok(&["del", "b", "--prev-kv"]), "1\nb\n2\n");
    let by_prefix = m.json(&["del", "c/", "--prefix"]);
    assert_eq!(by_prefix["deleted"], 2);
    assert_eq!(by_prefix["header"]["revision"], 10, "one revision for both keys");
    assert_eq!(m.ok(&["del", "d", "--from-key", "--prev-kv"]), "2\nd\n5\ne\n6\n");
    assert_eq!(m.revision(), 11);
    assert_eq!(m.ok(&["get", "", "--prefix"]), "");

    // A key deleted and put again starts a new generation: version 1, a new create revision.
    m.ok(&["put", "a", "again"]);
    assert_eq!(
        kv_list(&m.json(&["get", "a"])),
        vec![kv("a", "again", Revisions(12, 12, 1))]
    );
    // History still holds the deleted keys.
    assert_eq!(m.ok(&["get", "a", "--rev=7"]), "a\n1\n");
    assert_eq!(m.ok(&["get", "a", "--rev=8"]), "");
    assert_eq!(m.ok(&["get", "c/", "--prefix", "--rev=9"]), "c/1\n3\nc/2\n4\n");
}

/// What `etcdctl txn -i` prints before the result: its three prompts.
const TXN_PROMPTS: &str = "compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\n";

#[test]
fn txn_compares_value_mod_version_and_create_and_runs_one_branch() {
    let m = Member::start("txn", &[]);
    for (key, value) in [("k1", "v1"), ("k2", "v2"), ("k3", "v3"), ("k3", "v3b")] {
        m.ok(&["put", key, value]);
    }
    // k1: created 2; k2: created 3; k3: created 4, modified 5, version 2.
    let success = "value(\"k1\") = \"v1\"\nmod(\"k2\") = \"3\"\nversion(\"k3\") = \"2\"\ncreate(\"k3\") = \"4\"\n\n\
                   put k1 new\nget k2\ndel k3\n\nput failed 1\n\n";
    let out = ok(m.etcdctl_stdin(&["txn", "-i"], success));
    assert_eq!(out, format!("{TXN_PROMPTS}SUCCESS\n\nOK\n\nk2\nv2\n\n1\n"));
    // Every write of the branch at one revision.
    assert_eq!(m.revision(), 6);
    assert_eq!(
        kv_list(&m.json(&["get", "k1"])),
        vec![kv("k1", "new", Revisions(2, 6, 2))]
    );
    assert_eq!(m.ok(&["get", "k3"]), "");
    assert_eq!(m.ok(&["get", "failed"]), "", "the failure branch did not run");

    let failure = "value(\"k1\") = \"v1\"\n\nput succeeded 1\n\nput failed yes\nget k1\n\n";
    let out = ok(m.etcdctl_stdin(&["txn", "-i"], failure));
    assert_eq!(out, format!("{TXN_PROMPTS}FAILURE\n\nOK\n\nk1\nnew\n"));
    assert_eq!(m.revision(), 7);
    assert_eq!(m.ok(&["get", "failed"]), "failed\nyes\n");
    assert_eq!(m.ok(&["get", "succeeded"]), "");

    // Compares are ANDed: one false compare fails the whole txn.
    let mixed = "value(\"k1\") = \"new\"\nversion(\"k2\") = \"5\"\n\nput x 1\n\nput y 1\n\n";
    let out = ok(m.etcdctl_stdin(&["txn", "-i", "-w", "json"], mixed));
    let answer: Value = serde_json::from_str(out.strip_prefix(TXN_PROMPTS).unwrap()).unwrap();
    assert_eq!(answer["succeeded"], Value::Null, "false is omitted: {answer}");
    assert_eq!(answer["header"]["revision"], 8);

    // A missing key compares as 0 for version, create and mod; other operators.
    let missing = "version(\"absent\") = \"0\"\ncreate(\"absent\") = \"0\"\nmod(\"k1\") > \"5\"\n\
                   mod(\"k1\") < \"7\"\nvalue(\"k2\") != \"zzz\"\n\nput absent here\n\n\n";
    let out = ok(m.etcdctl_stdin(&["txn", "-i"], missing));
    assert_eq!(out, format!("{TXN_PROMPTS}SUCCESS\n\nOK\n"));
    assert_eq!(
        kv_list(&m.json(&["get", "absent"])),
        vec![kv("absent", "here", Revisions(9, 9, 1))]
    );

    // A txn that only reads writes no revision.
    let read_only = "mod(\"k1\") = \"6\"\n\nget k1\n\n\n";
    let out = ok(m.etcdctl_stdin(&["txn", "-i", "-w", "json"], read_only));
    let answer: Value = serde_json::from_str(out.strip_prefix(TXN_PROMPTS).unwrap()).unwrap();
    assert_eq!(answer["succeeded"], true);
    assert_eq!(answer["header"]["revision"], 9);
    let range = &answer["responses"][0]["Response"]["ResponseRange"];
    assert_eq!(kv_list(range), vec![kv("k1", "new", Revisions(2, 6, 2))]);
    assert_eq!(m.revision(), 9);
}

#[test]
fn compaction_discards_history_below_it() {
    let m = Member::start("compaction", &[]);
    for (key, value) in [("a", "v1"), ("a", "v2"), ("a", "v3"), ("b", "x")] {
        m.ok(&["put", key, value]);
    }
    assert_eq!(m.ok(&["compaction", "3"]), "compacted revision 3\n");
    let compacted = "etcdserver: mvcc: required revision has been compacted";
    m.fails(&["get", "a", "--rev=2"], compacted);
    assert_eq!(
        m.ok(&["get", "a", "--rev=3"]),
        "a\nv2\n",
        "the compaction revision stays readable"
    );
    m.fails(&["compaction", "3"], compacted);
    m.fails(
        &["compaction", "6"],
        "etcdserver: mvcc: required revision is a future revision",
    );

    assert_eq!(m.ok(&["compaction", "--physical", "5"]), "compacted revision 5\n");
    m.fails(&["get", "a", "--rev=4"], compacted);
    assert_eq!(m.ok(&["get", "", "--prefix", "--rev=5"]), "a\nv3\nb\nx\n");
    assert_eq!(m.revision(), 5, "compaction writes no revision");

    // A watch from a compacted revision is canceled with the same reason.
    let mut watch = m.etcdctl_lines(&["watch", "a", "--rev=2"]);
    let (status, stderr) = watch.wait_exit();
    assert!(!status.success());
    assert!(
        stderr.contains("watch was canceled (etcdserver: mvcc: required revision has been compacted)"),
        "{stderr}"
    );
    assert_eq!(watch.rest(), Vec::<String>::new());

    // HashKV reports the compaction, and refuses a revision at or below it.
    let hash = json(m.etcdctl(&["endpoint", "hashkv", "-w", "json"]));
    assert_eq!(hash[0]["HashKV"]["compact_revision"], 5);
    fails(m.etcdctl(&["endpoint", "hashkv", "--rev=4"]), compacted);
}

#[test]
fn hashkv_at_the_compacted_revision_is_compacted() {
    let m = Member::start("hashkv-compacted", &[]);
    for value in ["1", "2", "3"] {
        m.ok(&["put", "a", value]);
    }
    assert_eq!(m.ok(&["compaction", "3"]), "compacted revision 3\n");
    // etcd: `rev > 0 && rev <= compactRev` is ErrCompacted.
    fails(
        m.etcdctl(&["endpoint", "hashkv", "--rev=3"]),
        "etcdserver: mvcc: required revision has been compacted",
    );
}

#[test]
fn watch_from_a_revision_with_prefix_and_prev_kv() {
    let m = Member::start("watch", &[]);
    m.ok(&["put", "w/a", "1"]);
    m.ok(&["put", "w/a", "2"]);
    let mut everything = m.etcdctl_lines(&["watch", "w/", "--prefix", "--prev-kv", "--rev=2"]);
    // From the next revision on: nothing of the past.
    let mut one_key = m.etcdctl_lines(&["watch", "w/a", "--rev=4"]);

    m.ok(&["put", "w/b", "3"]); // 4
    m.ok(&["del", "w/a"]); // 5
    ok(m.etcdctl_stdin(&["txn"], "\nput w/c 1\nput w/a 9\n\n\n")); // 6
    m.ok(&["put", "w/a", "end"]); // 7

    let expected = [
        // Revision 2 and 3, from history; no previous kv at creation.
        "PUT", "w/a", "1", //
        "PUT", "w/a", "1", "w/a", "2", //
        "PUT", "w/b", "3", //
        // A delete: the previous kv, then the deleted key with no value.
        "DELETE", "w/a", "2", "w/a", "", //
        "PUT", "w/c", "1", //
        "PUT", "w/a", "9", //
        "PUT", "w/a", "9", "w/a", "end",
    ];
    assert_eq!(everything.until("end"), expected);
    assert_eq!(
        one_key.until("end"),
        ["DELETE", "w/a", "", "PUT", "w/a", "9", "PUT", "w/a", "end"]
    );
    // Nothing outside the watched range, nothing twice.
    m.ok(&["put", "elsewhere", "x"]); // 8
    m.ok(&["put", "w/z", "last"]); // 9
    m.ok(&["put", "w/a", "fin"]); // 10
    assert_eq!(
        everything.until("fin"),
        ["PUT", "w/z", "last", "PUT", "w/a", "end", "w/a", "fin"]
    );
    assert_eq!(one_key.until("fin"), ["PUT", "w/a", "fin"]);

    // In JSON: every event of one revision in one response, in the txn's order.
    let mut from_six = m.etcdctl_lines(&["watch", "w/", "--prefix", "--rev=6", "-w", "json"]);
    let mut events = Vec::new();
    while events.len() < 3 {
        let line = from_six.until_match(|_| true).pop().unwrap();
        let response: Value = serde_json::from_str(&line).unwrap();
        let at_six = response["Events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kv"]["mod_revision"] == 6)
            .count();
        assert!(at_six == 0 || at_six == 2, "revision 6 split across responses: {line}");
        for e in response["Events"].as_array().unwrap() {
            let key = b64(e["kv"]["key"].as_str().unwrap());
            events.push((key, e["kv"]["mod_revision"].as_i64().unwrap()));
        }
    }
    let expected = [("w/c".to_string(), 6), ("w/a".to_string(), 6), ("w/a".to_string(), 7)];
    assert_eq!(events[..3], expected);
}

#[test]
fn lease_grant_keep_alive_time_to_live_list_revoke_and_expiry() {
    let m = Member::start("lease", &[]);
    let id = granted_lease(&m.ok(&["lease", "grant", "100"]), 100);
    let lease = u64::from_str_radix(&id, 16).unwrap();
    let other = granted_lease(&m.ok(&["lease", "grant", "200"]), 200);

    m.ok(&["put", "l1", "a", &format!("--lease={id}")]);
    m.ok(&["put", "l2", "b", &format!("--lease={id}")]);
    m.ok(&["put", "free", "c"]);

    let ttl = m.ok(&["lease", "timetolive", &id, "--keys"]);
    let prefix = format!("lease {id} granted with TTL(100s), remaining(");
    let rest = ttl.strip_prefix(&prefix).unwrap_or_else(|| panic!("{ttl:?}"));
    let (remaining, keys) = rest.split_once("s), attached keys([").unwrap();
    let remaining: i64 = remaining.parse().unwrap();
    assert!((1..=100).contains(&remaining), "{ttl:?}");
    let keys: BTreeSet<&str> = keys.strip_suffix("])\n").unwrap().split(' ').collect();
    assert_eq!(keys, BTreeSet::from(["l1", "l2"]));
    let ttl = m.json(&["lease", "timetolive", &id, "--keys"]);
    assert_eq!(ttl["id"].as_u64(), Some(lease));
    assert_eq!(ttl["granted-ttl"], 100);
    let keys: BTreeSet<String> = ttl["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| b64(k.as_str().unwrap()))
        .collect();
    assert_eq!(keys, BTreeSet::from(["l1".to_string(), "l2".to_string()]));

    assert_eq!(
        m.ok(&["lease", "keep-alive", "--once", &id]),
        format!("lease {id} keepalived with TTL(100)\n")
    );

    let list = m.ok(&["lease", "list"]);
    let mut lines = list.lines();
    assert_eq!(lines.next(), Some("found 2 leases"), "{list}");
    assert_eq!(
        lines.collect::<BTreeSet<&str>>(),
        BTreeSet::from([id.as_str(), other.as_str()])
    );

    // Revoking deletes every attached key, in one revision.
    let before = m.revision();
    assert_eq!(m.ok(&["lease", "revoke", &id]), format!("lease {id} revoked\n"));
    assert_eq!(m.revision(), before + 1);
    assert_eq!(m.ok(&["get", "l", "--prefix"]), "");
    assert_eq!(m.ok(&["get", "free"]), "free\nc\n");
    assert_eq!(
        m.ok(&["lease", "timetolive", &id]),
        format!("lease {id} already expired\n")
    );
    assert_eq!(m.json(&["lease", "timetolive", &id])["ttl"], -1);

    // A TTL below the minimum (1.5 election timeouts, 2 s by default) is raised to it; such a
    // lease expires by itself, taking its key along. (On a loaded machine it may expire
    // before the put: then grant another.)
    let mut short = String::new();
    for attempt in 1..=5 {
        let granted = m.json(&["lease", "grant", "1"]);
        assert_eq!(granted["TTL"], 2);
        short = format!("{:016x}", granted["ID"].as_u64().unwrap());
        let put = m.etcdctl(&["put", "ephemeral", "x", &format!("--lease={short}")]);
        if put.status.success() {
            break;
        }
        let stderr = fails(put, "etcdserver: requested lease not found");
        assert!(attempt < 5, "every short lease expired before the put: {stderr}");
    }
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while !m.ok(&["get", "ephemeral"]).is_empty() {
        assert!(std::time::Instant::now() < deadline, "lease {short} never expired");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        m.ok(&["lease", "timetolive", &short]),
        format!("lease {short} already expired\n")
    );
    assert_eq!(m.ok(&["lease", "list"]), format!("found 1 leases\n{other}\n"));
}

#[test]
fn member_list_and_refused_member_changes() {
    let m = Member::start("solo", &[]);
    let list = m.json(&["member", "list"]);
    let members = list["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{list}");
    let id = members[0]["ID"].as_u64().unwrap();
    assert_eq!(list["header"]["member_id"].as_u64(), Some(id));
    assert_eq!(members[0]["name"], "solo");
    assert_eq!(members[0]["peerURLs"], serde_json::json!([m.peer_url()]));
    assert_eq!(members[0]["clientURLs"], serde_json::json!([m.client_url()]));
    assert_eq!(members[0]["isLearner"], Value::Null, "not a learner (false is omitted)");

    let hex = format!("{id:x}");
    assert_eq!(
        m.ok(&["member", "list"]),
        format!("{hex}, started, solo, {}, {}, false\n", m.peer_url(), m.client_url())
    );
    let table = m.ok(&["member", "list", "-w", "table"]);
    let rows: Vec<Vec<String>> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["ID", "STATUS", "NAME", "PEER ADDRS", "CLIENT ADDRS", "IS LEARNER"],
            vec![
                hex.as_str(),
                "started",
                "solo",
                m.peer_url().as_str(),
                m.client_url().as_str(),
                "false"
            ],
        ],
        "{table}"
    );

    m.fails(
        &["member", "promote", &hex],
        "etcdserver: can only promote a learner member",
    );
    m.fails(&["member", "remove", "1234"], "etcdserver: member not found");
    m.fails(
        &["member", "update", "1234", "--peer-urls=http://127.0.0.1:1"],
        "etcdserver: member not found",
    );
    m.fails(
        &["member", "add", "twin", &format!("--peer-urls={}", m.peer_url())],
        "etcdserver: Peer URLs already exists",
    );
    // Nothing changed.
    assert_eq!(m.json(&["member", "list"])["members"], list["members"]);
}

#[test]
fn member_promote_of_an_unknown_id_is_member_not_found() {
    let m = Member::start("promote", &[]);
    m.fails(&["member", "promote", "1234"], "etcdserver: member not found");
}

#[test]
fn endpoint_status_health_and_hashkv() {
    let m = Member::start("endpoint", &[]);
    m.ok(&["put", "a", "1"]);
    // The endpoint as host:port; every other test gives etcdctl the member's URL.
    let at = m.client_addr();
    let status = json(m.etcdctl_at(&at, &["endpoint", "status", "-w", "json"]));
    assert_eq!(status.as_array().unwrap().len(), 1);
    assert_eq!(status[0]["Endpoint"], at.as_str());
    let s = &status[0]["Status"];
    let id = s["header"]["member_id"].as_u64().unwrap();
    assert_eq!(s["version"], "3.6.0");
    assert_eq!(s["leader"].as_u64(), Some(id), "a single member leads");
    assert_eq!(s["header"]["revision"], 2);
    assert!(s["raftIndex"].as_u64().unwrap() > 0, "{s}");
    assert!(s["raftTerm"].as_u64().unwrap() > 0, "{s}");
    assert!(s["raftAppliedIndex"].as_u64().unwrap() > 0, "{s}");
    let db_size = s["dbSize"].as_u64().unwrap();
    // The data held, in pages, not the 64 MiB preallocated for the data file (kube-apiserver
    // exports it as apiserver_storage_size_bytes).
    assert!(db_size > 0 && db_size < 1 << 20 && db_size.is_multiple_of(4096), "{s}");
    assert_eq!(s["isLearner"], Value::Null, "{s}");
    assert_eq!(s["errors"], Value::Null, "{s}");

    let simple = ok(m.etcdctl_at(&at, &["endpoint", "status"]));
    let fields: Vec<&str> = simple.trim_end().split(", ").collect();
    assert_eq!(fields[..3], [at.as_str(), &format!("{id:x}"), "3.6.0"], "{simple}");
    assert_eq!(fields[4..6], ["true", "false"], "leader, not a learner: {simple}");

    // etcdctl 3.4 prints the health of each endpoint on stderr.
    let health = m.etcdctl(&["endpoint", "health"]);
    assert!(health.status.success());
    let health = String::from_utf8(health.stderr).unwrap();
    let expected = format!(
        "{} is healthy: successfully committed proposal: took = ",
        m.client_url()
    );
    assert!(health.starts_with(&expected), "{health}");
    let health = m.json(&["endpoint", "health"]);
    assert_eq!(health[0]["endpoint"], m.client_url().as_str());
    assert_eq!(health[0]["health"], true);

    let hash = |extra: &[&str]| -> u64 {
        let mut args = vec!["endpoint", "hashkv", "-w", "json"];
        args.extend_from_slice(extra);
        let out = json(m.etcdctl_at(&at, &args));
        out[0]["HashKV"]["hash"].as_u64().unwrap_or(0)
    };
    let first = hash(&[]);
    assert_eq!(hash(&[]), first, "nothing changed");
    m.ok(&["get", "a"]);
    assert_eq!(hash(&[]), first, "reads change nothing");
    m.ok(&["put", "b", "2"]);
    let second = hash(&[]);
    assert_ne!(second, first, "a write changes the hash");
    assert_eq!(hash(&["--rev=2"]), first, "the hash at revision 2 is what it was then");
    fails(
        m.etcdctl_at(&at, &["endpoint", "hashkv", "--rev=4"]),
        "etcdserver: mvcc: required revision is a future revision",
    );
}

#[test]
fn hashkv_before_any_compaction_reports_compact_revision_minus_one() {
    let m = Member::start("hashkv", &[]);
    m.ok(&["put", "a", "1"]);
    let hash = json(m.etcdctl(&["endpoint", "hashkv", "-w", "json"]));
    assert_eq!(hash[0]["HashKV"]["compact_revision"], -1, "{hash}");
}

#[test]
fn alarm_defrag_and_move_leader() {
    let m = Member::start("maintenance", &[]);
    m.ok(&["put", "a", "1"]);
    m.ok(&["del", "a"]);
    m.ok(&["put", "b", "2"]);
    assert_eq!(m.ok(&["alarm", "list"]), "", "no alarm raised");
    assert_eq!(m.ok(&["alarm", "disarm"]), "");
    assert_eq!(m.ok(&["alarm", "list"]), "");

    let at = m.client_url();
    assert_eq!(
        ok(m.etcdctl_at(&at, &["defrag"])),
        format!("Finished defragmenting etcd member[{at}]\n")
    );
    assert_eq!(m.ok(&["get", "", "--prefix"]), "b\n2\n", "defragmenting keeps the data");
    assert_eq!(m.ok(&["get", "a", "--rev=2"]), "a\n1\n", "and the history");
    assert_eq!(m.revision(), 4);

    fails(
        m.etcdctl_at(&at, &["move-leader", "1234"]),
        "etcdserver: bad leader transferee",
    );
    assert_eq!(m.json(&["endpoint", "health"])[0]["health"], true);
}

/// etcdctl 3.4 sends a URL endpoint as the HTTP/2 `:authority` of its per-endpoint commands
/// (`http://127.0.0.1:port`), which is not a URI authority; Go's server accepts it, and so
/// must cairn's (server/src/transport/http2/authority.rs).
#[test]
fn endpoint_commands_accept_an_endpoint_url() {
    let m = Member::start("url", &[]);
    let url = m.client_url();
    let status = json(m.etcdctl_at(&url, &["endpoint", "status", "-w", "json"]));
    assert_eq!(status[0]["Status"]["version"], "3.6.0");
    let hash = json(m.etcdctl_at(&url, &["endpoint", "hashkv", "-w", "json"]));
    assert_eq!(hash[0]["Endpoint"], url.as_str());
    assert_eq!(
        ok(m.etcdctl_at(&url, &["defrag"])),
        format!("Finished defragmenting etcd member[{url}]\n")
    );
    fails(
        m.etcdctl_at(&url, &["move-leader", "1234"]),
        "etcdserver: bad leader transferee",
    );
}

#[test]
fn snapshot_save_status_and_restore_into_a_new_member() {
    let m = Member::start("origin", &[]);
    for (key, value) in [("a", "1"), ("a", "2"), ("b", "1"), ("c", "3")] {
        m.ok(&["put", key, value]);
    }
    m.ok(&["del", "b"]);
    let before = m.json(&["get", "", "--prefix"]);
    assert_eq!(before["header"]["revision"], 6);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.db");
    let file_arg = file.to_str().unwrap();
    assert_eq!(
        m.ok(&["snapshot", "save", file_arg]),
        format!("Snapshot saved at {file_arg}\n")
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().len() % 4096,
        32,
        "a bbolt database of 4 KiB pages, as etcd sends it, then its SHA-256"
    );

    let status = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["snapshot", "status", file_arg, "-w", "json"])
        .output()
        .unwrap();
    let status = json(status);
    assert_eq!(status["revision"], 6);
    // As etcdutl 3.6 and later: the live keys, and the database's size (the trailer aside).
    assert_eq!(status["totalKey"], 2, "the live keys: a and c");
    assert_eq!(
        status["totalSize"].as_u64(),
        Some(std::fs::metadata(&file).unwrap().len() - 32)
    );

    let restore = |data_dir: &std::path::Path, peer_url: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["snapshot", "restore", file_arg, "--data-dir"])
            .arg(data_dir)
            .args(["--name", "restored"])
            .args(["--initial-cluster", &format!("restored={peer_url}")])
            .args(["--initial-advertise-peer-urls", peer_url])
            .output()
            .unwrap();
        let out = ok(out);
        assert_eq!(out, format!("restored snapshot into {}\n", data_dir.display()));
    };
    let r = Member::start_prepared("restored", &[], restore);
    let after = r.json(&["get", "", "--prefix"]);
    assert_eq!(after["header"]["revision"], 6);
    assert_eq!(kv_list(&after), kv_list(&before));
    assert_eq!(
        kv_list(&after),
        vec![kv("a", "2", Revisions(2, 3, 2)), kv("c", "3", Revisions(5, 5, 1))]
    );

    // A new cluster of one: this member, with the name and peer URL it was restored with.
    let list = r.json(&["member", "list"]);
    assert_eq!(list["members"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["members"][0]["name"], "restored");
    assert_eq!(list["members"][0]["peerURLs"], serde_json::json!([r.peer_url()]));
    assert_ne!(list["header"]["cluster_id"], before["header"]["cluster_id"]);
    // Revisions go on from the snapshot's.
    assert_eq!(r.json(&["put", "d", "4"])["header"]["revision"], 7);
}

#[test]
fn refused_requests_leave_the_member_serving() {
    let mut m = Member::start("limits", &["--max-request-bytes", "4096", "--max-txn-ops", "4"]);
    m.fails(&["put", "", "v"], "etcdserver: key is not provided");
    let big = "x".repeat(10 * 1024);
    m.fails(&["put", "big", &big], "etcdserver: request is too large");
    m.ok(&["put", "small", &"x".repeat(1024)]);

    let five = "\nput t1 1\nput t2 2\nput t3 3\nput t4 4\nput t5 5\n\n\n";
    fails(
        m.etcdctl_stdin(&["txn"], five),
        "etcdserver: too many operations in txn request",
    );
    let four = "\nput t1 1\nput t2 2\nput t3 3\nput t4 4\n\n\n";
    assert_eq!(ok(m.etcdctl_stdin(&["txn"], four)), "SUCCESS\n\nOK\n\nOK\n\nOK\n\nOK\n");
    fails(
        m.etcdctl_stdin(&["txn"], "\nput d 1\nput d 2\n\n\n"),
        "etcdserver: duplicate key given in txn request",
    );

    // etcdctl reports a keep-alive answered with TTL 0 as the lease not found.
    m.fails(
        &["lease", "keep-alive", "--once", "1234"],
        "etcdserver: requested lease not found",
    );
    m.fails(&["lease", "revoke", "1234"], "etcdserver: requested lease not found");
    assert_eq!(
        m.ok(&["lease", "timetolive", "1234"]),
        "lease 0000000000001234 already expired\n"
    );
    m.fails(
        &["put", "k", "v", "--lease=1234"],
        "etcdserver: requested lease not found",
    );

    // Only the two accepted writes happened.
    assert_eq!(m.revision(), 3);
    assert_eq!(
        m.ok(&["get", "t", "--prefix", "--keys-only"]),
        "t1\n\nt2\n\nt3\n\nt4\n\n"
    );
    assert!(m.is_running());
    assert_eq!(m.get("/health"), (200, r#"{"health":"true","reason":""}"#.to_string()));
    assert_eq!(
        m.get("/no-such-path").0,
        404,
        "an unknown path is not found, as with etcd"
    );
    assert_eq!(m.ok(&["put", "after", "ok"]), "OK\n");
}

#[test]
fn http_health_version_and_metrics() {
    let m = Member::start("http", &[]);
    assert_eq!(m.get("/health"), (200, r#"{"health":"true","reason":""}"#.to_string()));
    let (code, body) = m.get("/livez");
    assert_eq!((code, body.trim_end()), (200, "ok"));
    let (code, body) = m.get("/readyz");
    assert_eq!((code, body.trim_end()), (200, "ok"));
    // etcd 3.6's named checks, one line each with ?verbose, any of them excluded by name.
    assert_eq!(
        m.get("/readyz?verbose"),
        (
            200,
            "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n[+]non_learner ok\nok\n".into()
        )
    );
    assert_eq!(
        m.get("/readyz?exclude=linearizable_read&exclude=non_learner&exclude=no_such_check&verbose"),
        (200, "[+]data_corruption ok\n[+]serializable_read ok\nok\n".into())
    );
    assert_eq!(m.get("/livez?verbose"), (200, "[+]serializable_read ok\nok\n".into()));
    assert_eq!(
        m.get("/readyz/non_learner?verbose"),
        (200, "[+]non_learner ok\nok\n".into())
    );
    assert_eq!(m.get("/readyz/linearizable_read"), (200, "ok\n".into()));
    assert_eq!(m.get("/readyz/no_such_check").0, 404);

    let (code, body) = m.get("/version");
    assert_eq!(code, 200);
    let version: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(version["etcdserver"], "3.6.0", "{body}");
    assert!(version["etcdcluster"].is_string(), "{body}");

    m.ok(&["put", "a", "1"]);
    let (code, metrics) = m.get("/metrics");
    assert_eq!(code, 200);
    assert!(metrics.lines().any(|l| l == "etcd_server_has_leader 1"), "{metrics}");
    // gRPC calls started, by method, under etcd's (go-grpc-prometheus) name.
    let puts = metrics.lines().find(|l| {
        l.starts_with("grpc_server_started_total{")
            && l.contains(r#"grpc_method="Put""#)
            && l.contains(r#"grpc_service="etcdserverpb.KV""#)
            && l.contains(r#"grpc_type="unary""#)
    });
    assert_eq!(puts.and_then(|l| l.rsplit(' ').next()), Some("1"), "{metrics}");
    let size = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_mvcc_db_total_size_in_bytes "))
        .unwrap_or_else(|| panic!("no etcd_mvcc_db_total_size_in_bytes in:\n{metrics}"));
    assert!(size.parse::<f64>().unwrap() > 0.0, "{size}");
}

#[test]
fn sigterm_stops_cleanly_and_a_restart_keeps_every_key() {
    let mut m = Member::start("graceful", &[]);
    for i in 0..20 {
        m.ok(&["put", &format!("key{i:02}"), &format!("value{i}")]);
    }
    m.ok(&["del", "key05"]);
    let id = granted_lease(&m.ok(&["lease", "grant", "600"]), 600);
    m.ok(&["put", "leased", "x", &format!("--lease={id}")]);
    let before = m.json(&["get", "", "--prefix"]);
    assert_eq!(before["header"]["revision"], 23);

    let status = m.stop();
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop: {status}");

    m.restart();
    let after = m.json(&["get", "", "--prefix"]);
    assert_eq!(after["header"]["revision"], 23);
    assert_eq!(kv_list(&after), kv_list(&before));
    assert_eq!(after["count"], 20);
    assert_eq!(m.ok(&["get", "key05", "--rev=21"]), "key05\nvalue5\n", "history kept");
    let list = m.ok(&["lease", "list"]);
    assert_eq!(list, format!("found 1 leases\n{id}\n"), "leases kept");
    assert_eq!(m.json(&["put", "next", "1"])["header"]["revision"], 24);
}
