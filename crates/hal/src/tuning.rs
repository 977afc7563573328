//! Routing thresholds the GPU backends share: where `nearest_centroid` and `segment_sum`
//! switch kernels. Both backends switch at the same sizes, so a parity case near a threshold
//! exercises the same path on each, and a retuning changes both at once.

/// Below this many centroids `nearest_centroid` takes one light pass (a warp or a thread per
/// point, the centroids read in order) instead of a tiled GEMM-style kernel: with so few
/// centroids a tile computes mostly padding.
pub const FEW_CENTROIDS: usize = 16;

/// The sorted `segment_sum` sums each segment whole, in one part, while segments average at
/// most this many rows (no parts, so no second pass over parts).
pub const WHOLE_SEGMENT_ROWS: usize = 64;

/// `segment_sum` lets each segment's workgroup or block scan every id while segments times
/// rows stay within this: at 2^24 ids read from L2 that is a few microseconds, against the
/// several launches of the counting sort.
pub const SCAN_SEGMENTS_TIMES_ROWS: u64 = 1 << 24;
