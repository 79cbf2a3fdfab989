//! Passing file descriptors between the local ranks of a job (SCM_RIGHTS, through rustix).
//!
//! Each rank listens on an abstract Unix socket (Linux: no file on disk, nothing left
//! behind) whose name carries a token that rank 0 broadcasts through the bootstrap. Every
//! rank connects to every peer and sends its descriptor with its rank number; the kernel
//! queues the message until the peer accepts, so the all-to-all cannot deadlock. Every
//! wait is bounded by the bootstrap's timeout.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use comm_core::{Bootstrap, Error, Result};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// Sends `mine` to every local rank and returns every rank's descriptor, indexed by rank
/// (this rank's own entry is a duplicate of `mine`). All ranks must be on this node.
pub fn exchange_fds(bootstrap: &dyn Bootstrap, mine: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
    let world = bootstrap.world_size();
    let me = bootstrap.rank();
    let timeout = bootstrap.timeout();
    let token = bootstrap.broadcast_bytes(&random_token().to_le_bytes(), 0)?;
    let name = |rank: usize| format!("comm-symm-{}-{rank}", hex(&token));

    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name(me))?)?;
    listener.set_nonblocking(true)?;
    bootstrap.barrier()?;

    for peer in (0..world).filter(|&p| p != me) {
        let addr = SocketAddr::from_abstract_name(name(peer))?;
        let stream = UnixStream::connect_addr(&addr).map_err(|e| {
            Error::Bootstrap(format!(
                "rank {me}: connecting to rank {peer} for fd passing: {e}"
            ))
        })?;
        send_fd(&stream, mine, me as u32)?;
    }

    let mut fds: Vec<Option<OwnedFd>> = (0..world).map(|_| None).collect();
    fds[me] = Some(mine.try_clone_to_owned()?);
    let deadline = Instant::now() + timeout;
    for _ in 1..world {
        let stream = accept_until(&listener, deadline, timeout)?;
        stream.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))?;
        let (fd, rank) = recv_fd(&stream)?;
        let slot = fds.get_mut(rank as usize).ok_or_else(|| {
            Error::Bootstrap(format!(
                "fd passing: rank {rank} is outside a world of {world}"
            ))
        })?;
        *slot = Some(fd);
    }
    // Nobody may tear down its listener (and its name) while a peer could still connect.
    bootstrap.barrier()?;
    fds.into_iter()
        .enumerate()
        .map(|(r, fd)| {
            fd.ok_or_else(|| Error::Bootstrap(format!("fd passing: no descriptor from rank {r}")))
        })
        .collect()
}

fn accept_until(
    listener: &UnixListener,
    deadline: Instant,
    timeout: Duration,
) -> Result<UnixStream> {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        what: "a peer's file descriptor".into(),
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>, rank: u32) -> Result<()> {
    let payload = rank.to_le_bytes();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Error::Bootstrap(
            "fd passing: no room for the descriptor".into(),
        ));
    }
    let sent = sendmsg(
        stream,
        &[IoSlice::new(&payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(io::Error::from)?;
    if sent != payload.len() {
        return Err(Error::Bootstrap(format!(
            "fd passing: short send ({sent} bytes)"
        )));
    }
    Ok(())
}

fn recv_fd(stream: &UnixStream) -> Result<(OwnedFd, u32)> {
    let mut payload = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = match recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut payload)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    ) {
        Ok(got) => got.bytes,
        Err(e) => {
            let e = io::Error::from(e);
            return Err(if e.kind() == io::ErrorKind::WouldBlock {
                Error::Timeout {
                    what: "a peer's file descriptor message".into(),
                    after: stream.read_timeout()?.unwrap_or_default(),
                }
            } else {
                e.into()
            });
        }
    };
    // Every descriptor that arrived is owned (and closed) here, wanted or not.
    let mut fds: Vec<OwnedFd> = control
        .drain()
        .filter_map(|msg| match msg {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    if got != payload.len() {
        return Err(Error::Bootstrap(format!(
            "fd passing: short message ({got} bytes)"
        )));
    }
    if fds.len() != 1 {
        return Err(Error::Bootstrap(format!(
            "fd passing: message carried {} descriptors, not one",
            fds.len()
        )));
    }
    Ok((fds.remove(0), u32::from_le_bytes(payload)))
}

fn random_token() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    t ^ (u64::from(std::process::id()) << 32) ^ (&local as *const u8 as u64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
