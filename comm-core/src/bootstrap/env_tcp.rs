//! Environment + TCP bootstrap: ranks from the launcher's variables, bytes through a TCP
//! store that rank 0 serves.
//!
//! The ranks form a star. Rank 0 listens (on loopback unless told otherwise; see
//! [`EnvBootstrap::from_env`] for the variables and the port rule under `mpirun`), every
//! other rank connects to it, retrying until the timeout, and introduces itself with its rank,
//! the world size and a key derived from the job identity; rank 0 answers once every rank
//! has arrived. Connections that are not ranks (idle, slow, garbage) are heard each on a
//! thread of its own and shed when too many wait, so they cannot delay the start (see
//! `lobby`). Each collective call is then one round: every rank sends rank 0 a frame
//! (kind, root, sequence number, its bytes), rank 0 checks that all frames name the same
//! call and answers each rank with the result. A rank that is missing, late past the
//! timeout, out of step or calling something else makes the call fail on every rank
//! (rank 0 tells the others why); the store is then unusable ([`Error::Aborted`]), since
//! the ranks no longer agree on where they are in the sequence.
//!
//! Sockets use `TCP_NODELAY`, and small frames go out in one write, so that a round of
//! small messages costs two short hops, not Nagle's delay.

mod launch;
mod lobby;
mod wire;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use launch::LaunchInfo;

use self::launch::{StoreConfig, env_var};
use self::wire::{FailClass, Header, Kind, WireError, pack, read_frame, unpack, write_frame};
use super::{Bootstrap, default_timeout};
use crate::error::{Error, Result};

/// Size of a hello's payload: rank, world size and job key, 8 bytes each.
const HELLO_BYTES: usize = 24;

/// How long rank 0 tries to tell the others about a failure; it must not hang on a peer
/// that stopped reading.
const FAIL_NOTICE_WAIT: Duration = Duration::from_millis(500);

/// One rank of a job whose ranks talk through rank 0's TCP store.
///
/// ```no_run
/// use comm_core::{Bootstrap, EnvBootstrap};
///
/// // Under torchrun or mpirun: rank and world from the environment.
/// let boot = EnvBootstrap::from_env()?;
/// let names = boot.all_gather_bytes(format!("rank {}", boot.rank()).as_bytes())?;
/// assert_eq!(names.len(), boot.world_size());
/// # Ok::<(), comm_core::Error>(())
/// ```
#[derive(Debug)]
pub struct EnvBootstrap {
    info: LaunchInfo,
    timeout: Duration,
    link: Mutex<Link>,
}

#[derive(Debug)]
struct Link {
    role: Role,
    /// Collective calls made so far.
    seq: u64,
    /// Why the store became unusable.
    broken: Option<String>,
}

#[derive(Debug)]
enum Role {
    /// A job of one rank: nothing to talk to.
    Solo,
    /// Rank 0: one connection per other rank, rank `r` at index `r - 1`.
    Hub(Vec<TcpStream>),
    /// Any other rank: the connection to rank 0.
    Spoke(TcpStream),
}

impl EnvBootstrap {
    /// Joins the job described by this process's environment (see [`LaunchInfo::detect`]),
    /// waiting at most [`default_timeout`] for the others. A process started without a
    /// launcher is a job of one rank.
    ///
    /// The store is at `COMM_MASTER_ADDR` or `MASTER_ADDR` (default `127.0.0.1`; required
    /// when the ranks span several nodes), port `COMM_MASTER_PORT` or `MASTER_PORT`. Under
    /// `mpirun` (or Slurm, or torchrun's elastic agent) without a port, every rank derives
    /// the same one from the job's identity: `20000 + fnv1a64(identity) % 12000`, where the
    /// identity is the `NAME=value` line(s) of the first of `PMIX_NAMESPACE`,
    /// `OMPI_MCA_ess_base_jobid`, `SLURM_JOB_ID` + `SLURM_STEP_ID`, `TORCHELASTIC_RUN_ID`
    /// with `MASTER_PORT` that is set. Under torchrun `MASTER_PORT` is torch's own store's,
    /// so the port is derived there too unless `COMM_MASTER_PORT` is set. Concurrent jobs on
    /// one host thus use different ports (and a rank that reaches another job's store is
    /// refused, since the hash of the identity is checked when it connects). The range
    /// stays below Linux's ephemeral ports (32768 and up).
    pub fn from_env() -> Result<Self> {
        let info = LaunchInfo::detect()?.unwrap_or_else(LaunchInfo::single);
        let timeout = default_timeout();
        if info.world_size == 1 {
            return Ok(Self::solo(info, timeout));
        }
        let store = StoreConfig::from_vars(&info, env_var)?;
        Self::join(info, &store, timeout)
    }

