//! Store stage, the spool: where records wait on local disk while a database server is away
//! (unreachable, restarting), so the writer keeps taking records with memory flat and none is
//! lost, also across a restart of the gateway. One JSON line per record, appended and synced
//! by the writer thread alone; replayed from the front in batches once the server answers, and
//! removed when all of it is in. A replay cut short (a crash) starts again from the front: the
//! engine skips request ids it already has, so nothing counts twice.

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
    pub fn new(path: PathBuf) -> Spool {
        Spool {
            path,
            read_at: 0,
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
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io_err("creating its folder", dir, e))?;
        }
        let mut buf = Vec::with_capacity(records.len() * 320);
        for r in records {
            serde_json::to_writer(&mut buf, r)
                .map_err(|e| format!("usage spool: encoding a record: {e}"))?;
            buf.push(b'\n');
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| io_err("opening", &self.path, e))?;
        f.write_all(&buf)
            .and_then(|()| f.sync_data())
            .map_err(|e| io_err("writing", &self.path, e))
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

    /// Everything before `offset` is committed; when that is all of it, the file goes.
    pub fn consumed(&mut self, offset: u64) -> Result<(), String> {
        self.read_at = offset;
        let len = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        if self.read_at >= len {
            match std::fs::remove_file(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &self.path, e)),
            }
            self.read_at = 0;
        }
        Ok(())
    }
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
        // A restart reads from the front again (the engine skips what it has).
        let mut again = Spool::new(path.clone());
        assert_eq!(again.read(100).unwrap().0, recs);
        let (rest, at) = s.read(100).unwrap();
        assert_eq!(rest, recs[4..]);
        s.consumed(at).unwrap();
        assert!(!path.exists() && s.is_empty());
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
