//! Upstream connections: new ones (TCP; TLS + SNI through Pingora's transport connector) and
//! the idle keep-alive ones kept for reuse, per peer (address, TLS and SNI), most recently used
//! first.
//!
//! Pingora's own pool spawns a task per released connection to watch it while idle (the stream
//! behind an `Arc<Mutex>`), and each reuse waits for that task to let go and checks the socket's
//! peer address again (`getpeername`): about 2 µs and 6-8% of the gateway's CPU per plain
//! request under load. Here a released connection is only put in a list. It is checked when
//! taken (a closed or talking connection is readable: dropped, the next one is tried, as
//! Pingora does), and a sweep every second closes those past their `keepalive_timeout` and
//! those the upstream closed meanwhile.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_core::protocols::l4::stream::Stream as L4Stream;
use pingora_core::protocols::{Shutdown, Stream};
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorType, RetryType};
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::AsyncReadExt;

use crate::config::PoolConfig;
use crate::http1::client;
use crate::ops::metrics::Metrics;

/// An exchange on an upstream connection (`http1::client::Conn`, whose methods it has), and
/// where the connection goes back to once its reply was read whole.
pub struct Conn {
    exchange: client::Conn,
    home: Home,
}

impl Conn {
    pub fn new(stream: Stream, peer: &HttpPeer) -> Conn {
        Conn {
            exchange: client::Conn::new(stream, peer),
            home: Home::of(peer),
        }
    }
}

impl std::ops::Deref for Conn {
    type Target = client::Conn;

    fn deref(&self) -> &client::Conn {
        &self.exchange
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut client::Conn {
        &mut self.exchange
    }
}

/// The longest a connection's release (keeping it, or shutting it down) may take.
const RELEASE_LIMIT: Duration = Duration::from_secs(1);

/// Most idle connections kept, all upstreams together; past it the one nearest its timeout
/// is closed.
const MAX_IDLE: usize = 4096;
/// How often idle connections are looked over (timeouts are also checked when one is taken).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Pingora's connector, for TLS upstreams only, shared by every listener's proxy and the health
/// checks (only its `new_stream` is used, none of its own pools). It loads the platform's root
/// certificates (about 0.3 MB of heap, and file reads of a few dozen ms), which a gateway of
/// plain upstreams never needs: `warm_tls` makes it when pools with a TLS upstream are put in
/// force (at the start, and by a reload, off the requests' path). Each proxy and the health
/// checks had made their own at the start, whatever the pools (Pingora's proxy still makes one
/// of its own, unused: it cannot be told not to).
static TLS: std::sync::OnceLock<TransportConnector> = std::sync::OnceLock::new();

/// The connector, made on first use; why not, when the trust store it loads cannot be loaded
/// (Pingora's connector would panic on it).
fn tls() -> Result<&'static TransportConnector, String> {
    if let Some(made) = TLS.get() {
        return Ok(made);
    }
    check_trust_store()?;
    Ok(TLS.get_or_init(|| TransportConnector::new(None)))
}

/// Whether any of these pools has a TLS upstream.
fn needs_tls<'a>(pools: impl IntoIterator<Item = &'a PoolConfig>) -> bool {
    pools.into_iter().any(|p| p.upstreams.iter().any(|u| u.tls))
}

/// Makes the TLS connector now if these pools (about to be put in force) have a TLS upstream,
/// so that no request waits for it on a proxy thread; why not, when the trust store it loads
/// cannot be loaded (the pools are then not to be put in force: Pingora's connector would
/// panic).
pub fn warm_tls<'a>(pools: impl IntoIterator<Item = &'a PoolConfig>) -> Result<(), String> {
    if needs_tls(pools) {
        tls()?;
    }
    Ok(())
}

/// Whether the trust store every TLS connector loads (the platform's roots, or the bundle
/// `SSL_CERT_FILE` names, or the folder `SSL_CERT_DIR` names) can be loaded; why not, if not.
/// Pingora's proxy makes a connector of its own as it is built, whatever the pools, and
/// panics on a store it cannot load: the start asks this first.
pub fn check_trust_store() -> Result<(), String> {
    let mut store = pingora_core::tls::RootCertStore::empty();
    pingora_core::tls::load_platform_certs_incl_env_into_store(&mut store).map_err(|e| {
        let named = ["SSL_CERT_FILE", "SSL_CERT_DIR"]
            .iter()
            .filter_map(|v| std::env::var_os(v).map(|p| format!("{v}={}", p.to_string_lossy())))
            .collect::<Vec<_>>();
        let source = if named.is_empty() {
            "the platform's root certificates".to_string()
        } else {
            named.join(", ")
        };
        let why = e.to_string();
        format!(
            "the trust store for TLS upstreams cannot be loaded ({source}): {}",
            why.trim()
        )
    })
}

