//! Index files as an adversary writes them (a valid checksum over lying counts), searches
//! with absurd arguments, and writes interrupted by `kill -9`: each a clear error or a
//! correct answer, never a hang, an abort or a lost file.

use half::f16;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vlc_anneal::index::{Header, IndexParts, assignment_bits};
use vlc_anneal::pq::ProductQuantizer;
use vlc_anneal::{Config, Index, Matrix, compress};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vlc-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `bytes` with the CRC-32 before the end magic recomputed: what an adversary does.
fn reseal(bytes: &mut [u8]) {
    let end = bytes.len();
    let crc = crc32fast::hash(&bytes[..end - 8]);
    bytes[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
}

/// `n x d` synthetic vectors (seed `seed`) and their index of `m` anchors and `bytes`
/// residual bytes, compressed on the CPU in a few iterations.
fn built(n: usize, d: usize, m: usize, bytes: usize, seed: u64) -> (Matrix, Index) {
    let data = vlc_anneal::synthetic::gaussian_mixture(n, d, 6, 0.1, seed);
    let mut cfg = Config::new(m);
    cfg.pq_bytes = bytes;
    cfg.iterations = 3;
    let out = compress(&backend_cpu::CpuBackend::new(), &data, &cfg, &mut |_| {}).unwrap();
    (data, out.index)
}

/// The file: 50 x 4 vectors, one anchor, no residual bytes (nothing per vector).
fn one_anchor_index() -> Vec<u8> {
    let (_, index) = built(50, 4, 1, 0, 5);
    let dir = scratch("one-anchor");
    let path = dir.join("i.vlc");
    index.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    bytes
}

#[test]
fn a_lying_vector_count_is_refused_at_once() {
    let good = one_anchor_index();
    let index = Index::from_bytes(good.clone(), "good").unwrap();
    assert_eq!(index.header.n, 50);
    for n in [1u64 << 62, 1 << 31, (1 << 32) + 3, u64::MAX, 1 << 20] {
        let mut bytes = good.clone();
        bytes[16..24].copy_from_slice(&n.to_le_bytes());
        reseal(&mut bytes);
        let started = Instant::now();
        let result = Index::from_bytes(bytes, "crafted");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "n = {n}: {:?}",
            started.elapsed()
        );
        let err = result.expect_err("a count the file cannot hold");
        assert!(
            err.to_string().contains("vectors claimed"),
            "n = {n}: {err}"
        );
    }
}

#[test]
fn decompressing_more_than_memory_is_an_error_not_an_abort() {
    // A legal one-anchor index claiming as many vectors as its size allows, with a huge
    // dimension: its decompression would need far more memory than any machine has.
    let d = 1 << 20;
    let n = 8 * (2 * d + 200);
    let parts = IndexParts {
        header: Header {
            n,
            d,
            m: 1,
            pq_bytes: 0,
            codewords: 0,
            assignment_bits: assignment_bits(1),
            exact: false,
            seed: 0,
            iterations: 0,
            energy: 0.0,
            mse: 0.0,
            metric: vlc_anneal::Metric::L2,
        },
        anchors: vec![f16::ZERO; d],
        assignments: vec![0; n],
        pq: ProductQuantizer {
            dim: d,
            codewords: 0,
            bounds: vec![0],
            codebooks: Vec::new(),
        },
        codes: Vec::new(),
        ids: None,
        refine: None,
    };
    let index = Index::from_bytes(parts.to_bytes(), "wide").unwrap();
    let err = index.decompress().unwrap_err();
    assert!(err.to_string().contains("decompressing"), "{err}");
}

fn small() -> (Matrix, Index) {
    built(300, 8, 6, 4, 9)
}

#[test]
fn absurd_k_is_clamped_to_the_vectors_held() {
    let (data, index) = small();
    let q = Matrix::new(2, 8, data.data[..16].to_vec()).unwrap();
    for k in [1_000_000_000_000usize, 1 << 62, usize::MAX] {
        let hits = index.search(&q, k, 6).unwrap();
        assert!(hits.iter().all(|h| h.len() == 300), "k = {k}");
    }
    let err = index.search(&q, 10, 0).unwrap_err();
    assert!(err.to_string().contains("nprobe"), "{err}");
}

