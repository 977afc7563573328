// gemm_dot.wgsl with the 32 partials of each output combined by subgroup shuffles instead of
// a tree in workgroup memory (for adapters with subgroup operations). Threads are numbered by
// subgroup (`subgroup_id * subgroup_size + subgroup_invocation_id`), so each output's 32
// threads are lanes of one subgroup when subgroups have at least 32 lanes; smaller subgroups
// reduce their share by shuffles and meet in workgroup memory.

// @include gemm_dot_body.wgsl
// @include gemm_params.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let t = sg * sg_size + sg_lane;
    let o = (wg.y * nwg.x + wg.x) * 8u + t / 32u;
    let lane = t % 32u;
    var v = dot_partial(o, lane);
    for (var w = 16u; w > 0u; w = w >> 1u) {
        if (w < sg_size) { v = v + subgroupShuffleXor(v, w); }
    }
    // Subgroups of 32 or more lanes hold each output's total in its lane 0; smaller ones
    // hold 32 / sg_size partials, one per subgroup, added here in order.
    RED[t] = v;
    workgroupBarrier();
    if (lane == 0u) {
        var sum = v;
        if (sg_size < 32u) {
            sum = 0.0;
            for (var j = 0u; j < 32u; j = j + sg_size) { sum = sum + RED[t + j]; }
        }
        write_out(o, sum);
    }
}
