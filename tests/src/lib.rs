//! Shared helpers of cairn's integration tests. The tests themselves live in `tests/tests/`;
//! helper processes (a WAL appender and an engine writer to kill with SIGKILL) in `src/bin/`.

pub mod engine_crash;
pub mod linearizability;

use bytes::Bytes;
use cairn_wal::{Config, Record};

/// The payload the crash-test child writes for entry `index`: derived from the index, so the
/// parent can check every byte after recovery without sharing state.
pub fn crash_payload(index: u64) -> Bytes {
    let len = 16 + (index.wrapping_mul(2_654_435_761) % 700) as usize;
    (0..len)
        .map(|i| (index as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// The configuration of the crash-test log: 64 KiB segments (about 170 entries of
/// [`crash_payload`]), so rotation, and a kill in the middle of one, happen often.
pub fn crash_config() -> Config {
    Config {
        segment_size: 64 << 10,
        ..Config::default()
    }
}

/// The entries a replay of the crash-test log holds: `first..=last`, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashLog {
    pub first: Option<u64>,
    pub last: Option<u64>,
}

/// Checks a replay of the crash-test log and returns the range of its entries.
///
/// The crash-test log holds nothing but entries, so every record must be one, its index must
/// follow the previous one, and its payload must be [`crash_payload`] of its index. A replay
/// error (corruption, or a torn tail in strict mode) fails the check too. The error describes
/// the first problem found.
pub fn check_crash_log(records: impl IntoIterator<Item = cairn_wal::Result<Record>>) -> Result<CrashLog, String> {
    let mut log = CrashLog {
        first: None,
        last: None,
    };
    for record in records {
        let record = record.map_err(|e| format!("replay failed after entry {:?}: {e}", log.last))?;
        let Record::Entry { index, payload } = record else {
            return Err(format!("after entry {:?}: unexpected record {record:?}", log.last));
        };
        let index = index.get();
        if let Some(last) = log.last {
            if index != last + 1 {
                return Err(format!("entry {index} follows entry {last}"));
            }
        }
        if payload != crash_payload(index) {
            return Err(format!("entry {index} has a wrong payload of {} bytes", payload.len()));
        }
        log.first = log.first.or(Some(index));
        log.last = Some(index);
    }
    Ok(log)
}

/// The records of the committed WAL fixtures (`tests/fixtures/wal/`), shared by their generator
/// and their test.
pub mod fixtures {
    use bytes::Bytes;
    use cairn_wal::{LogIndex, Record};

    /// Entry `index`, with payload `entry-<index>`.
    pub fn entry(index: u64) -> Record {
        Record::Entry {
            index: LogIndex(index),
            payload: Bytes::from(format!("entry-{index}")),
        }
    }

    /// A state record holding `text`.
    pub fn state(text: &'static str) -> Record {
        Record::State(Bytes::from_static(text.as_bytes()))
    }
}

/// Running a helper process that a crash test kills with SIGKILL.
pub mod child {
    use std::fs::File;
    use std::io::{BufRead, BufReader};
    use std::path::Path;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::sync::mpsc::{self, RecvTimeoutError};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// How a killed child ended.
    #[derive(Debug)]
    pub struct Ended {
        pub status: ExitStatus,
        pub stderr: String,
    }

    /// Kills the child when dropped, so that a failing test leaves nothing running.
    struct KillOnDrop(Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Runs `command` (stdout piped, stderr to `stderr_path`: a pipe nobody reads could fill up
    /// and stall it), handing each complete stdout line to `on_line`, and kills it with SIGKILL
    /// as soon as `on_line` returns true. Lines printed before the kill landed still arrive; a
    /// line cut short by it is dropped (it promises nothing). Returns once the child is dead.
    ///
    /// `hang_timeout` is not a timing assertion, only a guard: a child still running after it
    /// (a deadlock) is killed and the call panics, instead of the test hanging forever.
    pub fn run_until_killed(
        mut command: Command,
        stderr_path: &Path,
        hang_timeout: Duration,
        mut on_line: impl FnMut(&str) -> bool,
    ) -> Ended {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(stderr_path).expect("create the child's stderr file"))
            .spawn()
            .expect("spawn the child");
        let child = Arc::new(Mutex::new(KillOnDrop(child)));
        let stdout = child.lock().expect("child lock").0.stdout.take().expect("piped stdout");
        let (finished, finished_rx) = mpsc::channel::<()>();
        let watchdog = {
            let child = Arc::clone(&child);
            std::thread::spawn(move || {
                let hung = finished_rx.recv_timeout(hang_timeout) == Err(RecvTimeoutError::Timeout);
                if hung {
                    let _ = child.lock().expect("child lock").0.kill();
                }
                hung
            })
        };
        let mut killed = false;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).expect("read the child's stdout") == 0 {
                break; // EOF: the child is dead
            }
            let Some(complete) = line.strip_suffix('\n') else {
                break;
            };
            if on_line(complete) && !killed {
                child.lock().expect("child lock").0.kill().expect("SIGKILL the child");
                killed = true;
            }
        }
        drop(finished);
        let hung = watchdog.join().expect("watchdog thread");
        let status = child.lock().expect("child lock").0.wait().expect("wait for the child");
        let stderr = std::fs::read_to_string(stderr_path).unwrap_or_default();
        assert!(
            !hung,
            "the child was still running after {hang_timeout:?}; stderr:\n{stderr}"
        );
        Ended { status, stderr }
    }
}

/// The engine configuration the format fixtures (`tests/fixtures/format`) are written and
/// read with: small WAL segments and data files, no background lease checks, a manual clock.
pub fn format_fixture_config() -> cairn_engine::Config {
    cairn_engine::Config {
        wal: cairn_wal::Config {
            segment_size: 64 << 10,
            ..cairn_wal::Config::default()
        },
        data_file_size: 64 << 10,
        checkpoint_entries: 1_000_000,
        // Closing saves the key index, however little is stored (since saved index 1).
        saved_index_bytes: 0,
        lease_check_interval: None,
        lease_checkpoint_interval: None,
        clock: std::sync::Arc::new(cairn_engine::ManualClock::default()),
        ..cairn_engine::Config::default()
    }
}
