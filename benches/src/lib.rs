//! Benchmarks live in `src/bin/` (load tools) and `benches/` (criterion).