/// The upstream connections of one listener's proxy.
pub struct Connections {
    idle: Arc<Mutex<Idle>>,
    max_idle: usize,
    sweeping: std::sync::Once,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Idle {
    /// Oldest at the front, the most recently released at the back.
    by_peer: HashMap<Key, VecDeque<Kept>, foldhash::fast::RandomState>,
    count: usize,
}

/// A peer: `HttpPeer::reuse_hash` (address, TLS, SNI, client certificate, …) and, so that no
/// hash collision can send one upstream's request (and credential) to another, its address.
type Key = (u64, SocketAddr);

fn key(peer: &HttpPeer) -> Key {
    (peer.reuse_hash(), peer._address.clone())
}

/// Where a connection goes back to: its peer, and how long it may wait there for its next
/// request (the pool's `keepalive_timeout`; none or zero: it is closed).
struct Home {
    key: Key,
    idle: Option<Duration>,
}

impl Home {
    fn of(peer: &HttpPeer) -> Home {
        Home {
            key: key(peer),
            idle: peer.options.idle_timeout.filter(|idle| !idle.is_zero()),
        }
    }
}

struct Kept {
    stream: Stream,
    /// When it has waited its `keepalive_timeout`.
    until: Instant,
}

impl Connections {
    pub fn new(metrics: Arc<Metrics>) -> Connections {
        Connections {
            idle: Arc::default(),
            max_idle: MAX_IDLE,
            sweeping: std::sync::Once::new(),
            metrics,
        }
    }

    /// Runs `exchange` (the request sent, the reply's header read) on a connection to `peer`:
    /// an idle one if one is alive, else a new one. When the idle one proves [`stale`] (the
    /// upstream closed it as the request went out), the request goes again at once on a new
    /// connection: not a failed try, nothing against the upstream's health.
    pub async fn exchange<F, Fut>(
        &self,
        peer: &HttpPeer,
        exchange: F,
    ) -> pingora_error::Result<Box<Conn>>
    where
        F: Fn(Box<Conn>) -> Fut,
        Fut: Future<Output = pingora_error::Result<Box<Conn>>>,
    {
        let Some((stream, taken)) = self.take(&key(peer)) else {
            return exchange(self.fresh(peer).await?).await;
        };
        match exchange(Box::new(Conn::new(stream, peer))).await {
            Err(e) if stale(&e, taken) => {
                tracing::debug!("a reused upstream connection was closed: {e}; on a new one");
                self.metrics.upstream_stale.inc();
                exchange(self.fresh(peer).await?).await
            }
            done => done,
        }
    }

    /// An exchange on a new connection: plain TCP here, TLS through Pingora's connector.
    async fn fresh(&self, peer: &HttpPeer) -> pingora_error::Result<Box<Conn>> {
        let stream = if peer.tls() {
            // Boxed: the connector's future is 8.8 KB (a TLS handshake's state); inline it
            // would size the request's future, held for the whole of a stream.
            let connector = tls().map_err(|m| {
                pingora_error::Error::explain(pingora_error::ErrorType::InvalidCert, m)
            })?;
            Box::pin(connector.new_stream(peer)).await?
        } else {
            tcp(peer).await?
        };
        self.metrics.upstream_connects.inc();
        Ok(Box::new(Conn::new(stream, peer)))
    }

    /// Keeps a connection whose reply was read whole for its peer's `idle_timeout` (the
    /// pool's `keepalive_timeout`); one that cannot be reused, or with a zero timeout, is
    /// closed.
    pub async fn release(&self, client: Box<Conn>) {
        let Conn { exchange, home } = *client;
        match (exchange.into_stream(), home) {
            (
                Ok(stream),
                Home {
                    key,
                    idle: Some(idle),
                },
            ) => self.put(key, stream, idle),
            // Shut down, which on TLS writes a close_notify: an upstream that reads nothing
            // must not hold the request's end for it.
            (Ok(mut stream), _) | (Err(mut stream), _) => {
                let _ = fast_timeout(RELEASE_LIMIT, Shutdown::shutdown(&mut *stream)).await;
            }
        }
    }

