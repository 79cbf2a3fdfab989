//! Rank 0's store among connections that are not ranks: idle ones, ones that trickle their
//! bytes, garbage, absurd lengths and false introductions. None of them may delay the real
//! ranks, and a job that cannot start still ends in an error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::tests::info;
use super::*;

/// Loose on purpose (shared CI machines): a start among strays takes milliseconds, while
/// serving the strays' introductions one after another took 2 s each.
const PROMPT: Duration = Duration::from_secs(5);

/// A connection that is not a rank, held open until dropped.
fn stray(addr: SocketAddr) -> TcpStream {
    TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("rank 0 accepts strays")
}

/// Serves a job of `n` ranks on an ephemeral port: rank 0 starts at once, `strays` then
/// gets the address, and ranks 1.. start after it returned. Gives each rank's result of
/// joining and gathering its rank, the time the ranks 1.. took from their start, and what
/// `strays` returned (dropped by the caller, so the strays stay open throughout).
fn start_among<S>(
    n: usize,
    timeout: Duration,
    strays: impl FnOnce(SocketAddr) -> S,
) -> (Vec<Result<Vec<Vec<u8>>>>, Duration, S) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let gather = |boot: Result<EnvBootstrap>| -> Result<Vec<Vec<u8>>> {
        let boot = boot?;
        boot.all_gather_bytes(&[boot.rank() as u8])
    };
    let zero = std::thread::spawn(move || {
        gather(EnvBootstrap::with_listener(listener, info(0, n), timeout))
    });
    let held = strays(addr);
    let start = Instant::now();
    let others: Vec<JoinHandle<_>> = (1..n)
        .map(|rank| {
            std::thread::spawn(move || gather(EnvBootstrap::connect(info(rank, n), addr, timeout)))
        })
        .collect();
    let mut results: Vec<_> = others.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed();
    results.insert(0, zero.join().unwrap());
    (results, elapsed, held)
}

fn assert_started(results: &[Result<Vec<Vec<u8>>>]) {
    let want: Vec<Vec<u8>> = (0..results.len()).map(|r| vec![r as u8]).collect();
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.as_ref().ok(), Some(&want), "rank {rank}: {got:?}");
    }
}

/// True once the peer has closed `stream` (read gives end of file or a reset).
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = [0u8; 256];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

#[test]
fn hundreds_of_idle_connections_do_not_delay_the_start() {
    let (results, elapsed, mut idle) = start_among(4, Duration::from_secs(60), |addr| {
        let idle: Vec<TcpStream> = (0..200).map(|_| stray(addr)).collect();
        idle
    });
    assert_started(&results);
    eprintln!("the start took {elapsed:?} among 200 idle connections");
    assert!(
        elapsed < PROMPT,
        "the start took {elapsed:?} among 200 idle connections"
    );
    // Rank 0 holds a bounded number of them while it waits, and none once it is ready: every
    // one was closed, the oldest to make room, the rest when the store was ready.
    for (i, conn) in idle.iter_mut().enumerate() {
        assert!(closed_by_peer(conn), "idle connection {i} is still open");
    }
}

#[test]
fn idle_connections_arriving_during_the_start_do_not_delay_it() {
    let (results, elapsed, flood) = start_among(3, Duration::from_secs(60), |addr| {
        let (begun, has_begun) = std::sync::mpsc::channel();
        let flood = std::thread::spawn(move || {
            let mut held = Vec::new();
            // Until the store is ready and its port closes.
            while let Ok(conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
                held.push(conn);
                if held.len() == 50 {
                    begun.send(()).unwrap();
                }
            }
            held.len()
        });
        has_begun.recv().unwrap();
        flood
    });
    assert_started(&results);
    eprintln!("the start took {elapsed:?} during a flood");
    assert!(
        elapsed < PROMPT,
        "the start took {elapsed:?} during a flood"
    );
    assert!(flood.join().unwrap() >= 50);
}

