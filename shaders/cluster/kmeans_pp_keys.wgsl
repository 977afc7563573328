// k-means++ (hal::Backend::kmeans_pp), one step's race, step j read from the device: each
// point's squared distance to the last winner (a group of `lanes` invocations per point, each
// summing every lanes-th coordinate in order with fused multiply-adds, the group's sums then
// added in order by its first invocation), folded into D^2 (step 1 starts it), and its key
// -ln(u) / D^2 with u the uniform of hal::random's stream at offset j n + p (step 0: u
// itself); each workgroup writes its best key and point (ties to the lower point). The step
// and the winners come from kmeans_pp_pick.wgsl, so a whole seeding is these two dispatches
// m times over, encoded once.
// Scalars: 0 n, 1 d, 2 lanes per point (a power of two up to 32), 3-4 the seed (low, high);
// the backend keeps m n below 2^32.

// Bindings: 1 x (n x d, f32), 2 D^2 (n, f32), 3 the winners so far (u32), 4 the step (one u32
// word), 5 and 6 each workgroup's best key (f32) and point (u32).
// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
@group(0) @binding(4) var<storage, read> B4: array<u32>;
fn bits4(i: i32) -> u32 { return B4[i]; }
@group(0) @binding(5) var<storage, read_write> B5: array<u32>;
fn st5(i: i32, v: f32) { B5[i] = bitcast<u32>(v); }
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;
fn stbits6(i: i32, v: u32) { B6[i] = v; }
// @end

const KPP_INF: u32 = 0x7f800000u;
var<workgroup> kpp_sums: array<f32, 256>;
var<workgroup> kpp_keys: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = s(0u);
    let d = s(1u);
    let lanes = s(2u);
    let per = 256u / lanes;
    let q = li / lanes;
    let sub = li % lanes;
    let first = wg.x * per;
    let p = first + q;
    let j = bits4(0);
    var acc = 0.0;
    if (p < n && j > 0u) {
        let w = bits3(i32(j) - 1);
        for (var k = sub; k < d; k = k + lanes) {
            let t = ld1(i32(p * d + k)) - ld1(i32(w * d + k));
            acc = fma(t, t, acc);
        }
    }
    kpp_sums[li] = acc;
    workgroupBarrier();
    if (sub == 0u) {
        var key = bitcast<f32>(KPP_INF);
        if (p < n) {
            var total = 0.0;
            for (var t = 0u; t < lanes; t = t + 1u) {
                total = total + kpp_sums[li + t];
            }
            let word = philox(vec4<u32>(j * n + p, 0u, 0u, 0u), vec2<u32>(s(3u), s(4u))).x;
            let u = f32(word >> 8u) * (1.0 / 16777216.0);
            key = u;
            if (j > 0u) {
                var nd = total;
                if (j > 1u) { nd = min(ld2(i32(p)), total); }
                st2(i32(p), nd);
                key = select(-log(max(u, 1.17549435e-38)) / nd, bitcast<f32>(KPP_INF), nd <= 0.0);
            }
        }
        kpp_keys[q] = key;
    }
    workgroupBarrier();
    if (li == 0u) {
        var best = kpp_keys[0];
        var at = first;
        for (var t = 1u; t < per; t = t + 1u) {
            if (first + t < n && kpp_keys[t] < best) {
                best = kpp_keys[t];
                at = first + t;
            }
        }
        st5(i32(wg.x), best);
        stbits6(i32(wg.x), at);
    }
}
