//! Matrix products on cooperative matrices (tensor cores through `wgpu_cooperative_matrix`):
//! the tilings of `shaders/matmul/gemm_coop.wgsl` and the code its slots are filled with.
//!
//! The shader's fixed part stages tiles through workgroup memory; what depends on the tiling
//! (the fragment variables, the multiply-adds of one 16-deep step, the stores) is generated
//! here, because WGSL has no arrays of cooperative matrices.

/// How one workgroup of 8 subgroups (32 lanes each) covers its block of the output: an
/// `sr x sc` grid of subgroups, each `tm x tn` fragments of 16 x 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTiles {
    pub sr: u32,
    pub sc: u32,
    pub tm: u32,
    pub tn: u32,
}

impl CoopTiles {
    /// 128 x 128 blocks, 64 x 32 per subgroup: eight accumulators of eight registers a lane.
    pub const SINGLE: CoopTiles = CoopTiles {
        sr: 2,
        sc: 4,
        tm: 4,
        tn: 2,
    };
    /// The fast-f32 mode keeps two accumulators per fragment: 64 x 128 blocks, 32 x 32 per
    /// subgroup.
    pub const SPLIT: CoopTiles = CoopTiles {
        sr: 2,
        sc: 4,
        tm: 2,
        tn: 2,
    };

    /// Rows of the output block.
    pub fn rows(&self) -> usize {
        (self.sr * self.tm * 16) as usize
    }
    /// Columns of the output block.
    pub fn cols(&self) -> usize {
        (self.sc * self.tn * 16) as usize
    }

    /// Parses `SRxSCxTMxTN` (tuning runs set tilings by name).
    pub fn parse(s: &str) -> Option<CoopTiles> {
        let v: Vec<u32> = s
            .split('x')
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?;
        let &[sr, sc, tm, tn] = v.as_slice() else {
            return None;
        };
        let t = CoopTiles { sr, sc, tm, tn };
        // Whole loads of eight halves per thread: blocks of at least 64 x 64.
        (sr * sc == 8
            && (1..=8).contains(&tm)
            && (1..=8).contains(&tn)
            && t.rows() >= 64
            && t.cols() >= 64)
            .then_some(t)
    }
}

/// The depth of one staged step along k (the shader's `BK`).
pub const STEP_K: usize = 32;

/// Steps of [`STEP_K`] after which the split mode moves its main accumulators into outer
/// ones (plain f32 additions): the matrix units' f32 accumulation loses more than round to
/// nearest (measurably, over k = 8192), so long sums are kept short.
const FLUSH_STEPS: u32 = 8;

/// The fragment loads and multiply-adds of one 16-deep step: `c{i}{j} += a{i} b{j}` (and
/// the split mode's cross products into `d{i}{j}`).
fn multiply(tiles: CoopTiles, split: bool) -> String {
    let CoopTiles { tm, tn, .. } = tiles;
    let a_frag = |name: &str, tile: &str, i: u32| {
        format!(
            "            let at_{name}{i} = (ar + {}u) * AS + kk;\n            let {name}{i} = coopLoadT<coop_mat16x16<f16, A>>(&{tile}[at_{name}{i}], AS);\n",
            16 * i
        )
    };
    let b_frag = |name: &str, tile: &str, j: u32| {
        format!(
            "            let at_{name}{j} = kk * BS + bc + {}u;\n            let {name}{j} = coopLoadT<coop_mat16x16<f16, B>>(&{tile}[at_{name}{j}], BS);\n",
            16 * j
        )
    };
    let mut text: String = (0..tm).map(|i| a_frag("a", "SA", i)).collect();
    text += &(0..tn).map(|j| b_frag("b", "SB", j)).collect::<String>();
    if split {
        text += &(0..tm).map(|i| a_frag("al", "SAL", i)).collect::<String>();
        text += &(0..tn).map(|j| b_frag("bl", "SBL", j)).collect::<String>();
    }
    text += &each(tiles, &|i, j| {
        format!("            c{i}{j} = coopMultiplyAdd(a{i}, b{j}, c{i}{j});\n")
    });
    if split {
        text += &each(tiles, &|i, j| {
            format!(
                "            d{i}{j} = coopMultiplyAdd(a{i}, bl{j}, d{i}{j});\n            d{i}{j} = coopMultiplyAdd(al{i}, b{j}, d{i}{j});\n"
            )
        });
    }
    text
}

