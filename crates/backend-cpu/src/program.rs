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

use crate::math::exp_f32;
use crate::storage::CpuBuffer;
use hal::ir::{Constant, Inst, IrBinary, IrCmp, IrUnary, Program, ScalarType};
use hal::{DType, DeviceBuffer, Error, Result, bf16, f16};
use rayon::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

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

/// The element formats a 32-bit register value is loaded from and stored to.
#[derive(Clone, Copy)]
enum Narrow {
    /// f32, i32 and u32: the bits themselves.
    Bits32,
    F16,
    BF16,
}

#[derive(Clone, Copy)]
struct Mem {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
}
// SAFETY: every access goes through atomics (see `load`), bounds-checked by the caller.
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

impl Mem {
    /// How this buffer's 32-bit register values are stored: decided once per instruction,
    /// so the lane loops below carry no per-element `match`.
    #[inline(always)]
    fn narrow(&self) -> Narrow {
        match self.dtype {
            DType::F32 | DType::I32 | DType::U32 => Narrow::Bits32,
            DType::F16 => Narrow::F16,
            DType::BF16 => Narrow::BF16,
            DType::F64 => unreachable!("f64 buffers go through load64 and store64"),
        }
    }
    #[inline(always)]
    fn load(&self, w: Narrow, i: usize) -> u32 {
        // SAFETY: the caller checked `i < len`; atomics make concurrent access defined.
        unsafe {
            match w {
                Narrow::Bits32 => (*(self.ptr as *const AtomicU32).add(i)).load(Relaxed),
                Narrow::F16 => {
                    f16::from_bits((*(self.ptr as *const AtomicU16).add(i)).load(Relaxed))
                        .to_f32()
                        .to_bits()
                }
                Narrow::BF16 => {
                    bf16::from_bits((*(self.ptr as *const AtomicU16).add(i)).load(Relaxed))
                        .to_f32()
                        .to_bits()
                }
            }
        }
    }
    /// Element `i` of an `f64` buffer, as bits.
    #[inline(always)]
    fn load64(&self, i: usize) -> u64 {
        // SAFETY: the caller checked `i < len` and the dtype (f64: 8-byte elements).
        unsafe { (*(self.ptr as *const AtomicU64).add(i)).load(Relaxed) }
    }
    #[inline(always)]
    fn store64(&self, i: usize, bits: u64) {
        // SAFETY: as for `load64`.
        unsafe { (*(self.ptr as *const AtomicU64).add(i)).store(bits, Relaxed) }
    }
    #[inline(always)]
    fn atomic_add64(&self, i: usize, bits: u64) {
        // SAFETY: as for `load64`.
        let a = unsafe { &*(self.ptr as *const AtomicU64).add(i) };
        let mut cur = a.load(Relaxed);
        loop {
            let new = (f64::from_bits(cur) + f64::from_bits(bits)).to_bits();
            match a.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }
    #[inline(always)]
    fn store(&self, w: Narrow, i: usize, bits: u32) {
        // SAFETY: the caller checked `i < len`; atomics make concurrent access defined.
        unsafe {
            match w {
                Narrow::Bits32 => (*(self.ptr as *const AtomicU32).add(i)).store(bits, Relaxed),
                Narrow::F16 => (*(self.ptr as *const AtomicU16).add(i))
                    .store(f16::from_f32(f32::from_bits(bits)).to_bits(), Relaxed),
                Narrow::BF16 => (*(self.ptr as *const AtomicU16).add(i))
                    .store(bf16::from_f32(f32::from_bits(bits)).to_bits(), Relaxed),
            }
        }
    }
    #[inline(always)]
    fn atomic_add(&self, i: usize, bits: u32) {
        // SAFETY: the caller checked `i < len`; Program::validate admits atomic adds on F32,
        // I32 and U32 buffers only, so an AtomicU32 at element `i` is in bounds.
        unsafe {
            let a = &*(self.ptr as *const AtomicU32).add(i);
            match self.dtype {
                DType::F32 => {
                    let mut cur = a.load(Relaxed);
                    loop {
                        let new = (f32::from_bits(cur) + f32::from_bits(bits)).to_bits();
                        match a.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                            Ok(_) => break,
                            Err(seen) => cur = seen,
                        }
                    }
                }
                _ => {
                    a.fetch_add(bits, Relaxed);
                }
            }
        }
    }
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
            let end = (start + LANES * BLOCKS_PER_TASK).min(n);
            let mut s = start;
            while s < end {
                let lanes = LANES.min(end - s);
                let files = Files { regs, wide };
                #[cfg(target_arch = "x86_64")]
                if crate::has_avx2_fma() {
                    // SAFETY: the CPU has AVX2 and FMA (just checked).
                    unsafe { run_block_avx2(k, &mems, files, s as u32, lanes, &fault) };
                    s += lanes;
                    continue;
                }
                run_block(k, &mems, files, s as u32, lanes, &fault);
                s += lanes;
            }
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

/// [`run_block`] with every lane loop compiled for AVX2 and FMA: wider vectors, and `Fma`
/// in hardware instead of a libm call per lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_block_avx2(
    k: &CompiledProgram,
    mems: &[Mem],
    files: Files<'_>,
    base: u32,
    lanes: usize,
    fault: &AtomicU64,
) {
    run_block(k, mems, files, base, lanes, fault)
}

