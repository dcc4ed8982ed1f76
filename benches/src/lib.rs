//! Benchmarks live in `src/bin/` (load tools) and `benches/` (criterion).
//!
//! This library holds what the load tools share: failing and cleaning up (`tool`), measuring
//! latency and rates (`measure`), and printing the results (`report`).

mod measure;
mod report;
mod tool;

pub use measure::{
    histogram, merge, micros, payload, per_sec, preallocate, sleep_unless_stopped, Percentiles, WorkerResult,
    MEASURING, STOPPED, WARMING,
};
pub use report::{ratio, ratio_json, rounded, times_cell, us_cell};
pub use tool::{dedup_in_order, exit_code, parse_count, parse_seconds, Context, Failure, WorkDir, MAX_SECONDS};
