//! How the ranks of several processes meet: rank 0 makes NCCL's unique id and hands it to
//! the others, through a file on a shared file system or a TCP socket (the form a multi-node
//! run takes: rank 0's address).
//!
//! What travels is a 16-byte header (magic, the group's size, a format version) and the
//! 128-byte id; a rank that reads another group's size fails with both sizes named.

use super::nccl::UniqueId;
use hal::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"halnccl\0";
const VERSION: u32 = 1;
const MESSAGE: usize = 16 + 128;

/// Where the ranks of a multi-process group meet.
#[derive(Clone, Debug)]
pub enum Rendezvous {
    /// Rank 0 writes the id to this file (atomically) and the others poll for it. The path
    /// must be fresh for each run: rank 0 refuses to start over an existing file, which would
    /// hand the others a stale id.
    File(PathBuf),
    /// Rank 0 listens on this address and serves the id to `size - 1` connections; the others
    /// connect, retrying until the timeout.
    Tcp(SocketAddr),
}

fn failed(detail: String) -> Error {
    Error::Backend {
        backend: "cuda (NCCL rendezvous)",
        detail,
    }
}

fn encode(size: usize, id: &UniqueId) -> [u8; MESSAGE] {
    let mut m = [0u8; MESSAGE];
    m[..8].copy_from_slice(MAGIC);
    m[8..12].copy_from_slice(&(size as u32).to_le_bytes());
    m[12..16].copy_from_slice(&VERSION.to_le_bytes());
    m[16..].copy_from_slice(&id.internal);
    m
}

fn decode(size: usize, m: &[u8], from: &str) -> Result<UniqueId> {
    if m.len() != MESSAGE || &m[..8] != MAGIC {
        return Err(failed(format!("{from} does not hold a rendezvous message")));
    }
    let theirs = u32::from_le_bytes(m[8..12].try_into().unwrap()) as usize;
    let version = u32::from_le_bytes(m[12..16].try_into().unwrap());
    if version != VERSION {
        return Err(failed(format!(
            "{from}: format {version}, expected {VERSION}"
        )));
    }
    if theirs != size {
        return Err(failed(format!(
            "{from}: rank 0 formed a group of {theirs}, this rank was told {size}"
        )));
    }
    let mut id = UniqueId { internal: [0; 128] };
    id.internal.copy_from_slice(&m[16..]);
    Ok(id)
}

impl Rendezvous {
    /// Rank 0: publishes `id`. For TCP, a thread serves it until `size - 1` ranks have taken
    /// it or `timeout` passes.
    pub(crate) fn publish(&self, size: usize, id: &UniqueId, timeout: Duration) -> Result<()> {
        let message = encode(size, id);
        match self {
            Rendezvous::File(path) => {
                if path.exists() {
                    return Err(failed(format!(
                        "{} exists already (a stale id from an earlier run?): remove it or \
                         name a fresh path",
                        path.display()
                    )));
                }
                hal::durable::write_bytes_atomic(path, &message)
                    .map_err(|e| failed(format!("writing {}: {e}", path.display())))
            }
            Rendezvous::Tcp(addr) => {
                let listener = TcpListener::bind(addr)
                    .map_err(|e| failed(format!("listening on {addr}: {e}")))?;
                listener
                    .set_nonblocking(true)
                    .map_err(|e| failed(format!("{addr}: {e}")))?;
                std::thread::spawn(move || {
                    let deadline = Instant::now() + timeout;
                    let mut served = 0;
                    while served + 1 < size && Instant::now() < deadline {
                        match listener.accept() {
                            Ok((mut s, _)) => {
                                let _ = s.set_nonblocking(false);
                                let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
                                if s.write_all(&message).is_ok() {
                                    served += 1;
                                }
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(5)),
                        }
                    }
                });
                Ok(())
            }
        }
    }

    /// Ranks 1 and up: waits for rank 0's id.
    pub(crate) fn fetch(&self, size: usize, timeout: Duration) -> Result<UniqueId> {
        let deadline = Instant::now() + timeout;
        loop {
            let attempt = match self {
                Rendezvous::File(path) => match std::fs::read(path) {
                    Ok(bytes) => return decode(size, &bytes, &path.display().to_string()),
                    Err(e) => format!("{}: {e}", path.display()),
                },
                Rendezvous::Tcp(addr) => {
                    match TcpStream::connect_timeout(addr, Duration::from_secs(1)) {
                        Ok(mut s) => {
                            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                            let mut m = vec![0u8; MESSAGE];
                            match s.read_exact(&mut m) {
                                Ok(()) => return decode(size, &m, &addr.to_string()),
                                Err(e) => format!("reading from {addr}: {e}"),
                            }
                        }
                        Err(e) => format!("connecting to {addr}: {e}"),
                    }
                }
            };
            if Instant::now() >= deadline {
                return Err(failed(format!(
                    "no id from rank 0 within {timeout:?} (last attempt: {attempt})"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Rendezvous, UniqueId};
    use std::time::Duration;

    fn id(seed: u8) -> UniqueId {
        let mut id = UniqueId { internal: [0; 128] };
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8);
        }
        id
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rendezvous-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_file_hands_the_id_over_once_and_refuses_a_stale_one() {
        let dir = scratch("file");
        let r = Rendezvous::File(dir.join("id"));
        r.publish(3, &id(7), Duration::from_secs(1)).unwrap();
        assert_eq!(
            r.fetch(3, Duration::from_secs(1)).unwrap().internal,
            id(7).internal
        );
        // Another group's size, and a second rank 0 over the first's file, are refused.
        let e = r
            .fetch(4, Duration::from_secs(1))
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("group of 3") && e.contains("told 4"), "{e}");
        let e = r.publish(3, &id(8), Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("exists already"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_or_nothing_is_an_error_not_a_hang() {
        let dir = scratch("garbage");
        let path = dir.join("id");
        std::fs::write(&path, b"not a rendezvous message").unwrap();
        let r = Rendezvous::File(path);
        let e = r
            .fetch(2, Duration::from_secs(1))
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("does not hold"), "{e}");
        let missing = Rendezvous::File(dir.join("never"));
        let started = std::time::Instant::now();
        let e = missing
            .fetch(2, Duration::from_millis(200))
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("no id from rank 0"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tcp_serves_every_other_rank() {
        // A free port: bind to 0, read it back, let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let r = Rendezvous::Tcp(format!("127.0.0.1:{port}").parse().unwrap());
        r.publish(3, &id(1), Duration::from_secs(10)).unwrap();
        let fetched: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| s.spawn(|| r.fetch(3, Duration::from_secs(10)).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for f in fetched {
            assert_eq!(f.internal, id(1).internal);
        }
    }
}
