//! The one way the engine runs a thread. Every thread is named (`cairn-…`, as `top -H` and a
//! core dump show it), logs in the span it was started from (the member's), is joined by
//! whoever started it when the engine closes, and a panic in it comes back from [`Worker::join`]
//! as the engine's error instead of vanishing with the thread.
//!
//! - [`start`]: a thread that runs to its end by itself (the node, the apply thread, a
//!   snapshot being sent).
//! - [`start_stoppable`]: a thread that runs until it is told to stop (the watch and lease
//!   threads); [`Stoppable::stop`] tells it and joins it.
//! - [`start_scoped`]: a thread borrowing from its caller's stack, joined before the caller
//!   returns (a snapshot's reader, an etcd snapshot's hash check).

use std::any::Any;
use std::thread::{JoinHandle, Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::error::{Error, Failure, Result};

/// A thread of the engine's, to be joined.
#[derive(Debug)]
pub(crate) struct Worker<T = ()> {
    name: &'static str,
    handle: JoinHandle<T>,
}

/// Starts `run` on a thread named `name`, in the current span.
pub(crate) fn start<T: Send + 'static>(
    name: &'static str,
    run: impl FnOnce() -> T + Send + 'static,
) -> Result<Worker<T>> {
    let span = tracing::Span::current();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _span = span.enter();
            run()
        })
        .map_err(|e| Error::Internal(Failure::caused_by(format!("start the {name} thread"), e)))?;
    Ok(Worker { name, handle })
}

impl<T> Worker<T> {
    /// Waits for the thread to end: what it returned, or the engine's error if it panicked.
    pub(crate) fn join(self) -> Result<T> {
        let name = self.name;
        self.handle.join().map_err(|panic| panicked(name, &*panic))
    }

    /// Whether the thread has ended (joining it then does not wait).
    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// [`Worker::join`], but waits at most until `deadline`: a thread still running then (a
    /// snapshot stream to a peer that stopped answering) is left to end by itself, and said so.
    pub(crate) fn join_by(self, deadline: Instant) -> Result<Option<T>> {
        while !self.handle.is_finished() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                tracing::warn!(thread = self.name, "a thread still running is left to end by itself");
                return Ok(None);
            };
            std::thread::park_timeout(left.min(Duration::from_millis(10)));
        }
        self.join().map(Some)
    }
}

/// A thread that runs until told to stop.
#[derive(Debug)]
pub(crate) struct Stoppable {
    stop: Sender<()>,
    worker: Worker<()>,
}

/// Starts `run` on a thread named `name`, in the current span; `run` is given the receiver
/// that disconnects when the thread is to stop.
pub(crate) fn start_stoppable(
    name: &'static str,
    run: impl FnOnce(Receiver<()>) + Send + 'static,
) -> Result<Stoppable> {
    let (stop, stopped) = bounded(0);
    let worker = start(name, move || run(stopped))?;
    Ok(Stoppable { stop, worker })
}

impl Stoppable {
    /// Tells the thread to stop, and joins it.
    pub(crate) fn stop(self) -> Result<()> {
        drop(self.stop);
        self.worker.join()
    }
}

/// A thread borrowing from its caller, to be joined within the scope.
pub(crate) struct ScopedWorker<'scope, T> {
    name: &'static str,
    handle: ScopedJoinHandle<'scope, T>,
}

/// Starts `run` on a thread named `name` within `scope`, in the current span.
pub(crate) fn start_scoped<'scope, T: Send + 'scope>(
    scope: &'scope Scope<'scope, '_>,
    name: &'static str,
    run: impl FnOnce() -> T + Send + 'scope,
) -> Result<ScopedWorker<'scope, T>> {
    let span = tracing::Span::current();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(scope, move || {
            let _span = span.enter();
            run()
        })
        .map_err(|e| Error::Internal(Failure::caused_by(format!("start the {name} thread"), e)))?;
    Ok(ScopedWorker { name, handle })
}

impl<T> ScopedWorker<'_, T> {
    /// Waits for the thread to end: what it returned, or the engine's error if it panicked.
    pub(crate) fn join(self) -> Result<T> {
        let name = self.name;
        self.handle.join().map_err(|panic| panicked(name, &*panic))
    }
}

/// The engine's error for a thread that panicked, with the panic's message.
fn panicked(name: &str, panic: &(dyn Any + Send)) -> Error {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    tracing::error!(thread = name, panic = %message, "a thread panicked");
    Error::Internal(Failure::new(format!("the {name} thread panicked: {message}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_named_and_returns_what_it_ran() {
        let worker = start("cairn-test", || std::thread::current().name().map(str::to_string)).unwrap();
        assert_eq!(worker.join().unwrap().as_deref(), Some("cairn-test"));
    }

    #[test]
    fn a_panic_comes_back_as_the_engines_error_with_its_message() {
        let worker = start("cairn-test", || -> u32 { panic!("the state is inconsistent") }).unwrap();
        let e = worker.join().unwrap_err().to_string();
        assert!(
            e.contains("cairn-test thread panicked: the state is inconsistent"),
            "{e}"
        );
        let v = [1, 2];
        let scoped = std::thread::scope(|scope| {
            let w = start_scoped(scope, "cairn-scoped", || -> usize { panic!("{} items", v.len()) }).unwrap();
            w.join()
        });
        assert!(scoped
            .unwrap_err()
            .to_string()
            .contains("cairn-scoped thread panicked: 2 items"));
    }

    #[test]
    fn a_stoppable_thread_runs_until_stopped() {
        let (ran_tx, ran_rx) = bounded(1);
        let stoppable = start_stoppable("cairn-test", move |stop| {
            // Runs until the stop receiver disconnects.
            while stop.recv().is_ok() {}
            ran_tx.send(()).unwrap();
        })
        .unwrap();
        stoppable.stop().unwrap();
        assert!(ran_rx.try_recv().is_ok());
    }

    #[test]
    fn join_by_leaves_a_thread_running_past_the_deadline() {
        let (release, wait) = bounded::<()>(0);
        let worker = start("cairn-test", move || {
            let _ = wait.recv();
        })
        .unwrap();
        assert_eq!(worker.join_by(Instant::now()).unwrap(), None);
        drop(release);
        let worker = start("cairn-test", || 7).unwrap();
        assert_eq!(
            worker.join_by(Instant::now() + Duration::from_secs(60)).unwrap(),
            Some(7)
        );
    }
}
