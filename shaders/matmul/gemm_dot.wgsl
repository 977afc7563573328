// Matrix products with few outputs and a long k (matrix-vector products, small outputs of
// long sums), where a 128 x 128 tile would leave most of the GPU idle: each output is one
// dot product, summed by 32 threads (thread `lane` takes k = first + lane, + 32, ...) and
// combined; a workgroup of 256 threads computes 8 outputs. Coalesced when A's and B's k
// strides are 1, which is when the backend picks it for long products; small thin ones it
// also runs here with other strides, whole, epilogue and all (gemm_dot_body.wgsl's
// `dot_epilogue` slot). This file combines the 32 partials with
// a tree in workgroup memory; gemm_dot_subgroups.wgsl does it with subgroup shuffles.
// Same parameters as gemm.wgsl; scalar 6: the number of outputs (batch x m x n).

// @include gemm_dot_body.wgsl
// @include gemm_params.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = (wg.y * nwg.x + wg.x) * 8u + lid / 32u;
    let lane = lid % 32u;
    RED[lid] = dot_partial(o, lane);
    workgroupBarrier();
    for (var w = 16u; w > 0u; w = w >> 1u) {
        if (lane < w) { RED[lid] = RED[lid] + RED[lid + w]; }
        workgroupBarrier();
    }
    if (lane == 0u) { write_out(o, RED[lid]); }
}
