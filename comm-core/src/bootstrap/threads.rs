//! In-process bootstrap: every rank is a thread of this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Bootstrap, default_timeout};
use crate::error::{Error, Result};
use crate::exchange::Exchange;

/// One rank of a group of threads. Create the whole group with [`ThreadsBootstrap::create`]
/// and move one handle into each thread.
#[derive(Debug)]
pub struct ThreadsBootstrap {
    rank: usize,
    world_size: usize,
    exchange: Arc<Exchange<Arc<[u8]>>>,
    round: AtomicU64,
    timeout: Duration,
}

impl ThreadsBootstrap {
    /// Creates `world_size` handles, rank `i` at index `i`, with the default timeout.
    pub fn create(world_size: usize) -> Vec<ThreadsBootstrap> {
        Self::with_timeout(world_size, default_timeout())
    }

    /// Creates `world_size` handles whose waits give up after `timeout`.
    pub fn with_timeout(world_size: usize, timeout: Duration) -> Vec<ThreadsBootstrap> {
        assert!(world_size > 0, "a group needs at least one rank");
        let exchange = Exchange::new(world_size);
        (0..world_size)
            .map(|rank| ThreadsBootstrap {
                rank,
                world_size,
                exchange: exchange.clone(),
                round: AtomicU64::new(0),
                timeout,
            })
            .collect()
    }

    fn exchange(&self, data: &[u8], what: &str) -> Result<Arc<[Arc<[u8]>]>> {
        let round = self.round.fetch_add(1, Ordering::Relaxed);
        self.exchange
            .exchange(self.rank, round, Arc::from(data), Some(self.timeout), what)
    }
}

impl Bootstrap for ThreadsBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_world_size(&self) -> usize {
        self.world_size
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.exchange(data, "bootstrap all_gather")?;
        Ok(all.iter().map(|d| d.to_vec()).collect())
    }

    fn broadcast_bytes(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        if root >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a world of {}",
                self.world_size
            )));
        }
        let mine: &[u8] = if self.rank == root { data } else { &[] };
        let all = self.exchange(mine, "bootstrap broadcast")?;
        Ok(all[root].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_and_broadcasts_between_threads() {
        let handles: Vec<_> = ThreadsBootstrap::create(4)
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let all = b.all_gather_bytes(&vec![b.rank() as u8; b.rank()]).unwrap();
                    for (r, d) in all.iter().enumerate() {
                        assert_eq!(d, &vec![r as u8; r]);
                    }
                    let got = b.broadcast_bytes(b"from two", 2).unwrap();
                    assert_eq!(got, b"from two");
                    b.barrier().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_rank_that_never_arrives_is_a_timeout() {
        let group = ThreadsBootstrap::with_timeout(2, Duration::from_millis(100));
        let err = group[0].barrier().unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }
}