/// `f(i, j)` for every fragment of a subgroup's block, concatenated.
fn each(tiles: CoopTiles, f: &dyn Fn(u32, u32) -> String) -> String {
    (0..tiles.tm)
        .flat_map(|i| (0..tiles.tn).map(move |j| (i, j)))
        .map(|(i, j)| f(i, j))
        .collect()
}

/// The accumulation over k (the `k_loop` slot): operand tiles staged through registers and
/// workgroup memory, one tile ahead; `abase`, `bbase` and `li` come from the kernel.
fn k_loop(tiles: CoopTiles, split: bool) -> String {
    // Copies of the tile at `k` into registers, each line indented by `pad`.
    let loads = |k: &str, pad: &str| {
        let mut lines = vec![
            format!(
                "for (var j = 0u; j < AV; j = j + 1u) {{ ra[j] = MA[a_at(abase, li + 256u * j, {k})]; }}"
            ),
            format!(
                "for (var j = 0u; j < BV; j = j + 1u) {{ rb[j] = MB[b_at(bbase, li + 256u * j, {k})]; }}"
            ),
        ];
        if split {
            lines.push(format!("for (var j = 0u; j < AV; j = j + 1u) {{ ral[j] = MA[a_at(abase + s(7u), li + 256u * j, {k})]; }}"));
            lines.push(format!("for (var j = 0u; j < BV; j = j + 1u) {{ rbl[j] = MB[b_at(bbase + s(8u), li + 256u * j, {k})]; }}"));
        }
        lines
            .iter()
            .map(|l| format!("{pad}{l}\n"))
            .collect::<String>()
    };
    let mut puts = "        for (var j = 0u; j < AV; j = j + 1u) { put_a(li + 256u * j, ra[j], false); }\n        for (var j = 0u; j < BV; j = j + 1u) { put_b(li + 256u * j, rb[j], false); }\n".to_string();
    let mut registers =
        "    var ra: array<vec4<u32>, AV>;\n    var rb: array<vec4<u32>, BV>;\n".to_string();
    let mut flush = String::new();
    if split {
        registers += "    var ral: array<vec4<u32>, AV>;\n    var rbl: array<vec4<u32>, BV>;\n";
        puts += "        for (var j = 0u; j < AV; j = j + 1u) { put_a(li + 256u * j, ral[j], true); }\n        for (var j = 0u; j < BV; j = j + 1u) { put_b(li + 256u * j, rbl[j], true); }\n";
        flush = format!(
            "        if (kt % {FLUSH_STEPS}u == {}u) {{\n{}        }}\n",
            FLUSH_STEPS - 1,
            each(tiles, &|i, j| format!(
                "            o{i}{j} = o{i}{j} + c{i}{j};\n            c{i}{j} = coop_mat16x16<f32, C>();\n"
            ))
        );
    }
    format!(
        "{registers}{}    let steps = s(0u) / BK;\n    for (var kt = 0u; kt < steps; kt = kt + 1u) {{\n        workgroupBarrier();\n{puts}        workgroupBarrier();\n        if (kt + 1u < steps) {{\n            let k1 = (kt + 1u) * BK;\n{}        }}\n        for (var kk = 0u; kk < BK; kk = kk + 16u) {{\n{}        }}\n{flush}    }}\n",
        loads("0u", "    "),
        loads("k1", "            "),
        multiply(tiles, split),
    )
}

/// The accumulator declarations of a subgroup's fragments (`c`, and in the split mode the
/// cross products `d` and the flushed sums `o`).
fn accumulators(tiles: CoopTiles, split: bool) -> String {
    let mut text = each(tiles, &|i, j| {
        format!("    var c{i}{j} = coop_mat16x16<f32, C>();\n")
    });
    if split {
        for name in ["d", "o"] {
            text += &each(tiles, &|i, j| {
                format!("    var {name}{i}{j} = coop_mat16x16<f32, C>();\n")
            });
        }
    }
    text
}

