//! The collectives checked across a group: any [`Communicator`] (the CPU reference's threads,
//! NCCL's GPUs in one process or several) against float64 computed on the host from every
//! rank's inputs, with the tolerances [`hal::collective`] states.
//!
//! Inputs are a pure function of (seed, case, rank), so a process that holds one rank computes
//! what every other rank sent, and the check needs nothing from the others. Cases cover the
//! four collectives, every operation, the six dtypes, sizes 0, 1, odd and large, offsets into
//! a larger buffer, the in-place forms, and special values (signed zeros, infinities, NaN,
//! subnormals).

use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, DType, Layout, View, bf16, f16};
use std::time::Duration;

/// What a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    AllReduce(CollectiveOp),
    /// [`Communicator::all_reduce_overlapped`], then `wait_overlapped` (in place only).
    Overlapped(CollectiveOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(CollectiveOp),
}

/// One collective call, the same on every rank.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: Kind,
    pub dtype: DType,
    /// `send`'s elements for all-reduce, broadcast and all-gather; `recv`'s for reduce-scatter.
    pub n: usize,
    /// Elements before the operands in their buffers.
    pub offset: usize,
    pub in_place: bool,
    /// Signed zeros, infinities, NaN and subnormals among the values.
    pub special: bool,
}

impl Case {
    pub fn describe(&self) -> String {
        format!(
            "{:?} {} n={} offset={}{}{}",
            self.kind,
            self.dtype,
            self.n,
            self.offset,
            if self.in_place { " in place" } else { "" },
            if self.special { " special" } else { "" }
        )
    }

    fn send_len(&self, size: usize) -> usize {
        match self.kind {
            Kind::ReduceScatter(_) => self.n * size,
            _ => self.n,
        }
    }

    fn recv_len(&self, size: usize) -> usize {
        match self.kind {
            Kind::AllGather => self.n * size,
            _ => self.n,
        }
    }
}

/// The cases of a run: every collective, operation and dtype at the sizes given (each size
/// with and without special values, at an offset, and in place).
pub fn cases(size: usize, sizes: &[usize]) -> Vec<Case> {
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
    ];
    let mut kinds: Vec<Kind> = Vec::new();
    for op in CollectiveOp::ALL {
        kinds.push(Kind::AllReduce(op));
        kinds.push(Kind::Overlapped(op));
        kinds.push(Kind::ReduceScatter(op));
    }
    kinds.push(Kind::Broadcast(0));
    kinds.push(Kind::Broadcast(size - 1));
    kinds.push(Kind::AllGather);
    let mut out = Vec::new();
    for &n in sizes {
        for &kind in &kinds {
            for dtype in dtypes {
                for (offset, in_place, special) in
                    [(0, false, false), (3, false, true), (0, true, true)]
                {
                    if matches!(kind, Kind::Overlapped(_)) && !in_place {
                        continue;
                    }
                    let special = special && !matches!(dtype, DType::I32 | DType::U32);
                    out.push(Case {
                        kind,
                        dtype,
                        n,
                        offset,
                        in_place,
                        special,
                    });
                }
            }
        }
    }
    out
}

/// SplitMix64: a fast, seedable stream for inputs of any size.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of rank `rank`'s `send`, as f64 (exactly representable in the dtype).
pub fn input(seed: u64, case: &Case, rank: usize, i: usize) -> f64 {
    let h = mix(seed ^ mix((rank as u64) << 40 ^ i as u64));
    let unit = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    if case.special && h % 61 == 0 {
        let specials: [f64; 6] = [
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-300,
        ];
        let v = specials[(h >> 8) as usize % specials.len()];
        return round_to(
            case.dtype,
            if v == 1e-300 {
                subnormal(case.dtype)
            } else {
                v
            },
        );
    }
    match case.dtype {
        // Large enough that sums wrap past 32 bits.
        DType::I32 => (h as u32 as i32) as f64,
        DType::U32 => h as u32 as f64,
        d => round_to(d, unit * 100.0),
    }
}

fn subnormal(d: DType) -> f64 {
    match d {
        DType::F32 => f32::from_bits(3) as f64,
        DType::F64 => f64::from_bits(3),
        DType::F16 => f16::from_bits(3).to_f64(),
        _ => bf16::from_bits(3).to_f64(),
    }
}

