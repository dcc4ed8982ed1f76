//! The key-value workloads: put, range, txn-put and delete (and the load before a range).

use std::time::Duration;

use bytes::Bytes;
use cairn_benches::{payload, per_sec, ratio, rounded, Failure};
use serde_json::Value;

use crate::drive::*;
use crate::keys::*;
use crate::report::*;
use crate::request::*;
use crate::*;

/// `--total` and `--seconds` as a run's limits; `default_total` when neither is given.
pub(crate) fn limits(g: &Global, default_total: u64) -> (Option<u64>, Option<Duration>) {
    let seconds = g.seconds.map(Duration::from_secs_f64);
    match (g.total, seconds) {
        (None, None) => (Some(default_total), None),
        (total, seconds) => (total, seconds),
    }
}

pub(crate) async fn put(g: &Global, b: &Bench, a: &PutArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(1);
    let keys = Keys::new(&g.key_prefix, a.keys.key_size, space, a.keys.sequential_keys)?;
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::Put {
        keys,
        value: Bytes::from(payload(a.val_size)),
        stamp: None,
    };
    let (tally, elapsed) = b.drive_op("put", &run, g.clients, op).await?;
    let mut report = Report::new("put", g);
    report.param("key_size", a.keys.key_size);
    report.param("val_size", a.val_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.row("put", tally, elapsed);
    Ok(report.require_success())
}

pub(crate) async fn range(g: &Global, b: &Bench, a: &RangeArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(a.load.max(1));
    let keys = Keys::new(
        &g.key_prefix,
        a.keys.key_size,
        space.max(a.load),
        a.keys.sequential_keys,
    )?;
    let mut report = Report::new("range", g);
    if a.load > 0 {
        let loaded = Load {
            keys: &keys,
            count: a.load,
            val_size: a.val_size,
        };
        load(g, b, loaded, &mut report).await?;
    }
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::Range {
        keys: Keys { space, ..keys },
        whole_prefix: a.prefix,
        paged: a.paged,
        limit: i64::from(a.limit),
        keys_only: a.keys_only,
        count_only: a.count_only,
        serializable: a.consistency == Consistency::S,
    };
    let (tally, elapsed) = b.drive_op("range", &run, g.clients, op).await?;
    report.param("key_size", a.keys.key_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.param("consistency", if a.consistency == Consistency::S { "s" } else { "l" });
    report.param("prefix", a.prefix);
    report.param("limit", a.limit);
    report.param("paged", a.paged);
    report.param("keys_only", a.keys_only);
    report.param("count_only", a.count_only);
    report.param("load", a.load);
    let per_read = ratio(tally.hits as f64, tally.ok as f64);
    report.extra(
        "kvs_per_read",
        per_read.map_or(Value::Null, |v| Value::from(rounded(v, 2))),
    );
    report.note(format!(
        "keys returned (or counted, --count-only) per read: {}",
        per_read.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
    ));
    report.row("range", tally, elapsed);
    Ok(report.require_success())
}

pub(crate) async fn txn_put(g: &Global, b: &Bench, a: &TxnPutArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(1);
    let keys = Keys::new(&g.key_prefix, a.keys.key_size, space, a.keys.sequential_keys)?;
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::TxnPut {
        keys,
        value: Bytes::from(payload(a.val_size)),
        compare: a.compare,
    };
    let (tally, elapsed) = b.drive_op("txn-put", &run, g.clients, op).await?;
    let mut report = Report::new("txn-put", g);
    report.param("key_size", a.keys.key_size);
    report.param("val_size", a.val_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.param(
        "compare",
        if a.compare == TxnCompare::Absent {
            "absent"
        } else {
            "present"
        },
    );
    report.extra("txn_succeeded", tally.hits);
    report.note(format!(
        "txns whose compare held (and put): {} of {}",
        tally.hits, tally.ok
    ));
    report.row("txn-put", tally, elapsed);
    Ok(report.require_success())
}

pub(crate) async fn delete(g: &Global, b: &Bench, a: &DeleteArgs) -> Result<Report, Failure> {
    let keys = Keys::new(&g.key_prefix, a.key_size, a.keys, true)?;
    let mut report = Report::new("delete", g);
    if !a.skip_load {
        let loaded = Load {
            keys: &keys,
            count: a.keys,
            val_size: a.val_size,
        };
        load(g, b, loaded, &mut report).await?;
    }
    let (total, seconds) = limits(g, a.keys);
    let run = Run::start(Some(total.unwrap_or(a.keys).min(a.keys)), seconds, g.rate);
    let (tally, elapsed) = b.drive_op("delete", &run, g.clients, Op::Delete { keys }).await?;
    report.param("keys", a.keys);
    report.param("key_size", a.key_size);
    report.param("val_size", a.val_size);
    report.param("skip_load", a.skip_load);
    report.extra("deleted", tally.hits);
    report.note(format!(
        "keys deleted: {} by {} successful deletes",
        tally.hits, tally.ok
    ));
    report.row("delete", tally, elapsed);
    Ok(report.require_success())
}

/// What [`load`] puts: keys 0 to `count`-1 of `keys`, with values of `val_size` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) count: u64,
    pub(crate) val_size: usize,
}

/// Puts the keys of `loaded` with all clients, unmeasured, before a workload reads or deletes
/// them. A load where some puts failed goes on, with a note.
pub(crate) async fn load(g: &Global, b: &Bench, loaded: Load<'_>, report: &mut Report) -> Result<(), Failure> {
    let Load { keys, count, val_size } = loaded;
    eprintln!("{TOOL}: loading {count} keys ...");
    let run = Run::start(Some(count), None, None);
    let op = Op::Put {
        keys: Keys {
            space: count,
            sequential: true,
            ..keys.clone()
        },
        value: Bytes::from(payload(val_size)),
        stamp: None,
    };
    let (tally, elapsed) = b.drive_op("load", &run, g.clients, op).await?;
    if tally.ok == 0 {
        return Err(Failure(format!(
            "loading keys: no put succeeded{}",
            tally.errors_text()
        )));
    }
    report.extra("load_s", rounded(elapsed.as_secs_f64(), 3));
    report.note(format!(
        "loaded {} keys in {:.2} s ({:.0}/s), {} puts failed{}",
        tally.ok,
        elapsed.as_secs_f64(),
        per_sec(tally.ok, elapsed),
        tally.failed(),
        tally.errors_text()
    ));
    Ok(())
}
