//! Store stage, crash side: the journal. A request that passed auth gets an entry as it is
//! admitted, with what it sends upstream (or before it waits on anything: Redis, a body still
//! coming), one line `{"open":…}`, written before anything goes upstream or back to the
//! client; and its whole record (`{"close":…}`) follows before
//! the record goes to the writer; for a reply whose usage the upstream reported, before the
//! reply's last byte goes to the client. A process killed at any moment leaves every such
//! request in the kernel's hands: at the next start the journal is read back (`recover`), each
//! record and, for each entry left without one, a record of what is known (`cut = "crash"`,
//! estimated), and they go to the spool, from which the writer stores them (skipping those the
//! database already has). The writer syncs what was written to disk a second after the last
//! sync (`SYNC_EVERY`), whether or not its batches commit: a power loss costs at most the lines
//! of that second.
//!
//! Lines are written in groups: a request adds its line to its segment's pending lines and
//! yields once, so the requests its thread (or another) runs meanwhile add theirs, and the first
//! to come back writes them all in one `pwrite(2)` (`Segment::durable`); a request goes on
//! (upstream, or its reply's last byte to the client) only once its line is written. Under
//! load that is one system call for many requests instead of two for each.
//!
//! The journal is a folder of segments; lines go to the current one, which is sealed when it
//! passes `SEGMENT_BYTES` and a new one started. A segment is made at twice that size (sparse)
//! and each line written at an offset reserved for it: an append that grew the file would
//! change its size, which on ext4 is a file-system transaction per line (those cost the proxy
//! threads a fifth of their time under load, waiting on the file system's commits); a write
//! within the file's size is not. Reading back skips the zeros of what was never written. A
//! sealed segment whose entries have all ended is removed by the writer once everything queued
//! before is committed (`Writer::trim`).

use std::fs::{File, OpenOptions};
use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use super::record::{RecordRef, UsageRecord};

/// A segment is sealed, and a new one started, past this size.
const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

/// The writer syncs the journal to disk at most this often (a power loss costs at most this
/// much of it; a kill, nothing). Each sync makes the file system commit, during which appends
/// that need a new block wait: every batch (100 ms) cost the proxy threads more than this.
pub const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `state`'s bit saying no entry opens here any more; the bits below count open entries.
const SEALED: u64 = 1 << 63;

/// What is known of a request once it is admitted (or before it waits on anything): enough
/// for its record if it never ends; with what it sends upstream, when the entry is opened as
/// it goes (else that comes as a line of its own, `Sent`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Opened {
    pub time_ms: i64,
    pub request_id: String,
    pub key_id: String,
    pub listener: String,
    pub endpoint: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub cost: f64,
}

/// What a request sent upstream (its model, and its prompt estimated from its size): a crash
/// that ends it bills that prompt, estimated.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Sent {
    pub request_id: String,
    pub model: String,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub cost: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Open(Opened),
    Sent(Sent),
    Close(Box<UsageRecord>),
}

/// A line as written: borrowed, encoded into the thread's own buffer (by `super::line`; the
/// derived `Serialize` is the reference it is tested against).
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum LineRef<'a> {
    Open(OpenedRef<'a>),
    Sent(SentLine<'a>),
    Close(&'a RecordRef<'a>),
}

/// What a request sends upstream, borrowed: part of its entry's line, or a line of its own.
#[derive(Serialize, Clone, Copy)]
pub struct SentRef<'a> {
    pub model: &'a str,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub cost: f64,
}

/// `Sent`, borrowed.
#[derive(Serialize)]
pub(super) struct SentLine<'a> {
    pub request_id: &'a str,
    #[serde(flatten)]
    pub sent: SentRef<'a>,
}

/// `Opened`, borrowed.
#[derive(Serialize)]
pub struct OpenedRef<'a> {
    pub time_ms: i64,
    pub request_id: &'a str,
    pub key_id: &'a str,
    pub listener: &'a str,
    pub endpoint: &'a str,
    #[serde(flatten)]
    pub sent: Option<SentRef<'a>>,
}

/// Lines added to a segment and not yet written.
#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    /// The buffer the last group was written from, kept for the next.
    spare: Vec<u8>,
    /// Lines added so far (a line's ticket is this count once it is added).
    added: u64,
    /// A group is being written: the others wait for it rather than write theirs beside it.
    writing: bool,
}

