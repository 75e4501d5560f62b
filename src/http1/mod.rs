//! The HTTP/1 work the gateway does itself rather than through Pingora's sessions: the
//! listeners' connection loop (`listener`: the header deadline, the pre-read and its 400, the
//! write gathering), the client's side of an exchange (`Downstream`, implemented by Pingora's
//! session and by the gateway's own connection, `conn`), the reply writer's body framing
//! (`writer`), the upstream client codec (`client`), and the framing rules a message's body
//! follows (RFC 9112 §6), shared by the codec and the writer. It knows no keys, routes or
//! records; the proxy, the web stage and the upstream stage use it, never the reverse. Checked
//! against an oracle written from the RFC alone (tests/http1_framing.rs,
//! fuzz/fuzz_targets/h1_*.rs).

pub mod client;
pub mod conn;
pub mod downstream;
pub mod framing;
pub mod listener;
pub mod respond;
pub mod tls;
pub mod writer;

pub use downstream::Downstream;
