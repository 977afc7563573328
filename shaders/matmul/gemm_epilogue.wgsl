// The last step of a cooperative-matrix product whose output could not be stored directly:
// out = alpha P + beta out (beta 0 ignores out), P the f32 product gemm_coop.wgsl wrote,
// row major with padded rows. One thread per output element; block 0 is out as [batch, M, N].
// Scalars: 0 M, 1 N, 2 P's row stride, 3 P's batch stride, 4 alpha, 5 beta; skipped when
// the operands' range check failed (the f32 fallback writes out instead).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let z = t / (s(0u) * s(1u));
    let r = (t / s(1u)) % s(0u);
    let c = t % s(1u);
    let o = off(0u, t);
    var v = sf(4u) * ld1(i32(z * s(3u) + r * s(2u) + c));
    if (sf(5u) != 0.0) { v = v + sf(5u) * ld2(o); }
    st2(o, v);
}