#[test]
fn queries_whose_distances_overflow_are_refused() {
    let (_, index) = small();
    for bad in [1e19f32, -3e19, f32::NAN, f32::INFINITY] {
        let mut q = vec![0.5f32; 8];
        q[3] = bad;
        // Built directly: Matrix::new refuses non-finite values itself.
        let q = Matrix {
            rows: 1,
            cols: 8,
            data: q,
        };
        let err = index.search(&q, 5, 2).unwrap_err();
        assert!(err.to_string().contains("query 0"), "{bad}: {err}");
    }
    // Large but safe queries rank exactly: the nearest is the one with the smallest true
    // (f64) distance among those scored.
    let q = Matrix::new(1, 8, vec![1e17; 8]).unwrap();
    let hits = index.search(&q, 3, 6).unwrap();
    assert!(hits[0].iter().all(|&(_, d)| d.is_finite()), "{hits:?}");
}

#[test]
fn an_index_saved_over_the_file_it_was_mapped_from_is_whole() {
    let (_, index) = small();
    let dir = scratch("self-save");
    let path = dir.join("i.vlc");
    index.save(&path).unwrap();
    let original = std::fs::read(&path).unwrap();
    let mapped = Index::open(&path).unwrap();
    mapped.save(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), original);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mapped_reader_keeps_working_while_the_file_is_replaced() {
    let (data, index) = small();
    let dir = scratch("replace");
    let path = dir.join("i.vlc");
    index.save(&path).unwrap();
    let reader = Index::open(&path).unwrap();
    let before = reader.decompress().unwrap();
    // Another index (other data) written over the same name, many times.
    let (_, replacement) = built(900, 8, 5, 0, 10);
    for _ in 0..5 {
        replacement.save(&path).unwrap();
        assert_eq!(reader.decompress().unwrap(), before);
        let q = Matrix::new(1, 8, data.data[..8].to_vec()).unwrap();
        assert_eq!(reader.search(&q, 3, 6).unwrap()[0].len(), 3);
    }
    assert_eq!(Index::open(&path).unwrap().header.n, 900);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A large index (about 20 MB) whose every byte depends on `version`.
fn large_index(version: u8) -> Vec<u8> {
    let (n, d, m, b) = (1_000_000usize, 16usize, 256usize, 16usize);
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ version as u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let parts = IndexParts {
        header: Header {
            n,
            d,
            m,
            pq_bytes: b,
            codewords: 256,
            assignment_bits: assignment_bits(m),
            exact: false,
            seed: version as u64,
            iterations: 1,
            energy: 1.0,
            mse: 1.0,
            metric: vlc_anneal::Metric::L2,
        },
        anchors: (0..m * d)
            .map(|_| f16::from_f32((next() % 100) as f32))
            .collect(),
        assignments: (0..n).map(|_| (next() % m as u64) as u32).collect(),
        pq: ProductQuantizer {
            dim: d,
            codewords: 256,
            bounds: (0..=b).collect(),
            codebooks: (0..256 * d).map(|_| (next() % 7) as f32).collect(),
        },
        codes: (0..n * b).map(|_| next() as u8).collect(),
        ids: None,
        refine: None,
    };
    parts.to_bytes()
}

/// Run by the test below in a child process: saves two versions of a large index in turn
/// to the path in `VLC_KILL_TARGET`, for ever.
#[test]
#[ignore = "a helper: a_write_killed_at_any_point_leaves_a_whole_file runs it in a child"]
fn kill_target_writer() {
    let versions = [
        Index::from_bytes(large_index(1), "v1").unwrap(),
        Index::from_bytes(large_index(2), "v2").unwrap(),
    ];
    hal_parity::kill::write_until_killed("VLC_KILL_TARGET", &versions, |index, path| {
        index.save(path).unwrap()
    });
}

#[test]
fn a_write_killed_at_any_point_leaves_a_whole_file() {
    let dir = scratch("kill");
    let target = dir.join("i.vlc");
    let versions = [large_index(1), large_index(2)];
    std::fs::write(&target, &versions[0]).unwrap();
    // Somewhere inside the first few writes (each takes tens of milliseconds).
    hal_parity::kill::kill_rounds(
        "kill_target_writer",
        "VLC_KILL_TARGET",
        &target,
        12,
        400,
        |round| {
            let now = std::fs::read(&target).unwrap();
            assert!(
                now == versions[0] || now == versions[1],
                "round {round}: the file is neither version ({} bytes)",
                now.len()
            );
            Index::open(&target).unwrap();
        },
    );
    // Temporaries of killed writers may remain (named .i.vlc.tmp-*); the target never is one.
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A .npy header whose shape's byte count overflows is an error naming the shape.
#[test]
fn an_npy_shape_that_overflows_is_refused() {
    for shape in [
        "(4611686018427387904, 4)",
        "(18446744073709551615, 2)",
        "(0, 0)",
    ] {
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        let err = vlc_anneal::vectors::parse_npy(&bytes, "t").unwrap_err();
        assert!(
            err.to_string().contains("bytes") || err.to_string().contains("overflow"),
            "{err}"
        );
    }
}