    /// Joins the job of `info` through the store at `addr`: rank 0 binds `addr` and serves,
    /// the others connect to it. Every wait, now and in later calls, gives up after
    /// `timeout`.
    pub fn connect(info: LaunchInfo, addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let store = StoreConfig {
            addr,
            job_key: 0,
            port_source: format!("address {addr}"),
        };
        Self::join(info, &store, timeout)
    }

    /// Serves the store as rank 0 on a listener the caller already bound (for example to
    /// port 0, to let the system pick a free port and hand it to the others itself).
    pub fn with_listener(
        listener: TcpListener,
        info: LaunchInfo,
        timeout: Duration,
    ) -> Result<Self> {
        check_info(&info)?;
        if info.rank != 0 {
            return Err(Error::InvalidArgument(format!(
                "only rank 0 serves the store, this is {info}"
            )));
        }
        Self::serve(listener, info, 0, timeout)
    }

    /// What the launcher said about this process.
    pub fn launch_info(&self) -> &LaunchInfo {
        &self.info
    }

    fn solo(info: LaunchInfo, timeout: Duration) -> Self {
        EnvBootstrap {
            info,
            timeout,
            link: Mutex::new(Link {
                role: Role::Solo,
                seq: 0,
                broken: None,
            }),
        }
    }

    fn join(info: LaunchInfo, store: &StoreConfig, timeout: Duration) -> Result<Self> {
        check_info(&info)?;
        if info.world_size == 1 {
            return Ok(Self::solo(info, timeout));
        }
        if info.rank == 0 {
            let listener = TcpListener::bind(store.addr).map_err(|e| {
                Error::Bootstrap(format!(
                    "rank 0 cannot listen on {} ({}): {e}{}",
                    store.addr,
                    store.port_source,
                    if e.kind() == std::io::ErrorKind::AddrInUse {
                        "; another job or store holds this port: set COMM_MASTER_PORT or \
                         MASTER_PORT to a free one"
                    } else {
                        ""
                    }
                ))
            })?;
            Self::serve(listener, info, store.job_key, timeout)
        } else {
            Self::dial(info, store, timeout)
        }
    }

    /// Rank 0: accepts every other rank, then tells them all that the store is ready.
    fn serve(
        listener: TcpListener,
        info: LaunchInfo,
        job_key: u64,
        timeout: Duration,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut peers = lobby::gather_ranks(&listener, &info, job_key, deadline, timeout)?;
        // Connections from now on are refused by the system, not left waiting.
        drop(listener);
        for (i, peer) in peers.iter_mut().enumerate() {
            if let Err(e) = write_frame(peer, Header::new(Kind::Ready, 0, 0, 0), &[], deadline) {
                let why = format!("rank {} left before the store was ready: {e}", i + 1);
                notify_failure(&mut peers, FailClass::Bootstrap, &why);
                return Err(Error::Bootstrap(why));
            }
        }
        Ok(EnvBootstrap {
            info,
            timeout,
            link: Mutex::new(Link {
                role: Role::Hub(peers),
                seq: 0,
                broken: None,
            }),
        })
    }

