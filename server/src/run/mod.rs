//! The top floor: a member assembled from its flags and run until it is stopped, logging and
//! tracing set up, systemd told, and the offline tools (`cairn snapshot`, `cairn check disk`).

mod command;
pub mod disk_check;
mod error;
mod grpc;
mod identity;
mod listeners;
pub mod logging;
mod plan;
mod router;
pub mod server;
pub mod snapshot_tool;
pub mod systemd;
pub mod tracing_export;

pub use command::run_command_line;
