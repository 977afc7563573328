//! The kernel files composed every way the backend composes them, for `cargo xtask wgsl`.

use super::{
    Access, Entry, FILES, Features, Module, PAIRS_ENTRY_FILES, ShaderFile, compose,
    dot_epilogue_slot, file, gate_load_slot, includes, ones_column_slot, row_sums_slot,
};
use crate::coop::{CoopTiles, gemm_slots, nearest_slots};
use hal::DType;

/// A kernel file composed one way, for `cargo xtask wgsl`.
pub struct Variant {
    pub file: &'static str,
    pub label: String,
    pub module: Module,
    /// The optional features it uses (what the validator must allow).
    pub features: Features,
}

/// Every kernel file composed with its default slots, under each entry it can have, without
/// optional features and with all of them (immediates, `array<f16>` bindings where the file
/// has a bindings slot, subgroups): what `cargo xtask wgsl` validates. (Library files, the
/// prelude, `tile.wgsl` and the like, are validated as parts of the kernels that include them.)
pub fn default_modules() -> Vec<Variant> {
    let all = Features {
        immediate_words: 64,
        native_f16: true,
        subgroups: true,
        cooperative_matrix: true,
        fused_fma: Some(true),
        f64: false,
    };
    let mut out = file_variants(all);
    out.extend(product_variants(all));
    out.push(math_program_variant());
    out
}

/// An f64 IR program that calls every function of `math_wide.wgsl` through the lowering
/// (the library is not a kernel file, so no other variant includes it).
fn math_program_variant() -> Variant {
    use hal::ir::{Access as IrAccess, IrBinary, IrUnary, ProgramBuilder, ScalarType};
    let mut p = ProgramBuilder::new("f64_math");
    let x = p.buffer(DType::F64, IrAccess::Read);
    let y = p.buffer(DType::F64, IrAccess::Write);
    let i = p.index();
    let mut v = p.load(x, i);
    for op in [
        IrUnary::Exp,
        IrUnary::Exp2,
        IrUnary::Log,
        IrUnary::Log2,
        IrUnary::Sin,
        IrUnary::Cos,
        IrUnary::Tan,
        IrUnary::Tanh,
        IrUnary::Sqrt,
        IrUnary::Rsqrt,
        IrUnary::Recip,
        IrUnary::Floor,
    ] {
        v = p.unary(op, v);
    }
    for op in [IrBinary::Pow, IrBinary::Atan2, IrBinary::Rem, IrBinary::Div] {
        v = p.binary(op, v, v);
    }
    let w = p.fma(v, v, v);
    let n = p.cast(ScalarType::I32, w);
    let back = p.cast(ScalarType::F64, n);
    p.store(y, i, back);
    let features = Features {
        f64: true,
        ..Features::default()
    };
    let program = p.build().expect("a valid program");
    let source = crate::program::lower(&program, features).expect("lowers");
    Variant {
        file: "math_wide.wgsl",
        label: "an f64 program calling every function".to_string(),
        module: Module::generated("<f64 program>", source),
        features,
    }
}

/// Each kernel file with its default slots under every entry it has, without optional
/// features and with `all`.
fn file_variants(all: Features) -> Vec<Variant> {
    let mut out = Vec::new();
    for f in FILES {
        if !f.is_kernel() {
            continue;
        }
        let entries: &[(&str, Entry)] = if f.has_own_entry() {
            &[("own entry", Entry::Strided)]
        } else {
            &[
                ("strided entry", Entry::Strided),
                ("contiguous entry", Entry::Contiguous),
            ]
        };
        let bindings = default_bindings(f);
        if f.needs_f64() {
            // Only with shader-f64, as its own file's bindings declare.
            let wide = Features { f64: true, ..all };
            for &(label, e) in entries {
                out.push(Variant {
                    file: f.name,
                    label: format!("{label}, shader-f64"),
                    module: compose(f.name, None, &[], e, wide),
                    features: wide,
                });
            }
            continue;
        }
        if PAIRS_ENTRY_FILES.contains(&f.name) {
            // The written binding as f16, two elements per word.
            let paired: Vec<(DType, Access)> = bindings
                .iter()
                .flatten()
                .map(|&(d, a)| (if a == Access::Write { DType::F16 } else { d }, a))
                .collect();
            out.push(Variant {
                file: f.name,
                label: "contiguous pairs entry".to_string(),
                module: compose(
                    f.name,
                    Some(&paired),
                    &[],
                    Entry::ContiguousPairs,
                    Features::default(),
                ),
                features: Features::default(),
            });
        }
        for &(label, e) in entries {
            if !f.needs_subgroups() && !f.needs_cooperative_matrix() {
                out.push(Variant {
                    file: f.name,
                    label: label.to_string(),
                    module: compose(f.name, None, &[], e, Features::default()),
                    features: Features::default(),
                });
            }
            // f16 storage in every float binding the defaults declare.
            let f16: Option<Vec<(DType, Access)>> = bindings.as_ref().map(|b| {
                b.iter()
                    .map(|&(d, a)| (if d == DType::F32 { DType::F16 } else { d }, a))
                    .collect()
            });
            out.push(Variant {
                file: f.name,
                label: format!("{label}, all features"),
                module: compose(f.name, f16.as_deref(), &[], e, all),
                features: all,
            });
        }
    }
    out
}

