//! Wire format of the TCP store: length-prefixed frames, read and written against a deadline.
//!
//! A frame is a fixed header (magic, kind, root, sequence number, payload length, all
//! little-endian) followed by the payload. The sequence number is the count of collective
//! calls made before this one, so a rank that is one call ahead or behind is caught on the
//! first frame. Every read and write takes a deadline and returns [`WireError::Timeout`]
//! when it passes, whatever the peer does; payloads grow as their bytes arrive, so a
//! corrupt length cannot make a rank allocate memory that was never sent.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Identifies a frame of this protocol (and its version).
const MAGIC: [u8; 4] = *b"cmb1";

/// Encoded size of a [`Header`].
pub(super) const HEADER_BYTES: usize = 28;

/// Payloads below this size are sent in the same write as their header: one segment on the
/// wire, which matters with `TCP_NODELAY` for the many tiny exchanges of a host backend.
const COALESCE_BYTES: usize = 64 * 1024;

/// Payload bytes received per step; the buffer grows by at most this much ahead of the data.
const READ_STEP: usize = 4 << 20;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A rank introduces itself to rank 0 (payload: rank, world size, job key).
    Hello,
    /// Rank 0 has heard from every rank; the store is ready.
    Ready,
    /// Rank 0 refuses a connection (payload: the reason).
    Reject,
    /// A gather of every rank's bytes.
    AllGather,
    /// A broadcast from `root`.
    Broadcast,
    /// A barrier.
    Barrier,
    /// Rank 0 reports that the call failed (payload: [`FailClass`] byte and the reason).
    Fail,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Hello,
        Kind::Ready,
        Kind::Reject,
        Kind::AllGather,
        Kind::Broadcast,
        Kind::Barrier,
        Kind::Fail,
    ];

    fn code(self) -> u8 {
        match self {
            Kind::Hello => 1,
            Kind::Ready => 2,
            Kind::Reject => 3,
            Kind::AllGather => 4,
            Kind::Broadcast => 5,
            Kind::Barrier => 6,
            Kind::Fail => 7,
        }
    }

    /// Name of the call, for error messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Ready => "ready",
            Kind::Reject => "reject",
            Kind::AllGather => "all_gather_bytes",
            Kind::Broadcast => "broadcast_bytes",
            Kind::Barrier => "barrier",
            Kind::Fail => "fail",
        }
    }
}

/// Why rank 0 failed a call; each class maps back to the same [`crate::Error`] variant on
/// every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailClass {
    /// Anything else: a peer left, a malformed frame, an I/O error.
    Bootstrap = 0,
    /// A rank did not arrive in time.
    Timeout = 1,
    /// Ranks made different calls.
    Mismatch = 2,
}

impl FailClass {
    pub(super) fn from_code(code: u8) -> FailClass {
        match code {
            1 => FailClass::Timeout,
            2 => FailClass::Mismatch,
            _ => FailClass::Bootstrap,
        }
    }
}

/// The fixed part of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) kind: Kind,
    /// Root rank of a broadcast, 0 otherwise.
    pub(super) root: u32,
    /// Number of collective calls this rank made before this one.
    pub(super) seq: u64,
    /// Payload length in bytes.
    pub(super) len: u64,
}

impl Header {
    pub(super) fn new(kind: Kind, root: u32, seq: u64, len: usize) -> Self {
        Header {
            kind,
            root,
            seq,
            len: len as u64,
        }
    }

    pub(super) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = self.kind.code();
        out[8..12].copy_from_slice(&self.root.to_le_bytes());
        out[12..20].copy_from_slice(&self.seq.to_le_bytes());
        out[20..28].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Self, WireError> {
        if bytes[0..4] != MAGIC {
            return Err(WireError::Malformed(
                "not a comm bootstrap frame (bad magic)".into(),
            ));
        }
        let kind = Kind::ALL
            .into_iter()
            .find(|k| k.code() == bytes[4])
            .ok_or_else(|| WireError::Malformed(format!("unknown frame kind {}", bytes[4])))?;
        let word = |range: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..range.len()].copy_from_slice(&bytes[range]);
            u64::from_le_bytes(b)
        };
        Ok(Header {
            kind,
            root: word(8..12) as u32,
            seq: word(12..20),
            len: word(20..28),
        })
    }
}

