//! The scalar program IR on the CPU: a vectorised interpreter.
//!
//! Compilation validates the program and assigns each value a register slot, reusing slots
//! whose value is dead (liveness from [`Program::last_uses`]). A launch runs the instructions
//! one at a time over blocks of [`LANES`] launch indices, so each instruction is a tight loop
//! the compiler vectorises, and blocks run in parallel. Memory is accessed with relaxed
//! atomics: plain loads and stores on x86 and ARM, but defined behaviour when two indices
//! touch one element (which the IR allows).
//!
//! Values live in two register files: 32-bit lanes for `F32`, `I32`, `U32` and `Bool`, 64-bit
//! lanes for `F64`, each with its own slots, so programs without `F64` run as they always did.

mod lanes;
mod memory;

use crate::storage::CpuBuffer;
use hal::ir::{Constant, Inst, Program, ScalarType};
use hal::{DType, DeviceBuffer, Error, Result};
use lanes::{binary, binary64, cast_lanes, compare, fma64, lanes64, pick, unary, unary64};
use memory::{Mem, Narrow, Stored, lanes_of, store_lanes};
use rayon::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const LANES: usize = 64;
type Reg = [u32; LANES];
type Wide = [u64; LANES];

/// A compiled program: the program, each value's type and register slot (in the 64-bit file
/// for `F64` values, the 32-bit file for the rest).
#[derive(Debug)]
pub struct CompiledProgram {
    pub program: Program,
    types: Vec<Option<ScalarType>>,
    slots: Vec<usize>,
    n_slots: usize,
    n_wide: usize,
}

fn is_wide(t: Option<ScalarType>) -> bool {
    t == Some(ScalarType::F64)
}

/// The CPU backend's kernel handle.
#[derive(Clone, Debug)]
pub struct CpuKernel(pub(crate) Arc<CompiledProgram>);

impl CpuKernel {
    pub fn program(&self) -> &Program {
        &self.0.program
    }
    /// Registers the kernel needs per block of lanes (after slot reuse), both files together.
    pub fn registers(&self) -> usize {
        self.0.n_slots + self.0.n_wide
    }
}

pub(crate) fn compile(program: &Program) -> Result<CompiledProgram> {
    let types = program.validate()?;
    let last = program.last_uses();
    // Free slots and slot counts, per register file (0: 32-bit, 1: 64-bit).
    let mut free: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut slots = vec![usize::MAX; program.insts.len()];
    let mut count = [0usize; 2];
    // Values whose last use is instruction `at` are freed after `at` defines its own value.
    let mut dying: Vec<Vec<usize>> = vec![Vec::new(); program.insts.len()];
    for (v, &l) in last.iter().enumerate() {
        if types[v].is_some() {
            dying[l].push(v);
        }
    }
    for at in 0..program.insts.len() {
        if types[at].is_some() {
            let file = is_wide(types[at]) as usize;
            slots[at] = free[file].pop().unwrap_or_else(|| {
                count[file] += 1;
                count[file] - 1
            });
        }
        for &v in &dying[at] {
            free[is_wide(types[v]) as usize].push(slots[v]);
        }
    }
    Ok(CompiledProgram {
        program: program.clone(),
        types,
        slots,
        n_slots: count[0],
        n_wide: count[1],
    })
}

pub(crate) fn launch(k: &CompiledProgram, args: &[&CpuBuffer], n: usize) -> Result<()> {
    hal::validate::launch(&k.program, args, n)?;
    let mems: Vec<Mem> = args
        .iter()
        .map(|a| Mem {
            ptr: a.0.as_ptr(),
            len: a.len(),
            dtype: a.dtype(),
        })
        .collect();
    // First out-of-range access, as (buffer index + 1) << 32 | element index; 0 = none.
    let fault = AtomicU64::new(0);
    const BLOCKS_PER_TASK: usize = 16;
    let tasks = n.div_ceil(LANES * BLOCKS_PER_TASK);
    (0..tasks).into_par_iter().for_each_init(
        || {
            (
                vec![[0u32; LANES]; k.n_slots.max(1)],
                vec![[0u64; LANES]; k.n_wide],
            )
        },
        |(regs, wide), t| {
            let start = t * LANES * BLOCKS_PER_TASK;
            let indices = start..(start + LANES * BLOCKS_PER_TASK).min(n);
            let task = Task {
                k,
                mems: &mems,
                fault: &fault,
            };
            let files = Files { regs, wide };
            #[cfg(target_arch = "x86_64")]
            if crate::has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (just checked).
                return unsafe { run_task_avx2(&task, files, indices) };
            }
            run_task(&task, files, indices)
        },
    );
    match fault.load(Relaxed) {
        0 => Ok(()),
        f => {
            let (buf, idx) = ((f >> 32) - 1, f & 0xffff_ffff);
            Err(Error::IndexOutOfRange {
                op: "launch (program load/store)",
                index: idx as i64,
                bound: mems[buf as usize].len,
            })
        }
    }
}

