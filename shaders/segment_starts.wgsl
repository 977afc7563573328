// Sorted segment sums, pass 3 of 5: one workgroup writes the segments' start positions, the
// exclusive scan of their totals, 256 segments at a time (a scan in workgroup memory, then
// the running total carried to the next 256).
// Scalars: 1 m.

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;

const STARTS_WIDTH: u32 = 256u;
var<workgroup> starts_scan: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let m = s(1u);
    var carry = 0u;
    for (var base = 0u; base < m; base = base + STARTS_WIDTH) {
        let j = base + li;
        var v = 0u;
        if (j < m) {
            v = B1[j];
        }
        starts_scan[li] = v;
        workgroupBarrier();
        // Hillis-Steele: after the step of width w, entry i holds the sum of the 2w entries
        // ending at i.
        for (var w = 1u; w < STARTS_WIDTH; w = w * 2u) {
            var add = 0u;
            if (li >= w) {
                add = starts_scan[li - w];
            }
            workgroupBarrier();
            starts_scan[li] = starts_scan[li] + add;
            workgroupBarrier();
        }
        if (j < m) {
            B2[j] = carry + starts_scan[li] - v;
        }
        carry = carry + workgroupUniformLoad(&starts_scan[STARTS_WIDTH - 1u]);
    }
}