fn round_to(d: DType, v: f64) -> f64 {
    match d {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

fn epsilon(d: DType) -> f64 {
    match d {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        DType::F16 => f16::EPSILON.to_f64(),
        DType::BF16 => bf16::EPSILON.to_f64(),
        _ => 0.0,
    }
}

fn smallest_normal(d: DType) -> f64 {
    match d {
        DType::F32 => f32::MIN_POSITIVE as f64,
        DType::F64 => f64::MIN_POSITIVE,
        DType::F16 => f16::MIN_POSITIVE.to_f64(),
        DType::BF16 => bf16::MIN_POSITIVE.to_f64(),
        _ => 0.0,
    }
}

fn encode(d: DType, values: impl Iterator<Item = f64>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match d {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        }
    }
    out
}

fn decode(d: DType, bytes: &[u8], i: usize) -> f64 {
    let e = d.size_in_bytes();
    let b = &bytes[i * e..(i + 1) * e];
    match d {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
    }
}

/// A value no input takes, for recv's elements outside the operands (to see stray writes).
const GUARD: f64 = 7.0;

/// Runs `case` on one rank: uploads its inputs, calls the collective, waits (at most
/// `timeout`), and returns `recv`'s buffer whole (guards included).
pub fn run_rank<C: Communicator>(
    comm: &C,
    seed: u64,
    case: &Case,
    timeout: Duration,
) -> hal::Result<Vec<u8>> {
    let (rank, size) = (comm.rank(), comm.size());
    let be = comm.backend();
    let (ns, nr) = (case.send_len(size), case.recv_len(size));
    let send_values = (0..ns).map(|i| input(seed, case, rank, i));
    let d = case.dtype;
    let dump = |b: &<C::Backend as Backend>::Buffer| be.read_bytes(b);
    if case.in_place {
        // One buffer holding the larger operand, the other inside it where the in-place
        // form puts it; this rank's inputs at send's place, guards elsewhere.
        let send_at = case.offset
            + match case.kind {
                Kind::AllGather => rank * case.n,
                _ => 0,
            };
        let mut values = vec![GUARD; case.offset + ns.max(nr) + 2];
        for (i, v) in send_values.enumerate() {
            values[send_at + i] = v;
        }
        let buf = be.upload_bytes(d, &encode(d, values.into_iter()))?;
        let (ls, lr) = match case.kind {
            Kind::ReduceScatter(_) => (at(ns, case.offset), at(nr, case.offset + rank * case.n)),
            Kind::AllGather => (at(ns, send_at), at(nr, case.offset)),
            _ => (at(ns, case.offset), at(nr, case.offset)),
        };
        call(comm, case, View::new(&buf, &ls), View::new(&buf, &lr))?;
        comm.synchronize(timeout)?;
        return dump(&buf);
    }
    let mut send = vec![GUARD; case.offset];
    send.extend(send_values);
    let send_buf = be.upload_bytes(d, &encode(d, send.into_iter()))?;
    let recv_buf = be.upload_bytes(
        d,
        &encode(d, std::iter::repeat_n(GUARD, nr + case.offset + 2)),
    )?;
    let ls = at(ns, case.offset);
    let lr = at(nr, case.offset + 1);
    call(
        comm,
        case,
        View::new(&send_buf, &ls),
        View::new(&recv_buf, &lr),
    )?;
    comm.synchronize(timeout)?;
    dump(&recv_buf)
}

/// `n` contiguous elements from `offset`.
fn at(n: usize, offset: usize) -> Layout {
    let mut l = Layout::contiguous(&[n]);
    l.offset = offset;
    l
}

fn call<C: Communicator>(
    comm: &C,
    case: &Case,
    send: View<'_, <C::Backend as Backend>::Buffer>,
    recv: View<'_, <C::Backend as Backend>::Buffer>,
) -> hal::Result<()> {
    match case.kind {
        Kind::AllReduce(op) => comm.all_reduce(op, send, recv),
        Kind::Overlapped(op) => {
            comm.all_reduce_overlapped(op, recv)?;
            comm.wait_overlapped()
        }
        Kind::Broadcast(root) => comm.broadcast(root, send, recv),
        Kind::AllGather => comm.all_gather(send, recv),
        Kind::ReduceScatter(op) => comm.reduce_scatter(op, send, recv),
    }
}

/// Where rank `rank`'s recv operand starts in the buffer [`run_rank`] returned.
fn recv_start(case: &Case, rank: usize) -> usize {
    match (case.in_place, case.kind) {
        (true, Kind::ReduceScatter(_)) => case.offset + rank * case.n,
        (true, _) => case.offset,
        (false, _) => case.offset + 1,
    }
}

/// Checks rank `rank`'s result against float64 on the host: exact for broadcast, all-gather,
/// max, min and integers; sums within `size` roundings of the dtype of the sum of magnitudes
/// (and the dtype's smallest normal, for subnormals a device may flush). Guards around the
/// operand untouched. `Err` names the first element that differs.
pub fn check_rank(
    seed: u64,
    case: &Case,
    size: usize,
    rank: usize,
    got: &[u8],
) -> Result<(), String> {
    let d = case.dtype;
    let nr = case.recv_len(size);
    let start = recv_start(case, rank);
    let len = got.len() / d.size_in_bytes();
    for i in 0..len {
        let g = decode(d, got, i);
        if i < start || i >= start + nr {
            // Outside recv: untouched guards, or (in place) this rank's own inputs.
            let inside_send = case.in_place && {
                let (s0, ns) = match case.kind {
                    Kind::ReduceScatter(_) => (case.offset, case.send_len(size)),
                    Kind::AllGather => (case.offset + rank * case.n, case.n),
                    _ => (case.offset, case.n),
                };
                i >= s0 && i < s0 + ns
            };
            let expected = if inside_send {
                let s0 = match case.kind {
                    Kind::AllGather => case.offset + rank * case.n,
                    _ => case.offset,
                };
                input(seed, case, rank, i - s0)
            } else {
                GUARD
            };
            if !same(g, expected) {
                return Err(format!(
                    "element {i}, outside recv ({start}..{}), was changed: {g} (expected {expected})",
                    start + nr
                ));
            }
            continue;
        }
        let j = i - start;
        let (expected, bound) = expected_at(seed, case, size, rank, j);
        let ok = if expected.is_nan() {
            g.is_nan()
        } else if expected.is_infinite() || bound == 0.0 {
            g == expected
        } else {
            (g - expected).abs() <= bound
        };
        if !ok {
            return Err(format!(
                "rank {rank}, element {j} of recv: {g}, expected {expected} (within {bound})"
            ));
        }
    }
    Ok(())
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits() || a == b
}

/// The exact result at element `j` of rank `rank`'s recv and the difference allowed.
fn expected_at(seed: u64, case: &Case, size: usize, rank: usize, j: usize) -> (f64, f64) {
    let d = case.dtype;
    let (op, source) = match case.kind {
        Kind::Broadcast(root) => return (input(seed, case, root, j), 0.0),
        Kind::AllGather => return (input(seed, case, j / case.n, j % case.n), 0.0),
        Kind::AllReduce(op) | Kind::Overlapped(op) => (op, j),
        Kind::ReduceScatter(op) => (op, rank * case.n + j),
    };
    let values: Vec<f64> = (0..size).map(|r| input(seed, case, r, source)).collect();
    let integer = matches!(d, DType::I32 | DType::U32);
    match op {
        CollectiveOp::Max | CollectiveOp::Min => {
            let v = values[1..].iter().fold(values[0], |a, &v| {
                if op == CollectiveOp::Max {
                    a.max(v)
                } else {
                    a.min(v)
                }
            });
            (v, 0.0)
        }
        CollectiveOp::Sum | CollectiveOp::Mean if integer => {
            let sum: i128 = values.iter().map(|&v| v as i128).sum();
            let wrapped = sum.rem_euclid(1 << 32) as u32;
            let v = match (d, op) {
                (DType::I32, CollectiveOp::Sum) => wrapped as i32 as f64,
                (DType::I32, _) => (wrapped as i32 / size as i32) as f64,
                (_, CollectiveOp::Sum) => wrapped as f64,
                _ => (wrapped / size as u32) as f64,
            };
            (v, 0.0)
        }
        _ => {
            let sum: f64 = values.iter().sum();
            let magnitude: f64 = values.iter().map(|v| v.abs()).sum();
            let scale = if op == CollectiveOp::Mean {
                1.0 / size as f64
            } else {
                1.0
            };
            let bound = (2.0 * size as f64 * epsilon(d) * magnitude
                + size as f64 * smallest_normal(d))
                * scale;
            (sum * scale, bound.max(f64::MIN_POSITIVE))
        }
    }
}

/// One rank's check of a case, and its recv buffer when the call succeeded.
type RankOutcome = (Result<(), String>, Option<Vec<u8>>);

/// Runs every case on a group driven from one process (a thread per rank) and checks each
/// rank's result. Returns `(passed, failures)`, each failure naming its case.
pub fn check_group<C: Communicator>(
    comms: &mut [C],
    seed: u64,
    cases: &[Case],
    timeout: Duration,
) -> (usize, Vec<String>) {
    let size = comms.len();
    let mut passed = 0;
    let mut failures = Vec::new();
    for case in cases {
        // Each rank's thread runs the case and checks its own result.
        let results: Vec<RankOutcome> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter_mut()
                .map(|c| {
                    s.spawn(move || {
                        let rank = c.rank();
                        match run_rank(&*c, seed, case, timeout) {
                            Ok(bytes) => (check_rank(seed, case, size, rank, &bytes), Some(bytes)),
                            Err(e) => (Err(format!("rank {rank}: {e}")), None),
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut failed = results.iter().find_map(|(r, _)| r.clone().err());
        // Every rank of an all-reduce holds the same bits.
        if failed.is_none()
            && let Kind::AllReduce(_) | Kind::Overlapped(_) = case.kind
        {
            let first = results[0].1.as_ref().unwrap();
            let (a, n, e) = (recv_start(case, 0), case.n, case.dtype.size_in_bytes());
            for (rank, r) in results.iter().enumerate().skip(1) {
                let b = recv_start(case, rank);
                if r.1.as_ref().unwrap()[b * e..(b + n) * e] != first[a * e..(a + n) * e] {
                    failed = Some(format!(
                        "rank {rank}'s all-reduce differs from rank 0's in bits"
                    ));
                    break;
                }
            }
        }
        match failed {
            None => passed += 1,
            Some(e) => failures.push(format!("{} ({size} ranks): {e}", case.describe())),
        }
    }
    (passed, failures)
}
