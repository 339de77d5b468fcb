//! A TCP proxy on loopback that misbehaves on request, to put a slow or broken link
//! between an etcd client and one member: it can hold a client's bytes and deliver them
//! late, lose the server's answers, delay everything, or swallow everything.
//!
//! Each misbehaviour applies to the connections open when it is asked for; connections
//! the client opens afterwards (a reconnect) pass, unless the proxy is black-holed.
//! Shared by procflow-store's and the root package's etcd tests (`#[path]`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// A running proxy; it stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Bytes of new and open connections are swallowed, both ways.
    black_hole: AtomicBool,
    /// Every chunk waits this long (milliseconds) before it is passed on, both ways.
    delay_ms: AtomicU64,
}

/// One client connection and its upstream connection.
struct Conn {
    /// `Some` while the client's bytes are held rather than sent.
    held: Mutex<Option<Vec<u8>>>,
    /// The server's bytes are dropped rather than sent to the client.
    deaf: AtomicBool,
    /// Set to close the client's side (the upstream side stays open).
    cut: watch::Sender<bool>,
    upstream: tokio::sync::Mutex<OwnedWriteHalf>,
    /// Bytes the server has sent on this connection.
    from_server: AtomicUsize,
}

impl Proxy {
    /// A proxy on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(accept(listener, upstream, Arc::clone(&shared)));
        Proxy { addr, shared, task }
    }

    /// `host:port`, for a client's endpoint list.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Holds every byte the client sends on its open connections from now on.
    pub fn hold(&self) {
        for conn in self.open() {
            conn.held.lock().unwrap().get_or_insert_with(Vec::new);
        }
    }

    /// Drops every byte the server sends on the open connections from now on.
    pub fn lose_answers(&self) {
        for conn in self.open() {
            conn.deaf.store(true, Ordering::SeqCst);
        }
    }

    /// Closes the client's side of every held or deaf connection, keeping the upstream
    /// side open (so held bytes can still be delivered). The client sees a broken link.
    pub fn cut(&self) {
        for conn in self.open() {
            let held = conn.held.lock().unwrap().is_some();
            if held || conn.deaf.load(Ordering::SeqCst) {
                conn.cut.send_replace(true);
            }
        }
    }

    /// Delivers the held bytes, late, on their original upstream connections, and waits
    /// until the server has answered each (so the late copy was read and decided).
    /// Returns how many bytes were delivered.
    pub async fn release(&self) -> usize {
        let mut delivered = 0;
        for conn in self.open() {
            let Some(bytes) = conn.held.lock().unwrap().take() else {
                continue;
            };
            if bytes.is_empty() {
                continue;
            }
            let before = conn.from_server.load(Ordering::SeqCst);
            conn.upstream.lock().await.write_all(&bytes).await.unwrap();
            delivered += bytes.len();
            for _ in 0..200 {
                if conn.from_server.load(Ordering::SeqCst) > before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                conn.from_server.load(Ordering::SeqCst) > before,
                "the server did not answer the late bytes within 2 s"
            );
        }
        delivered
    }

    /// Delivers the held bytes, late, on their original upstream connections, without
    /// waiting for an answer (the server may have closed them). Returns how many bytes
    /// were written.
    pub async fn deliver(&self) -> usize {
        let mut delivered = 0;
        for conn in self.open() {
            let Some(bytes) = conn.held.lock().unwrap().take() else {
                continue;
            };
            if conn.upstream.lock().await.write_all(&bytes).await.is_ok() {
                delivered += bytes.len();
            }
        }
        delivered
    }

    /// Delays every chunk, both ways, by `delay`.
    pub fn delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Swallows every byte of open and new connections, both ways, without closing any:
    /// the link looks alive and says nothing.
    pub fn black_hole(&self) {
        self.shared.black_hole.store(true, Ordering::SeqCst);
    }

    /// Undoes [`black_hole`](Self::black_hole) and [`delay`](Self::delay) for new
    /// bytes.
    pub fn heal(&self) {
        self.shared.black_hole.store(false, Ordering::SeqCst);
        self.shared.delay_ms.store(0, Ordering::SeqCst);
    }

    /// Swallows the bytes of the connections open now, both ways, without closing them;
    /// connections opened afterwards pass.
    pub fn black_hole_open(&self) {
        for conn in self.open() {
            conn.held.lock().unwrap().get_or_insert_with(Vec::new);
            conn.deaf.store(true, Ordering::SeqCst);
        }
    }

    fn open(&self) -> Vec<Arc<Conn>> {
        self.shared.conns.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        for conn in self.open() {
            conn.cut.send_replace(true);
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let (cut, _) = watch::channel(false);
        let conn = Arc::new(Conn {
            held: Mutex::new(None),
            deaf: AtomicBool::new(false),
            cut,
            upstream: tokio::sync::Mutex::new(server_write),
            from_server: AtomicUsize::new(0),
        });
        shared.conns.lock().unwrap().push(Arc::clone(&conn));
        tokio::spawn(to_server(
            client_read,
            Arc::clone(&conn),
            Arc::clone(&shared),
        ));
        tokio::spawn(to_client(
            server_read,
            client_write,
            conn,
            Arc::clone(&shared),
        ));
    }
}

/// Client → server: sent, held, or swallowed.
async fn to_server(mut client: OwnedReadHalf, conn: Arc<Conn>, shared: Arc<Shared>) {
    let mut cut = conn.cut.subscribe();
    let (send, mut sending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = {
        let conn = Arc::clone(&conn);
        tokio::spawn(async move {
            while let Some((at, bytes)) = sending.recv().await {
                tokio::time::sleep_until(at.into()).await;
                if conn.upstream.lock().await.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        })
    };
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = tokio::select! {
            _ = cut.wait_for(|cut| *cut) => break,
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        if shared.black_hole.load(Ordering::SeqCst) {
            continue;
        }
        if let Some(held) = conn.held.lock().unwrap().as_mut() {
            held.extend_from_slice(&buf[..n]);
            continue;
        }
        let _ = send.send((shared.due(), buf[..n].to_vec()));
    }
    // What is on its way still arrives (a late delivery is the point of holding).
    drop(send);
    let _ = writer.await;
}

/// Server → client: sent or dropped. Keeps reading (and counting) after the client's
/// side is cut, so that a late delivery's answer is seen.
async fn to_client(
    mut server: OwnedReadHalf,
    client: OwnedWriteHalf,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
) {
    let (send, mut sending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut cut = conn.cut.subscribe();
    tokio::spawn(async move {
        let mut client = client;
        loop {
            let next = tokio::select! {
                _ = cut.wait_for(|cut| *cut) => None,
                next = sending.recv() => next,
            };
            let Some((at, bytes)) = next else { return };
            tokio::time::sleep_until(at.into()).await;
            if *cut.borrow() || client.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match server.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        conn.from_server.fetch_add(n, Ordering::SeqCst);
        if shared.black_hole.load(Ordering::SeqCst) || conn.deaf.load(Ordering::SeqCst) {
            continue;
        }
        let _ = send.send((shared.due(), buf[..n].to_vec()));
    }
}

impl Shared {
    /// When bytes read now are passed on: a fixed latency, so that chunks keep their
    /// order and do not add up their delays.
    fn due(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))
    }
}
