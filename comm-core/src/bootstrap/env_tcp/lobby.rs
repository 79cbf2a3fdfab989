//! Rank 0's lobby: where accepted connections introduce themselves before the store is ready.
//!
//! Any process that can reach the store's port can connect to it, so a connection that says
//! nothing, trickles its bytes or speaks another protocol must cost the real ranks nothing.
//! Each accepted connection gets a thread of its own, which reads its hello against a
//! deadline of its own ([`HELLO_WAIT`]) and then admits it as its rank or refuses it;
//! rank 0's thread only accepts and waits for the ranks. The connections still to introduce
//! themselves are bounded ([`MAX_STRAYS`] beyond the world's own): past that, the oldest is
//! shut down, which also ends its thread at once, so a flood holds a bounded number of
//! sockets and threads. A real rank whose connection was shed sees it close without an
//! answer and connects again.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::wire::{FailClass, Header, Kind, read_frame_at_most, write_frame};
use super::{FAIL_NOTICE_WAIT, HELLO_BYTES, LaunchInfo, notify_failure};
use crate::error::{Error, Result};

/// How long a connection may take to introduce itself, at most.
const HELLO_WAIT: Duration = Duration::from_secs(2);

/// How many connections beyond the world's own may wait to introduce themselves at once.
const MAX_STRAYS: usize = 64;

/// Connections accepted per look at the ranks, so that a flood cannot keep rank 0 from
/// seeing that they have all arrived, or that its time is up.
const ACCEPTS_PER_ROUND: usize = 64;

/// A hello reader's stack: it holds a 24-byte frame and formats a refusal.
const HELLO_STACK_BYTES: usize = 256 << 10;

/// What rank 0's thread and the hello readers share.
#[derive(Default)]
struct Lobby {
    /// Connections yet to introduce themselves, oldest first: a number that names the
    /// connection, and a handle to shut it down with.
    waiting: VecDeque<(u64, TcpStream)>,
    /// Rank `r`'s connection at index `r - 1`, once it has introduced itself.
    ranks: Vec<Option<TcpStream>>,
}

