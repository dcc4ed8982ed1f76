//! The `cairn` binary: an etcd-compatible member (`cairn [flags]`), and the offline snapshot
//! tools (`cairn snapshot restore|status`). See `cairn --help`.

use std::process::ExitCode;

use cairn_server::flags::{Cli, Command, LogLevel, SnapshotCommand};
use clap::Parser;

/// Logs at `level` into every one of `outputs` (etcd's `--log-outputs`: stderr, stdout,
/// default for stderr, or files appended to).
fn init_logging(level: LogLevel, outputs: &[String]) -> Result<(), String> {
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let default = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error | LogLevel::Panic | LogLevel::Fatal => "error",
    };
    // RUST_LOG, when set, refines the level (per module).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let mut outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    outputs.sort_unstable();
    outputs.dedup();
    let mut files = false;
    let mut writer: Option<BoxMakeWriter> = None;
    for output in outputs {
        let next = match output {
            "default" | "stderr" => BoxMakeWriter::new(std::io::stderr),
            "stdout" => BoxMakeWriter::new(std::io::stdout),
            path => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("--log-outputs: cannot open {path}: {e}"))?;
                files = true;
                BoxMakeWriter::new(std::sync::Arc::new(file))
            }
        };
        writer = Some(match writer {
            None => next,
            Some(before) => BoxMakeWriter::new(before.and(next)),
        });
    }
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr)));
    // No terminal colours in a file.
    let subscriber = if files { subscriber.with_ansi(false) } else { subscriber };
    subscriber.init();
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.flags.log_level, &cli.flags.log_outputs) {
        eprintln!("cairn: {e}");
        return ExitCode::from(1);
    }
    let outcome = match &cli.command {
        Some(Command::Snapshot(SnapshotCommand::Restore(args))) => {
            cairn_server::snapshot_tool::restore(args).map_err(|e| e.to_string())
        }
        Some(Command::Snapshot(SnapshotCommand::Status(args))) => {
            cairn_server::snapshot_tool::status(args).map_err(|e| e.to_string())
        }
        None => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(runtime) => runtime
                .block_on(cairn_server::server::serve(cli.flags))
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot start the runtime: {e}")),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {e}");
            ExitCode::from(1)
        }
    }
}
