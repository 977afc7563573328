//! Residual coding at scale: codebooks learned on a sample, every vector coded in chunks.

use backend_cpu::CpuBackend;
use hal::BackendExt;
use vlc_anneal::pq::Residuals;
use vlc_anneal::synthetic::gaussian_mixture;
use vlc_anneal::{Config, Matrix, compress};

/// Each vector's residual to its (stored, f16) anchor, row after row.
fn residuals_of(data: &Matrix, index: &vlc_anneal::Index) -> Vec<f32> {
    let mut residuals = data.data.clone();
    for (i, r) in residuals.chunks_mut(data.cols).enumerate() {
        for (v, a) in r.iter_mut().zip(index.anchor(index.assignment(i) as usize)) {
            *v -= a;
        }
    }
    residuals
}

#[test]
fn a_sampled_codebook_codes_every_vector_as_whole_coding_would() {
    let cpu = CpuBackend::new();
    // d = 20 in 6 bytes pads the subspaces (widths 4, 4, 3, 3, 3, 3); in 4 bytes it does not.
    for bytes in [6, 4] {
        let (n, d) = (3001, 20);
        let data = gaussian_mixture(n, d, 12, 0.1, 6);
        let mut cfg = Config::new(12);
        cfg.pq_bytes = bytes;
        cfg.pq_train_rows = 700;
        let index = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap().index;
        let parts = index.parts();
        assert_eq!(parts.pq.codewords, 256);
        // The codes in the index are the nearest codewords to every vector's residual,
        // sampled or not, and the error the index reports is theirs.
        let residuals = residuals_of(&data, &index);
        let (host, host_error) = parts.pq.encode(&cpu, &residuals, n).unwrap();
        assert_eq!(parts.codes, &host[..], "bytes {bytes}");
        let reported = parts.header.mse * n as f64;
        assert!(
            (reported - host_error).abs() <= 1e-5 * host_error,
            "bytes {bytes}: {reported} against {host_error}"
        );
        // Chunks of any size (here 7 rows, the last one short) give the same codes.
        let x = cpu.upload(&data.data).unwrap();
        let values: Vec<f32> = parts.anchors.iter().map(|v| v.to_f32()).collect();
        let anchors = cpu.upload(&values).unwrap();
        let assign = cpu.upload(&parts.assignments).unwrap();
        let src = Residuals {
            x: &x,
            anchors: &anchors,
            assign: &assign,
            n,
            d,
        };
        let (chunked, chunked_error) = parts.pq.code_chunks(&cpu, &src, 7).unwrap();
        assert_eq!(chunked, host);
        assert!((chunked_error - host_error).abs() <= 1e-5 * host_error);
    }
}

#[test]
fn a_sample_trains_codebooks_nearly_as_good_as_every_vector() {
    let cpu = CpuBackend::new();
    // 4 bytes of 4 dimensions: every subspace's 256 codewords see every vector or half.
    let data = gaussian_mixture(131_072, 16, 40, 0.2, 9);
    let error_with = |train_rows: usize| {
        let mut cfg = Config::new(40);
        cfg.pq_bytes = 4;
        cfg.pq_train_rows = train_rows;
        compress(&cpu, &data, &cfg, &mut |_| {})
            .unwrap()
            .index
            .parts()
            .header
            .mse
    };
    // 256 vectors per codeword, as FAISS samples, against 512.
    let (all, sampled) = (error_with(131_072), error_with(65_536));
    assert!(
        sampled <= 1.05 * all,
        "a sample of 65,536 of 131,072 left {sampled}, every vector {all}"
    );
}

#[test]
fn no_training_rows_is_refused() {
    let cpu = CpuBackend::new();
    let data = gaussian_mixture(500, 8, 4, 0.1, 1);
    let mut cfg = Config::new(4);
    cfg.pq_train_rows = 0;
    let e = compress(&cpu, &data, &cfg, &mut |_| {}).err().unwrap();
    assert!(e.to_string().contains("pq_train_rows"), "{e}");
}
