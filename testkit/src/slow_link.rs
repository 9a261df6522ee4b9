//! A slow link between two machines: a TCP forwarder in front of a port on which every byte
//! arrives `delay` later in either direction, as between a primary and its standby in another
//! zone. [`SlowLink::cut`] is the far machine dying with its network: the open connections are
//! closed, and the bytes still on their way are lost (new connections go through again, for
//! whoever takes the address over later).
//!
//! It stands only for distance: every failover in the tests is Patroni's and HAProxy's.
//! With no delay it is a witness of what the clients send: [`SlowLink::sends`] has the first
//! byte of each send (a client that waits for each answer, as sqlx does, sends once per round
//! trip; PostgreSQL's messages begin with their type).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct SlowLink {
    pub port: u16,
    cuts: watch::Sender<u64>,
    /// The first byte of each chunk read from a client, all connections together.
    sends: Sends,
    task: JoinHandle<()>,
}

impl SlowLink {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:target`, each byte arriving
    /// `delay` later in either direction.
    pub async fn start(target: u16, delay: Duration) -> SlowLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cuts, cut) = watch::channel(0u64);
        let sends = Sends::default();
        let witnessed = sends.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let mut cut = cut.clone();
                cut.mark_unchanged();
                let witnessed = witnessed.clone();
                tokio::spawn(async move {
                    // A target that refuses (its machine is down): the client's connection is
                    // closed at once, as a dead address would be.
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    tokio::select! {
                        () = delayed(from_client, to_server, delay, Some(witnessed)) => {}
                        () = delayed(from_server, to_client, delay, None) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        SlowLink {
            port,
            cuts,
            sends,
            task,
        }
    }

    /// The first byte of each send of the clients so far, in order: one a round trip for a
    /// client that waits for each answer.
    pub fn sends(&self) -> Vec<u8> {
        self.sends.lock().unwrap().clone()
    }

    /// The message types of the sends from the `before`th on, as letters (B a prepared
    /// statement run, Q a simple query, S a lone Sync…), leaving out a new connection's startup
    /// (0) and a statement's preparation (P): both depend on which connection a pool lends.
    pub fn message_types_since(&self, before: usize) -> String {
        self.sends()[before..]
            .iter()
            .filter(|kind| !matches!(kind, b'P' | 0))
            .map(|kind| char::from(*kind))
            .collect()
    }

    /// How many connections were opened (their startup messages) from the `before`th send on.
    pub fn startups_since(&self, before: usize) -> usize {
        self.sends()[before..]
            .iter()
            .filter(|kind| **kind == 0)
            .count()
    }

    /// Cuts every open connection, dropping what is still on its way.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

type Sends = Arc<Mutex<Vec<u8>>>;

/// Copies `from` to `to`, each chunk written `delay` after it was read (its first byte kept in
/// `witnessed`, if given); ends when either side closes.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    witnessed: Option<Sends>,
) {
    let (chunks, mut arriving) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            if let Some(witnessed) = &witnessed {
                witnessed.lock().unwrap().push(buffer[0]);
            }
            if chunks
                .send((Instant::now() + delay, buffer[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((due, chunk)) = arriving.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(reading, writing);
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
