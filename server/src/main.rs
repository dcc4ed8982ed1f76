//! The `cairn` binary: an etcd-compatible member (`cairn [flags]`), and the offline snapshot
//! tools (`cairn snapshot restore|status`). See `cairn --help`.

use std::process::ExitCode;

use cairn_server::flags::{Cli, Command, LogLevel, SnapshotCommand};
use clap::Parser;

fn init_logging(level: LogLevel) {
    let default = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error | LogLevel::Panic | LogLevel::Fatal => "error",
    };
    // RUST_LOG, when set, refines the level (per module).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.flags.log_level);
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