#[inline(always)]
fn f(x: u32) -> f32 {
    f32::from_bits(x)
}
#[inline(always)]
fn b(x: f32) -> u32 {
    x.to_bits()
}

/// The two register files of one worker.
struct Files<'a> {
    regs: &'a mut [Reg],
    wide: &'a mut [Wide],
}

/// What every block of a launch reads: the program, its buffers, and where the first
/// out-of-range access is noted.
struct Task<'a> {
    k: &'a CompiledProgram,
    mems: &'a [Mem],
    fault: &'a AtomicU64,
}

/// [`run_task`] with every lane loop compiled for AVX2 and FMA: wider vectors, and `Fma` in
/// hardware instead of a libm call per lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_task_avx2(task: &Task<'_>, files: Files<'_>, indices: std::ops::Range<usize>) {
    run_task(task, files, indices)
}

/// The launch indices `indices`, a block of [`LANES`] at a time.
#[inline(always)]
fn run_task(task: &Task<'_>, files: Files<'_>, indices: std::ops::Range<usize>) {
    let Files { regs, wide } = files;
    for base in indices.clone().step_by(LANES) {
        let lanes = LANES.min(indices.end - base);
        run_block(task, Files { regs, wide }, base as u32, lanes);
    }
}

#[inline(always)]
fn run_block(task: &Task<'_>, files: Files<'_>, base: u32, lanes: usize) {
    let Task { k, mems, fault } = *task;
    let Files { regs, wide } = files;
    // An operand's lanes where the destination reuses its slot (see `operands`).
    let mut saved: Reg = [0; LANES];
    let record_fault = |buf: u32, idx: u32| {
        let _ = fault.compare_exchange(0, ((buf as u64 + 1) << 32) | idx as u64, Relaxed, Relaxed);
    };
    for (at, inst) in k.program.insts.iter().enumerate() {
        let ty = k.types[at];
        let dst = k.slots[at];
        // An operand's slot (which this very instruction may reuse for its result).
        let op = |v: hal::ir::Value| k.slots[v.0 as usize];
        let wide_operand = |v: hal::ir::Value| is_wide(k.types[v.0 as usize]);
        match *inst {
            Inst::Index => {
                for (l, r) in regs[dst].iter_mut().enumerate() {
                    *r = base.wrapping_add(l as u32);
                }
            }
            Inst::Const(Constant::F64(bits)) => wide[dst] = [bits; LANES],
            Inst::Const(c) => regs[dst] = [narrow_bits(c); LANES],
            Inst::Load { buffer, index } => {
                let m = mems[buffer.0 as usize];
                let fault = |at| record_fault(buffer.0, at);
                if m.dtype == DType::F64 {
                    let ix = &regs[op(index)];
                    // Straight into the destination: no copy of the lanes (the index lives
                    // in the other register file).
                    let out = &mut wide[dst];
                    for l in 0..lanes {
                        let i = ix[l] as usize;
                        out[l] = if i < m.len {
                            m.load64(i)
                        } else {
                            fault(ix[l]);
                            0
                        };
                    }
                } else {
                    // One loop per format, the format chosen outside it.
                    let len = m.len;
                    let (out, [ix]) = operands(regs, &mut saved, dst, [op(index)]);
                    match m.narrow() {
                        Narrow::Bits32 => {
                            lanes_of(out, ix, lanes, len, &fault, |i| m.load(Narrow::Bits32, i))
                        }
                        Narrow::F16 => {
                            lanes_of(out, ix, lanes, len, &fault, |i| m.load(Narrow::F16, i))
                        }
                        Narrow::BF16 => {
                            lanes_of(out, ix, lanes, len, &fault, |i| m.load(Narrow::BF16, i))
                        }
                    }
                }
            }
            Inst::Store {
                buffer,
                index,
                value,
                ..
            }
            | Inst::AtomicAdd {
                buffer,
                index,
                value,
            } => {
                let m = mems[buffer.0 as usize];
                let value = if m.dtype == DType::F64 {
                    Stored::Wide(&wide[op(value)])
                } else {
                    Stored::Narrow(&regs[op(value)])
                };
                let when = match *inst {
                    Inst::Store { when: Some(w), .. } => Some(&regs[op(w)]),
                    _ => None,
                };
                let atomic = matches!(inst, Inst::AtomicAdd { .. });
                let fault = |at| record_fault(buffer.0, at);
                store_lanes(m, &regs[op(index)], value, when, atomic, lanes, &fault);
            }
            Inst::Unary { op: u, x } if wide_operand(x) => unary64(wide, u, dst, op(x)),
            Inst::Unary { op: u, x } => {
                let t = ty.expect("typed");
                let (out, [x]) = operands(regs, &mut saved, dst, [op(x)]);
                unary(u, t, x, out);
            }
            Inst::Binary { op: o, a, b: bv } if wide_operand(a) => {
                binary64(wide, o, dst, op(a), op(bv))
            }
            Inst::Binary { op: o, a, b: bv } => {
                let t = ty.expect("typed");
                let (out, [x, y]) = operands(regs, &mut saved, dst, [op(a), op(bv)]);
                binary(o, t, x, y, out);
            }
            Inst::Cmp { op: c, a, b: bv } if wide_operand(a) => {
                let (xa, xb) = (&wide[op(a)], &wide[op(bv)]);
                let out = &mut regs[dst];
                for l in 0..LANES {
                    out[l] = pick(c, f64::from_bits(xa[l]), f64::from_bits(xb[l]));
                }
            }
            Inst::Cmp { op: c, a, b: bv } => {
                let t = k.types[a.0 as usize].expect("typed");
                let (out, [x, y]) = operands(regs, &mut saved, dst, [op(a), op(bv)]);
                compare(c, t, x, y, out);
            }
            Inst::Fma { a, b: bv, c } if is_wide(ty) => fma64(wide, [op(a), op(bv), op(c), dst]),
            Inst::Fma { a, b: bv, c } => {
                let (out, [xa, xb, xc]) = operands(regs, &mut saved, dst, [op(a), op(bv), op(c)]);
                for l in 0..LANES {
                    out[l] = b(f(xa[l]).mul_add(f(xb[l]), f(xc[l])));
                }
            }
            Inst::Select { cond, a, b: bv } if is_wide(ty) => {
                let xc = &regs[op(cond)];
                lanes64(
                    wide,
                    dst,
                    op(a),
                    op(bv),
                    |l, p, q| if xc[l] != 0 { p } else { q },
                );
            }
            Inst::Select { cond, a, b: bv } => {
                let srcs = [op(cond), op(a), op(bv)];
                let (out, [xc, xa, xb]) = operands(regs, &mut saved, dst, srcs);
                for l in 0..LANES {
                    out[l] = if xc[l] != 0 { xa[l] } else { xb[l] };
                }
            }
            Inst::RandomBits { key, counter } => {
                let (k0, k1) = (regs[op(key[0])], regs[op(key[1])]);
                let (c0, c1) = (regs[op(counter[0])], regs[op(counter[1])]);
                regs[dst] = std::array::from_fn(|l| {
                    hal::random::philox4x32_10([c0[l], c1[l], 0, 0], [k0[l], k1[l]])[0]
                });
            }
            Inst::Cast { to, x } => {
                let from = k.types[x.0 as usize].expect("typed");
                let files = Files {
                    regs: &mut *regs,
                    wide: &mut *wide,
                };
                cast_lanes(files, from, to, op(x), dst);
            }
        }
    }
}