struct Shared {
    lobby: Mutex<Lobby>,
    /// Signalled when a rank is admitted.
    arrived: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Lobby> {
        // Every update of the lobby completes before anything can panic.
        self.lobby.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a connection's hello is checked against.
#[derive(Clone, Copy)]
struct Expect {
    world_size: usize,
    job_key: u64,
    /// When rank 0 stops waiting.
    deadline: Instant,
}

/// Accepts connections on `listener` until every rank `1..world_size` has introduced
/// itself, and returns their connections in rank order. At `deadline` it gives up: the
/// ranks that arrived are told, and the error names the missing ones.
pub(super) fn gather_ranks(
    listener: &TcpListener,
    info: &LaunchInfo,
    job_key: u64,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<TcpStream>> {
    let addr = listener.local_addr()?;
    // Non-blocking accept, so that rank 0 also watches the ranks and the clock.
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        lobby: Mutex::new(Lobby {
            waiting: VecDeque::new(),
            ranks: (1..info.world_size).map(|_| None).collect(),
        }),
        arrived: Condvar::new(),
    });
    let expect = Expect {
        world_size: info.world_size,
        job_key,
        deadline,
    };
    let capacity = MAX_STRAYS + info.world_size;
    let mut next_id = 0u64;
    let mut pause = Duration::from_millis(1);
    let outcome = 'wait: loop {
        let mut accepted = 0;
        while accepted < ACCEPTS_PER_ROUND {
            match listener.accept() {
                Ok((stream, _)) => {
                    welcome(&shared, stream, next_id, capacity, expect);
                    next_id += 1;
                    accepted += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => break 'wait Err(Error::Bootstrap(format!("accepting on {addr}: {e}"))),
            }
        }
        let lobby = shared.lock();
        if lobby.ranks.iter().all(Option::is_some) {
            break Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let missing: Vec<String> = lobby
                .ranks
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_none())
                .map(|(i, _)| (i + 1).to_string())
                .collect();
            break Err(Error::Timeout {
                what: format!(
                    "rank(s) {} to connect to the bootstrap store at {addr}",
                    missing.join(", ")
                ),
                after: timeout,
            });
        }
        if accepted > 0 {
            pause = Duration::from_millis(1);
        } else {
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        // An admission wakes rank 0 at once; new connections are looked for every `pause`.
        drop(shared.arrived.wait_timeout(lobby, pause.min(left)));
    };
    // Close the lobby: the connections still waiting are shut down, which ends their
    // threads now, and a hello read after this finds its connection gone.
    let mut lobby = shared.lock();
    for (_, waiting) in lobby.waiting.drain(..) {
        let _ = waiting.shutdown(Shutdown::Both);
    }
    let mut ranks: Vec<TcpStream> = std::mem::take(&mut lobby.ranks)
        .into_iter()
        .flatten()
        .collect();
    drop(lobby);
    match outcome {
        Ok(()) => Ok(ranks),
        Err(e) => {
            let class = match e {
                Error::Timeout { .. } => FailClass::Timeout,
                _ => FailClass::Bootstrap,
            };
            notify_failure(&mut ranks, class, &e.to_string());
            Err(e)
        }
    }
}

/// Puts a new connection in the lobby, shedding the oldest waiting one if it is full, and
/// starts the thread that hears its hello.
fn welcome(shared: &Arc<Shared>, stream: TcpStream, id: u64, capacity: usize, expect: Expect) {
    // Without a handle to shut it down with, it could not be shed: it is dropped instead.
    let Ok(handle) = stream.try_clone() else {
        return;
    };
    {
        let mut lobby = shared.lock();
        if lobby.waiting.len() >= capacity
            && let Some((_, oldest)) = lobby.waiting.pop_front()
        {
            let _ = oldest.shutdown(Shutdown::Both);
        }
        lobby.waiting.push_back((id, handle));
    }
    let reader = Arc::clone(shared);
    let started = std::thread::Builder::new()
        .name("comm-store-hello".into())
        .stack_size(HELLO_STACK_BYTES)
        .spawn(move || hear_hello(&reader, id, stream, expect));
    if started.is_err() {
        // No thread to hear it: the connection is dropped (a real rank connects again).
        let mut lobby = shared.lock();
        if let Some(at) = lobby.waiting.iter().position(|(w, _)| *w == id) {
            if let Some((_, handle)) = lobby.waiting.remove(at) {
                let _ = handle.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A connection's thread: reads its hello, then admits it as its rank, refuses it with the
/// reason, or (for anything that is not a hello) drops it without a word.
fn hear_hello(shared: &Shared, id: u64, mut stream: TcpStream, expect: Expect) {
    let hello_deadline = expect.deadline.min(Instant::now() + HELLO_WAIT);
    // Accepted sockets may inherit the listener's non-blocking mode on some systems.
    let hello = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .ok()
        .and_then(|()| read_frame_at_most(&mut stream, hello_deadline, HELLO_BYTES).ok());
    let mut lobby = shared.lock();
    // Gone from the lobby: shed for a newer connection, or rank 0 stopped waiting.
    let Some(at) = lobby.waiting.iter().position(|(w, _)| *w == id) else {
        return;
    };
    lobby.waiting.remove(at);
    let Some((header, payload)) = hello else {
        return;
    };
    if header.kind != Kind::Hello {
        return;
    }
    let word = |i: usize| {
        payload
            .get(8 * i..8 * i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let (Some(rank), Some(world), Some(key)) = (word(0), word(1), word(2)) else {
        return;
    };
    let why = if key != expect.job_key {
        format!(
            "it belongs to another job (job key {key:#x}, this store's is {:#x}); give each \
             job its own MASTER_PORT",
            expect.job_key
        )
    } else if world != expect.world_size as u64 {
        format!(
            "it says the world has {world} ranks, rank 0 says {}",
            expect.world_size
        )
    } else if rank == 0 || rank >= world {
        format!("rank {rank} is not a rank 1..{world} may connect as")
    } else if lobby.ranks[rank as usize - 1].is_some() {
        format!("rank {rank} is already connected")
    } else {
        lobby.ranks[rank as usize - 1] = Some(stream);
        shared.arrived.notify_one();
        return;
    };
    drop(lobby);
    let _ = write_frame(
        &mut stream,
        Header::new(Kind::Reject, 0, 0, why.len()),
        why.as_bytes(),
        Instant::now() + FAIL_NOTICE_WAIT,
    );
}
