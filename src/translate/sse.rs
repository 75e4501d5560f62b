//! Server-sent events read as they come (split at any byte) and written. Only what the model
//! APIs use: `event:` and `data:` fields (several `data:` lines joined by a newline), comments
//! and other fields skipped, any of the three line ends.

/// One event: its name (`event:`, empty when none) and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub name: String,
    pub data: Vec<u8>,
}

/// The largest event held while it is incomplete: past it the stream is not one the
/// gateway translates.
pub const MAX_EVENT: usize = 16 * 1024 * 1024;

/// An event larger than `MAX_EVENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

#[derive(Debug, Default)]
pub struct Reader {
    /// The unfinished line.
    line: Vec<u8>,
    name: String,
    data: Vec<u8>,
    has_data: bool,
    /// A `\r` ended the last piece: a `\n` starting the next one is the same line end.
    after_cr: bool,
}

impl Reader {
    /// Feeds one piece; complete events go to `out`. Err: an event past `MAX_EVENT`.
    pub fn feed(&mut self, piece: &[u8], out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        let mut rest = piece;
        if self.after_cr {
            self.after_cr = false;
            rest = rest.strip_prefix(b"\n").unwrap_or(rest);
        }
        while let Some(at) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (line, tail) = rest.split_at(at);
            self.line.extend_from_slice(line);
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out);
            rest = &tail[1..];
            if tail[0] == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.after_cr = true,
                    _ => {}
                }
            }
        }
        self.line.extend_from_slice(rest);
        if self.line.len() + self.data.len() > MAX_EVENT {
            return Err(TooLarge);
        }
        Ok(())
    }

    /// The stream ended: an event missing only its blank line counts.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out);
        }
        self.line_done(b"", out);
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    name: std::mem::take(&mut self.name),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.name.clear();
            self.has_data = false;
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(0) => return, // a comment
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => self.name = String::from_utf8_lossy(value).into_owned(),
            _ => {}
        }
    }
}

/// Writes one event (`event:` only when named).
pub fn write(out: &mut Vec<u8>, name: Option<&str>, data: &[u8]) {
    if let Some(n) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut r = Reader::default();
        let mut out = Vec::new();
        for p in pieces {
            r.feed(p, &mut out).expect("within bounds");
        }
        r.finish(&mut out);
        out
    }

    #[test]
    fn events_split_at_any_byte_read_the_same() {
        let stream = b"event: message_start\r\ndata: {\"a\":1}\r\n\r\n: ping\n\nevent: x\ndata: 1\ndata: 2\n\ndata: [DONE]";
        let whole = read_all(&[stream]);
        assert_eq!(
            whole,
            vec![
                SseEvent {
                    name: "message_start".into(),
                    data: b"{\"a\":1}".to_vec()
                },
                SseEvent {
                    name: "x".into(),
                    data: b"1\n2".to_vec()
                },
                SseEvent {
                    name: String::new(),
                    data: b"[DONE]".to_vec()
                },
            ]
        );
        for at in 0..stream.len() {
            let (a, b) = stream.split_at(at);
            assert_eq!(read_all(&[a, b]), whole, "split at {at}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(read_all(&bytes), whole);
    }

    #[test]
    fn an_event_past_the_bound_is_refused() {
        let mut r = Reader::default();
        let mut out = Vec::new();
        let big = vec![b'x'; MAX_EVENT + 1];
        assert!(r.feed(b"data: ", &mut out).is_ok());
        assert!(r.feed(&big, &mut out).is_err());
    }
}
