//! `host-floor`: all-reduce figures through host memory beside the floor model of the same
//! run's probes ([`Floors`]), and beside NCCL where it was measured: the table issue-style
//! targets are stated in ("each size within 1.3x of the floor, the model and its inputs
//! printed beside it").
//!
//! Inputs are `allreduce-perf --json` files (several runs each: medians) and one
//! `host-probe --json` file. Per file and size the fastest out-of-place row of the backend
//! counts (a file may hold several algorithms); across files, the median.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::host_probe::Floors;
use crate::perf::Row;
use crate::perf::report::Timing;

/// The rows of an `allreduce-perf --json` file and where its ranks ran.
#[derive(Debug, serde::Deserialize)]
pub struct PerfFile {
    /// The run's description (only where its ranks ran is read here).
    #[serde(default)]
    pub run: Option<PerfRun>,
    /// One entry per (backend, algorithm, size).
    pub results: Vec<Row>,
}

/// Where an `allreduce-perf` run's ranks ran.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct PerfRun {
    /// Ranks of the run.
    #[serde(default)]
    pub world_size: usize,
    /// GPUs the ranks ran on.
    #[serde(default)]
    pub gpus: usize,
}

impl PerfRun {
    /// Whether two or more ranks shared a GPU (and so its one host link).
    pub fn ranks_share_a_gpu(&self) -> bool {
        self.gpus > 0 && self.world_size > self.gpus
    }
}

/// Figures of one measurement over its runs: by message bytes, the median over the runs
/// of each run's fastest time (us).
pub type Medians = BTreeMap<u64, f64>;

/// The medians of `backend`'s out-of-place times in `runs` (each run's rows).
pub fn medians(runs: &[Vec<Row>], backend: &str) -> Medians {
    medians_of(runs, backend, |t| Some(t.time_us))
}

/// The medians of `backend`'s out-of-place eager calls enqueued back to back (nccl-tests'
/// way: no event between the calls), where the rows have them.
pub fn back_to_back_medians(runs: &[Vec<Row>], backend: &str) -> Medians {
    medians_of(runs, backend, |t| t.back_to_back_us)
}

fn medians_of(runs: &[Vec<Row>], backend: &str, time: impl Fn(&Timing) -> Option<f64>) -> Medians {
    let mut by_size: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for run in runs {
        let mut best: BTreeMap<u64, f64> = BTreeMap::new();
        for row in run.iter().filter(|r| r.backend == backend) {
            if let Some(us) = row.out_of_place.as_ref().and_then(&time) {
                let slot = best.entry(row.bytes).or_insert(f64::INFINITY);
                *slot = slot.min(us);
            }
        }
        for (bytes, us) in best {
            by_size.entry(bytes).or_default().push(us);
        }
    }
    by_size
        .into_iter()
        .map(|(bytes, mut v)| {
            v.sort_by(f64::total_cmp);
            (bytes, v[v.len() / 2])
        })
        .collect()
}

/// What one table sets side by side.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The probes of the run.
    pub floors: &'a Floors,
    /// Bytes from which one-shot push goes as data then a flag (below: Lamport).
    pub flagged_from: usize,
    /// Ours in CUDA-graph replays.
    pub graph: &'a Medians,
    /// Ours, eager calls, each framed by events (may be empty).
    pub eager: &'a Medians,
    /// Ours, eager calls enqueued back to back (may be empty).
    pub back_to_back: &'a Medians,
    /// NCCL without peer access, CUDA-graph replays (may be empty).
    pub nccl: &'a Medians,
    /// Whether our ranks shared one GPU (its link, and its launching of their kernels).
    pub ranks_share_a_gpu: bool,
}

