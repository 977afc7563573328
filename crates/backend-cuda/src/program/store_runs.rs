//! **Store runs**: stores of f32 values to a write-only f32 buffer at `base + 0, base + 1, ...,
//! base + K - 1` (one base value, every constant offset once; a residual kernel's Jacobian
//! entries) are held back to the end of the element and, where the warp's 32 lanes are all
//! live and their bases are `base_0 + lane * K`, written through shared memory as 32 x K
//! consecutive floats a lane at a time: one thread's K stores at a stride of K floats filled
//! each 32-byte sector a few bytes at a time (the same kernel's Jacobian stores took 0.52 ms of
//! 0.79; staged, the kernel took 0.36). Otherwise the stores go out one by one as before.

use super::dialect::{note_fault, storage};
use hal::DType;
use hal::ir::{Constant, Inst, IrBinary, Program, ScalarType};
use std::fmt::Write;

/// The longest store run combined through shared memory (8 warps x 32 lanes x this many
/// floats of staging: 48 KiB; half as many doubles).
const MAX_RUN: usize = 48;

/// The staged element type of a program's store runs: every run is of the element type of
/// the program's first run (f32 or f64), so one staging array serves them all.
pub(super) fn staged_type(runs: &[StoreRun]) -> Option<DType> {
    runs.first().map(|r| r.dtype)
}
/// Threads per block the staging is sized for (`device::BLOCK`).
pub(super) const STAGED_BLOCK: usize = 256;

/// A run of stores `buffer[base + 0..len]`, each offset's value.
pub(super) struct StoreRun {
    buffer: u32,
    pub(super) base: u32,
    pub(super) values: Vec<u32>,
    /// `F32` or `F64`.
    dtype: DType,
}

/// The store runs of `program` (see the module docs), and for each store instruction that
/// belongs to one, its run.
pub(super) fn store_runs(
    program: &Program,
    types: &[Option<ScalarType>],
) -> (Vec<StoreRun>, Vec<Option<usize>>) {
    use std::collections::BTreeMap;
    /// Offset -> the (store instruction, value) pairs at it.
    type Offsets = BTreeMap<u32, Vec<(usize, u32)>>;
    // (buffer, base) -> its stores by offset.
    let mut groups: BTreeMap<(u32, u32), Offsets> = BTreeMap::new();
    for (n, inst) in program.insts.iter().enumerate() {
        // (Conditional stores stay where they are.)
        let Inst::Store {
            buffer,
            index,
            value,
            when: None,
        } = *inst
        else {
            continue;
        };
        let decl = program.buffers[buffer.0 as usize];
        let float = match decl.dtype {
            DType::F32 => ScalarType::F32,
            DType::F64 => ScalarType::F64,
            _ => continue,
        };
        if decl.access != hal::ir::Access::Write || types[value.0 as usize] != Some(float) {
            continue;
        }
        let Inst::Binary {
            op: IrBinary::Add,
            a,
            b,
        } = program.insts[index.0 as usize]
        else {
            continue;
        };
        let Inst::Const(Constant::U32(offset)) = program.insts[b.0 as usize] else {
            continue;
        };
        groups
            .entry((buffer.0, a.0))
            .or_default()
            .entry(offset)
            .or_default()
            .push((n, value.0));
    }
    // Deferring a store is safe where nothing else writes its buffer: one run per buffer,
    // covering every store to it (write-only buffers are never loaded).
    let mut writes: BTreeMap<u32, usize> = BTreeMap::new();
    for inst in &program.insts {
        if let Inst::Store { buffer, .. } | Inst::AtomicAdd { buffer, .. } = inst {
            *writes.entry(buffer.0).or_default() += 1;
        }
    }
    let mut bases: BTreeMap<u32, usize> = BTreeMap::new();
    for &(buffer, _) in groups.keys() {
        *bases.entry(buffer).or_default() += 1;
    }
    let mut runs = Vec::new();
    let mut member = vec![None; program.insts.len()];
    for ((buffer, base), offsets) in groups {
        let k = offsets.len();
        if bases[&buffer] != 1 || writes[&buffer] != k {
            continue;
        }
        let dtype = program.buffers[buffer as usize].dtype;
        let longest = MAX_RUN * 4 / dtype.size_in_bytes();
        if runs.first().is_some_and(|r: &StoreRun| r.dtype != dtype) {
            continue;
        }
        let whole = (2..=longest).contains(&k)
            && offsets.keys().copied().eq(0..k as u32)
            && offsets.values().all(|v| v.len() == 1);
        if !whole {
            continue;
        }
        for (n, _) in offsets.values().flatten() {
            member[*n] = Some(runs.len());
        }
        runs.push(StoreRun {
            buffer,
            base,
            values: offsets.values().map(|v| v[0].1).collect(),
            dtype,
        });
    }
    (runs, member)
}

