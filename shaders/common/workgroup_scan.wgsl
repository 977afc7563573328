// An inclusive prefix sum over a workgroup of 256 invocations (Hillis-Steele in workgroup
// memory), for kernels that list or place items in order: segment_scan.wgsl (where each
// thread's matching rows go in the segment's list) and segment_starts.wgsl (the segments'
// start positions). Every invocation must call `inclusive_scan` together, from uniform control
// flow (it holds barriers); `scan_total` then gives all of them the workgroup's total.

const SCAN_WIDTH: u32 = 256u;
var<workgroup> scan_lanes: array<u32, 256>;

// The sum of `v` over invocations 0..=li.
fn inclusive_scan(li: u32, v: u32) -> u32 {
    scan_lanes[li] = v;
    workgroupBarrier();
    // After the step of width w, lane i holds the sum of the 2w lanes ending at i.
    for (var w = 1u; w < SCAN_WIDTH; w = w * 2u) {
        var add = 0u;
        if (li >= w) {
            add = scan_lanes[li - w];
        }
        workgroupBarrier();
        scan_lanes[li] = scan_lanes[li] + add;
        workgroupBarrier();
    }
    return scan_lanes[li];
}

// The total of the last `inclusive_scan` (a barrier: call it from uniform control flow too).
fn scan_total() -> u32 {
    return workgroupUniformLoad(&scan_lanes[SCAN_WIDTH - 1u]);
}
