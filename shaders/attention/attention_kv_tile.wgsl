// Tiles of key and value rows in workgroup memory (attention_fwd.wgsl, attention_bwd_q.wgsl):
// rows j0 .. j0 + 2048 / DMAX of k (binding 2, block 1) and v (binding 3, block 2), zero past
// tk and past each row's width, loaded by a workgroup of 64. Needs attention_params.wgsl and
// DMAX.

var<workgroup> ks: array<f32, 2048>;
var<workgroup> vs: array<f32, 2048>;

fn load_kv_tile(a: AttentionLaunch, b: u32, h: u32, j0: u32, lid: u32) {
    for (var e = lid; e < 2048u; e = e + 64u) {
        let r = e / DMAX;
        let c = e % DMAX;
        let j = j0 + r;
        var kx = 0.0;
        var vx = 0.0;
        if (j < a.tk && c < a.d) { kx = bitcast<f32>(B2[at4(1u, b, h, j, c)]); }
        if (j < a.tk && c < a.dv) { vx = bitcast<f32>(B3[at4(2u, b, h, j, c)]); }
        ks[e] = kx;
        vs[e] = vx;
    }
}
