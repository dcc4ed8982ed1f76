//! Logging as etcd logs: `--log-level`, `--log-outputs`, `--log-format`, and the rotation
//! of a log file (`--enable-log-rotation`, in [`rotation`]). The default format is etcd's
//! (zap's) JSON lines — `level`, `ts`, `caller`, `msg`, then the event's fields — so that
//! whatever reads etcd's logs reads cairn's. `console` is the human-readable format.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

mod rotation;

use crate::config::{LogFormat, LogLevel, Rotation, JOURNAL};

/// What the flags say of the logs: their level and format, where they go, and how a log file
/// rotates.
#[derive(Clone, Copy, Debug)]
pub struct Logs<'a> {
    /// `--log-level`.
    pub level: LogLevel,
    /// `--log-format`.
    pub format: LogFormat,
    /// Each of stderr, stdout, default (stderr), `systemd/journal`, or a file's path.
    pub outputs: &'a [String],
    /// When given (the flags allow it with one file alone).
    pub rotation: Option<&'a Rotation>,
}

/// Logs at `logs.level` in `logs.format` into every one of its outputs: stderr, stdout,
/// default (stderr), `systemd/journal` (journald's native protocol, on its socket), or files
/// appended to, each rotated as `logs.rotation` says when given. `RUST_LOG`, when set, refines
/// the level per module. With `export`, spans also go to the distributed-tracing exporter,
/// whatever the level (each output and the exporter filter what they take on their own).
pub fn init(logs: &Logs<'_>, export: Option<&crate::run::tracing_export::Exporter>) -> Result<(), String> {
    let Logs {
        level,
        format,
        outputs,
        rotation,
    } = *logs;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let default = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error | LogLevel::Panic | LogLevel::Fatal => "error",
    };
    let mut outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    outputs.sort_unstable();
    outputs.dedup();
    let mut files = false;
    let mut journal = None;
    let mut writer: Option<BoxMakeWriter> = None;
    for output in outputs {
        let next = match output {
            "default" | "stderr" => BoxMakeWriter::new(std::io::stderr),
            "stdout" => BoxMakeWriter::new(std::io::stdout),
            JOURNAL => {
                // etcd refuses to start when journald cannot be reached, rather than log
                // nowhere.
                let layer = tracing_journald::layer()
                    .map_err(|e| format!("--log-outputs: cannot reach journald ({JOURNAL_SOCKET}): {e}"))?
                    .with_syslog_identifier("cairn".into())
                    // syslog's levels as zap's journal writer gives them (info is 6, not 5).
                    .with_priority_mappings(tracing_journald::PriorityMappings {
                        info: tracing_journald::Priority::Informational,
                        debug: tracing_journald::Priority::Debug,
                        ..tracing_journald::PriorityMappings::new()
                    });
                journal = Some(layer);
                continue;
            }
            path => {
                let opened = match rotation {
                    Some(rotation) => rotation::RotatingFile::open(std::path::Path::new(path), rotation.clone())
                        .map(|file| BoxMakeWriter::new(std::sync::Arc::new(file))),
                    None => std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map(|file| BoxMakeWriter::new(std::sync::Arc::new(file))),
                };
                files = true;
                opened.map_err(|e| format!("--log-outputs: cannot open {path}: {e}"))?
            }
        };
        writer = Some(match writer {
            None => next,
            Some(before) => BoxMakeWriter::new(before.and(next)),
        });
    }
    let lines = writer.map(|writer| {
        let layer = tracing_subscriber::fmt::layer().with_writer(writer);
        match format {
            LogFormat::Json => layer.with_ansi(false).event_format(ZapJson).boxed(),
            // Colours only on a terminal (not in a file, nor in stderr redirected to one),
            // and not with NO_COLOR set.
            LogFormat::Console => {
                use std::io::IsTerminal;
                let colours = !files && std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                layer.with_ansi(colours).boxed()
            }
        }
    });
    tracing_subscriber::registry()
        .with(lines.map(|lines| lines.with_filter(logged(default))))
        .with(journal.map(|journal| journal.with_filter(logged(default))))
        .with(export.map(|export| export.layer()))
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))
}

