//! Store stage: a database server that stops answering without closing its connections (a
//! frozen process, a host gone quiet behind a live kernel, a lock held for good) never fails a
//! call, it only never returns. `Bounded` runs a batch writer on a thread of its own, so that
//! for the usage writer such a call ends after a limit, as a transient failure: the batch waits
//! in the spool like one the database refused, the writer goes on taking records, and a
//! shutdown is not held by it. The call left behind finishes (or fails) whenever the server
//! answers; a batch it commits late is not counted twice, since a replayed row whose request
//! id is stored is skipped. Until it has returned, calls fail at once without starting
//! another.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use super::engine::{BatchWriter, WriteError};
use super::record::UsageRecord;

/// One call on the inner writer, and where its answer goes.
type Job<W> = Box<dyn FnOnce(&mut W) + Send>;

pub(crate) struct Bounded<W: BatchWriter + 'static> {
    jobs: Sender<Job<W>>,
    limit: Duration,
    /// The answer of a call that outlived its limit: while it has not come, the inner writer
    /// is still in that call.
    late: Option<Receiver<()>>,
}

impl<W: BatchWriter + 'static> Bounded<W> {
    pub fn new(inner: W, limit: Duration) -> Result<Bounded<W>, String> {
        let (jobs, rx) = mpsc::channel::<Job<W>>();
        std::thread::Builder::new()
            .name("usage-db-io".into())
            .spawn(move || {
                let mut inner = inner;
                for job in rx {
                    job(&mut inner);
                }
            })
            .map_err(|e| format!("usage store: starting the database thread: {e}"))?;
        Ok(Bounded {
            jobs,
            limit,
            late: None,
        })
    }

    fn away(&self, what: &str) -> WriteError {
        WriteError {
            msg: format!(
                "usage store: the database has not answered {what} within {} ms",
                self.limit.as_millis()
            ),
            transient: true,
        }
    }

    /// Runs `f` on the inner writer, waiting at most `limit` for it.
    fn call<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut W) -> Result<T, WriteError> + Send + 'static,
    ) -> Result<T, WriteError> {
        if let Some(late) = &self.late {
            match late.try_recv() {
                Err(TryRecvError::Empty) => return Err(self.away("an earlier write")),
                Ok(()) | Err(TryRecvError::Disconnected) => self.late = None,
            }
        }
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let job: Job<W> = Box::new(move |w: &mut W| {
            let _ = tx.send(f(w));
            let _ = done_tx.send(());
        });
        if self.jobs.send(job).is_err() {
            return Err(WriteError {
                msg: "usage store: the database thread has stopped".into(),
                transient: false,
            });
        }
        match rx.recv_timeout(self.limit) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => {
                self.late = Some(done_rx);
                Err(self.away("a write"))
            }
            Err(RecvTimeoutError::Disconnected) => Err(WriteError {
                msg: "usage store: the database thread has stopped".into(),
                transient: false,
            }),
        }
    }
}

impl<W: BatchWriter + 'static> BatchWriter for Bounded<W> {
    fn insert_batch(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
        let batch = batch.to_vec();
        self.call(move |w| w.insert_batch(&batch))
    }

    fn delete_expired(&mut self, cutoff_ms: i64) -> Result<bool, WriteError> {
        self.call(move |w| w.delete_expired(cutoff_ms))
    }

    /// The inner writer's answer, within the limit; all of `batch` without one.
    fn not_stored(&mut self, batch: &[UsageRecord]) -> Vec<UsageRecord> {
        let all = batch.to_vec();
        self.call(move |w| Ok(w.not_stored(&all)))
            .unwrap_or_else(|_| batch.to_vec())
    }

    fn durable(&mut self) -> Result<(), WriteError> {
        self.call(|w| w.durable())
    }

    fn release_memory(&mut self) {
        let _ = self.call(|w| {
            w.release_memory();
            Ok(())
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer whose calls wait on a gate (a server that stopped answering) and are counted.
    struct Gated {
        gate: Arc<Mutex<()>>,
        written: Arc<Mutex<usize>>,
    }

    impl BatchWriter for Gated {
        fn insert_batch(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
            let _open = self.gate.lock().unwrap();
            *self.written.lock().unwrap() += batch.len();
            Ok(())
        }

        fn delete_expired(&mut self, _cutoff_ms: i64) -> Result<bool, WriteError> {
            Ok(false)
        }
    }

    #[test]
    fn a_call_that_hangs_fails_after_the_limit_and_the_next_ones_at_once_until_it_returns() {
        let gate = Arc::new(Mutex::new(()));
        let written = Arc::new(Mutex::new(0));
        let mut w = Bounded::new(
            Gated {
                gate: gate.clone(),
                written: written.clone(),
            },
            Duration::from_millis(200),
        )
        .unwrap();
        let batch = vec![crate::store::sqlite::sample_record(0, "k", 1)];
        w.insert_batch(&batch).unwrap();
        let frozen = gate.lock().unwrap();
        let started = std::time::Instant::now();
        let e = w.insert_batch(&batch).unwrap_err();
        assert!(e.transient, "{}", e.msg);
        assert!(started.elapsed() >= Duration::from_millis(200));
        let started = std::time::Instant::now();
        assert!(w.insert_batch(&batch).unwrap_err().transient);
        assert!(started.elapsed() < Duration::from_millis(100));
        // The server answers again: the late call ends, and then the next goes through.
        drop(frozen);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while w.insert_batch(&batch).is_err() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert_eq!(*written.lock().unwrap(), 3);
    }
}
