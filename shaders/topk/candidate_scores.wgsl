// candidate_scores (hal::topk): 32 invocations per (query, candidate), eight pairs a workgroup
// (workgroup (x, y): pairs 8 (y * groups_x + x) onward). Each invocation sums every 32nd
// dimension of q . v, the 32 partial sums are added in a fixed tree in workgroup memory, and
// the first adds the biases and writes `bias + alpha * dot`; no candidate (u32::MAX) scores
// +inf, another label at or above n claims the fault record and scores +inf.
// Blocks (for their offsets): 0 queries, 1 vectors, 2 labels, 3 query bias, 4 vector bias,
// 5 scores (and its strides). Scalars: CandidateLaunch.

struct CandidateLaunch {
    rows: u32,
    c: u32,
    d: u32,
    n: u32,
    alpha: f32,
    has_qb: u32,
    has_vb: u32,
    halves: u32,
    fault_code: u32,
}

fn candidate_params() -> CandidateLaunch {
    return CandidateLaunch(s(0u), s(1u), s(2u), s(3u), sf(4u), s(5u), s(6u), s(7u), s(8u));
}

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;
@group(0) @binding(7) var<storage, read_write> B7: array<atomic<u32>>;

var<workgroup> part: array<f32, 256>;

fn fault(value: u32, bound: u32, code: u32) {
    if (atomicExchange(&B7[0], 1u) == 0u) {
        atomicStore(&B7[1], value);
        atomicStore(&B7[2], bound);
        atomicStore(&B7[3], code);
    }
}

// Element `i` of the vectors (f32, or f16 two a word).
fn vector_at(p: CandidateLaunch, i: u32) -> f32 {
    if (p.halves == 0u) { return bitcast<f32>(B2[i]); }
    let w = B2[i / 2u];
    return f16_to_f32(select(w >> 16u, w & 0xffffu, (i & 1u) == 0u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3); _ = arrayLength(&B4);
    _ = arrayLength(&B5); _ = arrayLength(&B6); _ = arrayLength(&B7);
    let p = candidate_params();
    let pair = (wg.y * nwg.x + wg.x) * 8u + li / 32u;
    let lane = li % 32u;
    let live = pair < p.rows * p.c;
    var label = 0xffffffffu;
    var r = 0u;
    var j = 0u;
    if (live) {
        r = pair / p.c;
        j = pair % p.c;
        label = B3[u32(block_offset(2u)) + pair];
    }
    let real = live && label < p.n;
    var acc = 0.0;
    if (real) {
        let qbase = u32(block_offset(0u)) + r * p.d;
        let vbase = u32(block_offset(1u)) + label * p.d;
        for (var k = lane; k < p.d; k = k + 32u) {
            acc = acc + bitcast<f32>(B1[qbase + k]) * vector_at(p, vbase + k);
        }
    }
    part[li] = acc;
    workgroupBarrier();
    for (var w = 16u; w > 0u; w = w / 2u) {
        if (lane < w) { part[li] = part[li] + part[li + w]; }
        workgroupBarrier();
    }
    if (!live || lane != 0u) { return; }
    var score = inf();
    if (real) {
        var bias = 0.0;
        if (p.has_qb != 0u) { bias = bias + bitcast<f32>(B4[u32(block_offset(3u)) + r]); }
        if (p.has_vb != 0u) { bias = bias + bitcast<f32>(B5[u32(block_offset(4u)) + label]); }
        score = bias + p.alpha * part[li];
    } else if (label != 0xffffffffu) {
        fault(label, p.n, p.fault_code);
    }
    let o = block_offset(5u) + i32(r) * block_stride(5u, 0u) + i32(j) * block_stride(5u, 1u);
    B6[u32(o)] = bitcast<u32>(score);
}
