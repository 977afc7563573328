// Segment sums for few segments times few rows (either precision), and on a software
// rasteriser every reproducible one: one workgroup per segment finds its rows by scanning
// every segment id (four per thread per step; a workgroup-wide
// prefix sum keeps them in ascending order in a shared list), then adds them in row order.
// Under Precision::Reproducible (scalar 13 = 0) it adds exactly as segment_sum_ordered.wgsl
// does: the same terms in the same order from 0, a correctly rounded fused multiply-add per
// term, the count with plain adds, so the sums are bit-identical to the reproducible ones.
// Otherwise (scalar 13 = 1) runs of BLOCK rows are added from 0 and each run's partial is
// folded into the column's total with Kahan compensation: one long chain of same-sign terms
// (a broadcast row, hundreds of times) drifts past the Sum tolerance, 2^-17 sum|x|, while a
// run of 32 stays far inside it. The list is flushed into the per-column accumulators whenever
// it could overflow; every loop stays far below lavapipe's 65535 iterations where that
// applies (the backend gives it at most 8,192 rows a dispatch there).
// A dispatch takes the rows [scalar 8, scalar 0); with scalar 9 = 1 it continues from the
// accumulators an earlier dispatch left in B4 (the reproducible chain goes on exactly; in
// compensated runs only the compensation restarts), so a software rasteriser takes long
// inputs in row ranges short enough for its loop cap.
// Blocks: 0 segment ids, 1 weights. Scalars: 0 end row, 1 d (d + 1 <= 1024), 2 m, 3 x's
// offset, 4-5 x's strides, 7 whether there are weights, 8 first row, 9 continue, 11 whether
// fma() is fused, 12 zero (keep.wgsl), 13 whether to add in compensated runs. Output: B4,
// [m, d + 1] accumulators (column d the count).

// @include fma_exact.wgsl
// @include keep.wgsl
// @include segment_term.wgsl
// @include workgroup_scan.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn ld4(i: i32) -> f32 { return bitcast<f32>(B4[i]); }
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end

const THREADS: u32 = 256u;
const LIST: u32 = 2048u;
const BLOCK: u32 = 32u;

var<workgroup> acc: array<f32, 1024>;
var<workgroup> list: array<u32, 2048>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3); _ = arrayLength(&B4);
    let seg = wg.y * nwg.x + wg.x;
    if (seg >= s(2u)) { return; }
    let n = s(0u);
    let d = s(1u);
    for (var k = li; k <= d; k = k + THREADS) {
        acc[k] = 0.0;
        if (s(9u) == 1u) { acc[k] = ld4(i32(seg * (d + 1u) + k)); }
    }
    // Kahan compensation of this thread's columns li, li + 256, ... (d + 1 <= 1024: four).
    var comp = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    let runs = s(13u) == 1u;
    var listed = 0u;
    for (var base = s(8u); base < n; base = base + 4u * THREADS) {
        var mine = array<u32, 4>(0u, 0u, 0u, 0u);
        var c = 0u;
        for (var q = 0u; q < 4u; q = q + 1u) {
            let i = base + 4u * li + q;
            if (i < n && bits2(off(0u, i)) == seg) {
                mine[c] = i;
                c = c + 1u;
            }
        }
        // Inclusive prefix sum of the per-thread counts.
        let incl = inclusive_scan(li, c);
        let total = scan_total();
        let pos = listed + incl - c;
        for (var q = 0u; q < c; q = q + 1u) { list[pos + q] = mine[q]; }
        listed = listed + total;
        workgroupBarrier();
        if (listed > LIST - 4u * THREADS || base + 4u * THREADS >= n) {
            for (var k = li; k <= d; k = k + THREADS) {
                let j = (k - li) / THREADS;
                var a = acc[k];
                // Reproducible: one run over the whole list, continuing the chain.
                var span = listed;
                if (runs) { span = BLOCK; }
                for (var q0 = 0u; q0 < listed; q0 = q0 + span) {
                    var p = a;
                    if (runs) { p = 0.0; }
                    for (var q = q0; q < min(listed, q0 + span); q = q + 1u) {
                        p = add_row_term(p, list[q], k, d);
                    }
                    if (runs) {
                        let folded = kahan_add(vec2<f32>(a, comp[j]), p);
                        a = folded.x;
                        comp[j] = folded.y;
                    } else {
                        a = p;
                    }
                }
                acc[k] = a;
            }
            listed = 0u;
            workgroupBarrier();
        }
    }
    for (var k = li; k <= d; k = k + THREADS) {
        st4(i32(seg * (d + 1u) + k), acc[k]);
    }
}
