//! Telling systemd how the member is doing, as etcd does under its `Type=notify` unit:
//! `READY=1` once every listener serves, `STOPPING=1` when a stop begins, and, when the unit
//! sets `WatchdogSec=`, a keep-alive at half the watchdog's period for as long as the member
//! runs. Without `$NOTIFY_SOCKET` (not started by systemd) each call does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the member serves; a failure is logged, never fatal (etcd goes on serving too).
pub fn ready() {
    send(&[NotifyState::Ready], "READY=1");
}

/// Tells systemd the member is stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping], "STOPPING=1");
}

fn send(state: &[NotifyState<'_>], what: &str) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "cannot tell systemd {what}");
    }
}

/// The watchdog's keep-alive period, if systemd asked for one for this process: half its
/// timeout, as sd_watchdog_enabled(3) advises.
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled()
        .map(|timeout| timeout / 2)
        .filter(|p| !p.is_zero())
}

/// Sends `WATCHDOG=1` every `period`, until dropped (aborted) with the member.
pub async fn keep_alive(period: Duration) {
    let mut every = tokio::time::interval(period);
    loop {
        every.tick().await;
        send(&[NotifyState::Watchdog], "WATCHDOG=1");
    }
}