    /// Any other rank: connects to rank 0 (retrying while it is not listening yet, or when
    /// it closed the connection unanswered), introduces itself and waits for the store to be
    /// ready.
    fn dial(info: LaunchInfo, store: &StoreConfig, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let addr = store.addr;
        let mut pause = Duration::from_millis(5);
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = if left.is_zero() {
                Err(std::io::Error::from(std::io::ErrorKind::TimedOut))
            } else {
                TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5)))
            };
            let last_error = match attempt {
                Ok(mut stream) => {
                    if introduce(&mut stream, &info, store, deadline, timeout)? {
                        break stream;
                    }
                    "rank 0 closed the connection unanswered".to_string()
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "rank 0's bootstrap store at {addr} ({}; last error: {last_error})",
                        store.port_source
                    ),
                    after: timeout,
                });
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(100));
        };
        Ok(EnvBootstrap {
            info,
            timeout,
            link: Mutex::new(Link {
                role: Role::Spoke(stream),
                seq: 0,
                broken: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Link> {
        // Every update of the link completes before anything can panic.
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One collective round: sends `data`, returns rank 0's answer. On failure the store
    /// is marked unusable.
    fn round(&self, kind: Kind, root: usize, data: &[u8]) -> Result<Reply> {
        let mut link = self.lock();
        if let Some(why) = &link.broken {
            return Err(Error::Aborted(why.clone()));
        }
        let seq = link.seq;
        link.seq += 1;
        let deadline = Instant::now() + self.timeout;
        let result = match &mut link.role {
            Role::Solo => Ok(Reply::All(vec![data.to_vec()])),
            Role::Hub(peers) => self.hub_round(peers, kind, root as u32, seq, data, deadline),
            Role::Spoke(hub) => self.spoke_round(hub, kind, root as u32, seq, data, deadline),
        };
        if let Err(e) = &result {
            link.broken = Some(format!("an earlier bootstrap call failed: {e}"));
            // Closing the connections tells every peer at once, rather than at its timeout.
            link.role = Role::Solo;
        }
        result
    }

    fn hub_round(
        &self,
        peers: &mut [TcpStream],
        kind: Kind,
        root: u32,
        seq: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Reply> {
        let call = format!("{} #{seq}", describe(kind, root));
        let mut parts = Vec::with_capacity(peers.len() + 1);
        parts.push(data.to_vec());
        for r in 1..=peers.len() {
            let got = read_frame(&mut peers[r - 1], deadline);
            let fail = match got {
                Ok((h, payload)) => {
                    if h.kind == kind && h.root == root && h.seq == seq {
                        parts.push(payload);
                        continue;
                    }
                    (
                        FailClass::Mismatch,
                        format!(
                            "rank {r} called {} #{} while rank 0 called {call}",
                            describe(h.kind, h.root),
                            h.seq
                        ),
                    )
                }
                Err(WireError::Timeout) => (
                    FailClass::Timeout,
                    format!("rank {r} to join bootstrap {call} (seen by rank 0)"),
                ),
                Err(e) => (
                    FailClass::Bootstrap,
                    format!("rank {r} during bootstrap {call}: {e}"),
                ),
            };
            notify_failure(peers, fail.0, &fail.1);
            return Err(local_error(fail.0, fail.1, self.timeout));
        }
        let (reply, answer) = match kind {
            Kind::AllGather => {
                let packed = pack(&parts);
                (Reply::All(parts), packed)
            }
            Kind::Broadcast => {
                let data = std::mem::take(&mut parts[root as usize]);
                (Reply::One(data.clone()), data)
            }
            _ => (Reply::One(Vec::new()), Vec::new()),
        };
        let header = Header::new(kind, root, seq, answer.len());
        for r in 1..=peers.len() {
            if let Err(e) = write_frame(&mut peers[r - 1], header, &answer, deadline) {
                let (class, why) = match e {
                    WireError::Timeout => (
                        FailClass::Timeout,
                        format!("rank {r} to take rank 0's answer to bootstrap {call}"),
                    ),
                    e => (
                        FailClass::Bootstrap,
                        format!("rank {r} during bootstrap {call}: {e}"),
                    ),
                };
                notify_failure(&mut peers[r..], class, &why);
                return Err(local_error(class, why, self.timeout));
            }
        }
        Ok(reply)
    }

    fn spoke_round(
        &self,
        hub: &mut TcpStream,
        kind: Kind,
        root: u32,
        seq: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Reply> {
        let call = format!("bootstrap {} #{seq}", describe(kind, root));
        let hub_failed = |e: WireError| wire_error(e, "rank 0", &call, self.timeout);
        write_frame(
            hub,
            Header::new(kind, root, seq, data.len()),
            data,
            deadline,
        )
        .map_err(hub_failed)?;
        let (h, payload) = read_frame(hub, deadline).map_err(hub_failed)?;
        if h.kind == Kind::Fail {
            return Err(fail_error(&payload, self.timeout));
        }
        if h.kind != kind || h.seq != seq || h.root != root {
            return Err(Error::Bootstrap(format!(
                "rank 0 answered {} #{} to {call}",
                describe(h.kind, h.root),
                h.seq
            )));
        }
        match kind {
            Kind::AllGather => unpack(&payload, self.info.world_size)
                .map(Reply::All)
                .map_err(|e| Error::Bootstrap(format!("{call}: {e}"))),
            _ => Ok(Reply::One(payload)),
        }
    }
}

/// Rank 0's answer to one round.
enum Reply {
    All(Vec<Vec<u8>>),
    One(Vec<u8>),
}

impl Bootstrap for EnvBootstrap {
    fn rank(&self) -> usize {
        self.info.rank
    }
    fn world_size(&self) -> usize {
        self.info.world_size
    }
    fn local_rank(&self) -> usize {
        self.info.local_rank
    }
    fn local_world_size(&self) -> usize {
        self.info.local_world_size
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self.round(Kind::AllGather, 0, data)? {
            Reply::All(all) => Ok(all),
            Reply::One(_) => Err(Error::Bootstrap("all_gather_bytes: wrong reply".into())),
        }
    }

    fn broadcast_bytes(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        if root >= self.info.world_size {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a world of {}",
                self.info.world_size
            )));
        }
        let mine: &[u8] = if self.info.rank == root { data } else { &[] };
        match self.round(Kind::Broadcast, root, mine)? {
            Reply::One(data) => Ok(data),
            Reply::All(mut all) => Ok(all.swap_remove(root)),
        }
    }

    fn barrier(&self) -> Result<()> {
        self.round(Kind::Barrier, 0, &[]).map(drop)
    }
}

fn check_info(info: &LaunchInfo) -> Result<()> {
    if info.world_size == 0 || info.rank >= info.world_size {
        return Err(Error::InvalidArgument(format!(
            "inconsistent launch info: {info}"
        )));
    }
    if info.world_size > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "world of {} ranks is too large",
            info.world_size
        )));
    }
    Ok(())
}

