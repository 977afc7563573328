// top_k: a workgroup per row of x: [rows, n] (strided), the k least order keys (scalar 2 =
// 0xffffffff flips them: the largest values) by topk_select.wgsl. Scalars: 0 n, 1 k, 2 flip,
// 3-5 x's offset and strides, 6-8 values', 9-11 indices', 12 rows. B1 x, B2 values, B3 indices.

// @include topk_select.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3);
    let row = wg.y * nwg.x + wg.x;
    if (row >= s(12u)) { return; }
    let n = s(0u);
    let k = s(1u);
    let flip = s(2u);
    tk_init(li);
    for (var base = 0u; base < n; base = base + TK_BLOCK) {
        let c = base + li;
        if (c < n) {
            let v = bitcast<f32>(B1[si(3u) + i32(row) * si(4u) + i32(c) * si(5u)]);
            tk_offer(tk_key(v) ^ flip, c);
        }
        tk_round_end(li, k);
    }
    tk_compact(li, k);
    for (var c = li; c < k; c = c + TK_BLOCK) {
        B2[si(6u) + i32(row) * si(7u) + i32(c) * si(8u)] = bitcast<u32>(tk_value(tk_keys[c] ^ flip));
        B3[si(9u) + i32(row) * si(10u) + i32(c) * si(11u)] = tk_ids[c];
    }
}