/// The slots of gemm_coop.wgsl for `tiles`; `split`: the fast-f32 mode (low parts, a second
/// accumulator per fragment).
pub fn gemm_slots(tiles: CoopTiles, split: bool) -> Vec<(&'static str, String)> {
    let CoopTiles { sr, sc, tm, tn } = tiles;
    let mut slots = vec![(
        "config",
        format!(
            "const SR: u32 = {sr}u;\nconst SC: u32 = {sc}u;\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\n"
        ),
    )];
    if split {
        let low = |tile: &str| {
            format!(
                "    if (lo) {{ for (var e = 0u; e < 8u; e = e + 1u) {{ {tile}[i + e] = v[e]; }} return; }}\n"
            )
        };
        slots.extend([
            (
                "low_tiles",
                "var<workgroup> SAL: array<f16, BM * AS>;\nvar<workgroup> SBL: array<f16, BK * BS>;\n"
                    .to_string(),
            ),
            ("put_a_low", low("SAL")),
            ("put_b_low", low("SBL")),
        ]);
    }
    let store = each(tiles, &|i, j| {
        let value = if split {
            format!("o{i}{j} + c{i}{j} + d{i}{j} * 0.00048828125")
        } else {
            format!("c{i}{j}")
        };
        format!(
            "    let at_c{i}{j} = cbase + {}u * ld + {}u;\n    coopStoreT({value}, &MC[at_c{i}{j}], ld);\n",
            16 * i,
            16 * j,
        )
    });
    slots.extend([
        ("accumulators", accumulators(tiles, split)),
        ("k_loop", k_loop(tiles, split)),
        ("store", store),
    ]);
    slots
}

/// The tiling of nearest_coop.wgsl: each subgroup 16 points by the block's 128 centroids.
pub const NEAREST_TILES: CoopTiles = CoopTiles {
    sr: 8,
    sc: 1,
    tm: 1,
    tn: 8,
};

/// The slots of nearest_coop.wgsl: the accumulation of one block of scores, then its scan,
/// two fragments at a time through the subgroup's scratch.
pub fn nearest_slots() -> Vec<(&'static str, String)> {
    let t = NEAREST_TILES;
    let mut scan = "        if (li < BN) { NS[li] = NORMS[col0 + li]; }\n".to_string();
    scan += &(0..t.tn / 2)
        .map(|pair| {
            format!(
                "        workgroupBarrier();\n        coopStore(c0{}, &SCORE[sbase], 16u);\n        coopStore(c0{}, &SCORE[sbase + SECOND], 16u);\n        workgroupBarrier();\n        scan(sbase, {}u, col0, lane, &best);\n",
                2 * pair,
                2 * pair + 1,
                32 * pair
            )
        })
        .collect::<String>();
    vec![
        ("accumulators", accumulators(t, false)),
        ("k_loop", k_loop(t, false)),
        ("scan", scan),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilings_parse_and_cover_eight_subgroups() {
        assert_eq!(CoopTiles::parse("2x4x4x2"), Some(CoopTiles::SINGLE));
        assert_eq!(CoopTiles::parse("3x3x1x1"), None);
        assert_eq!(CoopTiles::parse("2x4x4"), None);
        assert_eq!(CoopTiles::SINGLE.rows(), 128);
        assert_eq!(CoopTiles::SPLIT.cols(), 128);
    }

    /// The files' own slot texts (what `cargo xtask wgsl` validates them with) are what the
    /// generator makes for the tilings the backend uses.
    #[test]
    fn the_shader_files_hold_the_generated_slots() {
        let file = |name: &str| {
            crate::wgsl::FILES
                .iter()
                .find(|f| f.name == name)
                .expect("a shader file")
                .text
        };
        let squeeze = |t: &str| -> Vec<String> {
            t.lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        };
        for (name, slots) in [
            ("gemm_coop.wgsl", gemm_slots(CoopTiles::SINGLE, false)),
            ("nearest_coop.wgsl", nearest_slots()),
        ] {
            let text = file(name);
            for (slot, generated) in slots {
                let Some(after) = text.split(&format!("// @slot {slot}\n")).nth(1) else {
                    continue; // a slot only the split mode fills (not in the file)
                };
                let body = after.split("// @end").next().expect("a closed slot");
                if body.trim_start().starts_with("// (Filled by the backend") {
                    continue; // left to the generator (the same text as another file's)
                }
                assert_eq!(squeeze(body), squeeze(&generated), "{name}, slot {slot}");
            }
        }
    }

    #[test]
    fn the_split_mode_has_three_products_per_fragment_pair() {
        let one = gemm_slots(CoopTiles::SINGLE, false);
        let three = gemm_slots(CoopTiles::SPLIT, true);
        let count = |slots: &[(&str, String)], what: &str| -> usize {
            slots.iter().map(|(_, t)| t.matches(what).count()).sum()
        };
        assert_eq!(count(&one, "coopMultiplyAdd"), 8);
        assert_eq!(count(&three, "coopMultiplyAdd"), 3 * 4);
        assert_eq!(count(&three, "coopStoreT"), 4);
    }
}
