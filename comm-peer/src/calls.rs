//! The call the kernels compare across ranks (`PeerArgs::call`, the kernels' `PeerCall`):
//! seven words from the call's [`CallDescriptor`] and this rank's plan for it (algorithm,
//! zero-copy offset), so that ranks that disagree about a call find out on the device,
//! with no host round trip, and report both calls.

use comm_core::CallDescriptor;

use crate::algorithm::Algorithm;
use crate::layout::CALL_WORDS;

/// A call as the kernels see it (the last word is padding).
pub(crate) type CallWords = [u32; CALL_WORDS + 1];

/// The words of a rank that rejected its arguments (`peer_agree_only`).
pub(crate) const REJECTED: CallWords = [u32::MAX; CALL_WORDS + 1];

/// Bytes of a plan the words hold (the rest is dropped).
const PLAN_BYTES: usize = 4 * (CALL_WORDS - 4);

/// `call` and `plan` (at most 12 bytes: what else each rank decided alike) as words.
pub(crate) fn encode(call: &CallDescriptor, plan: &[u8]) -> CallWords {
    let mut bytes = [0u8; 4 * CALL_WORDS];
    bytes[..16].copy_from_slice(&call.to_bytes());
    let n = plan.len().min(PLAN_BYTES);
    bytes[16..16 + n].copy_from_slice(&plan[..n]);
    let mut words = [0u32; CALL_WORDS + 1];
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    words
}

/// The 64-bit digest of a call's words (`PeerArgs::call_digest`) that peers compare before
/// the words themselves: each word mixed in turn by steps that are each invertible, so
/// that calls differing in one word always differ (the padding word is left out).
pub(crate) fn digest(words: &CallWords) -> u64 {
    words[..CALL_WORDS]
        .iter()
        .fold(0x9e37_79b9_7f4a_7c15, |h: u64, &w| {
            let h = (h ^ u64::from(w)).wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^ (h >> 29)
        })
}

/// A readable account of words from the status: the call and, for an all-reduce, the
/// algorithm and zero-copy offset and buffer.
pub(crate) fn describe(words: &[u32]) -> String {
    if words.len() < CALL_WORDS || words[..CALL_WORDS] == REJECTED[..CALL_WORDS] {
        return "no call (it rejected its arguments)".into();
    }
    let bytes: Vec<u8> = words[..CALL_WORDS]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let Ok(call) = CallDescriptor::from_bytes(&bytes[..16]) else {
        return format!("an unreadable call {:08x?}", &words[..CALL_WORDS]);
    };
    let plan = &bytes[16..];
    if plan.iter().all(|&b| b == 0) {
        return call.to_string();
    }
    let algorithm = Algorithm::ALL
        .into_iter()
        .find(|&a| a as u8 == plan[0])
        .map_or_else(|| format!("algorithm #{}", plan[0]), |a| a.to_string());
    let zero_copy = if plan[1] == 1 {
        let off = u64::from_le_bytes(plan[2..10].try_into().expect("8 bytes"));
        let buffer = u16::from_le_bytes(plan[10..12].try_into().expect("2 bytes"));
        format!(", zero-copy at offset {off} of registered buffer #{buffer}")
    } else {
        String::new()
    };
    format!("{call} by {algorithm}{zero_copy}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::{Collective, DType, ReduceOp};

    fn call(count: u64, dtype: DType) -> CallDescriptor {
        CallDescriptor {
            collective: Collective::AllReduce,
            dtype,
            count,
            op: Some(ReduceOp::Sum),
            root: None,
        }
    }

    #[test]
    fn words_tell_calls_apart_and_read_back() {
        let plan = [Algorithm::TwoshotPush as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let a = encode(&call(8, DType::F32), &plan);
        let b = encode(&call(262_144, DType::F32), &plan);
        let c = encode(&call(8, DType::F16), &plan);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, encode(&call(8, DType::F32), &plan));
        assert_ne!(a[..CALL_WORDS], REJECTED[..CALL_WORDS]);
        let said = describe(&b);
        assert!(said.contains("262144 x") && said.contains("f32"), "{said}");
        assert!(said.contains(&Algorithm::TwoshotPush.to_string()), "{said}");
    }

    #[test]
    fn digests_tell_calls_differing_in_any_one_word_apart() {
        let plan = [Algorithm::OneshotPush as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let words = encode(&call(21_504, DType::BF16), &plan);
        let mine = digest(&words);
        assert_eq!(mine, digest(&words));
        for i in 0..CALL_WORDS {
            for bit in [0, 1, 17, 31] {
                let mut other = words;
                other[i] ^= 1 << bit;
                assert_ne!(digest(&other), mine, "word {i}, bit {bit}");
            }
        }
        // The padding word is not part of the call.
        let mut padded = words;
        padded[CALL_WORDS] = 7;
        assert_eq!(digest(&padded), mine);
        assert_ne!(digest(&REJECTED), mine);
    }

    #[test]
    fn zero_copy_offsets_and_rejections_are_named() {
        let mut plan = vec![Algorithm::OneshotPull as u8, 1];
        plan.extend_from_slice(&4096u64.to_le_bytes());
        assert!(describe(&encode(&call(8, DType::BF16), &plan)).contains("offset 4096"));
        // The registered buffer's number is compared too: one offset in two buffers differs.
        let in_buffer = |n: u16| [&plan[..], &n.to_le_bytes()[..]].concat();
        let third = encode(&call(8, DType::BF16), &in_buffer(3));
        assert!(describe(&third).contains("offset 4096 of registered buffer #3"));
        assert_ne!(third, encode(&call(8, DType::BF16), &in_buffer(4)));
        assert_ne!(
            encode(&call(8, DType::BF16), &plan),
            encode(&call(8, DType::BF16), &plan[..2])
        );
        assert!(describe(&REJECTED).contains("rejected"));
        // Gathers and broadcasts have no plan.
        assert_eq!(
            describe(&encode(&call(3, DType::F32), &[])),
            call(3, DType::F32).to_string()
        );
    }
}
