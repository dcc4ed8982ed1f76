//! The top floor: a member assembled from its flags and run until it is stopped, logging and
//! tracing set up, systemd told, and the offline tools (`cairn snapshot`, `cairn check disk`).

pub mod disk_check;
pub mod logging;
pub mod server;
pub mod snapshot_tool;
pub mod systemd;
pub mod tracing_export;
