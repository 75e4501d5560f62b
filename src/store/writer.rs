//! Store stage, write side: the one thread that owns the write connection. It takes records
//! from the bounded channel and the overflow queue, commits them in batches (at most
//! `batch_max` rows or `batch_interval` after a batch's first row), and runs retention between
//! batches. It wakes once per batch, not per record: only an idle writer waits on the channel
//! (the first record of a batch wakes it); with a batch open it sleeps until the batch is due
//! and then takes everything queued, so senders under load never wake it, unless a whole batch
//! is already waiting, the channel is full, or a flush or stop is sent (`Store` unparks it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::engine::{BatchWriter, WriteError};
use super::record::UsageRecord;
use super::spool::Spool;

/// Records are boxed so a 65,536-slot channel costs a pointer per slot, not a whole record.
pub(super) enum Msg {
    Record(Box<UsageRecord>),
    /// Acknowledged once everything queued before it (channel and overflow) is committed.
    Flush(Sender<()>),
    /// Drain everything, commit, exit.
    Stop,
}

/// What the request side and the writer thread share besides the channel.
#[derive(Default)]
pub(super) struct Shared {
    /// Where records go when the channel is full; the writer drains it between channel reads.
    pub overflow: Mutex<VecDeque<Box<UsageRecord>>>,
    /// Records taken into the channel or the overflow queue.
    pub accepted: AtomicU64,
    /// Records in the channel not yet taken by the writer (approximate; wakes it early).
    pub pending: std::sync::atomic::AtomicUsize,
    pub overflowed: AtomicU64,
    pub dropped: AtomicU64,
    pub written: AtomicU64,
    pub write_errors: AtomicU64,
    /// Times the idle writer gave its page cache back (`BatchWriter::release_memory`).
    pub memory_releases: AtomicU64,
    /// Bytes of records waiting in the spool for the database to come back.
    pub spool_bytes: AtomicU64,
    /// Records put in the spool by this process and not yet written from it.
    pub spooled: AtomicU64,
    /// Records neither the database nor the spool could take (a full disk), waiting in the
    /// writer's memory.
    pub held: AtomicU64,
    /// Records in the overflow queue (the channel was full).
    pub overflow_len: AtomicU64,
    /// The last batch failed to commit (cleared by the next that commits): `/readyz`.
    pub failing: std::sync::atomic::AtomicBool,
    pub spill_log: LogGate,
    pub drop_log: LogGate,
    pub write_error_log: LogGate,
    /// Test hook: the writer idles while set, so a burst fills the channel deterministically.
    #[cfg(test)]
    pub paused: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn overflow(&self) -> MutexGuard<'_, VecDeque<Box<UsageRecord>>> {
        // A panic while holding this lock cannot leave the queue half-changed, so go on.
        self.overflow.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Lets one log line through per second, so a persistent failure under load does not flood
/// the log.
#[derive(Default)]
pub(super) struct LogGate {
    /// Unix milliseconds of the last line; 0 = never.
    last: AtomicU64,
}

impl LogGate {
    pub fn allow(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let prev = self.last.load(Ordering::Relaxed);
        if prev != 0 && now.saturating_sub(prev) < 1_000 {
            return false;
        }
        self.last
            .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

pub(super) struct WriterConfig {
    pub batch_max: usize,
    pub batch_interval: Duration,
    pub retention: Option<Duration>,
    /// Where batches wait while the database is away (engines with transient failures).
    pub spool: Option<std::path::PathBuf>,
    /// The spool takes no batch past this many bytes waiting in it.
    pub spool_max_bytes: u64,
    /// Records that wait in memory (the overflow queue and batches held) past which the
    /// store is full.
    pub memory_max: usize,
    /// `on_store_full = "refuse"`: past `memory_max` new requests are refused and no record
    /// is dropped; else records past it are dropped (counted).
    pub refuse_when_full: bool,
    pub metrics: Option<Arc<crate::ops::metrics::Metrics>>,
}

/// How long an idle writer sleeps before looking at retention again.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Retention scans at most this often unless the last pass left a backlog.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// While the database is away, it is tried again after this, doubling up to `RETRY_MAX`.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A replay round gives way to newly queued records after this long.
const REPLAY_ROUND: Duration = Duration::from_millis(250);

pub(super) struct Writer {
    conn: Box<dyn BatchWriter>,
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    cfg: WriterConfig,
    batch: Vec<UsageRecord>,
    batch_started: Option<Instant>,
    acks: Vec<Sender<()>>,
    retention_last: Option<Instant>,
    /// The last retention DELETE removed a full chunk: more old rows remain.
    retention_backlog: bool,
    /// The last round stopped at `batch_max` with records maybe still queued.
    backlog: bool,
    spool: Option<Spool>,
    /// While the spool holds records: when the database is tried next, and the wait after.
    retry_at: Option<Instant>,
    retry_wait: Duration,
    /// A batch committed since the engine last gave its memory back.
    holds_memory: bool,
    journal: Option<Arc<super::journal::Journal>>,
    /// A `Stop` taken while emptying the channel for a trim.
    stop_seen: bool,
    /// Batches neither the database nor the spool could take (a full disk), oldest first:
    /// they wait in memory and are tried again (`retry_held`).
    held: VecDeque<Vec<UsageRecord>>,
    /// Since when batches are held (one log line when it starts, one when it ends).
    held_since: Option<Instant>,
    /// Records dropped before the store filled up (the episode's own are those after), and
    /// whether the episode's first drop was logged.
    dropped_before: u64,
    drop_logged: bool,
}

impl Writer {
    pub fn new(
        conn: Box<dyn BatchWriter>,
        rx: Receiver<Msg>,
        shared: Arc<Shared>,
        cfg: WriterConfig,
        journal: Option<Arc<super::journal::Journal>>,
    ) -> Self {
        Writer {
            conn,
            rx,
            shared,
            batch: Vec::with_capacity(cfg.batch_max),
            batch_started: None,
            acks: Vec::new(),
            retention_last: None,
            retention_backlog: false,
            backlog: false,
            spool: cfg.spool.clone().map(Spool::new),
            retry_at: None,
            retry_wait: RETRY_FIRST,
            holds_memory: false,
            journal,
            stop_seen: false,
            held: VecDeque::new(),
            held_since: None,
            dropped_before: 0,
            drop_logged: false,
            cfg,
        }
    }

    /// Records wait in the spool.
    fn spooling(&self) -> bool {
        self.spool.as_ref().is_some_and(|s| !s.is_empty())
    }

    pub fn run(mut self) {
        // A first retention pass before any flush can be acknowledged, so a restart with a
        // shorter retention trims right away.
        self.retention_tick();
        loop {
            #[cfg(test)]
            while self.shared.paused.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if self.batch.len() < self.cfg.batch_max {
                self.take_overflow(usize::MAX);
            }
            let mut flush = false;
            let mut stop = false;
            if self.batch.len() < self.cfg.batch_max {
                match self.batch_started {
                    // A batch is open and the channel was empty when last looked at: sleep
                    // until it is due (records sent meanwhile wake nobody).
                    Some(t) if !self.backlog => {
                        std::thread::park_timeout(
                            self.cfg.batch_interval.saturating_sub(t.elapsed()),
                        );
                    }
                    Some(_) => {}
                    None => {
                        let wait = if self.retention_backlog {
                            Duration::ZERO
                        } else if self.spooling() || !self.held.is_empty() {
                            self.retry_at.map_or(Duration::ZERO, |t| {
                                t.saturating_duration_since(Instant::now()).min(IDLE_TICK)
                            })
                        } else {
                            IDLE_TICK
                        };
                        // Lines written since the journal's last sync are synced on time.
                        let wait = match self.journal.as_ref().and_then(|j| j.sync_due_in()) {
                            Some(due) => wait.min(due),
                            None => wait,
                        };
                        match self.rx.recv_timeout(wait) {
                            Ok(msg) => self.take(msg, &mut flush, &mut stop),
                            Err(RecvTimeoutError::Timeout) if wait == IDLE_TICK => {
                                self.release_memory()
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => stop = true,
                        }
                    }
                }
            }
            self.backlog = false;
            // Take what is already queued without waiting; a flush or stop ends the batch.
            while !flush && !stop {
                if self.batch.len() >= self.cfg.batch_max {
                    // More may be queued: the next round commits without sleeping.
                    self.backlog = true;
                    break;
                }
                match self.rx.try_recv() {
                    Ok(msg) => self.take(msg, &mut flush, &mut stop),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => stop = true,
                }
            }
            stop |= std::mem::take(&mut self.stop_seen);
            let due = self.batch.len() >= self.cfg.batch_max
                || self
                    .batch_started
                    .is_some_and(|t| t.elapsed() >= self.cfg.batch_interval);
            if due || flush || stop {
                self.commit();
            }
            if stop {
                self.drain_after_stop();
                return;
            }
            if flush {
                self.drain_overflow();
            }
            self.retry_held();
            self.replay();
            // A flush is acknowledged once nothing waits in the spool or memory either.
            if !self.acks.is_empty() && !self.spooling() && self.held.is_empty() {
                self.ack();
            }
            if self.batch.is_empty() {
                self.retention_tick();
            }
            if let Some(j) = &self.journal {
                j.sync();
            }
            self.trim();
        }
    }

    /// Removes the journal's segments whose entries are all closed, once their records are
    /// committed (or safe in the spool): everything queued now is, first. Not while batches
    /// fail: the journal keeps their records for the next start.
    fn trim(&mut self) {
        let Some(journal) = self.journal.clone() else {
            return;
        };
        let done = journal.take_done();
        if done.is_empty() {
            return;
        }
        // Each record of those segments was queued before its entry closed.
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Record(r)) => {
                    self.shared.pending.fetch_sub(1, Ordering::Relaxed);
                    self.push(r);
                    if self.batch.len() >= self.cfg.batch_max {
                        self.commit();
                    }
                }
                Ok(Msg::Flush(ack)) => self.acks.push(ack),
                Ok(Msg::Stop) => self.stop_seen = true,
                Err(_) => break,
            }
        }
        self.drain_overflow();
        // The rows committed must also outlive a power loss before the lines that hold them go.
        let keep = self.shared.failing.load(Ordering::Relaxed)
            || self
                .conn
                .durable()
                .map_err(|e| {
                    tracing::warn!("{}; the journal keeps its segments", e.msg);
                })
                .is_err();
        if keep {
            journal
                .done
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(done);
            return;
        }
        for s in done {
            if let Err(e) = std::fs::remove_file(s.path()) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("usage journal: removing {}: {e}", s.path().display());
                }
            }
        }
    }

    /// A whole idle tick without a record: what the last batches left cached goes back.
    fn release_memory(&mut self) {
        if self.holds_memory {
            self.conn.release_memory();
            crate::ops::alloc::trim_thread_cache();
            self.holds_memory = false;
            self.shared.memory_releases.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn take(&mut self, msg: Msg, flush: &mut bool, stop: &mut bool) {
        match msg {
            Msg::Record(r) => {
                self.shared.pending.fetch_sub(1, Ordering::Relaxed);
                self.push(r);
            }
            Msg::Flush(ack) => {
                self.acks.push(ack);
                *flush = true;
            }
            Msg::Stop => *stop = true,
        }
    }

    fn push(&mut self, r: Box<UsageRecord>) {
        if self.batch_started.is_none() {
            self.batch_started = Some(Instant::now());
        }
        self.batch.push(*r);
    }

    /// Tops the batch up from the overflow queue, oldest first, taking at most `most`.
    fn take_overflow(&mut self, most: usize) -> usize {
        let room = self
            .cfg
            .batch_max
            .saturating_sub(self.batch.len())
            .min(most);
        let taken: Vec<Box<UsageRecord>> = {
            let mut q = self.shared.overflow();
            let n = room.min(q.len());
            let taken = q.drain(..n).collect();
            self.shared
                .overflow_len
                .store(q.len() as u64, Ordering::Relaxed);
            taken
        };
        let n = taken.len();
        for r in taken {
            self.push(r);
        }
        n
    }

    /// Commits the batch and then everything that is in the overflow queue now. Records that
    /// spill in meanwhile wait for the normal loop, so a flush under sustained overload ends.
    fn drain_overflow(&mut self) {
        let mut left = self.shared.overflow().len();
        loop {
            self.commit();
            if left == 0 {
                return;
            }
            let n = self.take_overflow(left);
            if n == 0 {
                return;
            }
            left -= n;
        }
    }

    /// After `Stop` only flush markers can still be queued (`Store::close` waits for in-flight
    /// `record` calls first), but take records too rather than lose any.
    fn drain_after_stop(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Record(r)) => {
                    self.push(r);
                    if self.batch.len() >= self.cfg.batch_max {
                        self.commit();
                    }
                }
                Ok(Msg::Flush(ack)) => self.acks.push(ack),
                Ok(Msg::Stop) => {}
                Err(_) => break,
            }
        }
        self.commit();
        self.drain_overflow();
        // The database may be back: one last round, and what is left waits for the next start.
        self.retry_at = None;
        self.retry_held();
        if self.spooling() {
            self.retry_at = None;
            self.replay();
        }
        // What still waits in memory is lost to this process (the journal keeps those it
        // could write, for the next start).
        let held: usize = self.held.drain(..).map(|b| b.len()).sum();
        if held > 0 {
            self.shared.held.store(0, Ordering::Relaxed);
            self.lose(
                held,
                &WriteError::from("the store is still full at the stop".to_string()),
            );
        }
        if let Some(j) = self.journal.as_ref() {
            // Every record is committed or in the spool; a batch that failed keeps its
            // records in the journal for the next start.
            if self.shared.failing.load(Ordering::Relaxed) || self.conn.durable().is_err() {
                j.sync_now();
            } else {
                j.remove_all();
            }
        }
        if let Some(s) = self.spool.as_ref().filter(|s| !s.is_empty()) {
            tracing::warn!(
                spool = %s.path().display(),
                bytes = s.pending_bytes(),
                "usage store: records wait in the spool; they are written at the next start"
            );
        }
        self.ack();
    }

    fn ack(&mut self) {
        for ack in self.acks.drain(..) {
            // The flusher may have timed out and gone; nothing to tell it then.
            let _ = ack.send(());
        }
    }

    /// Commits the batch. A transient failure (the database away) sends it to the spool, where
    /// it waits with every later batch until the database answers again (`replay`); any other
    /// failed batch is retried once, then its rows are counted in `write_errors` and logged,
    /// never retried forever (a full disk would otherwise stall every later record).
    fn commit(&mut self) {
        self.batch_started = None;
        if self.batch.is_empty() {
            return;
        }
        // Records already waiting go in first: newer ones queue behind them.
        if !self.held.is_empty() {
            self.hold_batch("records wait in memory before them");
            return;
        }
        if self.spooling() {
            self.spool_batch();
            return;
        }
        let n = self.batch.len() as u64;
        let started = Instant::now();
        let mut result = self.conn.insert_batch(&self.batch);
        if matches!(&result, Err(e) if !e.transient) {
            std::thread::sleep(Duration::from_millis(50));
            result = self.conn.insert_batch(&self.batch);
        }
        match result {
            Ok(()) => {
                self.holds_memory = true;
                if let Some(m) = &self.cfg.metrics {
                    m.batch(self.batch.len(), started.elapsed());
                }
                self.shared.written.fetch_add(n, Ordering::SeqCst);
                self.shared.failing.store(false, Ordering::Relaxed);
            }
            Err(e) if e.transient && self.spool.is_some() => {
                tracing::error!(
                    spool = %self.spool.as_ref().map_or_else(String::new, |s| s.path().display().to_string()),
                    "usage store: the database is away ({}); records wait in the spool until it is back",
                    e.msg
                );
                self.retry_at = Some(Instant::now() + RETRY_FIRST);
                self.retry_wait = RETRY_FIRST;
                self.spool_batch();
            }
            Err(e) if e.transient => {
                self.retry_at = Some(Instant::now() + RETRY_FIRST);
                self.retry_wait = RETRY_FIRST;
                self.hold_batch(&e.msg);
            }
            Err(e) => self.lose(self.batch.len(), &e),
        }
        self.batch.clear();
    }

    /// `rows` will never be written: counted, logged (once a second at most).
    fn lose(&self, rows: usize, e: &WriteError) {
        let n = rows as u64;
        self.shared.failing.store(true, Ordering::Relaxed);
        let total = self.shared.write_errors.fetch_add(n, Ordering::SeqCst) + n;
        if self.shared.write_error_log.allow() {
            tracing::error!(
                rows = n,
                lost_total = total,
                "usage store: batch not written: {}",
                e.msg
            );
        }
    }

    /// Appends the batch to the spool (synced before this returns); a spool at its bound or
    /// failing (a full disk) leaves the batch in memory (`hold_batch`).
    fn spool_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        match self.append_to_spool(&batch) {
            Ok(n) if n == batch.len() => {}
            // Those past the spool's bound wait in memory.
            Ok(n) => {
                self.batch = batch.split_off(n);
                let why = "the spool is at its bound (spool_max_bytes)".to_string();
                self.hold_batch(&why);
            }
            Err(why) => {
                self.batch = batch;
                self.hold_batch(&why);
            }
        }
        self.batch.clear();
    }

    /// The first of `records` into the spool, as many as its bound has room for; how many.
    /// An error when none fits or the write fails.
    fn append_to_spool(&mut self, records: &[UsageRecord]) -> Result<usize, String> {
        let Some(spool) = self.spool.as_mut() else {
            return Err("no spool".into());
        };
        let waiting = spool.pending_bytes();
        if waiting >= self.cfg.spool_max_bytes {
            return Err(format!(
                "the spool {} holds {waiting} bytes, its bound",
                spool.path().display()
            ));
        }
        let n = spool.append_within(records, self.cfg.spool_max_bytes - waiting)?;
        if n == 0 {
            return Err(format!(
                "the spool {} is at its bound ({waiting} bytes)",
                spool.path().display()
            ));
        }
        self.shared
            .spool_bytes
            .store(spool.pending_bytes(), Ordering::Relaxed);
        self.shared.spooled.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Keeps the batch in memory: neither the database nor the spool can take it now (`why`).
    /// Past the memory bound, with `on_store_full = "serve"`, it is dropped (counted).
    fn hold_batch(&mut self, why: &str) {
        let n = self.batch.len() as u64;
        if n == 0 {
            return;
        }
        let waiting = self.shared.held.load(Ordering::Relaxed)
            + self.shared.overflow_len.load(Ordering::Relaxed);
        if !self.cfg.refuse_when_full && waiting + n > self.cfg.memory_max as u64 {
            self.shared.accepted.fetch_sub(n, Ordering::SeqCst);
            let total = self.shared.dropped.fetch_add(n, Ordering::Relaxed) + n;
            // One line an episode: the rest are counted, and summed up at its end.
            if !std::mem::replace(&mut self.drop_logged, true) {
                tracing::error!(
                    rows = n,
                    dropped_total = total,
                    "usage records dropped: the store is full ({why}) and {waiting} records \
                     wait in memory, its bound (on_store_full = \"serve\"); the others \
                     dropped until it has room are counted (usage_records_dropped_total)"
                );
            }
            self.batch.clear();
            return;
        }
        self.shared.failing.store(true, Ordering::Relaxed);
        self.shared.held.fetch_add(n, Ordering::Relaxed);
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.cfg.batch_max));
        self.held.push_back(batch);
        if self.held_since.is_none() {
            self.held_since = Some(Instant::now());
            self.dropped_before = self.shared.dropped.load(Ordering::Relaxed);
            self.drop_logged = false;
            if self.retry_at.is_none() {
                self.retry_at = Some(Instant::now() + RETRY_FIRST);
            }
            let past = if self.cfg.refuse_when_full {
                "new requests are refused with 503 usage_store_unavailable (on_store_full = \"refuse\")"
            } else {
                "records are dropped and counted (on_store_full = \"serve\")"
            };
            tracing::error!(
                bound = self.cfg.memory_max,
                "usage store full: neither the database nor the spool takes records ({why}); \
                 they wait in memory, and past its bound {past}"
            );
        }
    }

    /// Writes the batches held in memory, oldest first, when the store is due to be tried
    /// again: to the database, else to the spool if it has room again.
    fn retry_held(&mut self) {
        if self.held.is_empty() || self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        while let Some(mut batch) = self.held.pop_front() {
            let n = batch.len() as u64;
            let stored = match self.conn.insert_batch(&batch) {
                Ok(()) => {
                    self.holds_memory = true;
                    self.shared.written.fetch_add(n, Ordering::SeqCst);
                    true
                }
                Err(e) if !e.transient => {
                    self.lose(batch.len(), &e);
                    true
                }
                Err(_) => match self.append_to_spool(&batch) {
                    // The spool took those its bound has room for; the rest wait on.
                    Ok(k) if k < batch.len() => {
                        batch = batch.split_off(k);
                        self.shared.held.fetch_sub(k as u64, Ordering::Relaxed);
                        false
                    }
                    Ok(_) => true,
                    Err(_) => false,
                },
            };
            if !stored {
                self.held.push_front(batch);
                self.retry_at = Some(Instant::now() + self.retry_wait);
                self.retry_wait = (self.retry_wait * 2).min(RETRY_MAX);
                return;
            }
            self.shared.held.fetch_sub(n, Ordering::Relaxed);
        }
        if let Some(since) = self.held_since.take() {
            let dropped = self.shared.dropped.load(Ordering::Relaxed) - self.dropped_before;
            tracing::warn!(
                after_ms = since.elapsed().as_millis() as u64,
                dropped,
                "usage store: records are stored again; none waits in memory ({dropped} \
                 dropped meanwhile)"
            );
        }
        self.retry_wait = RETRY_FIRST;
        if !self.spooling() {
            self.retry_at = None;
        }
        self.shared.failing.store(false, Ordering::Relaxed);
    }

    /// Writes what waits in the spool, oldest first, when the database is due to be tried
    /// again; gives way to newly queued records after `REPLAY_ROUND`.
    fn replay(&mut self) {
        let Some(spool) = self.spool.as_mut() else {
            return;
        };
        if spool.is_empty() || self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let round = Instant::now();
        while round.elapsed() < REPLAY_ROUND {
            let (records, next) = match spool.read(self.cfg.batch_max) {
                Ok(r) => r,
                Err(msg) => {
                    tracing::error!("{msg}");
                    self.retry_at = Some(Instant::now() + RETRY_MAX);
                    return;
                }
            };
            let result = if records.is_empty() {
                Ok(())
            } else {
                self.conn.insert_replayed(&records)
            };
            match result {
                Ok(()) => {
                    self.holds_memory = true;
                    let n = records.len() as u64;
                    self.shared.written.fetch_add(n, Ordering::SeqCst);
                    let _ = self.shared.spooled.fetch_update(
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                        |s| Some(s.saturating_sub(n)),
                    );
                }
                Err(e) if e.transient => {
                    self.retry_at = Some(Instant::now() + self.retry_wait);
                    self.retry_wait = (self.retry_wait * 2).min(RETRY_MAX);
                    return;
                }
                Err(e) => {
                    let n = records.len();
                    let shared = &self.shared;
                    shared.failing.store(true, Ordering::Relaxed);
                    let total = shared.write_errors.fetch_add(n as u64, Ordering::SeqCst);
                    tracing::error!(
                        rows = n,
                        lost_total = total + n as u64,
                        "usage store: spooled batch not written: {}",
                        e.msg
                    );
                }
            }
            if let Err(msg) = spool.consumed(next) {
                tracing::error!("{msg}");
            }
            self.shared
                .spool_bytes
                .store(spool.pending_bytes(), Ordering::Relaxed);
            if spool.is_empty() {
                tracing::info!("usage store: the database is back; the spool is written");
                self.retry_at = None;
                self.retry_wait = RETRY_FIRST;
                return;
            }
        }
    }

    /// One retention DELETE (at most `RETENTION_CHUNK` rows) when due: every
    /// `RETENTION_EVERY`, or at once while a backlog remains.
    fn retention_tick(&mut self) {
        let Some(keep) = self.cfg.retention else {
            return;
        };
        let due = self.retention_backlog
            || self
                .retention_last
                .is_none_or(|t| t.elapsed() >= RETENTION_EVERY);
        if !due {
            return;
        }
        self.retention_last = Some(Instant::now());
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(keep_ms);
        match self.conn.delete_expired(cutoff) {
            Ok(more) => self.retention_backlog = more,
            Err(e) => {
                self.retention_backlog = false;
                tracing::error!("usage store: retention: {}", e.msg);
            }
        }
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
