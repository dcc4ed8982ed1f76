//! How the load tools print what they measured: ratios to a baseline, and the cells of their
//! tables and JSON objects. Nothing on disk.

use serde_json::Value;

/// `num / den`, or `None` when the denominator is zero.
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}

/// `v` rounded to `decimals` places, for JSON that reads well.
pub fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// A table cell for a latency in microseconds: the number, or `-` when there is none.
pub fn us_cell(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// A table cell for a ratio: `1.23x`, or `-` when there is none.
pub fn times_cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}x"))
}

/// A JSON value for a ratio: rounded to 4 places, or `null` when there is none.
pub fn ratio_json(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| Value::from(rounded(v, 4)))
}
