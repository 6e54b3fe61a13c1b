//! The accept loop: at most `--max-connections` connections at once, and at most
//! `--max-connections-per-client` from one client (one IPv4 address, one IPv6 /64), so
//! one client cannot hold every place — extra ones are closed at once —, TLS when configured (the handshake within `--header-timeout`), HTTP/1.1
//! with `--header-timeout` on every request head (which also ends idle keep-alive
//! connections), a peer that accepts no bytes for `--body-timeout` dropped (responses and
//! WebSocket messages alike), WebSocket upgrades, and graceful shutdown.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// Largest request head (request line and headers), bytes.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// How long open connections get to finish after a shutdown signal.
const GRACE: Duration = Duration::from_secs(5);

/// How connections are served.
pub struct Settings {
    /// Time to send a request head (and, once, the TLS handshake).
    pub header_timeout: Duration,
    /// Time a peer may accept no bytes before it is dropped.
    pub stall_timeout: Duration,
    /// Connections at once.
    pub max_connections: usize,
    /// Connections at once from one client ([`Client`]), whether or not they have sent
    /// their request head yet.
    pub max_connections_per_client: usize,
    /// TLS, when configured.
    pub tls: Option<TlsAcceptor>,
}

/// Who a connection counts against for `--max-connections-per-client`: its peer's IPv4
/// address, or the /64 prefix of its IPv6 address (one host usually holds a whole /64;
/// an IPv4 address mapped into IPv6 counts as that IPv4 address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Client(IpAddr);

impl Client {
    /// The client a peer address belongs to.
    fn of(ip: IpAddr) -> Client {
        match ip {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Client(IpAddr::V6(prefix.into()))
                }
            },
        }
    }
}

/// Open connections per client, each at most the limit.
#[derive(Debug)]
struct PerClient {
    max: usize,
    open: Mutex<HashMap<Client, usize>>,
}

/// One open connection counted against its client, uncounted when dropped.
struct ClientPlace {
    clients: Arc<PerClient>,
    client: Client,
}

impl PerClient {
    fn new(max: usize) -> Arc<PerClient> {
        Arc::new(PerClient {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection of `client`, or None when it holds the limit.
    fn take(self: &Arc<PerClient>, client: Client) -> Option<ClientPlace> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(client).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ClientPlace {
            clients: self.clone(),
            client,
        })
    }
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// A connection: its places among all connections and among its client's (given back
/// when the socket closes, WebSockets included) and a timer on writes the peer does not
/// accept.
struct Conn {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
    _client_place: ClientPlace,
    stall: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// Answers a pending write: an error once the peer has accepted nothing for the
    /// stall timeout.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stall = self.stall;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer accepted no bytes for {} s", stall.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.pending(cx),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.progress(r, cx)
    }
}

/// A connection's byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Serves one connection until it ends or, after `shutdown`, for at most [`GRACE`].
async fn connection(
    conn: Conn,
    router: Router,
    http: http1::Builder,
    tls: Option<TlsAcceptor>,
    header_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let io: Box<dyn Io> = match tls {
        None => Box::new(conn),
        Some(acceptor) => match tokio::time::timeout(header_timeout, acceptor.accept(conn)).await {
            Ok(Ok(stream)) => Box::new(stream),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake timed out");
                return;
            }
        },
    };
    let served = http
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router))
        .with_upgrades();
    tokio::pin!(served);
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    let ended = tokio::select! {
        r = served.as_mut() => r,
        () = stopping => {
            served.as_mut().graceful_shutdown();
            match tokio::time::timeout(GRACE, served.as_mut()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!("connection ended: {e}");
    }
}

/// Serves `router` on `listener` until `stop` resolves, then gives open connections
/// [`GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: Settings,
    stop: impl Future<Output = ()>,
) {
    let places = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let clients = PerClient::new(settings.max_connections_per_client);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD_BYTES);
    let (tx, rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait a little instead of spinning.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The client's own limit first, so a client over it takes no place of others.
        let Some(client_place) = clients.take(Client::of(peer.ip())) else {
            tracing::debug!(
                "connection from {} refused: --max-connections-per-client reached",
                peer.ip()
            );
            drop(stream);
            continue;
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::debug!("connection refused: --max-connections reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            stream,
            _place: place,
            _client_place: client_place,
            stall: settings.stall_timeout,
            stalled: None,
        };
        tokio::spawn(connection(
            conn,
            router.clone(),
            http.clone(),
            settings.tls.clone(),
            settings.header_timeout,
            rx.clone(),
        ));
    }
    let _ = tx.send(true);
    // Every place back means every connection closed; WebSockets may keep theirs.
    let all = u32::try_from(settings.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(GRACE, places.acquire_many(all)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_limit_and_gets_places_back() {
        let clients = PerClient::new(2);
        let a = Client::of("127.0.0.2".parse().unwrap());
        let b = Client::of("127.0.0.3".parse().unwrap());
        let first = clients.take(a).expect("a first place");
        let _second = clients.take(a).expect("a second place");
        assert!(clients.take(a).is_none(), "a third place of one client");
        assert!(clients.take(b).is_some(), "another client is not affected");
        drop(first);
        assert!(
            clients.take(a).is_some(),
            "a place given back is taken again"
        );
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64_prefix_and_mapped_ipv4_as_ipv4() {
        let one = |s: &str| Client::of(s.parse().unwrap());
        assert_eq!(one("2001:db8:1:2::1"), one("2001:db8:1:2:ffff::9"));
        assert_ne!(one("2001:db8:1:2::1"), one("2001:db8:1:3::1"));
        assert_eq!(one("::ffff:10.0.0.5"), one("10.0.0.5"));
        assert_ne!(one("10.0.0.5"), one("10.0.0.6"));
    }
}
