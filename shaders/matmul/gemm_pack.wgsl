// Packs one operand of a cooperative-matrix product (gemm_coop.wgsl): a [batch, R, C] view of
// any float dtype and strides (scalars 7-10: offset, batch, row and column strides) to
// row-major f16 [batch, Rp, Cp] (Rp, Cp whole tiles; the padding is zero), two halves per
// output word, one thread per word.
// Scalars: 0 R, 1 C, 2 Rp, 3 Cp (even), 4 mode (0: f16 of each value, rounded to nearest even;
// 1: also the low part f16((x - hi) * 2048) at word offset 5, for the fast-f32 mode),
// 6 the range check (0 none; 1 each value must be exactly an f16, as a bf16 operand must;
// 2 each value must be finite and at most 65504 in magnitude), 14-15 the verdict word and
// serial written when a value fails the check (the product then takes its f32 fallback).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn stbits3(i: i32, v: u32) { B3[i] = v; }
// @end

fn fits(v: f32, h: u32) -> bool {
    if (s(6u) == 1u) { return f16_to_f32(h) == v; }
    if (s(6u) == 2u) { return abs(v) <= 65504.0; }
    return true;
}

fn kernel(t: u32) {
    let words = s(3u) / 2u;
    let per_batch = s(2u) * words;
    let z = t / per_batch;
    let r = (t % per_batch) / words;
    let c = (t % words) * 2u;
    var v = vec2<f32>(0.0);
    if (r < s(0u)) {
        let at = si(7u) + i32(z) * si(8u) + i32(r) * si(9u) + i32(c) * si(10u);
        if (c < s(1u)) { v.x = ld1(at); }
        if (c + 1u < s(1u)) { v.y = ld1(at + si(10u)); }
    }
    let hx = f32_to_f16(v.x);
    let hy = f32_to_f16(v.y);
    stbits2(i32(t), hx | (hy << 16u));
    if (s(4u) == 1u) {
        let lx = f32_to_f16((v.x - f16_to_f32(hx)) * 2048.0);
        let ly = f32_to_f16((v.y - f16_to_f32(hy)) * 2048.0);
        stbits2(i32(s(5u) + t), lx | (ly << 16u));
    }
    if (!(fits(v.x, hx) && fits(v.y, hy))) { stbits3(i32(s(14u)), s(15u)); }
}
