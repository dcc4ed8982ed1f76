//! The `cairn` binary: an etcd-compatible member (`cairn [flags]`), and the offline snapshot
//! tools (`cairn snapshot restore|status`). See `cairn --help`.

use std::process::ExitCode;

use cairn_server::flags::{Cli, Command, SnapshotCommand};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let f = &cli.flags;
    if let Err(e) = cairn_server::logging::init(f.log_level, f.log_format, &f.log_outputs) {
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
