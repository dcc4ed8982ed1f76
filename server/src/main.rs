//! The `cairn` binary.
//!
//! Today it opens (or creates) the data directory with the embedded engine, recovering its
//! state, then says that the etcd v3 gRPC API is not served yet. The server issue replaces this with the real
//! node; the flags below already carry etcd's names and defaults.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// An etcd-compatible key-value node (work in progress: see README.md's status table).
#[derive(Debug, Parser)]
#[command(name = "cairn", version)]
struct Args {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    name: String,
    /// Path to the data directory (default: ./<name>.cairn).
    #[arg(long, env = "ETCD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_URLS", default_value = "http://127.0.0.1:2379")]
    listen_client_urls: String,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let data_dir = args
        .data_dir
        .unwrap_or_else(|| PathBuf::from(format!("{}.cairn", args.name)));
    let member_dir = data_dir.join("member");
    let opened = cairn_engine::Engine::open(&member_dir, cairn_engine::Config::default());
    match opened {
        Ok(engine) => {
            println!(
                "cairn: data dir {} ready (revision {})",
                data_dir.display(),
                engine.current_revision()
            );
            println!(
                "cairn: the etcd v3 API on {} is not implemented yet; see README.md",
                args.listen_client_urls
            );
            match engine.close() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("cairn: closing {}: {e}", data_dir.display());
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("cairn: cannot open data dir {}: {e}", data_dir.display());
            ExitCode::from(1)
        }
    }
}