/// The floor that applies to our protocol at `bytes`, plus what its one kernel costs by
/// itself in graph replay: every call is a kernel, and its launch and end are no part of
/// the link's figures. Ranks sharing a GPU: the kernel of two streams at once, added to
/// "both ways" where the message goes as data and a flag (streamed, reading while writing),
/// else to the shared floor; or, where the probe timed it and it is more, the handshake
/// (a kernel a call that hears from the other rank once: the kernel and the flag's trip
/// timed together) added to the same bound less its flag's trip. A GPU per rank: one
/// stream's kernel and the floor. `None` where the probe did not time the kernel.
fn floor_with_kernel(inputs: &Inputs<'_>, bytes: usize) -> Option<f64> {
    let f = inputs.floors;
    let from = inputs.flagged_from;
    if inputs.ranks_share_a_gpu {
        let bound = f
            .both_ways(bytes, from)
            .or_else(|| f.one_shot_shared(bytes, from).map(|t| t.total()))
            .unwrap_or_else(|| f.one_shot(bytes, from).total());
        let handshake = f.handshake_us + bound - f.flag_ns / 1e3;
        (f.kernel_pair_us > 0.0).then(|| (f.kernel_pair_us + bound).max(handshake))
    } else {
        (f.kernel_us > 0.0).then(|| f.kernel_us + f.one_shot(bytes, from).total())
    }
}

