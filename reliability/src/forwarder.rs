//! "The primary's address": a TCP forwarder the harness moves to the promoted standby. Every
//! checkout instance connects here; at a move, new connections go to the new target and the
//! ones still open to the old one are cut (as a virtual IP moving to another machine does).
//!
//! With a delay it is also the network between the primary and a standby farther away: every
//! byte arrives that much later, and bytes still on their way when the link is cut are lost
//! (the primary's machine and its link die together).
//!
//! The harness's own forwarder rather than HAProxy or PgBouncer: the move has to happen at a
//! moment the campaign chooses (right after `pg_ctl promote`) and be known to it, without a
//! health check's delay or a configuration reload in between, and without one more daemon to
//! install. What a production deployment uses instead is in the README.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct Forwarder {
    pub port: u16,
    target: Arc<AtomicU16>,
    moves: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Forwarder {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Forwarder {
        Forwarder::with_delay(target, Duration::ZERO).await
    }

    /// The same, each byte arriving `delay` later in either direction.
    pub async fn with_delay(target: u16, delay: Duration) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let (moves, moved) = watch::channel(0u64);
        let to = target.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (to, mut moved) = (to.load(Ordering::SeqCst), moved.clone());
                moved.mark_unchanged();
                tokio::spawn(async move {
                    // A target that refuses (the primary is dead, not yet replaced): the
                    // client's connection is closed at once, as a dead address would be.
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    let mut client = client;
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    if delay.is_zero() {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = moved.changed() => {}
                        }
                        return;
                    }
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    tokio::select! {
                        () = delayed(from_client, to_server, delay) => {}
                        () = delayed(from_server, to_client, delay) => {}
                        _ = moved.changed() => {}
                    }
                });
            }
        });
        Forwarder {
            port,
            target,
            moves,
            task,
        }
    }

    /// From now on connections go to `target`; those open to the old one are cut.
    pub fn move_to(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
        self.moves.send_modify(|n| *n += 1);
    }

    /// Cuts every open connection, dropping what is still on its way.
    pub fn cut(&self) {
        self.moves.send_modify(|n| *n += 1);
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read; ends when either side
/// closes.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (chunks, mut arriving) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buffer).await {
            if n == 0
                || chunks
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

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