thread_local! {
    /// Each thread encodes its lines here before adding them (`Segment::add`).
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A pending buffer past this is not kept for the next group (a burst of huge records).
const SPARE_KEPT: usize = 1 << 20;

pub(super) struct Segment {
    id: u64,
    path: PathBuf,
    file: File,
    /// `SEALED`, and the entries opened here and not yet closed.
    state: AtomicU64,
    bytes: AtomicU64,
    pending: Mutex<Pending>,
    /// Lines written so far (tickets up to this are in the kernel's hands).
    written: AtomicU64,
    /// Wakes those waiting while another wrote a group.
    group_written: tokio::sync::Notify,
}

impl Segment {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `line` at the end of the pending lines; returns its ticket. The line is encoded in
    /// the thread's own buffer first: the lock shared by every proxy thread is held for a copy
    /// only.
    fn add(&self, line: &LineRef<'_>) -> u64 {
        LINE.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            match line {
                LineRef::Open(o) => super::line::open(&mut buf, o),
                LineRef::Sent(o) => super::line::sent(&mut buf, o),
                LineRef::Close(r) => super::line::close(&mut buf, r),
            }
            buf.push(b'\n');
            let mut p = self.pending();
            p.lines.extend_from_slice(&buf);
            p.added += 1;
            let ticket = p.added;
            drop(p);
            // A huge record's buffer is not kept.
            if buf.capacity() > 64 * 1024 {
                *buf = Vec::new();
            }
            ticket
        })
    }

    /// Returns once the line of `ticket` is written: it yields first, so that the lines other
    /// requests add meanwhile go in the same write; then the first back writes them all.
    async fn durable(&self, ticket: u64, journal: &Journal) {
        if self.written.load(Ordering::Acquire) >= ticket {
            return;
        }
        tokio::task::yield_now().await;
        loop {
            if self.write_pending(ticket, journal) {
                return;
            }
            // Another thread is writing a group: it may hold this line. Registered before
            // looking again, so a group written meanwhile is not missed.
            let written = self.group_written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            if self.write_pending(ticket, journal) {
                return;
            }
            written.await;
        }
    }

    /// Writes the pending lines unless the line of `ticket` is written already; false while
    /// another caller writes a group.
    fn write_pending(&self, ticket: u64, journal: &Journal) -> bool {
        if self.written.load(Ordering::Acquire) >= ticket {
            return true;
        }
        let (lines, upto) = {
            let mut p = self.pending();
            if p.writing {
                return false;
            }
            if p.lines.is_empty() {
                return true;
            }
            p.writing = true;
            let spare = std::mem::take(&mut p.spare);
            (std::mem::replace(&mut p.lines, spare), p.added)
        };
        // One group is written at a time (`writing`); `bytes` also tells `rotate` the size.
        let at = self.bytes.fetch_add(lines.len() as u64, Ordering::Relaxed);
        if let Err(e) = self.file.write_all_at(&lines, at) {
            journal.failed("lines not written", &e);
        }
        journal.writes.fetch_add(1, Ordering::Relaxed);
        self.written.store(upto, Ordering::Release);
        {
            let mut p = self.pending();
            p.writing = false;
            if lines.capacity() <= SPARE_KEPT {
                let mut lines = lines;
                lines.clear();
                p.spare = lines;
            }
        }
        self.group_written.notify_waiters();
        true
    }

    /// Writes whatever is pending (the writer, before it syncs): a line whose request went
    /// away before writing it is not left in memory.
    fn write_all_pending(&self, journal: &Journal) {
        while !self.write_pending(u64::MAX, journal) {
            std::thread::yield_now();
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// A line added to an entry (`Entry::close_line`), to wait for.
#[must_use]
pub struct Added(u64);

/// An open entry: its record written (`preclose`) and queued, it drops, and the segment may go
/// once all its entries did.
pub struct Entry {
    segment: Arc<Segment>,
    journal: Arc<Journal>,
    /// The ticket of the entry's last line.
    ticket: u64,
}

impl Entry {
    /// Returns once the entry's lines are in the kernel's hands.
    pub async fn durable(&self) {
        self.segment.durable(self.ticket, &self.journal).await;
    }

    /// Adds what the request sends upstream (an entry opened before it was known), without
    /// waiting: it is written with the next group, or by `durable`.
    pub fn sent(&mut self, request_id: &str, sent: SentRef<'_>) {
        self.ticket = self
            .segment
            .add(&LineRef::Sent(SentLine { request_id, sent }));
    }

    /// Writes the request's record (the entry stays open until it drops, once the record is
    /// queued for the writer; written ahead of the request's end, a later line replaces it).
    pub async fn preclose(&mut self, record: &RecordRef<'_>) {
        let line = self.close_line(record);
        self.written(line).await;
    }

    /// Adds the request's record, without waiting: `written` waits for it (the record may
    /// borrow what holds the entry).
    pub fn close_line(&self, record: &RecordRef<'_>) -> Added {
        Added(self.segment.add(&LineRef::Close(record)))
    }

    /// Returns once `line`, and the entry's lines before it, are in the kernel's hands.
    pub async fn written(&mut self, line: Added) {
        self.ticket = line.0;
        self.durable().await;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.journal.release(&self.segment);
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("segment", &self.segment.id)
            .finish()
    }
}

pub struct Journal {
    dir: PathBuf,
    current: ArcSwap<Segment>,
    rotating: AtomicBool,
    /// Sealed segments whose entries are all closed, for the writer to remove.
    pub(super) done: Mutex<Vec<Arc<Segment>>>,
    failed_log: super::writer::LogGate,
    /// Appends that failed (a full disk): counted, logged once a second.
    pub failures: AtomicU64,
    /// Groups of lines written (one `pwrite(2)` each).
    pub writes: AtomicU64,
    /// Wakes the writer when a segment is done.
    wake: Mutex<Option<std::thread::Thread>>,
    /// Sealed segments to sync: each until its entries have all ended.
    unsynced: Mutex<Vec<Arc<Segment>>>,
    /// When the writer last synced, and the groups written by then.
    synced: Mutex<(std::time::Instant, u64)>,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("segment-{id:012}.jsonl"))
}

fn open_segment(dir: &Path, id: u64) -> std::io::Result<Segment> {
    let path = segment_path(dir, id);
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)?;
    // Sized ahead (sparse): lines written within the size change no file-system metadata.
    file.set_len(SEGMENT_BYTES * 2)?;
    Ok(Segment {
        id,
        path,
        file,
        state: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        pending: Mutex::default(),
        written: AtomicU64::new(0),
        group_written: tokio::sync::Notify::new(),
    })
}