/// A 32-bit constant's register bits.
fn narrow_bits(c: Constant) -> u32 {
    match c {
        Constant::F32(x) | Constant::U32(x) => x,
        Constant::I32(x) => x as u32,
        Constant::Bool(x) => x as u32,
        Constant::F64(_) => unreachable!("f64 constants live in the 64-bit file"),
    }
}

/// The destination slot's lanes and the operand slots' lanes. Where an operand shares the
/// destination's slot (slots are reused by the instruction that frees them), it reads a copy
/// of the lanes as they were, kept in `saved`; otherwise no lanes are copied, and the
/// references do not alias, so the lane loops over them vectorise.
#[inline(always)]
fn operands<'a, const N: usize>(
    regs: &'a mut [Reg],
    saved: &'a mut Reg,
    dst: usize,
    srcs: [usize; N],
) -> (&'a mut Reg, [&'a Reg; N]) {
    assert!(
        dst < regs.len() && srcs.iter().all(|&s| s < regs.len()),
        "slots in the file"
    );
    let aliased = srcs.contains(&dst);
    if aliased {
        *saved = regs[dst];
    }
    let saved: &'a Reg = saved;
    let base = regs.as_mut_ptr();
    // SAFETY: every slot is in the file (asserted); the only mutable reference is to slot
    // `dst`, and no shared one points at it (an operand in that slot reads `saved`).
    unsafe {
        let xs: [&'a Reg; N] = std::array::from_fn(|i| {
            if aliased && srcs[i] == dst {
                saved
            } else {
                &*base.add(srcs[i])
            }
        });
        (&mut *base.add(dst), xs)
    }
}
