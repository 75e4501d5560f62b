//! The neutral form every API is read into and written from: a conversation (the request), a
//! reply, and the events of a streamed reply. Each API's module reads its own shape into these
//! and writes these into its own shape, so N inbound APIs and M provider APIs need N + M
//! readers and writers, not N × M translations.

use serde_json::Value;

/// A request: what every chat-like API asks for, in one shape.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Conversation {
    /// System and developer instructions, in order.
    pub system: Vec<Part>,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    /// False: at most one tool call a turn.
    pub parallel_tool_calls: Option<bool>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// The client wants the usage (a chat stream's last event).
    pub include_usage: bool,
    pub reasoning: Option<Reasoning>,
    /// The reply must be JSON matching this schema (structured output).
    pub json_schema: Option<Value>,
    /// An end-user id for the provider's abuse checks.
    pub user: Option<String>,
    /// Tools the client offered that only its own API's provider runs (a hosted web search):
    /// left out, and named to the client in the reply's `x-modelgate-tools-dropped`.
    pub dropped: Vec<String>,
    /// Request fields the provider has no equivalent of: refused, or left out where the pool's
    /// `drop_params` names them (and named in the reply's `x-modelgate-params-dropped`).
    pub refused: Vec<&'static str>,
    /// The Responses API's tool namespaces (their functions go as `namespace__function`).
    pub namespaces: Vec<String>,
    /// The Responses API's free-form (`custom`) tools, by the name the provider sees: a
    /// function of one string, `input`.
    pub free_form: Vec<String>,
}

impl Conversation {
    /// Adds a turn; one of the same role as the last is merged into it (the providers take
    /// alternating turns).
    pub fn push(&mut self, role: Role, parts: Vec<Part>) {
        match self.messages.last_mut() {
            Some(last) if last.role == role => last.parts.extend(parts),
            _ => self.messages.push(Message { role, parts }),
        }
    }
}

/// How much the model may think before it answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reasoning {
    /// OpenAI's `reasoning_effort` / `reasoning.effort`.
    Effort(String),
    /// A token budget (Anthropic's `thinking.budget_tokens`).
    Budget(u64),
    /// Thinking off.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// One piece of a message, a system prompt or a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// `cache`: the prompt is cached up to here (Anthropic's `cache_control`).
    Text {
        text: String,
        cache: bool,
    },
    Image {
        source: Source,
        cache: bool,
    },
    /// A PDF or other document, as data.
    Document {
        source: Source,
        cache: bool,
    },
    /// A call the model made; `arguments` is the JSON text of its input.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// A tool's answer to call `id`.
    ToolResult {
        id: String,
        content: Vec<Part>,
        is_error: bool,
    },
    /// The model's reasoning, with the provider's signature of it (sent back on the next turn).
    Thinking {
        text: String,
        signature: Option<String>,
    },
    /// Reasoning the provider keeps encrypted.
    RedactedThinking {
        data: String,
    },
}

/// Where an image's or document's bytes are.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Url(String),
    Base64 { media_type: String, data: String },
}

impl Source {
    /// A `data:` URL as its media type and base64 data; any other URL as a URL.
    pub fn from_url(url: &str) -> Source {
        let parsed = url.strip_prefix("data:").and_then(|rest| {
            let (meta, data) = rest.split_once(',')?;
            let media_type = meta.strip_suffix(";base64")?;
            Some(Source::Base64 {
                media_type: media_type.to_string(),
                data: data.to_string(),
            })
        });
        parsed.unwrap_or_else(|| Source::Url(url.to_string()))
    }

    /// As a URL (`data:` for inline bytes).
    pub fn to_url(&self) -> String {
        match self {
            Source::Url(u) => u.clone(),
            Source::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its input.
    pub schema: Value,
    pub cache: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some tool must be called.
    Required,
    Named(String),
}

/// Why a reply ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Stop {
    #[default]
    End,
    MaxTokens,
    /// One of the request's stop sequences (which one, when the provider says).
    StopSequence(Option<String>),
    ToolUse,
    /// The provider refused or filtered the content.
    Refusal,
    /// A long turn paused by the provider, to be continued.
    Pause,
}

/// Token counts, each token in exactly one of them: `input` excludes the cached and
/// cache-write tokens; `output` includes reasoning (`reasoning` says how much of it was).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: Option<u64>,
}

