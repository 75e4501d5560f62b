//! Store stage, the spool: where records wait on local disk while a database server is away
//! (unreachable, restarting), so the writer keeps taking records with memory flat and none is
//! lost, also across a restart of the gateway. One JSON line per record, appended and synced
//! by the writer thread alone; replayed from the front in batches once the server answers, and
//! removed when all of it is in. How far the replay got is kept beside it (`<spool>.done`,
//! written after each batch commits), so a restart mid-replay goes on from there instead of
//! writing those records (and their spend) twice. A crash between a batch's commit and that
//! note replays the batch again: the engine skips records it already has.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::record::UsageRecord;

pub(super) struct Spool {
    path: PathBuf,
    /// Byte offset of the first record not yet committed.
    read_at: u64,
    /// Lines that did not parse (a torn last line after a power cut), skipped.
    pub skipped: u64,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("usage spool {}: {what}: {e}", path.display())
}

impl Spool {
    /// The spool at `path`, read from where an earlier replay left off.
    pub fn new(path: PathBuf) -> Spool {
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        let read_at = std::fs::read_to_string(done_path(&path))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|at| *at <= len)
            .unwrap_or(0);
        Spool {
            path,
            read_at,
            skipped: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written and not yet replayed (0 when there is no file).
    pub fn pending_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len().saturating_sub(self.read_at))
    }

    pub fn is_empty(&self) -> bool {
        self.pending_bytes() == 0
    }

    /// Appends `records` and syncs them to disk before returning.
    pub fn append(&mut self, records: &[UsageRecord]) -> Result<(), String> {
        self.append_within(records, u64::MAX).map(|_| ())
    }

    /// `append` of the first records whose lines fit in `room` bytes; returns how many.
    pub fn append_within(&mut self, records: &[UsageRecord], room: u64) -> Result<usize, String> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io_err("creating its folder", dir, e))?;
        }
        if !self.path.exists() {
            // A new spool is read from its front: a note left from one removed by hand would
            // skip its first records.
            let _ = std::fs::remove_file(done_path(&self.path));
            self.read_at = 0;
        }
        let mut buf = Vec::with_capacity(records.len() * 320);
        let mut fit = 0;
        for r in records {
            let at = buf.len();
            serde_json::to_writer(&mut buf, r)
                .map_err(|e| format!("usage spool: encoding a record: {e}"))?;
            buf.push(b'\n');
            if buf.len() as u64 > room {
                buf.truncate(at);
                break;
            }
            fit += 1;
        }
        if fit == 0 {
            return Ok(0);
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| io_err("opening", &self.path, e))?;
        let before = f
            .metadata()
            .map_err(|e| io_err("reading", &self.path, e))?
            .len();
        if let Err(e) = f.write_all(&buf).and_then(|()| f.sync_data()) {
            // A part written (a full disk) goes: the batch waits elsewhere, whole.
            let _ = f.set_len(before);
            return Err(io_err("writing", &self.path, e));
        }
        Ok(fit)
    }

    /// Up to `max` records from the front, and the offset just past them (pass it to
    /// `consumed` once they are committed).
    pub fn read(&mut self, max: usize) -> Result<(Vec<UsageRecord>, u64), String> {
        let f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Vec::new(), self.read_at));
            }
            Err(e) => return Err(io_err("opening", &self.path, e)),
        };
        let mut r = BufReader::new(f);
        r.seek(SeekFrom::Start(self.read_at))
            .map_err(|e| io_err("seeking", &self.path, e))?;
        let mut out = Vec::with_capacity(max.min(4_096));
        let mut at = self.read_at;
        let mut line = Vec::new();
        while out.len() < max {
            line.clear();
            let n = r
                .read_until(b'\n', &mut line)
                .map_err(|e| io_err("reading", &self.path, e))?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                // A line still being written cannot be: only this thread writes. A torn tail
                // (a power cut mid-append) is skipped.
                at += n as u64;
                self.skipped += 1;
                break;
            }
            at += n as u64;
            match serde_json::from_slice::<UsageRecord>(&line) {
                Ok(rec) => out.push(rec),
                Err(e) => {
                    self.skipped += 1;
                    tracing::error!("usage spool {}: a line skipped: {e}", self.path.display());
                }
            }
        }
        Ok((out, at))
    }

    /// The cost per key of the records waiting (for the spend at start: they are not in the
    /// database's totals until they are replayed), less those `stored` says are in already
    /// (a crash between a batch's commit and the note of it).
    pub fn pending_costs(
        &mut self,
        mut stored: impl FnMut(&[UsageRecord]) -> Vec<UsageRecord>,
    ) -> Result<std::collections::HashMap<String, f64>, String> {
        let start = self.read_at;
        let mut costs = std::collections::HashMap::new();
        loop {
            let (records, next) = self.read(4_096)?;
            for r in &stored(&records) {
                *costs.entry(r.key_id.clone()).or_insert(0.0) += r.cost;
            }
            if next == self.read_at {
                break;
            }
            self.read_at = next;
        }
        self.read_at = start;
        Ok(costs)
    }

    /// Everything before `offset` is committed; when that is all of it, the file goes.
    pub fn consumed(&mut self, offset: u64) -> Result<(), String> {
        self.read_at = offset;
        let len = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let done = done_path(&self.path);
        if self.read_at >= len {
            // The note first: a spool started after a crash here is never read from a stale
            // offset (the old spool would be replayed whole, its records skipped).
            for path in [&done, &self.path] {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("removing", path, e)),
                }
            }
            self.read_at = 0;
            return Ok(());
        }
        let tmp = done.with_extension("done.tmp");
        std::fs::write(&tmp, self.read_at.to_string())
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &done))
            .map_err(|e| io_err("noting the replay's progress", &done, e))
    }
}