/// Why a frame could not be moved.
#[derive(Debug)]
pub(super) enum WireError {
    /// The deadline passed.
    Timeout,
    /// The peer closed the connection.
    Closed,
    /// The bytes are not a valid frame.
    Malformed(String),
    /// The socket failed.
    Io(io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Timeout => f.write_str("timed out"),
            WireError::Closed => f.write_str("connection closed"),
            WireError::Malformed(why) => write!(f, "malformed frame: {why}"),
            WireError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Writes one frame, giving up at `deadline`.
pub(super) fn write_frame(
    stream: &mut TcpStream,
    header: Header,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), WireError> {
    let head = header.encode();
    if payload.len() < COALESCE_BYTES {
        let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
        frame.extend_from_slice(&head);
        frame.extend_from_slice(payload);
        write_all_by(stream, &frame, deadline)
    } else {
        write_all_by(stream, &head, deadline)?;
        write_all_by(stream, payload, deadline)
    }
}

/// Reads one frame, giving up at `deadline`.
pub(super) fn read_frame(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<(Header, Vec<u8>), WireError> {
    read_frame_at_most(stream, deadline, usize::MAX)
}

/// Reads one frame whose payload is `limit` bytes at most (a longer one is malformed, and
/// none of it is read), giving up at `deadline`.
pub(super) fn read_frame_at_most(
    stream: &mut TcpStream,
    deadline: Instant,
    limit: usize,
) -> Result<(Header, Vec<u8>), WireError> {
    let mut head = [0u8; HEADER_BYTES];
    read_exact_by(stream, &mut head, deadline)?;
    let header = Header::decode(&head)?;
    let len = usize::try_from(header.len)
        .ok()
        .filter(|&len| len <= limit)
        .ok_or_else(|| WireError::Malformed(format!("payload of {} bytes", header.len)))?;
    let mut payload = Vec::new();
    payload
        .try_reserve_exact(len.min(READ_STEP))
        .map_err(|_| WireError::Malformed(format!("cannot allocate {len} bytes")))?;
    while payload.len() < len {
        let start = payload.len();
        let step = (len - start).min(READ_STEP.max(start));
        payload
            .try_reserve(step)
            .map_err(|_| WireError::Malformed(format!("cannot allocate {len} bytes")))?;
        payload.resize(start + step, 0);
        read_exact_by(stream, &mut payload[start..], deadline)?;
    }
    Ok((header, payload))
}

fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        arm(deadline, |t| stream.set_read_timeout(Some(t)))?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => done += n,
            Err(e) if retryable(&e) => {}
            Err(e) if closed(&e) => return Err(WireError::Closed),
            Err(e) => return Err(WireError::Io(e)),
        }
    }
    Ok(())
}

fn write_all_by(stream: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        arm(deadline, |t| stream.set_write_timeout(Some(t)))?;
        match stream.write(&buf[done..]) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => done += n,
            Err(e) if retryable(&e) => {}
            Err(e) if closed(&e) => return Err(WireError::Closed),
            Err(e) => return Err(WireError::Io(e)),
        }
    }
    Ok(())
}

/// Sets the socket timeout to what is left before `deadline`, or reports the timeout.
fn arm(
    deadline: Instant,
    set: impl FnOnce(std::time::Duration) -> io::Result<()>,
) -> Result<(), WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(WireError::Timeout);
    }
    set(left).map_err(WireError::Io)
}