impl Usage {
    /// All prompt tokens (OpenAI's `prompt_tokens`).
    pub fn prompt(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// A whole reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    pub id: String,
    pub model: String,
    pub parts: Vec<Part>,
    pub stop: Stop,
    pub usage: Usage,
}

/// What a streamed reply says, in order. A content block (`index`) starts, grows and stops;
/// blocks do not overlap in the providers translated here.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Start {
        id: String,
        model: String,
    },
    TextStart {
        index: usize,
    },
    Text {
        index: usize,
        text: String,
    },
    ThinkingStart {
        index: usize,
    },
    Thinking {
        index: usize,
        text: String,
    },
    Signature {
        index: usize,
        signature: String,
    },
    RedactedThinking {
        index: usize,
        data: String,
    },
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArguments {
        index: usize,
        json: String,
    },
    BlockStop {
        index: usize,
    },
    /// The counts so far (cumulative: a later one replaces an earlier one).
    Usage(Usage),
    Stop(Stop),
    /// The provider's error in the middle of a stream.
    Error {
        kind: String,
        message: String,
    },
    /// The reply is whole.
    End,
}

impl Reply {
    /// The reply as the events a stream of it would have carried.
    pub fn events(&self) -> Vec<Event> {
        let mut out = vec![Event::Start {
            id: self.id.clone(),
            model: self.model.clone(),
        }];
        for (index, part) in self.parts.iter().enumerate() {
            match part {
                Part::Text { text, .. } => {
                    out.push(Event::TextStart { index });
                    out.push(Event::Text {
                        index,
                        text: text.clone(),
                    });
                }
                Part::Thinking { text, signature } => {
                    out.push(Event::ThinkingStart { index });
                    out.push(Event::Thinking {
                        index,
                        text: text.clone(),
                    });
                    if let Some(s) = signature {
                        out.push(Event::Signature {
                            index,
                            signature: s.clone(),
                        });
                    }
                }
                Part::RedactedThinking { data } => out.push(Event::RedactedThinking {
                    index,
                    data: data.clone(),
                }),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    out.push(Event::ToolStart {
                        index,
                        id: id.clone(),
                        name: name.clone(),
                    });
                    out.push(Event::ToolArguments {
                        index,
                        json: arguments.clone(),
                    });
                }
                _ => continue,
            }
            out.push(Event::BlockStop { index });
        }
        out.push(Event::Usage(self.usage));
        out.push(Event::Stop(self.stop.clone()));
        out.push(Event::End);
        out
    }
}

/// Builds a whole reply from a stream's events (a stream answered to a client that asked for
/// a plain reply).
#[derive(Debug, Default)]
pub struct Collect {
    pub reply: Reply,
    /// The stream's block index → the reply's part.
    at: Vec<(usize, usize)>,
    pub error: Option<(String, String)>,
    pub ended: bool,
}

impl Collect {
    fn part(&mut self, index: usize) -> Option<&mut Part> {
        let at = self.at.iter().find(|(i, _)| *i == index)?.1;
        self.reply.parts.get_mut(at)
    }

    fn open(&mut self, index: usize, part: Part) {
        self.at.push((index, self.reply.parts.len()));
        self.reply.parts.push(part);
    }

    pub fn push(&mut self, e: Event) {
        match e {
            Event::Start { id, model } => {
                self.reply.id = id;
                self.reply.model = model;
            }
            Event::TextStart { index } => self.open(
                index,
                Part::Text {
                    text: String::new(),
                    cache: false,
                },
            ),
            Event::ThinkingStart { index } => self.open(
                index,
                Part::Thinking {
                    text: String::new(),
                    signature: None,
                },
            ),
            Event::RedactedThinking { index, data } => {
                self.open(index, Part::RedactedThinking { data })
            }
            Event::ToolStart { index, id, name } => self.open(
                index,
                Part::ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                },
            ),
            Event::Text { index, text: more } | Event::Thinking { index, text: more } => {
                if let Some(Part::Text { text, .. } | Part::Thinking { text, .. }) =
                    self.part(index)
                {
                    text.push_str(&more);
                }
            }
            Event::Signature { index, signature } => {
                if let Some(Part::Thinking { signature: s, .. }) = self.part(index) {
                    *s = Some(signature);
                }
            }
            Event::ToolArguments { index, json } => {
                if let Some(Part::ToolCall { arguments, .. }) = self.part(index) {
                    arguments.push_str(&json);
                }
            }
            Event::BlockStop { .. } => {}
            Event::Usage(u) => self.reply.usage = u,
            Event::Stop(s) => self.reply.stop = s,
            Event::Error { kind, message } => self.error = Some((kind, message)),
            Event::End => self.ended = true,
        }
    }
}
