//! A connection made of bytes: each read gets the next scripted piece (then the close), and
//! every write is kept. Pingora's `Stream` over it lets the gateway's HTTP/1 code run on
//! exactly the splits a test or a fuzzer chooses, with no socket.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug, Default)]
pub struct ScriptIo {
    reads: VecDeque<Vec<u8>>,
    /// What was written, shared with whoever made the connection.
    pub written: Arc<Mutex<Vec<u8>>>,
}

impl ScriptIo {
    /// A connection whose peer sends `pieces`, one a read, then closes.
    pub fn new(pieces: Vec<Vec<u8>>) -> ScriptIo {
        ScriptIo {
            reads: pieces.into_iter().filter(|p| !p.is_empty()).collect(),
            written: Arc::default(),
        }
    }
}

impl AsyncRead for ScriptIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut piece) = self.reads.pop_front() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                piece.drain(..n);
                self.reads.push_front(piece);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ScriptIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.written
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[async_trait::async_trait]
impl Shutdown for ScriptIo {
    async fn shutdown(&mut self) {}
}

impl UniqueID for ScriptIo {
    fn id(&self) -> UniqueIDType {
        0
    }
}

impl Ssl for ScriptIo {}

impl GetTimingDigest for ScriptIo {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        vec![]
    }
}

impl GetProxyDigest for ScriptIo {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}

impl GetSocketDigest for ScriptIo {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        None
    }
}

impl Peek for ScriptIo {}
