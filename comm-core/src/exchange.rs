//! An in-process exchange: `n` threads each deposit a value and all receive every value.
//!
//! This is the one synchronisation primitive of the in-process bootstrap and of
//! [`LocalComm`](crate::LocalComm). Waits are bounded: a participant that does not arrive
//! makes the others fail with [`Error::Timeout`], and the exchange is then aborted for
//! everyone, so no thread can later touch buffers that a timed-out peer has released.
//!
//! Two slot sets alternate. A fast participant can deposit for round `k + 1` while a slow
//! one still reads the results of round `k`, but it cannot reach round `k + 2` (which
//! reuses round `k`'s set) before every participant has deposited for `k + 1`, that is,
//! after all of them have read round `k`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::error::{Error, Result};

/// The shared state of one exchange group.
#[derive(Debug)]
pub(crate) struct Exchange<T> {
    participants: usize,
    state: Mutex<State<T>>,
    round_done: Condvar,
    /// Number of completed rounds; read without the lock while spinning.
    completed: AtomicU64,
}

#[derive(Debug)]
struct State<T> {
    /// Each participant's value with the round it was deposited for.
    deposits: [Vec<Option<(u64, T)>>; 2],
    arrived: [usize; 2],
    results: [Option<Arc<[T]>>; 2],
    aborted: Option<Abort>,
}

/// Why an exchange stopped for good.
#[derive(Debug, Clone)]
struct Abort {
    why: String,
    /// Set when a peer never arrived: ranks that were waiting for it report a timeout too.
    timed_out: Option<(String, Duration)>,
}

impl<T: Clone> Exchange<T> {
    pub(crate) fn new(participants: usize) -> Arc<Self> {
        Arc::new(Exchange {
            participants,
            state: Mutex::new(State {
                deposits: [vec![None; participants], vec![None; participants]],
                arrived: [0, 0],
                results: [None, None],
                aborted: None,
            }),
            round_done: Condvar::new(),
            completed: AtomicU64::new(0),
        })
    }

    /// Deposits `value` as participant `me` for round `round` (each participant counts its
    /// own rounds from 0) and returns every participant's value, in participant order.
    /// `timeout: None` waits without bound; use it only where every peer is known to have
    /// arrived already and is merely finishing work.
    pub(crate) fn exchange(
        &self,
        me: usize,
        round: u64,
        value: T,
        timeout: Option<Duration>,
        what: &str,
    ) -> Result<Arc<[T]>> {
        let set = (round % 2) as usize;
        {
            let mut state = self.lock();
            if let Some(abort) = &state.aborted {
                return Err(Error::Aborted(abort.why.clone()));
            }
            state.deposits[set][me] = Some((round, value));
            state.arrived[set] += 1;
            if state.arrived[set] == self.participants {
                let deposits: Vec<(u64, T)> = state.deposits[set]
                    .iter_mut()
                    .map(|v| v.take().unwrap())
                    .collect();
                // A participant two rounds off shares this slot set: its value belongs to
                // another call and must not be handed out as this one's.
                if let Some(p) = deposits.iter().position(|(r, _)| *r != round) {
                    let why = format!(
                        "participants are out of step: {p} is at round {}, {me} at {round}",
                        deposits[p].0
                    );
                    state.aborted = Some(Abort {
                        why: why.clone(),
                        timed_out: None,
                    });
                    drop(state);
                    self.round_done.notify_all();
                    return Err(Error::Aborted(why));
                }
                let all: Arc<[T]> = deposits.into_iter().map(|(_, v)| v).collect();
                state.arrived[set] = 0;
                state.results[set] = Some(all.clone());
                self.completed.store(round + 1, Ordering::Release);
                drop(state);
                self.round_done.notify_all();
                return Ok(all);
            }
        }
        self.wait_for(round, set, timeout, what)
    }

    fn wait_for(
        &self,
        round: u64,
        set: usize,
        timeout: Option<Duration>,
        what: &str,
    ) -> Result<Arc<[T]>> {
        // Peers usually arrive within microseconds: spin briefly before sleeping.
        let backoff = Backoff::new();
        while !backoff.is_completed() {
            if self.completed.load(Ordering::Acquire) > round {
                return Ok(self.result(set));
            }
            backoff.snooze();
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.lock();
        loop {
            if self.completed.load(Ordering::Acquire) > round {
                return Ok(state.results[set]
                    .clone()
                    .expect("completed round has results"));
            }
            if let Some(abort) = &state.aborted {
                return Err(match &abort.timed_out {
                    Some((what, after)) => Error::Timeout {
                        what: what.clone(),
                        after: *after,
                    },
                    None => Error::Aborted(abort.why.clone()),
                });
            }
            match deadline {
                None => {
                    state = self
                        .round_done
                        .wait(state)
                        .unwrap_or_else(|p| p.into_inner())
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let after = timeout.unwrap_or_default();
                        let what = format!("{what} (a peer never arrived)");
                        state.aborted = Some(Abort {
                            why: format!("timed out after {after:?} waiting for {what}"),
                            timed_out: Some((what.clone(), after)),
                        });
                        drop(state);
                        self.round_done.notify_all();
                        return Err(Error::Timeout { what, after });
                    }
                    state = self
                        .round_done
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    fn result(&self, set: usize) -> Arc<[T]> {
        self.lock().results[set]
            .clone()
            .expect("completed round has results")
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic elsewhere must not turn into a second panic here; the state stays consistent
        // because every critical section completes its updates before anything can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_participant_gets_every_value_over_many_rounds() {
        let ex = Exchange::<usize>::new(3);
        let handles: Vec<_> = (0..3)
            .map(|me| {
                let ex = ex.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let got = ex
                            .exchange(me, round, me * 1000 + round as usize, None, "test")
                            .unwrap();
                        let want: Vec<usize> = (0..3).map(|p| p * 1000 + round as usize).collect();
                        assert_eq!(&*got, &want[..]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn participants_out_of_step_abort_instead_of_mixing_rounds() {
        let ex = Exchange::<u8>::new(2);
        let t = Duration::from_millis(50);
        // Participant 1 skipped rounds 0 and 1: its round 2 lands in round 0's slot set.
        let p0 = {
            let ex = ex.clone();
            std::thread::spawn(move || ex.exchange(0, 0, 1, Some(t * 20), "test"))
        };
        std::thread::sleep(t);
        let late = ex.exchange(1, 2, 2, Some(t), "test").unwrap_err();
        assert!(
            matches!(late, Error::Aborted(ref m) if m.contains("out of step")),
            "{late}"
        );
        let early = p0.join().unwrap().unwrap_err();
        assert!(matches!(early, Error::Aborted(_)), "{early}");
    }

    #[test]
    fn a_missing_participant_times_out_and_aborts_the_group() {
        let ex = Exchange::<u8>::new(2);
        let t = Duration::from_millis(50);
        let err = ex.exchange(0, 0, 1, Some(t), "test").unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        let late = ex.exchange(1, 0, 2, Some(t), "test").unwrap_err();
        assert!(matches!(late, Error::Aborted(_)), "{late}");
    }
}