#[inline(always)]
fn run_block(
    k: &CompiledProgram,
    mems: &[Mem],
    files: Files<'_>,
    base: u32,
    lanes: usize,
    fault: &AtomicU64,
) {
    let Files { regs, wide } = files;
    // An operand's lanes where the destination reuses its slot (see `operands`).
    let mut saved: Reg = [0; LANES];
    let record_fault = |buf: u32, idx: u32| {
        let _ = fault.compare_exchange(0, ((buf as u64 + 1) << 32) | idx as u64, Relaxed, Relaxed);
    };
    for (at, inst) in k.program.insts.iter().enumerate() {
        let ty = k.types[at];
        let dst = k.slots[at];
        // Copies of operand registers: a value's slot may be reused by this very instruction.
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
            Inst::Fma { a, b: bv, c } if is_wide(ty) => {
                let slots = [op(a), op(bv), op(c), dst];
                assert!(slots.iter().all(|&s| s < wide.len()), "slots in the file");
                #[cfg(target_arch = "x86_64")]
                if has_avx2_fma() {
                    // SAFETY: the CPU has AVX2 and FMA (just checked).
                    unsafe { fma64_avx2(wide, slots) };
                    continue;
                }
                fma64_body(wide, slots);
            }
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

/// The values a store or atomic add writes: 32-bit lanes, or 64-bit ones for an f64 buffer.
enum Stored<'a> {
    Narrow(&'a Reg),
    Wide(&'a Wide),
}

/// Stores (or adds atomically) each live lane's value at its index where `when` holds,
/// noting the fault of an index out of range.
#[inline(always)]
fn store_lanes(
    m: Mem,
    ix: &Reg,
    value: Stored<'_>,
    when: Option<&Reg>,
    atomic: bool,
    lanes: usize,
    fault: &impl Fn(u32),
) {
    // The lanes to write, each index checked; `put` is chosen once, outside the loop.
    #[inline(always)]
    fn each(
        ix: &Reg,
        when: Option<&Reg>,
        lanes: usize,
        len: usize,
        fault: &impl Fn(u32),
        put: impl Fn(usize, usize),
    ) {
        for l in 0..lanes {
            if when.is_some_and(|w| w[l] == 0) {
                continue;
            }
            let i = ix[l] as usize;
            if i >= len {
                fault(ix[l]);
                continue;
            }
            put(l, i);
        }
    }
    let len = m.len;
    match (value, atomic) {
        (Stored::Wide(v), true) => {
            each(ix, when, lanes, len, fault, |l, i| m.atomic_add64(i, v[l]))
        }
        (Stored::Wide(v), false) => each(ix, when, lanes, len, fault, |l, i| m.store64(i, v[l])),
        (Stored::Narrow(v), true) => {
            each(ix, when, lanes, len, fault, |l, i| m.atomic_add(i, v[l]))
        }
        (Stored::Narrow(v), false) => match m.narrow() {
            Narrow::Bits32 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::Bits32, i, v[l])
            }),
            Narrow::F16 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::F16, i, v[l])
            }),
            Narrow::BF16 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::BF16, i, v[l])
            }),
        },
    }
}