/// Says who this rank is on a fresh connection to rank 0 and waits for its answer: `true`
/// once the store is ready, `false` when rank 0 closed the connection without answering (it
/// sheds the oldest waiting connections when strays crowd it, or it is going away:
/// connecting again tells which).
fn introduce(
    stream: &mut TcpStream,
    info: &LaunchInfo,
    store: &StoreConfig,
    deadline: Instant,
    timeout: Duration,
) -> Result<bool> {
    stream.set_nodelay(true)?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&(info.rank as u64).to_le_bytes());
    hello.extend_from_slice(&(info.world_size as u64).to_le_bytes());
    hello.extend_from_slice(&store.job_key.to_le_bytes());
    let header = Header::new(Kind::Hello, 0, 0, hello.len());
    let reply =
        write_frame(stream, header, &hello, deadline).and_then(|()| read_frame(stream, deadline));
    let (reply, payload) = match reply {
        Ok(reply) => reply,
        Err(WireError::Closed) => return Ok(false),
        Err(e) => return Err(wire_error(e, "rank 0", "joining the store", timeout)),
    };
    let addr = store.addr;
    match reply.kind {
        Kind::Ready => Ok(true),
        Kind::Reject => Err(Error::Bootstrap(format!(
            "rank 0's store at {addr} refused rank {}: {}",
            info.rank,
            String::from_utf8_lossy(&payload)
        ))),
        Kind::Fail => Err(fail_error(&payload, timeout)),
        other => Err(Error::Bootstrap(format!(
            "rank 0's store at {addr} answered {} to hello",
            other.name()
        ))),
    }
}

/// Tells every peer that the call failed, and why.
fn notify_failure(peers: &mut [TcpStream], class: FailClass, why: &str) {
    let mut payload = vec![class as u8];
    payload.extend_from_slice(why.as_bytes());
    let header = Header::new(Kind::Fail, 0, 0, payload.len());
    let deadline = Instant::now() + FAIL_NOTICE_WAIT;
    for peer in peers {
        // Best effort: a peer that cannot be told finds out when the connection closes.
        let _ = write_frame(peer, header, &payload, deadline);
    }
}

/// The error a rank reports for rank 0's failure notice.
fn fail_error(payload: &[u8], timeout: Duration) -> Error {
    let class = FailClass::from_code(payload.first().copied().unwrap_or(0));
    let why = String::from_utf8_lossy(payload.get(1..).unwrap_or_default()).into_owned();
    local_error(class, why, timeout)
}

fn local_error(class: FailClass, why: String, timeout: Duration) -> Error {
    match class {
        FailClass::Timeout => Error::Timeout {
            what: why,
            after: timeout,
        },
        FailClass::Mismatch => Error::Mismatch(why),
        FailClass::Bootstrap => Error::Bootstrap(why),
    }
}

fn wire_error(e: WireError, peer: &str, call: &str, timeout: Duration) -> Error {
    match e {
        WireError::Timeout => Error::Timeout {
            what: format!("{peer} during {call}"),
            after: timeout,
        },
        WireError::Closed => Error::Bootstrap(format!(
            "{peer} closed the connection during {call} (did it exit or fail?)"
        )),
        e => Error::Bootstrap(format!("{peer} during {call}: {e}")),
    }
}

fn describe(kind: Kind, root: u32) -> String {
    match kind {
        Kind::Broadcast => format!("{} from root {root}", kind.name()),
        _ => kind.name().to_string(),
    }
}

#[cfg(test)]
mod stray_tests;
#[cfg(test)]
mod tests;
