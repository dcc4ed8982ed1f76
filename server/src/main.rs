//! The `cairn` binary.
//!
//! Today it opens (or creates) the data directory and recovers its write-ahead log, then says
//! that the etcd v3 gRPC API is not served yet. The server issue replaces this with the real
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
    let wal_dir = data_dir.join("member").join("wal");
    let opened = cairn_engine::wal::Wal::open(&wal_dir, cairn_engine::wal::Config::default()).and_then(|replay| {
        let mut records = 0u64;
        let mut replay = replay;
        for r in replay.by_ref() {
            r?;
            records += 1;
        }
        replay.finish().map(|wal| (wal, records))
    });
    match opened {
        Ok((wal, records)) => {
            println!(
                "cairn: data dir {} ready ({records} wal records recovered)",
                data_dir.display()
            );
            println!(
                "cairn: the etcd v3 API on {} is not implemented yet; see README.md",
                args.listen_client_urls
            );
            drop(wal);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cairn: cannot open data dir {}: {e}", data_dir.display());
            ExitCode::from(1)
        }
    }
}
