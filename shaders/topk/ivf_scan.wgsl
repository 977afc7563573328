// ivf_scan: a workgroup per query scores the members of the lists it probes (hal::topk gives
// the distance: the probe's base plus, byte by byte in order, the table entry list + query of
// the member's code) and keeps the k best by topk_select.wgsl. The probed list's table sits
// in workgroup memory (TABLE floats, at least bytes x codewords). A probe naming no list,
// broken offsets or a code byte beyond the codewords claim the fault record (read at the next
// synchronize) and are skipped.
// Blocks (for their offsets): 0 tables, 1 list tables, 2 probes, 3 bases, 4 offsets, 5 codes,
// 6 ids. Scalars: 0 probes a query, 1 lists, 2 members, 3 bytes, 4 codewords, 5 words a code,
// 6 k, 7 whether there are list tables, 8 the fault code of a bad index, 9 of bad offsets,
// 10-12 distances' offset and strides, 13-15 labels'. The queries: block 2's first dimension.

// @include topk_select.wgsl

// @slot table
const TABLE: u32 = 4096u;
// @end

var<workgroup> tk_table: array<f32, TABLE>;

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<u32>;
@group(0) @binding(4) var<storage, read> B4: array<u32>;
@group(0) @binding(5) var<storage, read> B5: array<u32>;
@group(0) @binding(6) var<storage, read> B6: array<u32>;
@group(0) @binding(7) var<storage, read> B7: array<u32>;
@group(0) @binding(8) var<storage, read_write> B8: array<u32>;
@group(0) @binding(9) var<storage, read_write> B9: array<u32>;
@group(0) @binding(10) var<storage, read_write> B10: array<atomic<u32>>;

fn fault(value: u32, bound: u32, code: u32) {
    if (atomicExchange(&B10[0], 1u) == 0u) {
        atomicStore(&B10[1], value);
        atomicStore(&B10[2], bound);
        atomicStore(&B10[3], code);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3); _ = arrayLength(&B4);
    _ = arrayLength(&B5); _ = arrayLength(&B6); _ = arrayLength(&B7); _ = arrayLength(&B8);
    _ = arrayLength(&B9); _ = arrayLength(&B10);
    let q = wg.y * nwg.x + wg.x;
    let queries = pw(pw(17u + 2u) + 2u);
    if (q >= queries) { return; }
    let np = s(0u);
    let lists = s(1u);
    let members = s(2u);
    let bytes = s(3u);
    let cw = s(4u);
    let words = s(5u);
    let k = s(6u);
    let len = bytes * cw;
    let offsets0 = B5[block_offset(4u)];
    if (q == 0u && li == 0u && offsets0 != 0u) { fault(offsets0, members, s(9u)); }
    tk_init(li);
    for (var p = 0u; p < np; p = p + 1u) {
        let a = B3[block_offset(2u) + i32(q * np + p)];
        if (a >= lists) {
            if (li == 0u) { fault(a, lists, s(8u)); }
            continue;
        }
        let start = B5[block_offset(4u) + i32(a)];
        let end = B5[block_offset(4u) + i32(a) + 1];
        if (start > end || end > members) {
            if (li == 0u) { fault(select(end, start, start > end), members, s(9u)); }
            continue;
        }
        let qt = block_offset(0u) + i32(q * len);
        let lt = block_offset(1u) + i32(a * len);
        for (var i = li; i < len; i = i + TK_BLOCK) {
            var t = bitcast<f32>(B1[qt + i32(i)]);
            if (s(7u) == 1u) { t = bitcast<f32>(B2[lt + i32(i)]) + t; }
            tk_table[i] = t;
        }
        workgroupBarrier();
        let base = bitcast<f32>(B4[block_offset(3u) + i32(q * np + p)]);
        for (var b0 = start; b0 < end; b0 = b0 + TK_BLOCK) {
            let i = b0 + li;
            if (i < end) {
                var d = base;
                var ok = true;
                let code = block_offset(5u) + i32(i * words);
                for (var j = 0u; j < bytes; j = j + 1u) {
                    var c = (B6[code + i32(j / 4u)] >> (8u * (j % 4u))) & 0xffu;
                    if (c >= cw) {
                        ok = false;
                        fault(c, cw, s(8u));
                        c = 0u;
                    }
                    d = d + tk_table[j * cw + c];
                }
                if (ok) { tk_offer(tk_key(d), B7[block_offset(6u) + i32(i)]); }
            }
            tk_round_end(li, k);
        }
        // The next probe's table replaces this one only once every invocation is done.
        workgroupBarrier();
    }
    tk_compact(li, k);
    let found = tk_found(li);
    for (var c = li; c < k; c = c + TK_BLOCK) {
        var v = 0x7f800000u;
        var id = 0xffffffffu;
        if (c < found) {
            v = bitcast<u32>(tk_value(tk_keys[c]));
            id = tk_ids[c];
        }
        B8[si(10u) + i32(q) * si(11u) + i32(c) * si(12u)] = v;
        B9[si(13u) + i32(q) * si(14u) + i32(c) * si(15u)] = id;
    }
}