/// The segments in `dir`, oldest first.
fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("segment-")?.strip_suffix(".jsonl"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(id) = id {
            out.push((id, path));
        }
    }
    out.sort();
    Ok(out)
}

impl Journal {
    /// Opens the journal in `dir` with a new segment (after `recover` read the old ones).
    pub fn open(dir: &Path) -> Result<Arc<Journal>, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("usage journal: creating {}: {e}", dir.display()))?;
        let next = segments(dir)
            .map_err(|e| format!("usage journal: reading {}: {e}", dir.display()))?
            .last()
            .map_or(0, |(id, _)| id + 1);
        let first = open_segment(dir, next)
            .map_err(|e| format!("usage journal: opening a segment in {}: {e}", dir.display()))?;
        Ok(Arc::new(Journal {
            dir: dir.to_path_buf(),
            current: ArcSwap::from_pointee(first),
            rotating: AtomicBool::new(false),
            done: Mutex::new(Vec::new()),
            failed_log: super::writer::LogGate::default(),
            failures: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            wake: Mutex::new(None),
            unsynced: Mutex::new(Vec::new()),
            synced: Mutex::new((std::time::Instant::now(), 0)),
        }))
    }

    pub(super) fn wake_with(&self, writer: std::thread::Thread) {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
    }

    fn failed(&self, what: &str, e: &std::io::Error) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.failed_log.allow() {
            tracing::error!(
                failures_total = n,
                dir = %self.dir.display(),
                "usage journal: {what}: {e}"
            );
        }
    }

    /// Opens an entry for a request that passed auth; its line is written once `durable`
    /// returns.
    pub fn open_entry(self: &Arc<Self>, opened: OpenedRef<'_>) -> Option<Entry> {
        let segment = loop {
            let segment = self.current.load_full();
            // Counted first: a segment sealed meanwhile is left alone (and its count given back).
            if segment.state.fetch_add(1, Ordering::AcqRel) & SEALED == 0 {
                break segment;
            }
            self.release(&segment);
        };
        let ticket = segment.add(&LineRef::Open(opened));
        if segment.bytes.load(Ordering::Relaxed) > SEGMENT_BYTES {
            self.rotate(&segment);
        }
        Some(Entry {
            segment,
            journal: Arc::clone(self),
            ticket,
        })
    }

    /// An entry of `segment` ended: the last of a sealed one hands it to the writer.
    fn release(&self, segment: &Arc<Segment>) {
        if segment.state.fetch_sub(1, Ordering::AcqRel) == SEALED + 1 {
            self.done_with(segment);
        }
    }

    fn done_with(&self, segment: &Arc<Segment>) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(segment));
        if let Some(t) = self.wake.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            t.unpark();
        }
    }

    /// Starts a new segment and seals `full` (one caller at a time; the others go on).
    fn rotate(&self, full: &Arc<Segment>) {
        if self.rotating.swap(true, Ordering::AcqRel) {
            return;
        }
        if Arc::ptr_eq(&self.current.load(), full) {
            match open_segment(&self.dir, full.id + 1) {
                Ok(next) => {
                    self.current.store(Arc::new(next));
                    self.unsynced
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::clone(full));
                    if full.state.fetch_or(SEALED, Ordering::AcqRel) == 0 {
                        self.done_with(full);
                    }
                }
                Err(e) => self.failed("a new segment not opened", &e),
            }
        }
        self.rotating.store(false, Ordering::Release);
    }

    /// How long until the lines written since the last sync are due to be synced; None when
    /// there are none.
    pub(super) fn sync_due_in(&self) -> Option<std::time::Duration> {
        let (at, writes) = *self.synced.lock().unwrap_or_else(|e| e.into_inner());
        // (A sealed segment's lines, as every line, count in `writes` once written.)
        let dirty = self.writes.load(Ordering::Relaxed) != writes
            || !self.current.load().pending().lines.is_empty();
        dirty.then(|| SYNC_EVERY.saturating_sub(at.elapsed()))
    }

    /// Syncs the segments written since the last sync to disk, once that was `SYNC_EVERY` ago
    /// (the writer, on its rounds, whether or not its batches commit).
    pub(super) fn sync(&self) {
        if self.sync_due_in() == Some(std::time::Duration::ZERO) {
            self.sync_now();
        }
    }

    /// Writes what is pending and syncs every segment that may have been written since the
    /// last sync: the current one, and each sealed one until its entries have all ended.
    pub(super) fn sync_now(&self) {
        let sealed = std::mem::take(&mut *self.unsynced.lock().unwrap_or_else(|e| e.into_inner()));
        // Looked at before the syncs: one with entries still open may get lines after them
        // (their records), and is synced again next time.
        let open: Vec<Arc<Segment>> = sealed
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) & !SEALED != 0)
            .cloned()
            .collect();
        let all: Vec<Arc<Segment>> = sealed
            .into_iter()
            .chain(std::iter::once(self.current.load_full()))
            .collect();
        for s in &all {
            s.write_all_pending(self);
        }
        // Every group counted here was written before the syncs below start.
        let writes = self.writes.load(Ordering::Relaxed);
        *self.synced.lock().unwrap_or_else(|e| e.into_inner()) =
            (std::time::Instant::now(), writes);
        for s in &all {
            if let Err(e) = s.file.sync_data() {
                self.failed("not synced", &e);
            }
        }
        self.unsynced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(open);
    }

    /// Sealed segments whose entries are all closed.
    pub(super) fn take_done(&self) -> Vec<Arc<Segment>> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// At a clean stop, with every record committed: the current segment goes too.
    pub(super) fn remove_all(&self) {
        let current = self.current.load_full();
        if current.state.load(Ordering::Acquire) & !SEALED == 0 {
            let _ = std::fs::remove_file(&current.path);
        }
        for s in self.take_done() {
            let _ = std::fs::remove_file(&s.path);
        }
    }
}