/// `load(i)` at each live lane's index below `len`, or the fault noted (the lane left 0).
#[inline(always)]
fn lanes_of(
    out: &mut Reg,
    ix: &Reg,
    lanes: usize,
    len: usize,
    fault: &impl Fn(u32),
    load: impl Fn(usize) -> u32,
) {
    for l in 0..lanes {
        let i = ix[l] as usize;
        out[l] = if i < len {
            load(i)
        } else {
            fault(ix[l]);
            0
        };
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

/// `Inst::Cast` from slot `src` (of type `from`) into slot `dst` (of type `to`), across the
/// two register files.
#[inline(always)]
fn cast_lanes(files: Files<'_>, from: ScalarType, to: ScalarType, src: usize, dst: usize) {
    let Files { regs, wide } = files;
    match (from == ScalarType::F64, to == ScalarType::F64) {
        (true, true) => wide[dst] = wide[src],
        (true, false) => {
            let xs = wide[src];
            let out = &mut regs[dst];
            (0..LANES).for_each(|l| out[l] = cast_from64(to, xs[l]));
        }
        (false, true) => {
            let xs = regs[src];
            let out = &mut wide[dst];
            (0..LANES).for_each(|l| out[l] = cast_to64(from, xs[l]));
        }
        (false, false) => {
            let xs = regs[src];
            let out = &mut regs[dst];
            (0..LANES).for_each(|l| out[l] = cast(from, to, xs[l]));
        }
    }
}

/// An `f64` (as bits) converted to a 32-bit type: truncation toward zero, saturating, NaN 0.
fn cast_from64(to: ScalarType, x: u64) -> u32 {
    let v = f64::from_bits(x);
    match to {
        ScalarType::F32 => b(v as f32),
        ScalarType::I32 => v as i32 as u32,
        ScalarType::U32 => v as u32,
        ScalarType::Bool => (v != 0.0) as u32,
        ScalarType::F64 => unreachable!("a 32-bit target"),
    }
}

/// A 32-bit value of type `from` as `f64` bits (exact).
fn cast_to64(from: ScalarType, x: u32) -> u64 {
    let v = match from {
        ScalarType::F32 => f(x) as f64,
        ScalarType::I32 => x as i32 as f64,
        ScalarType::U32 | ScalarType::Bool => x as f64,
        ScalarType::F64 => unreachable!("a 32-bit source"),
    };
    v.to_bits()
}

/// `wide[dst][l] = g(l, wide[a][l], wide[b][l])` (as `f64` bits) for every lane, in place:
/// `dst` may be `a` or `b` (slots are reused by the instruction that frees them), so the lanes
/// go through raw pointers, each read before it is written; no operand is copied.
///
/// On x86-64 CPUs with AVX2 and FMA (checked at run time; the build targets baseline x86-64,
/// SSE2) the loop is compiled for them: four `f64` lanes an instruction and fused
/// multiply-adds in hardware rather than libm calls.
#[inline(always)]
fn lanes64(wide: &mut [Wide], dst: usize, a: usize, b: usize, g: impl Fn(usize, u64, u64) -> u64) {
    assert!(
        dst < wide.len() && a < wide.len() && b < wide.len(),
        "slots in the file"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (just checked).
        unsafe { lanes64_avx2(wide, dst, a, b, g) };
        return;
    }
    lanes64_body(wide, dst, a, b, g)
}

/// Whether this x86-64 CPU has AVX2 and FMA (cached by std after the first query).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// [`lanes64_body`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn lanes64_avx2(
    wide: &mut [Wide],
    dst: usize,
    a: usize,
    b: usize,
    g: impl Fn(usize, u64, u64) -> u64,
) {
    lanes64_body(wide, dst, a, b, g)
}

/// The loop of [`lanes64`]; the caller checked the slots.
#[inline(always)]
fn lanes64_body(
    wide: &mut [Wide],
    dst: usize,
    a: usize,
    b: usize,
    g: impl Fn(usize, u64, u64) -> u64,
) {
    let base = wide.as_mut_ptr() as *mut u64;
    // SAFETY: the three slots are in bounds (asserted) and `Wide` is `[u64; LANES]`, so lane
    // `l` of slot `s` is element `s * LANES + l`; no references are formed, so the
    // destination may alias an operand.
    unsafe {
        let (pa, pb, pd) = (
            base.add(a * LANES),
            base.add(b * LANES),
            base.add(dst * LANES),
        );
        for l in 0..LANES {
            *pd.add(l) = g(l, *pa.add(l), *pb.add(l));
        }
    }
}

/// `wide[d] = wide[a] * wide[b] + wide[c]` lane by lane, `[a, b, c, d]` in the file (the
/// caller checked).
#[inline(always)]
fn fma64_body(wide: &mut [Wide], slots: [usize; 4]) {
    let base = wide.as_mut_ptr() as *mut u64;
    // SAFETY: every slot is in the file (checked by the caller) and `Wide` is
    // `[u64; LANES]`; raw reads and writes, no references, so the destination may be an
    // operand's slot (lane `l` of every operand is read before lane `l` is written).
    let g = |s: usize, l: usize| f64::from_bits(unsafe { *base.add(s * LANES + l) });
    for l in 0..LANES {
        let v = g(slots[0], l).mul_add(g(slots[1], l), g(slots[2], l));
        // SAFETY: as above.
        unsafe { *base.add(slots[3] * LANES + l) = v.to_bits() };
    }
}

/// [`fma64_body`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma64_avx2(wide: &mut [Wide], slots: [usize; 4]) {
    fma64_body(wide, slots)
}