/// The end-of-element code of a store run: combined through shared memory where the warp
/// allows, else one checked store at a time. Each warp owns `32 * longest` elements of the
/// staging (`longest`: the program's longest run), whatever the run's own length: slices
/// sized per run would let one warp's short run overlap another warp's long one.
pub(super) fn emit_store_run(src: &mut String, run: &StoreRun, longest: usize) {
    let (b, base, k) = (run.buffer, run.base, run.values.len());
    let _ = writeln!(
        src,
        "  {{ const unsigned m_ = __activemask(); const u32 lane_ = threadIdx.x & 31u;"
    );
    let _ = writeln!(
        src,
        "    const u32 base_ = (u32)v{base}; const u32 first_ = __shfl_sync(m_, base_, 0);"
    );
    let _ = writeln!(
        src,
        "    if (m_ == 0xffffffffu && blockDim.x <= {STAGED_BLOCK}u && __all_sync(m_, base_ == first_ + lane_ * {k}u) && (i64)first_ + {} <= len{b}) {{",
        32 * k
    );
    let _ = writeln!(
        src,
        "      {}* st_ = stage_ + (threadIdx.x >> 5) * {};",
        storage(run.dtype),
        32 * longest
    );
    for (o, v) in run.values.iter().enumerate() {
        let _ = writeln!(src, "      st_[lane_ * {k}u + {o}u] = v{v};");
    }
    let _ = writeln!(src, "      __syncwarp();");
    let _ = writeln!(
        src,
        "      for (u32 j_ = 0; j_ < {k}u; ++j_) b{b}[first_ + j_ * 32u + lane_] = st_[j_ * 32u + lane_];"
    );
    let _ = writeln!(src, "      __syncwarp();\n    }} else {{");
    for (o, v) in run.values.iter().enumerate() {
        let i = format!("(base_ + {o}u)");
        let _ = writeln!(
            src,
            "      if ((i64){i} < len{b}) {{ b{b}[{i}] = v{v}; }} else {};",
            note_fault(&i, b)
        );
    }
    let _ = writeln!(src, "    }}\n  }}");
}

#[cfg(test)]
mod tests {
    use super::super::{Layout, lower_as};
    use hal::DType;
    use hal::ir::{Access, ProgramBuilder};

    /// An f64 run is staged in doubles; runs longer than 24 doubles (48 KiB of staging) are
    /// stored one by one.
    #[test]
    fn f64_store_runs_are_staged_in_doubles() {
        let program = |k: u32| {
            let mut b = ProgramBuilder::new("wide");
            let x = b.buffer(DType::F64, Access::Read);
            let out = b.buffer(DType::F64, Access::Write);
            let i = b.index();
            let v = b.load(x, i);
            let kk = b.const_u32(k);
            let base = b.mul(i, kk);
            for o in 0..k {
                let oo = b.const_u32(o);
                let at = b.add(base, oo);
                b.store(out, at, v);
            }
            lower_as(&b.build().unwrap(), &Layout::One).unwrap()
        };
        let six = program(6);
        assert!(six.contains("__shared__ double stage_[1536];"), "{six}");
        assert!(six.contains("double* st_ = stage_"), "{six}");
        assert!(!program(25).contains("stage_"));
    }

    /// `out[3 i + 0..3]` written as a run: combined through shared memory where the warp
    /// allows; with one more store to the same buffer, no run.
    #[test]
    fn store_runs_are_staged_only_where_nothing_else_writes_the_buffer() {
        let program = |extra: bool| {
            let mut b = ProgramBuilder::new("triple");
            let x = b.buffer(DType::F32, Access::Read);
            let out = b.buffer(DType::F32, Access::Write);
            let i = b.index();
            let v = b.load(x, i);
            let three = b.const_u32(3);
            let base = b.mul(i, three);
            for k in 0..3 {
                let kk = b.const_u32(k);
                let at = b.add(base, kk);
                b.store(out, at, v);
            }
            if extra {
                b.store(out, i, v);
            }
            lower_as(&b.build().unwrap(), &Layout::One).unwrap()
        };
        let staged = program(false);
        assert!(staged.contains("__shared__ float stage_[768];"), "{staged}");
        assert!(
            staged.contains("__all_sync(m_, base_ == first_ + lane_ * 3u)"),
            "{staged}"
        );
        // Fallback: three checked stores; staged: one loop.
        assert_eq!(staged.matches("b1[(base_ + ").count(), 3, "{staged}");
        let plain = program(true);
        assert!(!plain.contains("stage_"), "{plain}");
        assert_eq!(plain.matches("{ b1[").count(), 4, "{plain}");

        // Two runs of different lengths: every warp's slice is sized for the longer, in both
        // (per-run slices once overlapped across warps and gave wrong values on a GPU).
        let mut b = ProgramBuilder::new("two_runs");
        let x = b.buffer(DType::F32, Access::Read);
        let (short, long) = (
            b.buffer(DType::F32, Access::Write),
            b.buffer(DType::F32, Access::Write),
        );
        let i = b.index();
        let v = b.load(x, i);
        for (out, k) in [(short, 2u32), (long, 5)] {
            let kk = b.const_u32(k);
            let base = b.mul(i, kk);
            for o in 0..k {
                let oo = b.const_u32(o);
                let at = b.add(base, oo);
                b.store(out, at, v);
            }
        }
        let two = lower_as(&b.build().unwrap(), &Layout::One).unwrap();
        assert!(two.contains("__shared__ float stage_[1280];"), "{two}");
        assert_eq!(
            two.matches("stage_ + (threadIdx.x >> 5) * 160;").count(),
            2,
            "{two}"
        );
    }
}