/// The records a journal in `dir` holds (left by a process that did not stop cleanly): each
/// closed entry's record, and for each entry left open a record of the request cut by the
/// crash. Returns them with the segments they came from (to remove once they are safe).
pub fn recover(dir: &Path) -> Result<(Vec<UsageRecord>, Vec<PathBuf>), String> {
    let found = match segments(dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(format!("usage journal: reading {}: {e}", dir.display())),
    };
    let mut open: indexmap_lite::Ordered = indexmap_lite::Ordered::default();
    let mut records: Vec<UsageRecord> = Vec::new();
    // A request closed twice (its record written before its reply's last byte, then again
    // when that write failed) keeps its last.
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut paths = Vec::new();
    for (_, path) in found {
        let f = File::open(&path)
            .map_err(|e| format!("usage journal: opening {}: {e}", path.display()))?;
        for line in std::io::BufReader::new(f).split(b'\n') {
            let line =
                line.map_err(|e| format!("usage journal: reading {}: {e}", path.display()))?;
            // Zeros are room never written (reserved by a line the crash cut, or past the end).
            let Some(start) = line.iter().position(|b| *b != 0) else {
                continue;
            };
            // A line torn by the crash is skipped (its request's other line decides).
            match serde_json::from_slice::<Line>(&line[start..]) {
                Ok(Line::Open(o)) => {
                    let sent = o.model.clone().map(|model| Sent {
                        request_id: o.request_id.clone(),
                        model,
                        stream: o.stream,
                        prompt_tokens: o.prompt_tokens,
                        cost: o.cost,
                    });
                    open.insert(o, sent);
                }
                Ok(Line::Sent(s)) => open.sent(s),
                Ok(Line::Close(r)) => {
                    open.remove(&r.request_id);
                    match at.get(&r.request_id) {
                        Some(&i) => records[i] = *r,
                        None => {
                            at.insert(r.request_id.clone(), records.len());
                            records.push(*r);
                        }
                    }
                }
                Err(_) => {}
            }
        }
        paths.push(path);
    }
    records.extend(open.into_values().map(crashed));
    Ok((records, paths))
}