/// One `f64` binary operation over every lane, the operation chosen once per instruction.
#[inline(always)]
fn binary64(wide: &mut [Wide], op: IrBinary, dst: usize, a: usize, b: usize) {
    macro_rules! go {
        (|$p:ident, $q:ident| $e:expr) => {
            lanes64(wide, dst, a, b, |_, x, y| {
                let ($p, $q) = (f64::from_bits(x), f64::from_bits(y));
                ($e).to_bits()
            })
        };
    }
    match op {
        IrBinary::Add => go!(|p, q| p + q),
        IrBinary::Sub => go!(|p, q| p - q),
        IrBinary::Mul => go!(|p, q| p * q),
        IrBinary::Div => go!(|p, q| p / q),
        IrBinary::Rem => go!(|p, q| p % q),
        IrBinary::Min => go!(|p, q| p.min(q)),
        IrBinary::Max => go!(|p, q| p.max(q)),
        IrBinary::Pow => go!(|p, q| p.powf(q)),
        IrBinary::Atan2 => go!(|p, q| p.atan2(q)),
        _ => unreachable!("validated: not a float op"),
    }
}

/// One `f64` unary operation over every lane (see [`binary64`]).
#[inline(always)]
fn unary64(wide: &mut [Wide], op: IrUnary, dst: usize, x: usize) {
    macro_rules! go {
        (|$v:ident| $e:expr) => {
            lanes64(wide, dst, x, x, |_, a, _| {
                let $v = f64::from_bits(a);
                ($e).to_bits()
            })
        };
    }
    match op {
        IrUnary::Neg => go!(|v| -v),
        IrUnary::Abs => go!(|v| v.abs()),
        IrUnary::Sqrt => go!(|v| v.sqrt()),
        IrUnary::Rsqrt => go!(|v| 1.0 / v.sqrt()),
        IrUnary::Recip => go!(|v| 1.0 / v),
        IrUnary::Exp => go!(|v| v.exp()),
        IrUnary::Exp2 => go!(|v| v.exp2()),
        IrUnary::Log => go!(|v| v.ln()),
        IrUnary::Log2 => go!(|v| v.log2()),
        IrUnary::Sin => go!(|v| v.sin()),
        IrUnary::Cos => go!(|v| v.cos()),
        IrUnary::Tan => go!(|v| v.tan()),
        IrUnary::Tanh => go!(|v| v.tanh()),
        IrUnary::Floor => go!(|v| v.floor()),
        IrUnary::Ceil => go!(|v| v.ceil()),
        IrUnary::Not => unreachable!("validated: not a float op"),
    }
}

