//! raft-rs logs through slog; this drain hands each record to `tracing`, the engine's logger,
//! under the target `raft` at the matching level: the message, then the record's key-values
//! (`raft_id`, the term, ...) as `key=value` text. Nothing of slog's own bookkeeping (its
//! target, module path, source file and line in the cargo registry) comes along.

use std::fmt::Write as _;

/// A slog drain that logs into `tracing`.
pub(crate) struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        // Skip the formatting for a level nobody listens to.
        let level = match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::Level::ERROR,
            slog::Level::Warning => tracing::Level::WARN,
            slog::Level::Info => tracing::Level::INFO,
            slog::Level::Debug => tracing::Level::DEBUG,
            slog::Level::Trace => tracing::Level::TRACE,
        };
        if level > tracing::level_filters::LevelFilter::current() {
            return Ok(());
        }
        let mut line = Text(String::new());
        let _ = write!(line.0, "{}", record.msg());
        let _ = slog::KV::serialize(&record.kv(), record, &mut line);
        let _ = slog::KV::serialize(values, record, &mut line);
        let text = line.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{text}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{text}"),
            slog::Level::Info => tracing::info!(target: "raft", "{text}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{text}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{text}"),
        }
        Ok(())
    }
}

/// Key-values appended to a line as ` key=value`.
struct Text(String);

impl slog::Serializer for Text {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a subscriber writes, kept.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn raft_records_log_under_raft_at_their_level_without_slogs_bookkeeping() {
        let kept = Kept::default();
        let writer = kept.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let logger = slog::Logger::root(TracingDrain, slog::o!("raft_id" => 7u64));
            slog::info!(logger, "became leader at term {}", 3; "term" => 3u64);
            slog::warn!(logger, "a warning");
            slog::debug!(logger, "below the level");
        });
        let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains(" INFO raft: became leader at term 3 term=3 raft_id=7"),
            "{text}"
        );
        assert!(lines[1].contains(" WARN raft: a warning raft_id=7"), "{text}");
        assert!(!text.contains("slog"), "{text}");
    }
}