/// The record of a request the crash ended: what was known when it passed auth and, if it
/// went upstream, its model and prompt (estimated from its size, and billed: the provider
/// had it), no output (estimated: none was counted); status 500, cut by the crash.
fn crashed((o, sent): (Opened, Option<Sent>)) -> UsageRecord {
    let sent = sent.unwrap_or_default();
    UsageRecord {
        time_ms: o.time_ms,
        request_id: o.request_id,
        key_id: o.key_id,
        listener: o.listener,
        endpoint: o.endpoint,
        model: sent.model,
        stream: sent.stream,
        prompt_tokens: sent.prompt_tokens,
        total_tokens: sent.prompt_tokens,
        cost: sent.cost,
        status: 500,
        estimated: true,
        cut: "crash".into(),
        ..UsageRecord::default()
    }
}

/// Entries left open, in the order they were opened.
mod indexmap_lite {
    use std::collections::HashMap;

    use super::{Opened, Sent};

    #[derive(Default)]
    pub struct Ordered {
        seq: u64,
        by_id: HashMap<String, (u64, Opened, Option<Sent>)>,
    }

    impl Ordered {
        pub fn insert(&mut self, o: Opened, sent: Option<Sent>) {
            self.seq += 1;
            self.by_id.insert(o.request_id.clone(), (self.seq, o, sent));
        }

        /// What an open entry's request sent upstream.
        pub fn sent(&mut self, s: Sent) {
            if let Some(e) = self.by_id.get_mut(&s.request_id) {
                e.2 = Some(s);
            }
        }

        pub fn remove(&mut self, id: &str) {
            self.by_id.remove(id);
        }

        pub fn into_values(self) -> impl Iterator<Item = (Opened, Option<Sent>)> {
            let mut v: Vec<(u64, Opened, Option<Sent>)> = self.by_id.into_values().collect();
            v.sort_by_key(|(seq, ..)| *seq);
            v.into_iter().map(|(_, o, s)| (o, s))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn opened(id: &str) -> OpenedRef<'_> {
        OpenedRef {
            time_ms: 1,
            request_id: id,
            key_id: "k",
            listener: "main",
            endpoint: "chat",
            sent: None,
        }
    }

