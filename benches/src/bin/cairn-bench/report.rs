//! Reports: a table or JSON, with latency percentiles per phase.

use std::time::Duration;

use cairn_benches::{per_sec, rounded, us_cell, Context, Failure, Percentiles};
use hdrhistogram::Histogram;
use serde_json::{Map, Value};

use crate::drive::*;
use crate::*;

/// Latency percentiles with p90, the maximum and the mean, in microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    pub(crate) p: Percentiles,
    pub(crate) p90: Option<u64>,
    pub(crate) max: Option<u64>,
    pub(crate) mean: Option<f64>,
}

impl Summary {
    pub(crate) fn of(h: &Histogram<u64>) -> Summary {
        let some = !h.is_empty();
        Summary {
            p: Percentiles::of(h),
            p90: some.then(|| h.value_at_quantile(0.9)),
            max: some.then(|| h.max()),
            mean: some.then(|| h.mean()),
        }
    }
}

/// One measured line: a phase's tally over its time.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) tally: Tally,
    pub(crate) elapsed: Duration,
}

/// A run's outcome: its rows (the first is the workload's own), parameters, and what else
/// it found.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) workload: &'static str,
    pub(crate) endpoints: Vec<String>,
    pub(crate) conns: usize,
    pub(crate) clients: usize,
    pub(crate) params: Map<String, Value>,
    pub(crate) rows: Vec<Row>,
    pub(crate) extras: Map<String, Value>,
    pub(crate) notes: Vec<String>,
    /// Set when the run must end with a failure after its report is printed.
    pub(crate) failure: Option<String>,
    /// What `--latency-log` writes, when not the first row's answers.
    pub(crate) log: Option<AnswerLog>,
}

impl Report {
    pub(crate) fn new(workload: &'static str, g: &Global) -> Report {
        Report {
            workload,
            endpoints: g.endpoints.clone(),
            conns: g.conns,
            clients: g.clients,
            params: Map::new(),
            rows: Vec::new(),
            extras: Map::new(),
            notes: Vec::new(),
            failure: None,
            log: None,
        }
    }

    pub(crate) fn param(&mut self, k: &str, v: impl Into<Value>) {
        self.params.insert(k.to_string(), v.into());
    }

    pub(crate) fn extra(&mut self, k: &str, v: impl Into<Value>) {
        self.extras.insert(k.to_string(), v.into());
    }

    pub(crate) fn note(&mut self, s: String) {
        self.notes.push(s);
    }

    pub(crate) fn row(&mut self, name: &'static str, tally: Tally, elapsed: Duration) {
        self.rows.push(Row { name, tally, elapsed });
    }

    /// Marks the run failed if its first row has nothing that succeeded.
    pub(crate) fn require_success(mut self) -> Report {
        if let Some(first) = self.rows.first() {
            if first.tally.ok == 0 && self.failure.is_none() {
                self.failure = Some(format!("no {} succeeded{}", first.name, first.tally.errors_text()));
            }
        }
        self
    }

    /// Prints the report, and writes the latency log first if asked to.
    pub(crate) fn print(&self, args: &Args) -> Result<(), Failure> {
        if let Some(path) = &args.global.latency_log {
            let first = self.rows.first().map(|r| &r.tally.log);
            let empty = AnswerLog::default();
            let log = self.log.as_ref().or(first).unwrap_or(&empty);
            log.write(path, self.workload)?;
        }
        if args.global.json {
            let json = serde_json::to_string_pretty(&self.to_json()).context(|| "encode JSON".to_string())?;
            println!("{json}");
        } else {
            self.print_table();
        }
        Ok(())
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("workload".into(), Value::from(self.workload));
        m.insert("endpoints".into(), Value::from(self.endpoints.clone()));
        m.insert("conns".into(), Value::from(self.conns));
        m.insert("clients".into(), Value::from(self.clients));
        m.insert("params".into(), Value::Object(self.params.clone()));
        for (i, row) in self.rows.iter().enumerate() {
            // The workload's own row unprefixed; the others prefixed with their name.
            let p = if i == 0 {
                String::new()
            } else {
                format!("{}_", row.name.replace('-', "_"))
            };
            let t = &row.tally;
            let s = Summary::of(&t.latency);
            m.insert(format!("{p}ok"), Value::from(t.ok));
            m.insert(format!("{p}failed"), Value::from(t.failed()));
            m.insert(
                format!("{p}elapsed_s"),
                Value::from(rounded(row.elapsed.as_secs_f64(), 3)),
            );
            m.insert(
                format!("{p}ops_per_sec"),
                Value::from(rounded(per_sec(t.ok, row.elapsed), 2)),
            );
            m.insert(format!("{p}p50_us"), Value::from(s.p.p50));
            m.insert(format!("{p}p90_us"), Value::from(s.p90));
            m.insert(format!("{p}p99_us"), Value::from(s.p.p99));
            m.insert(format!("{p}p999_us"), Value::from(s.p.p999));
            m.insert(format!("{p}max_us"), Value::from(s.max));
            m.insert(
                format!("{p}mean_us"),
                s.mean.map_or(Value::Null, |v| Value::from(rounded(v, 1))),
            );
            let errors: Map<String, Value> = t
                .errors
                .iter()
                .map(|(code, e)| {
                    let mut o = Map::new();
                    o.insert("count".into(), Value::from(e.count));
                    o.insert("example".into(), Value::from(e.example.clone()));
                    (code.clone(), Value::Object(o))
                })
                .collect();
            m.insert(format!("{p}errors"), Value::Object(errors));
        }
        for (k, v) in &self.extras {
            m.insert(k.clone(), v.clone());
        }
        if let Some(f) = &self.failure {
            m.insert("failure".into(), Value::from(f.clone()));
        }
        Value::Object(m)
    }

    pub(crate) fn print_table(&self) {
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{TOOL} {} against {} ({} conns, {} clients): {}",
            self.workload,
            self.endpoints.join(","),
            self.conns,
            self.clients,
            params.join(" ")
        );
        println!(
            "{:<15} {:>9} {:>7} {:>8} {:>10} {:>8} {:>8} {:>8} {:>9} {:>8}",
            "", "ok", "failed", "seconds", "per sec", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us"
        );
        for row in &self.rows {
            let t = &row.tally;
            let s = Summary::of(&t.latency);
            println!(
                "{:<15} {:>9} {:>7} {:>8.2} {:>10.1} {:>8} {:>8} {:>8} {:>9} {:>8}",
                row.name,
                t.ok,
                t.failed(),
                row.elapsed.as_secs_f64(),
                per_sec(t.ok, row.elapsed),
                us_cell(s.p.p50),
                us_cell(s.p90),
                us_cell(s.p.p99),
                us_cell(s.p.p999),
                us_cell(s.max),
            );
        }
        for row in &self.rows {
            for (code, e) in &row.tally.errors {
                println!("errors ({}): {code} x{}, e.g. {:?}", row.name, e.count, e.example);
            }
        }
        for n in &self.notes {
            println!("{n}");
        }
    }
}
