//! Passing file descriptors between the local ranks of a job (SCM_RIGHTS).
//!
//! Each rank listens on an abstract Unix socket (Linux: no file on disk, nothing left
//! behind) whose name carries a token that rank 0 broadcasts through the bootstrap. Every
//! rank connects to every peer and sends its descriptor with its rank number; the kernel
//! queues the message until the peer accepts, so the all-to-all cannot deadlock. Every
//! wait is bounded by the bootstrap's timeout.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use comm_core::{Bootstrap, Error, Result};

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
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `control` has room for one cmsg carrying one int (CMSG_SPACE above), so the
    // first header and its data lie inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, fd.as_raw_fd());
    }
    // SAFETY: `msg` and everything it points to are valid for the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent != payload.len() as isize {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn recv_fd(stream: &UnixStream) -> Result<(OwnedFd, u32)> {
    let mut payload = [0u8; 4];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers of the stated sizes.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::WouldBlock {
            Error::Timeout {
                what: "a peer's file descriptor message".into(),
                after: stream.read_timeout()?.unwrap_or_default(),
            }
        } else {
            e.into()
        });
    }
    if got as usize != payload.len() {
        return Err(Error::Bootstrap(format!(
            "fd passing: short message ({got} bytes)"
        )));
    }
    // SAFETY: the kernel filled `control` up to msg_controllen; CMSG_FIRSTHDR checks bounds.
    let fd = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(Error::Bootstrap(
                "fd passing: message carried no descriptor".into(),
            ));
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int)
    };
    // SAFETY: SCM_RIGHTS installed a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((fd, u32::from_le_bytes(payload)))
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
