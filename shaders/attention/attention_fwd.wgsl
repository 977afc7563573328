// Scaled dot-product attention, forward (hal::attention): flash attention's plan with one
// thread per query row. A workgroup owns 64 query rows of one batch-head (workgroup x: the
// batch-head; y: the row tile, longest causal rows first); tiles of BC key and value rows
// stream through workgroup memory, read by every thread at once; each row keeps its running
// maximum, sum and output in registers (an online softmax), so nothing tq x tk is stored.
// Blocks: 0 q, 1 k, 2 v, 3 mask, 4 out, 5 lse. Scalars: attention_params.wgsl.

// @slot dmax
const DMAX: u32 = 64u;
// @end
const BC: u32 = 2048u / DMAX;

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;

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
    var acc: array<f32, DMAX>;
    for (var c = 0u; c < DMAX; c = c + 1u) {
        var x = 0.0;
        if (live && c < a.d) { x = bitcast<f32>(B1[at4(0u, b, h, i, c)]); }
        qr[c] = x;
        acc[c] = 0.0;
    }
    var m = neg_inf();
    var l = 0.0;
    var kend = a.tk;
    if (a.causal == 1u) { kend = min(kend, i0 + 64u); }
    for (var j0 = 0u; j0 < kend; j0 = j0 + BC) {
        workgroupBarrier();
        load_kv_tile(a, b, h, j0, lid);
        workgroupBarrier();
        if (live) {
            let jn = min(BC, kend - j0);
            for (var r = 0u; r < jn; r = r + 1u) {
                let j = j0 + r;
                var dot = 0.0;
                for (var c = 0u; c < DMAX; c = c + 1u) { dot = fma(qr[c], ks[r * DMAX + c], dot); }
                let sc = attention_score(a, b, h, i, j, dot);
                if (is_neg_inf(sc)) { continue; }
                if (is_neg_inf(m) || sc > m) {
                    var corr = 0.0;
                    if (!is_neg_inf(m)) { corr = exp(m - sc); }
                    l = l * corr;
                    for (var c = 0u; c < DMAX; c = c + 1u) { acc[c] = acc[c] * corr; }
                    m = sc;
                }
                let p = exp(sc - m);
                l = l + p;
                let w = p * drop_factor(a, bh, i, j);
                for (var c = 0u; c < DMAX; c = c + 1u) { acc[c] = fma(w, vs[r * DMAX + c], acc[c]); }
            }
        }
    }
    if (!live) { return; }
    var inv = 0.0;
    if (l > 0.0) { inv = 1.0 / l; }
    for (var c = 0u; c < a.dv; c = c + 1u) { B5[at4(4u, b, h, i, c)] = bitcast<u32>(acc[c] * inv); }
    var lse = neg_inf();
    if (l > 0.0) { lse = m + log(l); }
    B6[at3(5u, b, h, i)] = bitcast<u32>(lse);
}