#[inline(always)]
fn cast(from: ScalarType, to: ScalarType, x: u32) -> u32 {
    use ScalarType::*;
    match (from, to) {
        (a, b) if a == b => x,
        (F32, I32) => f(x) as i32 as u32,
        (F32, U32) => f(x) as u32,
        (F32, Bool) => (f(x) != 0.0) as u32,
        (I32, F32) => b(x as i32 as f32),
        (U32, F32) => b(x as f32),
        (Bool, F32) => b(x as f32),
        (I32, U32) | (U32, I32) | (Bool, I32) | (Bool, U32) => x,
        (I32, Bool) | (U32, Bool) => (x != 0) as u32,
        _ => unreachable!("all pairs covered"),
    }
}

#[inline(always)]
fn unary(op: IrUnary, t: ScalarType, x: &Reg, out: &mut Reg) {
    // Each arm one loop straight into `out`.
    macro_rules! lanes {
        (|$v:ident| $e:expr) => {
            for l in 0..LANES {
                let $v = x[l];
                out[l] = $e;
            }
        };
    }
    macro_rules! fl {
        ($g:expr) => {
            lanes!(|v| b($g(f(v))))
        };
    }
    match (op, t) {
        (IrUnary::Neg, ScalarType::F32) => fl!(|v: f32| -v),
        (IrUnary::Neg, _) => lanes!(|v| (v as i32).wrapping_neg() as u32),
        (IrUnary::Abs, ScalarType::F32) => fl!(f32::abs),
        (IrUnary::Abs, ScalarType::I32) => lanes!(|v| (v as i32).wrapping_abs() as u32),
        (IrUnary::Abs, _) => *out = *x,
        (IrUnary::Not, ScalarType::Bool) => lanes!(|v| (v == 0) as u32),
        (IrUnary::Not, _) => lanes!(|v| !v),
        (IrUnary::Sqrt, _) => fl!(f32::sqrt),
        (IrUnary::Rsqrt, _) => fl!(|v: f32| 1.0 / v.sqrt()),
        (IrUnary::Recip, _) => fl!(|v: f32| 1.0 / v),
        (IrUnary::Exp, _) => fl!(exp_f32),
        (IrUnary::Exp2, _) => fl!(f32::exp2),
        (IrUnary::Log, _) => fl!(f32::ln),
        (IrUnary::Log2, _) => fl!(f32::log2),
        (IrUnary::Sin, _) => fl!(f32::sin),
        (IrUnary::Cos, _) => fl!(f32::cos),
        (IrUnary::Tan, _) => fl!(f32::tan),
        (IrUnary::Tanh, _) => fl!(f32::tanh),
        (IrUnary::Floor, _) => fl!(f32::floor),
        (IrUnary::Ceil, _) => fl!(f32::ceil),
    }
}

