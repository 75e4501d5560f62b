//! The translation of one reply: the provider's API read (a stream event by event, a plain
//! reply once whole) into neutral events, written out in the client's API as they come.

use bytes::Bytes;
use pingora_http::ResponseHeader;

use super::ir::{Collect, Conversation, Event, Reply};
use super::{Api, Plan, chat_reply, errors, messages_reply, responses_reply, sse};

/// Reads the provider's stream.
#[derive(Debug)]
enum Decoder {
    Messages(messages_reply::StreamIn),
    Chat(chat_reply::StreamIn),
}

impl Decoder {
    fn event(&mut self, data: &[u8], out: &mut Vec<Event>) {
        match self {
            Decoder::Messages(d) => d.event(data, out),
            Decoder::Chat(d) => d.event(data, out),
        }
    }
}

/// Writes the client's stream.
#[derive(Debug)]
enum Encoder {
    Chat(chat_reply::StreamOut),
    Messages(messages_reply::StreamOut),
    Responses(responses_reply::StreamOut),
}

/// The reply's body as it is read.
#[derive(Debug)]
enum Body {
    /// Before the header.
    Unknown,
    /// Events, read as they come.
    Events {
        reader: sse::Reader,
        decoder: Decoder,
    },
    /// A plain reply, held until whole.
    Whole(Vec<u8>),
}

/// The translation of one reply: it reads the provider's and writes the client's API.
#[derive(Debug)]
pub struct Translation {
    plan: Plan,
    /// The client asked for a stream.
    stream: bool,
    body: Body,
    out: Encoder,
    /// A stream read for a client that asked for a plain reply.
    collect: Collect,
    created: u64,
    /// The request's tool namespaces (Responses API).
    namespaces: std::sync::Arc<responses_reply::ToolNames>,
    /// The tools offered that the provider cannot run, left out (`x-modelgate-tools-dropped`).
    dropped: String,
    /// The request fields left out (`x-modelgate-params-dropped`).
    params_dropped: String,
}

/// The largest plain reply translated.
const MAX_WHOLE: usize = 64 * 1024 * 1024;

impl Translation {
    pub(super) fn new(plan: Plan, c: &Conversation) -> Translation {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let names = std::sync::Arc::new(responses_reply::ToolNames {
            namespaces: c.namespaces.clone(),
            free_form: c.free_form.clone(),
        });
        let out = match plan.from {
            Api::Messages => Encoder::Messages(messages_reply::StreamOut::default()),
            Api::Responses => {
                Encoder::Responses(responses_reply::StreamOut::new(created, names.clone()))
            }
            _ => Encoder::Chat(chat_reply::StreamOut::new(created, c.include_usage)),
        };
        Translation {
            plan,
            stream: c.stream,
            body: Body::Unknown,
            out,
            collect: Collect::default(),
            created,
            namespaces: names,
            dropped: c.dropped.join(", "),
            params_dropped: c.refused.join(", "),
        }
    }

    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// A success's header: what its body will be, in the client's API.
    pub fn on_header(&mut self, resp: &mut ResponseHeader) -> pingora_error::Result<()> {
        let events = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        self.body = if events {
            let decoder = match self.plan.to {
                Api::Messages => Decoder::Messages(messages_reply::StreamIn::default()),
                _ => Decoder::Chat(chat_reply::StreamIn::default()),
            };
            Body::Events {
                reader: sse::Reader::default(),
                decoder,
            }
        } else {
            Body::Whole(Vec::new())
        };
        let content_type = if self.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        resp.insert_header(http::header::CONTENT_TYPE, content_type)?;
        if self.stream {
            resp.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
        }
        if !self.dropped.is_empty() {
            resp.insert_header("x-modelgate-tools-dropped", self.dropped.as_str())?;
        }
        if !self.params_dropped.is_empty() {
            resp.insert_header("x-modelgate-params-dropped", self.params_dropped.as_str())?;
        }
        // Its length changes; and what is translated is the decoded body.
        resp.remove_header(&http::header::CONTENT_LENGTH);
        resp.remove_header(&http::header::CONTENT_ENCODING);
        Ok(())
    }

    /// The provider's whole reply, read.
    fn read_whole(&self, body: &[u8]) -> Option<Reply> {
        match self.plan.to {
            Api::Messages => messages_reply::read_reply(body),
            _ => chat_reply::read_reply(body),
        }
    }

    /// The events of one piece of the provider's body.
    fn read(&mut self, piece: Option<&[u8]>, end: bool) -> Vec<Event> {
        let mut events = Vec::new();
        let whole = match &mut self.body {
            Body::Events { reader, decoder } => {
                let mut read = Vec::new();
                if let Some(p) = piece {
                    if reader.feed(p, &mut read).is_err() {
                        events.push(too_large());
                    }
                }
                if end {
                    reader.finish(&mut read);
                }
                for e in read {
                    decoder.event(&e.data, &mut events);
                }
                return events;
            }
            Body::Whole(buf) => {
                if let Some(p) = piece {
                    buf.extend_from_slice(p);
                }
                if buf.len() > MAX_WHOLE {
                    buf.clear();
                    return vec![too_large()];
                }
                if !end {
                    return events;
                }
                std::mem::take(buf)
            }
            Body::Unknown => return events,
        };
        match self.read_whole(&whole) {
            Some(r) => r.events(),
            None => vec![Event::Error {
                kind: "api_error".into(),
                message: "The provider's reply could not be read.".into(),
            }],
        }
    }

    /// One piece of the provider's body: the client's bytes in its place.
    pub fn feed(&mut self, piece: Option<&[u8]>, end: bool) -> Bytes {
        let events = self.read(piece, end);
        let mut out = Vec::new();
        for e in events {
            match (&mut self.out, self.stream) {
                (Encoder::Chat(w), true) => w.event(e, &mut out),
                (Encoder::Messages(w), true) => w.event(e, &mut out),
                (Encoder::Responses(w), true) => w.event(e, &mut out),
                (_, false) => self.collect.push(e),
            }
        }
        if !self.stream && end {
            out = self.write_whole();
        }
        Bytes::from(out)
    }

    /// The reply collected, in the client's API (or the error that ended it).
    fn write_whole(&mut self) -> Vec<u8> {
        let error = self.collect.error.take();
        match (&self.out, error) {
            (Encoder::Chat(_) | Encoder::Responses(_), Some((kind, message))) => {
                errors::openai_error(&kind, &message)
                    .to_string()
                    .into_bytes()
            }
            (Encoder::Messages(_), Some((kind, message))) => serde_json::json!({
                "type": "error",
                "error": {"type": errors::anthropic_kind(&kind), "message": message},
            })
            .to_string()
            .into_bytes(),
            (Encoder::Chat(_), None) => chat_reply::write_reply(&self.collect.reply, self.created),
            (Encoder::Messages(_), None) => messages_reply::write_reply(&self.collect.reply),
            (Encoder::Responses(_), None) => {
                responses_reply::write_reply(&self.collect.reply, self.created, &self.namespaces)
            }
        }
    }

    /// An error reply from the provider, in the client's shape: its status and body.
    pub fn error(&self, status: u16, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        match (self.plan.from, self.plan.to) {
            (Api::Messages, _) => Some((status, errors::openai_to_anthropic(status, body)?)),
            (_, Api::Messages) => Some((
                errors::openai_status(status),
                errors::anthropic_to_openai(body)?,
            )),
            _ => None,
        }
    }
}

fn too_large() -> Event {
    Event::Error {
        kind: "api_error".into(),
        message: "The provider's reply is too large to translate.".into(),
    }
}