/// What an output logs: `default`'s level, or as `RUST_LOG` says; never a gRPC call's span,
/// which is for the exporter alone (etcd's lines have no such field).
fn logged<S>(default: &str) -> impl tracing_subscriber::layer::Filter<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter};
    // The filter that leaves the call spans out says it takes every level, so the pair keeps
    // the EnvFilter's level hint. Without a hint, the registry made and entered every trace
    // span of h2's, on every poll, whatever the level.
    let no_call_spans =
        filter_fn(|meta| !crate::run::tracing_export::is_call_span(meta)).with_max_level_hint(LevelFilter::TRACE);
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        .and(no_call_spans)
}
/// Where journald listens for its native protocol.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// One JSON object per line, keyed as zap keys etcd's lines: `level` (lower case), `ts`
/// (RFC 3339, UTC), `caller` (source file and line), `msg`, then the fields of the event
/// and of the spans it is in (a span's fields under its name).
#[derive(Debug, Clone, Copy)]
pub struct ZapJson;

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut ts = String::new();
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        let mut fields = Fields::default();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(formatted) = extensions.get::<FormattedFields<N>>() {
                    if !formatted.is_empty() {
                        fields
                            .rest
                            .push((span.name().to_string(), formatted.fields.as_str().into()));
                    }
                }
            }
        }
        event.record(&mut fields);
        let text = |v: &str| serde_json::Value::from(v).to_string();
        write!(
            writer,
            "{{\"level\":\"{}\",\"ts\":{}",
            level_name(*meta.level()),
            text(&ts)
        )?;
        if let (Some(file), Some(at)) = (meta.file(), meta.line()) {
            write!(writer, ",\"caller\":{}", text(&format!("{}:{at}", short_path(file))))?;
        }
        write!(writer, ",\"msg\":{}", text(&fields.msg))?;
        for (name, value) in &fields.rest {
            write!(writer, ",{}:{value}", text(name))?;
        }
        writeln!(writer, "}}")
    }
}

/// zap's level names; tracing's TRACE, which etcd has not, logs as debug.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// A source path from the crate's folder on (`server/src/server.rs`), as zap's short caller
/// is a path from the package's folder; a dependency's path keeps only what follows `src`'s
/// parent, not the cargo registry's location.
fn short_path(file: &str) -> &str {
    match file.rfind("/src/") {
        Some(at) => {
            let crate_start = file.get(..at).and_then(|p| p.rfind('/')).map_or(0, |s| s + 1);
            file.get(crate_start..).unwrap_or(file)
        }
        None => file,
    }
}

/// An event's fields: its message, and the others in order (named in zap's kebab case),
/// numbers and booleans as JSON's, the rest as text.
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(String, serde_json::Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.rest.push((field.name().replace('_', "-"), value));
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.msg);
        } else {
            self.put(field, value.into());
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.msg = format!("{value:?}");
        } else {
            self.put(field, format!("{value:?}").into());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_zaps_json_with_the_fields_and_spans_of_the_event() {
        let out = Captured::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .event_format(ZapJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let _span = tracing::info_span!("member", id = "8e9e05c52164694d").entered();
            tracing::warn!(took_ms = 130_u64, slow = true, key = %"a\"b", "apply request took too long");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "warn");
        assert_eq!(line["msg"], "apply request took too long");
        assert_eq!(line["took-ms"], 130);
        assert_eq!(line["slow"], true);
        assert_eq!(line["key"], "a\"b");
        assert_eq!(line["member"], "id=\"8e9e05c52164694d\"");
        let caller = line["caller"].as_str().unwrap();
        assert!(caller.starts_with("server/src/run/logging/mod.rs:"), "{caller}");
        let ts = line["ts"].as_str().unwrap();
        assert!(ts.starts_with("20") && ts.ends_with('Z'), "{ts}");
        // The keys come in zap's order.
        let keys: Vec<&str> = text
            .split("\":")
            .take(4)
            .map(|k| k.rsplit('"').next().unwrap())
            .collect();
        assert_eq!(keys, ["level", "ts", "caller", "msg"]);
    }

    #[test]
    fn a_path_is_kept_from_its_crates_folder() {
        assert_eq!(short_path("server/src/server.rs"), "server/src/server.rs");
        assert_eq!(
            short_path("/root/.cargo/registry/src/index-1/raft-0.7.0/src/raft.rs"),
            "raft-0.7.0/src/raft.rs"
        );
        assert_eq!(short_path("main.rs"), "main.rs");
    }
}