    /// The most recently kept live connection to the peer, and when it was taken.
    fn take(&self, key: &Key) -> Option<(Stream, Instant)> {
        let now = Instant::now();
        let mut closing = Vec::new();
        let found = {
            let mut idle = lock(&self.idle);
            let Idle { by_peer, count } = &mut *idle;
            let list = by_peer.get_mut(key)?;
            loop {
                let Some(mut kept) = list.pop_back() else {
                    break None;
                };
                *count -= 1;
                if kept.until > now && alive(&mut kept.stream) {
                    break Some((kept.stream, now));
                }
                closing.push(kept.stream);
            }
        };
        drop(closing);
        found
    }

    fn put(&self, key: Key, stream: Stream, idle: Duration) {
        let kept = Kept {
            stream,
            until: Instant::now() + idle,
        };
        let evicted = {
            let mut idle = lock(&self.idle);
            let Idle { by_peer, count } = &mut *idle;
            // Full: the connection nearest its timeout goes, whichever peer it is for.
            let evicted = if *count < self.max_idle {
                *count += 1;
                None
            } else {
                by_peer
                    .values_mut()
                    .filter(|list| !list.is_empty())
                    .min_by_key(|list| list.front().map(|k| k.until))
                    .and_then(|list| list.pop_front())
                    .map(|oldest| oldest.stream)
            };
            by_peer.entry(key).or_default().push_back(kept);
            evicted
        };
        drop(evicted);
        self.sweeping.call_once(|| {
            // Ends when the pool is dropped (it holds a weak reference).
            #[allow(clippy::disallowed_methods)]
            tokio::spawn(sweep(Arc::downgrade(&self.idle)));
        });
    }
}

/// Within this long of a reused connection being taken, a close or reset before any reply is
/// the upstream's close of the idle connection crossing the request (it arrives within a
/// round trip); later, it is the upstream's doing with the request.
const STALE_WITHIN: Duration = Duration::from_millis(500);

/// Whether a request that failed on a connection reused since `taken` met a connection the
/// upstream had already closed, so that it can go again at once on a new one: refused as it
/// was written (the upstream had reset it), or closed or reset before a byte of the reply
/// came, soon after. A TLS error, a reply begun, a timeout, or a close long after is the
/// upstream's answer and is not redone.
fn stale(e: &Error, taken: Instant) -> bool {
    if taken.elapsed() > STALE_WITHIN {
        return false;
    }
    match e.etype() {
        ErrorType::WriteError => true,
        // Pingora marks these retryable on a reused connection only for an OS error or a
        // close (not TLS), and says how much of the reply had come.
        ErrorType::ConnectionClosed | ErrorType::ReadError => {
            matches!(e.retry, RetryType::ReusedOnly)
                && e.context
                    .as_ref()
                    .is_some_and(|c| c.as_str().ends_with("bytes already read: 0"))
        }
        _ => false,
    }
}

/// A new plain TCP connection to the peer, within its `connection_timeout`, with Nagle off:
/// what Pingora's connector does for a plain peer (modelgate sets none of the other socket
/// options it knows), with its error types. Its future is about 100 bytes where the
/// connector's is 8.8 KB, boxed and written whole for each new connection: two pages per
/// stream while a burst of streams connect at once.
async fn tcp(peer: &HttpPeer) -> pingora_error::Result<Stream> {
    use ErrorType::{ConnectError, ConnectNoRoute, ConnectRefused, ConnectTimedout};
    let SocketAddr::Inet(addr) = peer.address() else {
        return Error::e_explain(ConnectError, format!("{peer}: not an IP address"));
    };
    let connect = tokio::net::TcpStream::connect(*addr);
    let connected = match peer.options.connection_timeout {
        Some(t) => fast_timeout(t, connect).await.or_else(|_| {
            Error::e_explain(
                ConnectTimedout,
                format!("timeout {t:?} connecting to server {peer}"),
            )
        })?,
        None => connect.await,
    };
    let tcp = connected.map_err(|e| {
        use std::io::ErrorKind::{ConnectionRefused, HostUnreachable, NetworkUnreachable};
        let kind = match e.kind() {
            ConnectionRefused => ConnectRefused,
            NetworkUnreachable | HostUnreachable => ConnectNoRoute,
            _ => ConnectError,
        };
        Error::because(kind, format!("Fail to connect to {peer}"), e)
    })?;
    if let Err(e) = tcp.set_nodelay(true) {
        return Error::e_because(ConnectError, "failed to set TCP_NODELAY", e);
    }
    Ok(Box::new(L4Stream::from(tcp)))
}

fn lock(idle: &Mutex<Idle>) -> MutexGuard<'_, Idle> {
    // Nothing panics while holding it; a poisoned lock still holds a consistent pool.
    idle.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether an idle connection can carry a request: nothing to read on it. An upstream never
/// speaks first on an idle connection, so a readable one was closed (or is broken).
fn alive(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    // `unconstrained`: a spent task budget would make a ready read look pending.
    let read = tokio::task::unconstrained(stream.read(&mut byte)).now_or_never();
    match read {
        None => true,
        Some(Ok(0)) => false,
        Some(Ok(_)) => {
            tracing::warn!("an idle upstream connection sent unexpected data; closed");
            false
        }
        Some(Err(e)) => {
            tracing::debug!("an idle upstream connection is broken: {e}");
            false
        }
    }
}

/// Closes the connections past their timeout, and those the upstream closed, every
/// [`SWEEP_EVERY`] while the pool lives.
async fn sweep(idle: Weak<Mutex<Idle>>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut closing = Vec::new();
        {
            let mut idle = lock(&idle);
            let Idle { by_peer, count } = &mut *idle;
            by_peer.retain(|_, list| {
                for mut kept in std::mem::take(list) {
                    if kept.until > now && alive(&mut kept.stream) {
                        list.push_back(kept);
                    } else {
                        *count -= 1;
                        closing.push(kept.stream);
                    }
                }
                !list.is_empty()
            });
        }
        drop(closing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A listener, a peer for it, and a connection to it: (ours, the server's end). Made as
    /// the pool makes a plain one (`tcp`).
    async fn connected(listener: &TcpListener, peer: &HttpPeer) -> (Stream, TcpStream) {
        let (ours, theirs) = tokio::join!(tcp(peer), listener.accept());
        (ours.expect("connect"), theirs.expect("accept").0)
    }

    #[tokio::test]
    async fn a_new_plain_connection_talks_and_a_refused_one_says_so() {
        let (_pool, listener, peer) = setup().await;
        let (ours, theirs) = tokio::join!(tcp(&peer), listener.accept());
        let (mut ours, mut theirs) = (ours.expect("connect"), theirs.expect("accept").0);
        ours.write_all(b"ping").await.expect("write");
        ours.flush().await.expect("flush");
        let mut buf = [0u8; 4];
        theirs.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");

        drop(listener);
        let e = tcp(&peer).await.expect_err("refused");
        assert_eq!(e.etype(), &ErrorType::ConnectRefused, "{e}");
    }

    #[test]
    fn the_tls_connector_is_wanted_only_for_a_tls_upstream() {
        let config = |upstream: &str| {
            let text = format!(
                "[listeners]\nmain = \"127.0.0.1:1\"\ndirect = \"127.0.0.1:2\"\n\
                 [keys]\nfile = \"keys.toml\"\n\
                 [[pools]]\nname = \"p\"\nupstreams = [\"http://127.0.0.1:9\"]\n\
                 [[pools]]\nname = \"q\"\nupstreams = [\"{upstream}\"]\n\
                 [[models]]\nname = \"m\"\npool = \"p\"\n"
            );
            crate::config::Config::parse(std::path::Path::new("/tmp/c.toml"), &text)
                .expect("config")
        };
        assert!(!needs_tls(&config("http://127.0.0.1:10").live.pools));
        assert!(needs_tls(&config("https://127.0.0.1:10").live.pools));
    }

    async fn setup() -> (Connections, TcpListener, HttpPeer) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        (
            Connections::new(Arc::new(Metrics::new().expect("metrics"))),
            listener,
            HttpPeer::new(addr, false, String::new()),
        )
    }

    fn count(pool: &Connections) -> usize {
        lock(&pool.idle).count
    }

    /// Resolves when the server's end sees the connection closed.
    async fn closed(theirs: &mut TcpStream) {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), theirs.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }

    #[tokio::test]
    async fn a_kept_connection_is_taken_again_most_recent_first() {
        let (pool, listener, peer) = setup().await;
        let (a, _ta) = connected(&listener, &peer).await;
        let (b, _tb) = connected(&listener, &peer).await;
        let (a_id, b_id) = (a.id(), b.id());
        let key = key(&peer);
        pool.put(key.clone(), a, Duration::from_secs(60));
        pool.put(key.clone(), b, Duration::from_secs(60));
        assert_eq!(count(&pool), 2);
        assert_eq!(pool.take(&key).map(|(s, _)| s.id()), Some(b_id));
        assert_eq!(pool.take(&key).map(|(s, _)| s.id()), Some(a_id));
        assert!(pool.take(&key).is_none());
        assert_eq!(count(&pool), 0);
        // Another peer's connections are not this one's.
        let (c, _tc) = connected(&listener, &peer).await;
        pool.put(key.clone(), c, Duration::from_secs(60));
        let other = HttpPeer::new(
            "127.0.0.1:9".parse::<std::net::SocketAddr>().expect("addr"),
            false,
            String::new(),
        );
        assert!(pool.take(&super::key(&other)).is_none());
        assert_eq!(count(&pool), 1);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_or_spoke_on_is_not_taken() {
        let (pool, listener, peer) = setup().await;
        let key = key(&peer);
        for speak in [false, true] {
            let (ours, mut theirs) = connected(&listener, &peer).await;
            pool.put(key.clone(), ours, Duration::from_secs(60));
            if speak {
                theirs
                    .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
                    .await
                    .expect("write");
            } else {
                drop(theirs);
            }
            // Taken back (alive) until the close or the bytes reach this side; then refused.
            let refused = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match pool.take(&key) {
                        None => break,
                        Some((s, _)) => pool.put(key.clone(), s, Duration::from_secs(60)),
                    }
                    tokio::task::yield_now().await;
                }
            })
            .await;
            assert!(refused.is_ok(), "speak {speak}");
            assert_eq!(count(&pool), 0);
        }
    }

    #[tokio::test]
    async fn past_its_timeout_a_connection_is_not_taken_and_the_sweep_closes_it() {
        let (pool, listener, peer) = setup().await;
        let key = key(&peer);
        let (a, _ta) = connected(&listener, &peer).await;
        pool.put(key.clone(), a, Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(pool.take(&key).is_none());
        // Left in the pool, the sweep closes it (the server sees the close) within a second.
        let (b, mut tb) = connected(&listener, &peer).await;
        pool.put(key.clone(), b, Duration::from_millis(1));
        closed(&mut tb).await;
        assert_eq!(count(&pool), 0);
    }

    #[tokio::test]
    async fn past_the_cap_the_one_nearest_its_timeout_is_closed_whatever_its_peer() {
        let (mut pool, listener, peer) = setup().await;
        let (_, other_listener, other) = setup().await;
        pool.max_idle = 2;
        let (key, other_key) = (key(&peer), key(&other));
        let (a, mut ta) = connected(&listener, &peer).await;
        let (b, _tb) = connected(&other_listener, &other).await;
        let (c, _tc) = connected(&listener, &peer).await;
        let (b_id, c_id) = (b.id(), c.id());
        pool.put(key.clone(), a, Duration::from_secs(60));
        pool.put(other_key.clone(), b, Duration::from_secs(60));
        pool.put(key.clone(), c, Duration::from_secs(60));
        assert_eq!(count(&pool), 2);
        closed(&mut ta).await;
        assert_eq!(pool.take(&key).map(|(s, _)| s.id()), Some(c_id));
        assert!(pool.take(&key).is_none());
        assert_eq!(pool.take(&other_key).map(|(s, _)| s.id()), Some(b_id));
    }

    #[test]
    fn only_a_close_before_any_reply_and_soon_after_is_stale() {
        use ErrorType::*;
        let now = Instant::now();
        let failed = |etype: ErrorType, read: usize, retry: RetryType| {
            let context = format!("while reading response headers, bytes already read: {read}");
            let mut e = Error::explain(etype, context);
            e.retry = retry;
            e
        };
        assert!(stale(
            &failed(ConnectionClosed, 0, RetryType::ReusedOnly),
            now
        ));
        assert!(stale(&failed(ReadError, 0, RetryType::ReusedOnly), now));
        assert!(stale(&Error::explain(WriteError, "while writing"), now));
        // The reply had begun: the upstream took the request.
        assert!(!stale(
            &failed(ConnectionClosed, 12, RetryType::ReusedOnly),
            now
        ));
        // A TLS error (Pingora does not mark it retryable).
        assert!(!stale(&failed(ReadError, 0, false.into()), now));
        // Long after the request went out.
        let earlier = now - Duration::from_secs(1);
        assert!(!stale(
            &failed(ConnectionClosed, 0, RetryType::ReusedOnly),
            earlier
        ));
        assert!(!stale(&Error::explain(ReadTimedout, "while reading"), now));
    }
}
