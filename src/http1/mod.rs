//! The HTTP/1 work the gateway does itself rather than through Pingora's sessions: the
//! upstream client codec (`client`), the framing rules a message's body follows (RFC 9112
//! §6), shared by the codec and the reply writer, and the reply writer's body framing. It knows no keys, routes or
//! records; the proxy and the upstream stage use it, never the reverse. Checked against an
//! oracle written from the RFC alone (tests/http1_framing.rs, fuzz/fuzz_targets/h1_*.rs).

pub mod client;
pub mod framing;
pub mod writer;
