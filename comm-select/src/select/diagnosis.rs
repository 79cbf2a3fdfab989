//! After a failed call: the ranks compare what they called through the bootstrap, so
//! that disagreeing ranks all get [`Error::Mismatch`] naming the calls, and a member that
//! may be out of step anywhere poisons the selector everywhere. The fast path pays nothing:
//! this runs only once a call has failed.

use comm_core::{CallDescriptor, Error};

use super::SelectComm;

/// The call a rank made last, for the diagnosis after a failure.
#[derive(Debug, Clone, Copy)]
pub(super) struct LastCall {
    pub(super) number: u64,
    pub(super) call: CallDescriptor,
    pub(super) member: Option<usize>,
}

impl SelectComm {
    /// After a failed call: every rank says what it called and whether its member may be
    /// out of step; ranks that disagree all get [`Error::Mismatch`], and a possibly
    /// out-of-step member anywhere poisons the selector everywhere.
    pub(super) fn diagnose(&self, mine: LastCall, error: Error) -> Error {
        let fatal = leaves_out_of_step(&error);
        let gathered = self.bootstrap.all_gather_bytes(&encode_last(&mine, fatal));
        let all = match gathered.map(|all| all.iter().map(|b| decode_last(b)).collect()) {
            Ok(Some(all)) => all,
            Ok(None) => {
                return self.poison(Error::Aborted(format!(
                    "ranks are out of step after call {} failed ({error})",
                    mine.number
                )));
            }
            Err(e) => {
                self.poison_quietly(format!(
                    "call {} failed ({error}); asking the peers why failed too: {e}",
                    mine.number
                ));
                return error;
            }
        };
        let all: Vec<(LastCall, bool)> = all;
        let any_fatal = all.iter().any(|(_, f)| *f);
        if all.iter().any(|(c, _)| c.number != mine.number) {
            let numbers: Vec<String> = all
                .iter()
                .enumerate()
                .map(|(r, (c, _))| format!("rank {r} at call {}", c.number))
                .collect();
            return self.poison(Error::Aborted(format!(
                "ranks are out of step: {}",
                numbers.join(", ")
            )));
        }
        let result = if all.iter().any(|(c, _)| c.call != mine.call) {
            Error::Mismatch(self.describe_calls(&all))
        } else {
            error
        };
        if any_fatal || fatal {
            self.poison_quietly(format!("call {} failed: {result}", mine.number));
        }
        result
    }

    /// `rank 0: all_gather of 8 x f32 on symm; ranks 1, 2: all_reduce of 8 x i32 (sum) on local`.
    fn describe_calls(&self, all: &[(LastCall, bool)]) -> String {
        let mut groups: Vec<(LastCall, Vec<usize>)> = Vec::new();
        for (rank, (c, _)) in all.iter().enumerate() {
            match groups.iter_mut().find(|(g, _)| g.call == c.call) {
                Some((_, ranks)) => ranks.push(rank),
                None => groups.push((*c, vec![rank])),
            }
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|(c, ranks)| {
                let who: Vec<String> = ranks.iter().map(usize::to_string).collect();
                let on = match c.member {
                    Some(m) => format!(" on {}", self.backends[m].comm.name()),
                    None => " (no backend)".to_string(),
                };
                format!(
                    "rank{} {}: {}{on}",
                    if ranks.len() > 1 { "s" } else { "" },
                    who.join(", "),
                    c.call
                )
            })
            .collect();
        format!("call {}: {}", all[0].0.number, parts.join("; "))
    }

    fn poison(&self, error: Error) -> Error {
        self.poison_quietly(error.to_string());
        error
    }

    pub(super) fn poison_quietly(&self, why: String) {
        self.poisoned.borrow_mut().get_or_insert(why);
    }
}

/// True for errors after which a member may be out of step with its peers.
pub(super) fn leaves_out_of_step(e: &Error) -> bool {
    e.is_fatal() || matches!(e, Error::Backend { .. })
}

/// Marks a diagnosis message, so that a peer still inside a member that moves data
/// through the same bootstrap cannot take it for its own (nor the other way round).
const DIAGNOSIS: u8 = 0xd1;

fn encode_last(last: &LastCall, fatal: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(27);
    out.push(DIAGNOSIS);
    out.extend_from_slice(&last.number.to_le_bytes());
    out.extend_from_slice(&last.call.to_bytes());
    out.push(last.member.map_or(u8::MAX, |m| m as u8));
    out.push(u8::from(fatal));
    out
}

fn decode_last(bytes: &[u8]) -> Option<(LastCall, bool)> {
    if bytes.len() != 27 || bytes[0] != DIAGNOSIS {
        return None;
    }
    let number = u64::from_le_bytes(bytes[1..9].try_into().ok()?);
    let call = CallDescriptor::from_bytes(&bytes[9..25]).ok()?;
    let member = (bytes[25] != u8::MAX).then_some(bytes[25] as usize);
    Some((
        LastCall {
            number,
            call,
            member,
        },
        bytes[26] != 0,
    ))
}
