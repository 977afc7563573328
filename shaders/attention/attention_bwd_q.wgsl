// Attention backward, pass 3 of 3: dq. A workgroup owns 64 query rows of one batch-head, one
// per thread (q, dout and the gradient in registers); tiles of BK key and value rows stream
// through workgroup memory. Weights are recomputed as in attention_bwd_kv.wgsl.
// Blocks: 0 q, 1 k, 2 v, 3 mask, 4 lse, 5 dout, 6 dq; binding 7: delta (contiguous).
// Scalars: attention_params.wgsl.

// @slot dmax
const DMAX: u32 = 64u;
// @end
const BK: u32 = 2048u / DMAX;

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read> B6: array<u32>;
@group(0) @binding(7) var<storage, read> B7: array<u32>;
@group(0) @binding(8) var<storage, read_write> B8: array<u32>;

// @include attention_params.wgsl
// @include attention_common.wgsl
// @include attention_kv_tile.wgsl

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let a = attention_params();
    let bh = wg.x;
    let b = bh / a.heads;
    let h = bh % a.heads;
    let i0 = (nwg.y - 1u - wg.y) * 64u;
    let i = i0 + lid;
    let live = i < a.tq;
    var qr: array<f32, DMAX>;
    var gr: array<f32, DMAX>;
    var gq: array<f32, DMAX>;
    for (var c = 0u; c < DMAX; c = c + 1u) {
        var qx = 0.0;
        var gx = 0.0;
        if (live && c < a.d) { qx = bitcast<f32>(B1[at4(0u, b, h, i, c)]); }
        if (live && c < a.dv) { gx = bitcast<f32>(B6[at4(5u, b, h, i, c)]); }
        qr[c] = qx;
        gr[c] = gx;
        gq[c] = 0.0;
    }
    var li = neg_inf();
    var delta = 0.0;
    if (live) {
        li = bitcast<f32>(B5[at3(4u, b, h, i)]);
        delta = bitcast<f32>(B7[bh * a.tq + i]);
    }
    var kend = a.tk;
    if (a.causal == 1u) { kend = min(kend, i0 + 64u); }
    for (var j0 = 0u; j0 < kend; j0 = j0 + BK) {
        workgroupBarrier();
        load_kv_tile(a, b, h, j0, lid);
        workgroupBarrier();
        if (live && !is_neg_inf(li)) {
            let rn = min(BK, kend - j0);
            for (var r = 0u; r < rn; r = r + 1u) {
                let j = j0 + r;
                if (a.causal == 1u && j > i) { break; }
                var dot = 0.0;
                for (var c = 0u; c < DMAX; c = c + 1u) { dot = fma(qr[c], ks[r * DMAX + c], dot); }
                let p = recompute(attention_score(a, b, h, i, j, dot), li);
                if (p == 0.0) { continue; }
                let z = drop_factor(a, bh, i, j);
                var dp = 0.0;
                for (var c = 0u; c < DMAX; c = c + 1u) { dp = fma(gr[c], vs[r * DMAX + c], dp); }
                let dsc = a.scale * (p * (z * dp - delta));
                for (var c = 0u; c < DMAX; c = c + 1u) { gq[c] = fma(dsc, ks[r * DMAX + c], gq[c]); }
            }
        }
    }
    if (!live) { return; }
    for (var c = 0u; c < a.d; c = c + 1u) { B8[at4(6u, b, h, i, c)] = bitcast<u32>(gq[c]); }
}