#[inline(always)]
fn binary(op: IrBinary, t: ScalarType, x: &Reg, y: &Reg, out: &mut Reg) {
    use ScalarType::*;
    // Each arm one loop straight into `out`.
    macro_rules! lanes {
        (|$a:ident, $b2:ident| $e:expr) => {
            for l in 0..LANES {
                let ($a, $b2) = (x[l], y[l]);
                out[l] = $e;
            }
        };
    }
    match (op, t) {
        (IrBinary::Add, F32) => lanes!(|p, q| b(f(p) + f(q))),
        (IrBinary::Sub, F32) => lanes!(|p, q| b(f(p) - f(q))),
        (IrBinary::Mul, F32) => lanes!(|p, q| b(f(p) * f(q))),
        (IrBinary::Div, F32) => lanes!(|p, q| b(f(p) / f(q))),
        (IrBinary::Rem, F32) => lanes!(|p, q| b(f(p) % f(q))),
        (IrBinary::Min, F32) => lanes!(|p, q| b(f(p).min(f(q)))),
        (IrBinary::Max, F32) => lanes!(|p, q| b(f(p).max(f(q)))),
        (IrBinary::Pow, _) => lanes!(|p, q| b(f(p).powf(f(q)))),
        (IrBinary::Atan2, _) => lanes!(|p, q| b(f(p).atan2(f(q)))),
        (IrBinary::Add, _) => lanes!(|p, q| p.wrapping_add(q)),
        (IrBinary::Sub, _) => lanes!(|p, q| p.wrapping_sub(q)),
        (IrBinary::Mul, _) => lanes!(|p, q| p.wrapping_mul(q)),
        (IrBinary::Div, I32) => lanes!(|p, q| if q == 0 {
            0
        } else {
            (p as i32).wrapping_div(q as i32) as u32
        }),
        (IrBinary::Div, _) => lanes!(|p, q| div_u32(p, q)),
        (IrBinary::Rem, I32) => lanes!(|p, q| if q == 0 {
            0
        } else {
            (p as i32).wrapping_rem(q as i32) as u32
        }),
        (IrBinary::Rem, _) => lanes!(|p, q| if q == 0 {
            0
        } else {
            p.wrapping_sub(q.wrapping_mul(div_u32(p, q)))
        }),
        (IrBinary::Min, I32) => lanes!(|p, q| (p as i32).min(q as i32) as u32),
        (IrBinary::Max, I32) => lanes!(|p, q| (p as i32).max(q as i32) as u32),
        (IrBinary::Min, _) => lanes!(|p, q| p.min(q)),
        (IrBinary::Max, _) => lanes!(|p, q| p.max(q)),
        (IrBinary::And, _) => lanes!(|p, q| p & q),
        (IrBinary::Or, _) => lanes!(|p, q| p | q),
        (IrBinary::Xor, _) => lanes!(|p, q| p ^ q),
        (IrBinary::Shl, _) => lanes!(|p, q| p.wrapping_shl(q)),
        (IrBinary::Shr, I32) => lanes!(|p, q| (p as i32).wrapping_shr(q) as u32),
        (IrBinary::Shr, _) => lanes!(|p, q| p.wrapping_shr(q)),
    }
}

/// `p / q` rounded down, 0 where `q` is 0, through `f64`: a vector division, where the
/// integer one is a scalar instruction of some 25 cycles per lane (index arithmetic such as
/// `t / classes` runs it for every element). Exact: both operands are below 2^32, so the
/// correctly rounded `f64` quotient of a non-integer `p / q` stays below the next integer
/// (their gap, at least `1 / q`, exceeds the quotient's rounding error, at most
/// `2^-52 p / q`).
#[inline(always)]
fn div_u32(p: u32, q: u32) -> u32 {
    let quotient = (p as f64 / q as f64) as u32;
    if q == 0 { 0 } else { quotient }
}

fn pick<T: PartialOrd>(op: IrCmp, a: T, b: T) -> u32 {
    (match op {
        IrCmp::Eq => a == b,
        IrCmp::Ne => a != b,
        IrCmp::Lt => a < b,
        IrCmp::Le => a <= b,
        IrCmp::Gt => a > b,
        IrCmp::Ge => a >= b,
    }) as u32
}

#[inline(always)]
fn compare(op: IrCmp, t: ScalarType, x: &Reg, y: &Reg, out: &mut Reg) {
    // One loop per type, straight into `out`.
    match t {
        ScalarType::F32 => (0..LANES).for_each(|l| out[l] = pick(op, f(x[l]), f(y[l]))),
        ScalarType::I32 => (0..LANES).for_each(|l| out[l] = pick(op, x[l] as i32, y[l] as i32)),
        _ => (0..LANES).for_each(|l| out[l] = pick(op, x[l], y[l])),
    }
}