    /// Requests a thread runs together share a write, and each goes on only once its own line
    /// is in the file: a crash then leaves a record of each (cut by the crash).
    #[test]
    fn lines_added_together_go_in_one_write_and_each_is_written_before_its_request_goes_on() {
        let dir = tempfile::tempdir().expect("tmp");
        let journal = Journal::open(dir.path()).expect("open");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let ids: Vec<String> = (0..100).map(|i| format!("req_{i}")).collect();
        rt.block_on(async {
            let tasks: Vec<_> = ids
                .iter()
                .map(|id| {
                    let entry = journal.open_entry(opened(id)).expect("entry");
                    let journal = Arc::clone(&journal);
                    let id = id.clone();
                    // A test's own tasks.
                    #[allow(clippy::disallowed_methods)]
                    tokio::spawn(async move {
                        entry.durable().await;
                        // Its line is in the file now, whatever the others do.
                        let segment = journal.current.load_full();
                        let mut text = vec![0; segment.bytes.load(Ordering::Relaxed) as usize];
                        File::open(&segment.path)
                            .and_then(|f| f.read_exact_at(&mut text, 0))
                            .expect("read");
                        let line = format!("\"request_id\":\"{id}\",");
                        let text = String::from_utf8_lossy(&text);
                        assert!(text.contains(&line), "{id}");
                        entry
                    })
                })
                .collect();
            for t in tasks {
                drop(t.await.expect("task"));
            }
        });
        let writes = journal.writes.load(Ordering::Relaxed);
        assert!((1..10).contains(&writes), "{writes} writes for 100 lines");
        let (records, _) = recover(dir.path()).expect("recover");
        assert_eq!(records.len(), 100);
        assert!(records.iter().all(|r| r.cut == "crash"));
    }

    /// A record written ahead of the end replaces the entry; the writer's sync writes a line
    /// whose request went away before writing it.
    #[test]
    fn a_closed_entry_leaves_its_record_and_sync_writes_what_is_pending() {
        let dir = tempfile::tempdir().expect("tmp");
        let journal = Journal::open(dir.path()).expect("open");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let mut closed = journal.open_entry(opened("req_closed")).expect("entry");
        let record = UsageRecord {
            request_id: "req_closed".into(),
            status: 200,
            completion_tokens: 7,
            ..UsageRecord::default()
        };
        rt.block_on(closed.preclose(&record.borrowed()));
        // Added, never awaited: only the sync writes it.
        let _gone = journal.open_entry(opened("req_gone")).expect("entry");
        let (records, _) = recover(dir.path()).expect("recover");
        assert_eq!(records.len(), 1, "{records:?}");
        journal.synced.lock().expect("lock").0 -= SYNC_EVERY;
        journal.sync();
        let (records, _) = recover(dir.path()).expect("recover");
        let by_id = |id: &str| records.iter().find(|r| r.request_id == id).cloned();
        assert_eq!(by_id("req_closed").map(|r| r.completion_tokens), Some(7));
        assert_eq!(by_id("req_gone").map(|r| r.cut), Some("crash".to_string()));
    }

    /// A request the crash ended after it went upstream is billed its prompt, estimated.
    #[test]
    fn a_request_sent_upstream_is_billed_its_prompt_when_the_crash_ends_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let journal = Journal::open(dir.path()).expect("open");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let mut sent = journal.open_entry(opened("req_sent")).expect("entry");
        let what = SentRef {
            model: "gpt-x",
            stream: true,
            prompt_tokens: 40,
            cost: 0.25,
        };
        sent.sent("req_sent", what);
        // Opened as it goes: one line.
        let as_it_goes = journal
            .open_entry(OpenedRef {
                sent: Some(what),
                ..opened("req_as_it_goes")
            })
            .expect("entry");
        rt.block_on(as_it_goes.durable());
        let waiting = journal.open_entry(opened("req_waiting")).expect("entry");
        rt.block_on(sent.durable());
        rt.block_on(waiting.durable());
        let (records, _) = recover(dir.path()).expect("recover");
        let by_id = |id: &str| records.iter().find(|r| r.request_id == id).cloned();
        for id in ["req_sent", "req_as_it_goes"] {
            let r = by_id(id).expect("record");
            assert_eq!(
                (r.model.as_str(), r.stream, r.prompt_tokens, r.cost),
                ("gpt-x", true, 40, 0.25)
            );
            assert_eq!(r.total_tokens, 40);
            assert_eq!(
                (r.cut.as_str(), r.estimated, r.status),
                ("crash", true, 500)
            );
        }
        let r = by_id("req_waiting").expect("record");
        assert_eq!((r.prompt_tokens, r.cost, r.model.as_str()), (0, 0.0, ""));
    }
}