/// The table (Markdown), with the model and its inputs above it.
pub fn table(inputs: &Inputs<'_>) -> String {
    let f = inputs.floors;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "floor model (host-probe of this run): one load {:.0} ns, a flag's trip {:.0} ns, a \
         fence {:.0} ns; fastest read / fenced write over the grids:",
        f.host_load_ns, f.flag_ns, f.fence_ns
    );
    for m in &f.moves {
        let _ = write!(
            s,
            "  {} B: read {:.2} us, write {:.2} us",
            m.bytes, m.read_us, m.write_us
        );
        if m.pair_read_us > 0.0 {
            let _ = write!(
                s,
                "; two at once: read {:.2} us, write {:.2} us",
                m.pair_read_us, m.pair_write_us
            );
        }
        if m.both_ways_us > 0.0 {
            let _ = write!(
                s,
                "; two written while two are read: {:.2} us",
                m.both_ways_us
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "floor = write + flag + read from {} B (data, fence, flag, read); below, the data is \
         its own flag: flag + the read beyond its first load. \"link shared\": the same with \
         two messages moved at once, the floor of two ranks on one GPU; \"overlapped\": \
         flag + the longer of that write and read, the least a protocol that reads while it \
         writes (streamed chunks) could take if the link's two directions did not slow each \
         other; \"both ways\": flag + both ranks' writes and reads moved at once, as measured \
         (from {} B: below, the data is its own flag and pays no fence)",
        inputs.flagged_from, inputs.flagged_from
    );
    let kernel = if inputs.ranks_share_a_gpu {
        f.kernel_pair_us
    } else {
        f.kernel_us
    };
    if kernel > 0.0 {
        let _ = writeln!(
            s,
            "\"with the kernel\": an empty kernel in graph replay, launched as ours are ({:.2} us \
             on one stream, {:.2} us each with two streams at once), here {kernel:.2} us ({}), \
             added to the floor that applies: {}",
            f.kernel_us,
            f.kernel_pair_us,
            if inputs.ranks_share_a_gpu {
                "ranks sharing this GPU"
            } else {
                "a GPU per rank"
            },
            if inputs.ranks_share_a_gpu {
                "\"both ways\" where a message goes as data and a flag, else \"link shared\""
            } else {
                "\"floor\""
            }
        );
        if inputs.ranks_share_a_gpu && f.handshake_us > 0.0 {
            let _ = writeln!(
                s,
                "  or, where more: a handshake (a kernel a call on each of two streams that \
                 hears from the other once through host memory, graphs) {:.2} us, added to the \
                 same floor less its flag's trip",
                f.handshake_us
            );
        }
        if inputs.ranks_share_a_gpu && f.handshake_us > 0.0 && f.handshake_framed_us > 0.0 {
            let _ = writeln!(
                s,
                "  the handshake launched eagerly by two threads, as ours are: framed by events \
                 {:.2} us ({:+.2} over its graphs), back to back {:.2} us ({:+.2}): what any \
                 eager call of these ranks pays over a graph replay",
                f.handshake_framed_us,
                f.handshake_framed_us - f.handshake_us,
                f.handshake_back_to_back_us,
                f.handshake_back_to_back_us - f.handshake_us
            );
        }
    }
    let _ = writeln!(s);
    let shared = f.pairs_probed();
    let both_ways = f.both_ways_probed();
    let mut head =
        String::from("| size | ours, graph | floor | write + flag + read | ours / floor |");
    let mut rule = String::from("|---:|---:|---:|---|---:|");
    if shared {
        head.push_str(
            " floor, link shared | write + flag + read | ours / shared | overlapped | ours / \
             overlapped |",
        );
        rule.push_str("---:|---|---:|---:|---:|");
    }
    if both_ways {
        head.push_str(" both ways | ours / both ways |");
        rule.push_str("---:|---:|");
    }
    if kernel > 0.0 {
        head.push_str(" with the kernel | ours / that |");
        rule.push_str("---:|---:|");
    }
    if !inputs.eager.is_empty() {
        head.push_str(" ours, eager | eager - graph |");
        rule.push_str("---:|---:|");
    }
    if !inputs.back_to_back.is_empty() {
        head.push_str(" eager back to back | - graph |");
        rule.push_str("---:|---:|");
    }
    if !inputs.nccl.is_empty() {
        head.push_str(" NCCL no-P2P, graph | ours / NCCL |");
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for (&bytes, &ours) in inputs.graph {
        let terms = f.one_shot(bytes as usize, inputs.flagged_from);
        let floor = terms.total();
        let _ = write!(
            s,
            "| {bytes} | {ours:.2} | {floor:.2} | {:.2} + {:.2} + {:.2} | {:.2} |",
            terms.write_us,
            terms.flag_us,
            terms.read_us,
            ours / floor
        );
        if let Some(t) = f.one_shot_shared(bytes as usize, inputs.flagged_from) {
            let _ = write!(
                s,
                " {:.2} | {:.2} + {:.2} + {:.2} | {:.2} | {:.2} | {:.2} |",
                t.total(),
                t.write_us,
                t.flag_us,
                t.read_us,
                ours / t.total(),
                t.overlapped(),
                ours / t.overlapped()
            );
        }
        if both_ways {
            match f.both_ways(bytes as usize, inputs.flagged_from) {
                Some(b) => {
                    let _ = write!(s, " {b:.2} | {:.2} |", ours / b);
                }
                None => s.push_str(" - | - |"),
            }
        }
        if kernel > 0.0 {
            match floor_with_kernel(inputs, bytes as usize) {
                Some(k) => {
                    let _ = write!(s, " {k:.2} | {:.2} |", ours / k);
                }
                None => s.push_str(" - | - |"),
            }
        }
        let cell = |m: &Medians| m.get(&bytes).copied();
        for eager in [inputs.eager, inputs.back_to_back] {
            if eager.is_empty() {
                continue;
            }
            match cell(eager) {
                Some(e) => {
                    let _ = write!(s, " {e:.2} | {:+.2} |", e - ours);
                }
                None => s.push_str(" - | - |"),
            }
        }
        if !inputs.nccl.is_empty() {
            match cell(inputs.nccl) {
                Some(n) => {
                    let _ = write!(s, " {n:.2} | {:.2} |", ours / n);
                }
                None => s.push_str(" - | - |"),
            }
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_probe::FloorMove;

    fn run(rows: &[(&str, u64, f64)]) -> Vec<Row> {
        rows.iter()
            .map(|&(backend, bytes, us)| {
                serde_json::from_value(serde_json::json!({
                    "backend": backend, "algorithm": null, "bootstrap": "threads", "ranks": 2,
                    "dtype": "bf16", "op": "sum", "bytes": bytes, "count": bytes / 2,
                    "iters": 10,
                    "out_of_place": {"time_us": us, "algbw": 0.0, "busbw": 0.0,
                                     "wrong": 0, "identical": true}
                }))
                .expect("a row")
            })
            .collect()
    }

    #[test]
    fn medians_take_each_runs_fastest_row_then_the_median_over_runs() {
        let runs = [
            run(&[
                ("symm-cuda", 8, 7.0),
                ("symm-cuda", 8, 6.0),
                ("nccl", 8, 1.0),
            ]),
            run(&[("symm-cuda", 8, 9.0)]),
            run(&[("symm-cuda", 8, 5.0), ("symm-cuda", 43008, 11.0)]),
        ];
        let m = medians(&runs, "symm-cuda");
        assert_eq!(m[&8], 6.0);
        assert_eq!(m[&43008], 11.0);
        assert_eq!(medians(&runs, "nccl")[&8], 1.0);
    }

    /// One load 1 us, a flag 2 us, a fence 1 us; 40 kB read in 3 us and written in 2 (by
    /// two grids at once: `pair_read_us`, `pair_write_us`; both ranks' writes and reads at
    /// once: `both_ways_us`; 0: not probed).
    fn floors_of_40k(pair_read_us: f64, pair_write_us: f64, both_ways_us: f64) -> Floors {
        Floors {
            host_load_ns: 1000.0,
            flag_ns: 2000.0,
            fence_ns: 1000.0,
            moves: vec![FloorMove {
                bytes: 40_000,
                read_us: 3.0,
                write_us: 2.0,
                pair_read_us,
                pair_write_us,
                both_ways_us,
            }],
            kernel_us: 0.0,
            kernel_pair_us: 0.0,
            handshake_us: 0.0,
            handshake_framed_us: 0.0,
            handshake_back_to_back_us: 0.0,
        }
    }

    /// The table of `floors` with graph figures only (flagged from 16 KiB).
    fn graph_table(floors: &Floors, graph: &[(u64, f64)]) -> String {
        let graph: Medians = graph.iter().copied().collect();
        let none = Medians::new();
        table(&Inputs {
            floors,
            flagged_from: 16_384,
            graph: &graph,
            eager: &none,
            back_to_back: &none,
            nccl: &none,
            ranks_share_a_gpu: true,
        })
    }

    #[test]
    fn the_table_sets_ours_beside_the_floor_and_nccl() {
        let floors = floors_of_40k(0.0, 0.0, 0.0);
        let graph: Medians = [(8, 5.0), (40_000, 10.5)].into();
        let eager: Medians = [(8, 8.0)].into();
        let back_to_back: Medians = [(8, 6.0), (40_000, 11.0)].into();
        let nccl: Medians = [(8, 10.0), (40_000, 14.0)].into();
        let text = table(&Inputs {
            floors: &floors,
            flagged_from: 16_384,
            graph: &graph,
            eager: &eager,
            back_to_back: &back_to_back,
            nccl: &nccl,
            ranks_share_a_gpu: true,
        });
        assert!(
            text.contains(
                "| 8 | 5.00 | 2.00 | 0.00 + 2.00 + 0.00 | 2.50 | 8.00 | +3.00 | 6.00 | +1.00 | \
                 10.00 | 0.50 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| 40000 | 10.50 | 7.00 | 2.00 + 2.00 + 3.00 | 1.50 | - | - | 11.00 | +0.50 | \
                 14.00 | 0.75 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("40000 B: read 3.00 us, write 2.00 us\n"),
            "{text}"
        );
        assert!(!text.contains("link shared |"), "{text}");
    }

    #[test]
    fn with_pairs_probed_the_table_adds_the_shared_floor() {
        let text = graph_table(&floors_of_40k(4.0, 3.5, 0.0), &[(40_000, 10.5)]);
        assert!(
            text.contains(
                "| 40000 | 10.50 | 7.00 | 2.00 + 2.00 + 3.00 | 1.50 | 9.50 | 3.50 + 2.00 + \
                 4.00 | 1.11 | 6.00 | 1.75 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("two at once: read 4.00 us, write 3.50 us"),
            "{text}"
        );
        assert!(!text.contains("| both ways |"), "{text}");
    }

    #[test]
    fn with_the_kernel_timed_the_table_adds_it_to_the_floor_that_applies() {
        let floors = Floors {
            kernel_us: 1.0,
            kernel_pair_us: 1.5,
            ..floors_of_40k(4.0, 3.5, 5.0)
        };
        let graph: Medians = [(8, 5.0), (40_000, 10.5)].into();
        let none = Medians::new();
        let with = |ranks_share_a_gpu| {
            table(&Inputs {
                floors: &floors,
                flagged_from: 16_384,
                graph: &graph,
                eager: &none,
                back_to_back: &none,
                nccl: &none,
                ranks_share_a_gpu,
            })
        };
        let shared = with(true);
        assert!(
            shared.contains("| with the kernel | ours / that |"),
            "{shared}"
        );
        // Flagged: both ways (flag 2 + 5) and two streams' kernel 1.5; 10.5 / 8.5.
        assert!(
            shared.contains("| 7.00 | 1.50 | 8.50 | 1.24 |\n"),
            "{shared}"
        );
        // Lamport: the shared floor (the flag 2, the read beyond its first load ~0) + 1.5.
        assert!(shared.contains("| 3.50 | 1.43 |\n"), "{shared}");
        assert!(
            shared.contains("here 1.50 us (ranks sharing this GPU)"),
            "{shared}"
        );
        // A GPU per rank: the floor (2 + 2 + 3) and one stream's kernel; 10.5 / 8.
        let apart = with(false);
        assert!(apart.contains("| 8.00 | 1.31 |\n"), "{apart}");
        assert!(apart.contains("here 1.00 us (a GPU per rank)"), "{apart}");
        // Not timed: no such column.
        assert!(
            !graph_table(&floors_of_40k(4.0, 3.5, 5.0), &[(8, 5.0)]).contains("with the kernel")
        );
    }

    #[test]
    fn a_handshake_slower_than_kernel_and_flag_apart_raises_the_floor_with_the_kernel() {
        let floors = Floors {
            kernel_us: 1.0,
            kernel_pair_us: 1.5,
            handshake_us: 4.5,
            handshake_framed_us: 9.0,
            handshake_back_to_back_us: 5.0,
            ..floors_of_40k(4.0, 3.5, 5.0)
        };
        let with = |floors: &Floors| graph_table(floors, &[(8, 5.0), (40_000, 10.5)]);
        let text = with(&floors);
        // Flagged: the handshake 4.5 + both ways less the flag (7 - 2), above 1.5 + 7.
        assert!(text.contains("| 7.00 | 1.50 | 9.50 | 1.11 |\n"), "{text}");
        // Lamport: 4.5 + the shared floor less the flag (~0), above 1.5 + 2.
        assert!(text.contains("| 4.50 | 1.11 |\n"), "{text}");
        assert!(text.contains("a handshake"), "{text}");
        assert!(
            text.contains(
                "framed by events 9.00 us (+4.50 over its graphs), back to back 5.00 us (+0.50)"
            ),
            "{text}"
        );
        // Where the handshake is less than the two apart, they stay the floor.
        let text = with(&Floors {
            handshake_us: 2.0,
            ..floors.clone()
        });
        assert!(text.contains("| 7.00 | 1.50 | 8.50 | 1.24 |\n"), "{text}");
    }

    #[test]
    fn the_run_tells_whether_ranks_shared_a_gpu() {
        let run = |world_size, gpus| PerfRun { world_size, gpus };
        assert!(run(2, 1).ranks_share_a_gpu());
        assert!(!run(2, 2).ranks_share_a_gpu());
        assert!(!run(2, 0).ranks_share_a_gpu(), "unknown GPUs");
    }

    #[test]
    fn with_both_ways_probed_the_table_adds_that_bound() {
        let text = graph_table(&floors_of_40k(4.0, 3.5, 5.0), &[(8, 5.0), (40_000, 10.5)]);
        // Flag 2 + 5 both ways = 7; 10.5 / 7 = 1.5.
        assert!(text.contains("| 6.00 | 1.75 | 7.00 | 1.50 |"), "{text}");
        assert!(text.contains("| ours / both ways |"), "{text}");
        // Below the flagged size: no such bound.
        assert!(text.contains("| 2.50 | 2.00 | 2.50 | - | - |\n"), "{text}");
        assert!(
            text.contains("two written while two are read: 5.00 us"),
            "{text}"
        );
    }
}
