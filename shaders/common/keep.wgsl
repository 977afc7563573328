// An optimisation barrier for error-free arithmetic (fma_exact.wgsl, Kahan-compensated sums).
// Scalar 12 must be 0 in every kernel that includes this file.
// Mesa's NIR rewrites `c - (c - a)` to `a`, and `((s + y) - s) - y` to 0, unless an instruction
// is marked exact, which WGSL cannot say. An XOR with a run-time zero is opaque to every such
// rule, so each step wrapped in `keep` is computed as written.
fn keep(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ s(12u));
}

// Adds `part` to `acc.x` with Kahan compensation (`acc.y` carries what the last add lost);
// returns the new pair.
fn kahan_add(acc: vec2<f32>, part: f32) -> vec2<f32> {
    let y = keep(part - acc.y);
    let t = keep(acc.x + y);
    return vec2<f32>(t, keep(keep(t - acc.x) - y));
}
