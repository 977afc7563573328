// Sorted segment sums, pass 4 of 5: one workgroup per chunk of rows writes each row's index
// to its place in `order`: segment start + the chunk's offset within the segment + the rows
// of this segment the chunk placed before it. A stable counting sort, so each segment's rows
// stay in ascending order and the sums are the same on every run. The chunk goes 256 rows at
// a time: each row's rank among the rows of its segment in those 256 comes from comparing
// ids in workgroup memory, and the last of them moves the chunk's cursor for the segment.
// Blocks: 0 segment ids. Scalars: 0 n, 1 m, 2 chunk length.

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;

// @slot guard
fn skipped() -> bool { return false; }
// @end

const PLACE_TILE: u32 = 256u;
var<workgroup> place_ids: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = s(0u);
    let m = s(1u);
    let begin = wg.x * s(2u);
    let end = min(n, begin + s(2u));
    // After a failed index check nothing is read or written (the loop still runs, its
    // barriers being the whole workgroup's).
    let ok = !skipped();
    for (var tile = begin; tile < end; tile = tile + PLACE_TILE) {
        let i = tile + li;
        let live = ok && i < end;
        var seg = 0xffffffffu;
        if (live) {
            seg = B1[off(0u, i)];
        }
        place_ids[li] = seg;
        workgroupBarrier();
        var before = 0u;
        var after = 0u;
        let rows = min(PLACE_TILE, end - tile);
        for (var j = 0u; j < rows; j = j + 1u) {
            if (place_ids[j] == seg) {
                if (j < li) {
                    before = before + 1u;
                } else if (j > li) {
                    after = after + 1u;
                }
            }
        }
        var cursor = 0u;
        let at = wg.x * m + seg;
        if (live) {
            cursor = B3[at];
            B4[B2[seg] + cursor + before] = i;
        }
        // Every row has read its segment's cursor before the last one moves it.
        storageBarrier();
        if (live && after == 0u) {
            B3[at] = cursor + before + 1u;
        }
        storageBarrier();
        workgroupBarrier();
    }
}