/// A connection that sends a hello's header one byte every 100 ms, for `bytes` bytes.
fn trickle(addr: SocketAddr, bytes: usize) -> JoinHandle<()> {
    let mut conn = stray(addr);
    std::thread::spawn(move || {
        let head = Header::new(Kind::Hello, 0, 0, HELLO_BYTES).encode();
        for &b in head.iter().cycle().take(bytes) {
            if conn.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

#[test]
fn slow_and_malformed_clients_do_not_block_the_start() {
    let (results, elapsed, (tricklers, mut others)) =
        start_among(3, Duration::from_secs(60), |addr| {
            let tricklers: Vec<_> = (0..16).map(|_| trickle(addr, 40)).collect();
            let mut others = Vec::new();
            // Garbage, headers that announce absurd payloads, then false introductions:
            // correct frames that name a rank no connection may be.
            for _ in 0..8 {
                let mut c = stray(addr);
                c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
                others.push(c);
            }
            for len in [HELLO_BYTES + 1, 1 << 40, usize::MAX >> 1] {
                let mut c = stray(addr);
                c.write_all(&Header::new(Kind::Hello, 0, 0, len).encode())
                    .unwrap();
                others.push(c);
            }
            for (rank, world) in [(0u64, 3u64), (3, 3), (1, 4)] {
                let mut c = stray(addr);
                let mut hello = Vec::new();
                for word in [rank, world, 0] {
                    hello.extend_from_slice(&word.to_le_bytes());
                }
                let head = Header::new(Kind::Hello, 0, 0, hello.len()).encode();
                c.write_all(&[&head[..], &hello].concat()).unwrap();
                let (reply, why) = read_frame(&mut c, Instant::now() + PROMPT).unwrap();
                assert_eq!(reply.kind, Kind::Reject, "rank {rank} of {world}");
                assert!(!why.is_empty());
            }
            (tricklers, others)
        });
    assert_started(&results);
    eprintln!("the start took {elapsed:?} among slow clients");
    assert!(
        elapsed < PROMPT,
        "the start took {elapsed:?} among slow clients"
    );
    for (i, conn) in others.iter_mut().enumerate() {
        assert!(closed_by_peer(conn), "malformed client {i} is still open");
    }
    for t in tricklers {
        t.join().unwrap();
    }
}

#[test]
fn a_missing_rank_among_strays_is_still_a_prompt_timeout() {
    let bound = Duration::from_millis(800);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    let zero = std::thread::spawn(move || EnvBootstrap::with_listener(listener, info(0, 3), bound));
    let idle: Vec<TcpStream> = (0..100).map(|_| stray(addr)).collect();
    let tricklers: Vec<_> = (0..8).map(|_| trickle(addr, 60)).collect();
    // Rank 2 of 3 never comes.
    let one = EnvBootstrap::connect(info(1, 3), addr, bound).map(drop);
    let zero = zero.join().unwrap().map(drop);
    let elapsed = start.elapsed();
    assert!(
        matches!(&zero, Err(Error::Timeout { what, .. }) if what.contains("rank(s) 2")),
        "{zero:?}"
    );
    assert!(one.is_err(), "{one:?}");
    assert!(elapsed < bound + PROMPT, "{elapsed:?}");
    drop(idle);
    for t in tricklers {
        t.join().unwrap();
    }
}

#[test]
fn a_rank_dropped_before_its_answer_connects_again() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let one = std::thread::spawn(move || {
        let boot = EnvBootstrap::connect(info(1, 2), addr, Duration::from_secs(20))?;
        boot.all_gather_bytes(b"one")
    });
    // As rank 0 drops the connections it has no room for: closed without an answer.
    let (first, _) = listener.accept().unwrap();
    drop(first);
    let boot = EnvBootstrap::with_listener(listener, info(0, 2), Duration::from_secs(20)).unwrap();
    let all = boot.all_gather_bytes(b"zero").unwrap();
    assert_eq!(all, vec![b"zero".to_vec(), b"one".to_vec()]);
    assert_eq!(one.join().unwrap().unwrap(), all);
}