/// Where the replay's progress is noted: `<spool>.done`.
fn done_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".done");
    PathBuf::from(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::sqlite::sample_record;

    #[test]
    fn records_come_back_in_order_across_reopening_and_the_file_goes_when_all_are_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/spool.jsonl");
        let mut s = Spool::new(path.clone());
        assert!(s.is_empty());
        let recs: Vec<_> = (0..10).map(|i| sample_record(i, "k", i as i64)).collect();
        s.append(&recs[..6]).unwrap();
        s.append(&recs[6..]).unwrap();
        let (first, at) = s.read(4).unwrap();
        assert_eq!(first, recs[..4]);
        s.consumed(at).unwrap();
        // A restart goes on where the replay got to, and counts only what waits.
        let mut again = Spool::new(path.clone());
        let costs = again.pending_costs(<[UsageRecord]>::to_vec).unwrap();
        let want: f64 = recs[4..].iter().map(|r| r.cost).sum();
        assert!((costs["k"] - want).abs() < 1e-9, "{costs:?}");
        assert_eq!(again.read(100).unwrap().0, recs[4..]);
        let (rest, at) = s.read(100).unwrap();
        assert_eq!(rest, recs[4..]);
        s.consumed(at).unwrap();
        assert!(!path.exists() && s.is_empty());
        assert!(!done_path(&path).exists());
        // A new spool begins at its front.
        s.append(&recs[..2]).unwrap();
        assert_eq!(Spool::new(path.clone()).read(100).unwrap().0, recs[..2]);
        // Also after a spool removed by hand mid-replay, its note left behind.
        let (_, at) = s.read(1).unwrap();
        s.consumed(at).unwrap();
        assert!(done_path(&path).exists());
        std::fs::remove_file(&path).unwrap();
        let mut s = Spool::new(path.clone());
        s.append(&recs[..3]).unwrap();
        assert_eq!(Spool::new(path.clone()).read(100).unwrap().0, recs[..3]);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.jsonl");
        let mut s = Spool::new(path.clone());
        let recs: Vec<_> = (0..3).map(|i| sample_record(i, "k", i as i64)).collect();
        s.append(&recs).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"time_ms\":1,\"requ").unwrap();
        let (got, at) = s.read(100).unwrap();
        assert_eq!(got, recs);
        assert_eq!(s.skipped, 1);
        s.consumed(at).unwrap();
        assert!(!path.exists());
    }
}