/// Errors after which the same call may simply be tried again (the deadline decides).
fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// Packs every rank's bytes into one payload: the count, each length, then the bytes.
pub(super) fn pack(parts: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = parts.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(8 * (parts.len() + 1) + total);
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
    }
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// Unpacks [`pack`], checking that it holds exactly `count` parts and nothing else.
pub(super) fn unpack(bytes: &[u8], count: usize) -> Result<Vec<Vec<u8>>, WireError> {
    let bad = |why: &str| WireError::Malformed(format!("gathered payload: {why}"));
    let word = |at: usize| -> Result<usize, WireError> {
        let b = bytes.get(at..at + 8).ok_or_else(|| bad("truncated"))?;
        usize::try_from(u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .map_err(|_| bad("length overflows"))
    };
    if word(0)? != count {
        return Err(bad(&format!("expected {count} parts")));
    }
    let mut at = 8 * (count + 1);
    let mut parts = Vec::with_capacity(count);
    for i in 0..count {
        let len = word(8 * (i + 1))?;
        let end = at.checked_add(len).ok_or_else(|| bad("length overflows"))?;
        parts.push(bytes.get(at..end).ok_or_else(|| bad("truncated"))?.to_vec());
        at = end;
    }
    if at != bytes.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = Header::new(Kind::Broadcast, 3, 1 << 40, 12345);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'x';
        assert!(matches!(Header::decode(&bad), Err(WireError::Malformed(_))));
        let mut bad = h.encode();
        bad[4] = 99;
        assert!(matches!(Header::decode(&bad), Err(WireError::Malformed(_))));
    }

    #[test]
    fn a_payload_over_the_limit_is_malformed_before_it_is_read() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // Only the header is sent: reading the payload would wait for the deadline.
        a.write_all(&Header::new(Kind::Hello, 0, 0, 25).encode())
            .unwrap();
        let start = Instant::now();
        let err = read_frame_at_most(&mut b, deadline, 24).unwrap_err();
        assert!(matches!(err, WireError::Malformed(_)), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
        write_frame(
            &mut a,
            Header::new(Kind::Hello, 0, 0, 24),
            &[1; 24],
            deadline,
        )
        .unwrap();
        let (h, p) = read_frame_at_most(&mut b, deadline, 24).unwrap();
        assert_eq!((h.kind, p), (Kind::Hello, vec![1; 24]));
    }

    #[test]
    fn packing_round_trips_and_rejects_truncation() {
        let parts = vec![vec![], vec![1u8, 2, 3], vec![9u8; 1000]];
        let packed = pack(&parts);
        assert_eq!(unpack(&packed, 3).unwrap(), parts);
        assert!(unpack(&packed, 2).is_err());
        assert!(unpack(&packed[..packed.len() - 1], 3).is_err());
        let mut long = packed.clone();
        long.push(0);
        assert!(unpack(&long, 3).is_err());
        assert!(unpack(&[], 0).is_err());
    }

    #[test]
    fn frames_cross_a_socket_and_a_silent_peer_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let deadline = || Instant::now() + Duration::from_secs(5);
        let big = vec![7u8; COALESCE_BYTES + 3];
        let sender = std::thread::spawn(move || {
            write_frame(
                &mut a,
                Header::new(Kind::AllGather, 0, 5, 3),
                b"abc",
                deadline(),
            )
            .unwrap();
            write_frame(
                &mut a,
                Header::new(Kind::Barrier, 0, 6, big.len()),
                &big,
                deadline(),
            )
            .unwrap();
            a
        });
        let (h, p) = read_frame(&mut b, deadline()).unwrap();
        assert_eq!(
            (h.kind, h.seq, p.as_slice()),
            (Kind::AllGather, 5, &b"abc"[..])
        );
        let (h, p) = read_frame(&mut b, deadline()).unwrap();
        assert_eq!((h.kind, p.len()), (Kind::Barrier, COALESCE_BYTES + 3));
        let a = sender.join().unwrap();
        let start = Instant::now();
        let err = read_frame(&mut b, Instant::now() + Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, WireError::Timeout), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(a);
        assert!(matches!(
            read_frame(&mut b, deadline()),
            Err(WireError::Closed)
        ));
    }
}
