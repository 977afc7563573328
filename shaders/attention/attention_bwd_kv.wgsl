// Attention backward, pass 2 of 3: dk and dv. A workgroup owns 64 key rows of one
// batch-head, one per thread (k, v and both gradients in registers); tiles of BQ query rows
// (q, dout, lse, delta) stream through workgroup memory, read by every thread at once. Each
// weight is recomputed from its row's log-sum-exp; each gradient is one thread's sum in row
// order, so the pass is deterministic.
// Blocks: 0 q, 1 k, 2 v, 3 mask, 4 lse, 5 dout, 6 dk, 7 dv; binding 7: delta (contiguous).
// Scalars: attention_params.wgsl.

// @slot dmax
const DMAX: u32 = 64u;
// @end
const BQ: u32 = 1024u / DMAX;

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read> B6: array<u32>;
@group(0) @binding(7) var<storage, read> B7: array<u32>;
@group(0) @binding(8) var<storage, read_write> B8: array<u32>;
@group(0) @binding(9) var<storage, read_write> B9: array<u32>;

// @include attention_params.wgsl
// @include attention_common.wgsl

var<workgroup> qs: array<f32, 1024>;
var<workgroup> gs: array<f32, 1024>;
var<workgroup> ls: array<f32, 64>;
var<workgroup> ds: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let a = attention_params();
    let bh = wg.x;
    let b = bh / a.heads;
    let h = bh % a.heads;
    let j0 = (nwg.y - 1u - wg.y) * 64u;
    let j = j0 + lid;
    let live = j < a.tk;
    var kr: array<f32, DMAX>;
    var vr: array<f32, DMAX>;
    var gk: array<f32, DMAX>;
    var gv: array<f32, DMAX>;
    for (var c = 0u; c < DMAX; c = c + 1u) {
        var kx = 0.0;
        var vx = 0.0;
        if (live && c < a.d) { kx = bitcast<f32>(B2[at4(1u, b, h, j, c)]); }
        if (live && c < a.dv) { vx = bitcast<f32>(B3[at4(2u, b, h, j, c)]); }
        kr[c] = kx;
        vr[c] = vx;
        gk[c] = 0.0;
        gv[c] = 0.0;
    }
    var istart = 0u;
    if (a.causal == 1u) { istart = (j0 / BQ) * BQ; }
    for (var i0 = istart; i0 < a.tq; i0 = i0 + BQ) {
        workgroupBarrier();
        for (var e = lid; e < BQ * DMAX; e = e + 64u) {
            let r = e / DMAX;
            let c = e % DMAX;
            let i = i0 + r;
            var qx = 0.0;
            var gx = 0.0;
            if (i < a.tq && c < a.d) { qx = bitcast<f32>(B1[at4(0u, b, h, i, c)]); }
            if (i < a.tq && c < a.dv) { gx = bitcast<f32>(B6[at4(5u, b, h, i, c)]); }
            qs[e] = qx;
            gs[e] = gx;
        }
        if (lid < BQ) {
            let i = i0 + lid;
            var lx = neg_inf();
            var dx = 0.0;
            if (i < a.tq) {
                lx = bitcast<f32>(B5[at3(4u, b, h, i)]);
                dx = bitcast<f32>(B7[bh * a.tq + i]);
            }
            ls[lid] = lx;
            ds[lid] = dx;
        }
        workgroupBarrier();
        if (live) {
            let rn = min(BQ, a.tq - i0);
            for (var r = 0u; r < rn; r = r + 1u) {
                let i = i0 + r;
                if (a.causal == 1u && j > i) { continue; }
                var dot = 0.0;
                for (var c = 0u; c < DMAX; c = c + 1u) { dot = fma(qs[r * DMAX + c], kr[c], dot); }
                let p = recompute(attention_score(a, b, h, i, j, dot), ls[r]);
                if (p == 0.0) { continue; }
                let z = drop_factor(a, bh, i, j);
                var dp = 0.0;
                for (var c = 0u; c < DMAX; c = c + 1u) { dp = fma(gs[r * DMAX + c], vr[c], dp); }
                let dsc = a.scale * (p * (z * dp - ds[r]));
                let pz = p * z;
                for (var c = 0u; c < DMAX; c = c + 1u) {
                    gv[c] = fma(pz, gs[r * DMAX + c], gv[c]);
                    gk[c] = fma(dsc, qs[r * DMAX + c], gk[c]);
                }
            }
        }
    }
    if (!live) { return; }
    for (var c = 0u; c < a.d; c = c + 1u) { B8[at4(6u, b, h, j, c)] = bitcast<u32>(gk[c]); }
    for (var c = 0u; c < a.dv; c = c + 1u) { B9[at4(7u, b, h, j, c)] = bitcast<u32>(gv[c]); }
}