/// The products' specialisations: a Linear layer's backward products (the gate in the
/// products' reads, the ones column of row sums, and the sum pass that stores them), a small
/// product run whole with its epilogue, and the cooperative-matrix kernels' generated
/// tilings.
fn product_variants(all: Features) -> Vec<Variant> {
    let mut out = Vec::new();
    let f32s = |reads: usize, writes: usize| -> Vec<(DType, Access)> {
        let mut b = vec![(DType::F32, Access::Read); reads];
        b.extend(vec![(DType::F32, Access::Write); writes]);
        b
    };
    let mut product = f32s(2, 1);
    product.push((DType::F32, Access::Read));
    let backward = [gate_load_slot(hal::UnaryOp::Sigmoid), ones_column_slot()];
    for file in ["gemm.wgsl", "gemm_dot.wgsl", "gemm_dot_subgroups.wgsl"] {
        out.push(Variant {
            file,
            label: "gate and ones column".to_string(),
            module: compose(file, Some(&product), &backward, Entry::Strided, all),
            features: all,
        });
    }
    // A small product run whole by the dot kernels: gate, bias (binding 5), activation and
    // row sums (binding 6) in one launch.
    let mut whole = product.clone();
    whole.push((DType::F32, Access::Read));
    whole.push((DType::F32, Access::Write));
    let finish = dot_epilogue_slot(Some(5), Some(hal::UnaryOp::Tanh), Some(6));
    for file in ["gemm_dot.wgsl", "gemm_dot_subgroups.wgsl"] {
        let slots = [backward[0].clone(), backward[1].clone(), finish.clone()];
        out.push(Variant {
            file,
            label: "whole, with an epilogue and row sums".to_string(),
            module: compose(file, Some(&whole), &slots, Entry::Strided, all),
            features: all,
        });
    }
    let nearest = vec![
        (DType::F32, Access::Read),
        (DType::F32, Access::Read),
        (DType::U32, Access::Write),
        (DType::F32, Access::Write),
    ];
    out.push(Variant {
        file: "nearest_short.wgsl",
        label: "rows of up to 32 values".to_string(),
        module: compose(
            "nearest_short.wgsl",
            Some(&nearest),
            &[super::nearest_short_wide_slot()],
            Entry::Strided,
            all,
        ),
        features: all,
    });
    out.push(Variant {
        file: "gemm_sum.wgsl",
        label: "row sums".to_string(),
        module: compose(
            "gemm_sum.wgsl",
            Some(&f32s(2, 2)),
            &[row_sums_slot()],
            Entry::Strided,
            all,
        ),
        features: all,
    });
    // The cooperative-matrix product's generated tilings, beside the file's own default.
    out.push(Variant {
        file: "nearest_coop.wgsl",
        label: "generated".to_string(),
        module: compose(
            "nearest_coop.wgsl",
            None,
            &nearest_slots(),
            Entry::Strided,
            all,
        ),
        features: all,
    });

    let tall = CoopTiles::parse("4x2x2x4").expect("a valid tiling");
    for (label, tiles, split) in [
        ("split mode", CoopTiles::SPLIT, true),
        ("4x2x2x4", tall, false),
    ] {
        out.push(Variant {
            file: "gemm_coop.wgsl",
            label: label.to_string(),
            module: compose(
                "gemm_coop.wgsl",
                None,
                &gemm_slots(tiles, split),
                Entry::Strided,
                all,
            ),
            features: all,
        });
    }
    out
}

/// The dtypes and access of the default `bindings` slot of a file (and its includes), read
/// from its declarations: `array<u32>` accessors with `ld`/`st` are f32, with `ldi` only
/// u32/i32 indices; `None` when the file has no bindings slot.
fn default_bindings(f: &ShaderFile) -> Option<Vec<(DType, Access)>> {
    let mut text = f.text.to_string();
    for inc in includes(f.text) {
        text += file(inc).text;
    }
    let slot = text
        .split("// @slot bindings")
        .nth(1)?
        .split("// @end")
        .next()?;
    let mut out = Vec::new();
    for b in 1..16 {
        let decl = format!("@binding({b}) var<storage, ");
        let Some(rest) = slot.split(&decl).nth(1) else {
            break;
        };
        let access = if rest.starts_with("read>") {
            Access::Read
        } else {
            Access::Write
        };
        let float = slot.contains(&format!("fn ld{b}(")) || slot.contains(&format!("fn st{b}("));
        out.push((if float { DType::F32 } else { DType::U32 }, access));
    }
    Some(out)
}
