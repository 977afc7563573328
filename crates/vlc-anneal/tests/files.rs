//! Vector files and index files: round trips, and every kind of bad file gets an error, never
//! a panic.

use proptest::prelude::*;
use vlc_anneal::vectors::{npy_bytes, parse_fvecs, parse_npy};
use vlc_anneal::{Config, Error, Index, Matrix, compress};

fn sample_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

fn npy_with(descr: &str, fortran: bool, shape: &str, body: &[u8], version: u8) -> Vec<u8> {
    let header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}\n",
        if fortran { "True" } else { "False" }
    );
    let mut out = b"\x93NUMPY".to_vec();
    out.push(version);
    out.push(0);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

fn format_error(r: vlc_anneal::Result<Matrix>) -> String {
    match r {
        Err(Error::Format { detail, .. }) => detail,
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn npy_round_trips_and_reads_version_2_and_f16() {
    let m = Matrix::new(3, 2, vec![1.0, -2.5, 3.0, 4.0, 0.125, -6.0]).unwrap();
    assert_eq!(parse_npy(&npy_bytes(&m), "t").unwrap(), m);
    let body: Vec<u8> = m.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        parse_npy(&npy_with("<f4", false, "(3, 2)", &body, 2), "t").unwrap(),
        m
    );
    let halfs: Vec<u8> = m
        .data
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    assert_eq!(
        parse_npy(&npy_with("<f2", false, "(3, 2)", &halfs, 1), "t").unwrap(),
        m
    );
}

/// float64, big-endian and Fortran-order arrays (numpy's defaults for some producers: the
/// GloVe package ships Fortran order) are converted, not refused.
#[test]
fn npy_converts_f64_big_endian_and_fortran_order() {
    let m = Matrix::new(3, 2, vec![1.0, -2.5, 3.0, 4.0, 0.125, -6.0]).unwrap();
    let as_f64 = |v: &[f32], big: bool| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| {
                let x = x as f64;
                if big {
                    x.to_be_bytes()
                } else {
                    x.to_le_bytes()
                }
            })
            .collect()
    };
    let columns: Vec<f32> = (0..2)
        .flat_map(|c| (0..3).map(move |r| (r, c)))
        .map(|(r, c)| m.row(r)[c])
        .collect();
    for (descr, fortran, body) in [
        ("<f8", false, as_f64(&m.data, false)),
        (">f8", false, as_f64(&m.data, true)),
        ("<f8", true, as_f64(&columns, false)),
        ("=f8", false, as_f64(&m.data, false)),
        (
            ">f4",
            false,
            m.data.iter().flat_map(|v| v.to_be_bytes()).collect(),
        ),
        (
            "<f4",
            true,
            columns.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            ">f2",
            true,
            columns
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_be_bytes())
                .collect(),
        ),
    ] {
        let got = parse_npy(&npy_with(descr, fortran, "(3, 2)", &body, 1), "t")
            .unwrap_or_else(|e| panic!("{descr} fortran={fortran}: {e}"));
        assert_eq!(got, m, "{descr} fortran={fortran}");
    }
    // f64 values round to the nearest f32.
    let fine = 0.1f64;
    let got = parse_npy(
        &npy_with("<f8", false, "(1, 1)", &fine.to_le_bytes(), 1),
        "t",
    )
    .unwrap();
    assert_eq!(got.data, vec![0.1f32]);
}

#[test]
fn the_committed_samples_load() {
    let glove = Matrix::load(sample_dir().join("glove-sample.npy")).unwrap();
    assert_eq!((glove.rows, glove.cols), (2000, 50));
    let minilm = Matrix::load(sample_dir().join("minilm-sample.npy")).unwrap();
    assert_eq!((minilm.rows, minilm.cols), (500, 384));
    // Normalised sentence embeddings (to f16 precision).
    let norm: f32 = minilm.row(7).iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-2, "{norm}");
}

#[test]
fn bad_npy_files_are_clear_errors() {
    let body = vec![0u8; 24];
    assert!(format_error(parse_npy(b"not numpy", "t")).contains("magic"));
    assert!(
        format_error(parse_npy(&npy_with("<i4", false, "(3, 2)", &body, 1), "t")).contains("<i4")
    );
    assert!(
        format_error(parse_npy(&npy_with("<c8", false, "(3, 1)", &body, 1), "t")).contains("<c8")
    );
    // f64 beyond f32's range names the vector and dimension, in either order.
    let mut wide = 0f64.to_le_bytes().repeat(6);
    wide[32..40].copy_from_slice(&1e300f64.to_le_bytes());
    let e = format_error(parse_npy(&npy_with("<f8", false, "(3, 2)", &wide, 1), "t"));
    assert!(e.contains("vector 2") && e.contains("dimension 0"), "{e}");
    let e = format_error(parse_npy(&npy_with("<f8", true, "(3, 2)", &wide, 1), "t"));
    assert!(e.contains("vector 1") && e.contains("dimension 1"), "{e}");
    assert!(
        format_error(parse_npy(
            &npy_with("<f4", false, "(2, 1, 3)", &body, 1),
            "t"
        ))
        .contains("two-dimensional")
    );
    assert!(
        format_error(parse_npy(&npy_with("<f4", false, "(3, 3)", &body, 1), "t"))
            .contains("truncated")
    );
    assert!(
        format_error(parse_npy(&npy_with("<f4", false, "(3, 2)", &body, 9), "t"))
            .contains("version")
    );
    let mut nan = body.clone();
    nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(
        format_error(parse_npy(&npy_with("<f4", false, "(3, 2)", &nan, 1), "t"))
            .contains("non-finite")
    );
    let inf = f32::INFINITY.to_le_bytes().repeat(6);
    assert!(
        format_error(parse_npy(&npy_with("<f4", false, "(3, 2)", &inf, 1), "t"))
            .contains("non-finite")
    );
    // Every truncation of a valid file is an error.
    let good = npy_bytes(&Matrix::new(4, 3, vec![0.5; 12]).unwrap());
    for cut in 0..good.len() {
        assert!(parse_npy(&good[..cut], "t").is_err(), "cut at {cut}");
    }
}

#[test]
fn fvecs_round_trip_and_errors() {
    let dir = std::env::temp_dir().join(format!("vlc-fvecs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = Matrix::new(2, 3, vec![1.0, 2.0, 3.0, -1.0, -2.0, -3.0]).unwrap();
    let path = dir.join("v.fvecs");
    m.save(&path).unwrap();
    assert_eq!(Matrix::load(&path).unwrap(), m);
    let bytes = std::fs::read(&path).unwrap();
    assert!(parse_fvecs(&bytes[..bytes.len() - 1], "t").is_err());
    let mut other_dim = bytes.clone();
    other_dim[16..20].copy_from_slice(&4i32.to_le_bytes());
    assert!(parse_fvecs(&other_dim, "t").is_err());
    assert!(parse_fvecs(&0i32.to_le_bytes(), "t").is_err());
    assert!(parse_fvecs(&[], "t").is_err());
    assert!(Matrix::load(dir.join("v.txt")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_parameters_are_clear_errors() {
    let cpu = backend_cpu::CpuBackend::new();
    let data = vlc_anneal::synthetic::gaussian_mixture(50, 4, 3, 0.1, 1);
    let run = |cfg: &Config, data: &Matrix| {
        compress(&cpu, data, cfg, &mut |_| {})
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert!(run(&Config::new(51), &data).contains("m must not exceed n"));
    assert!(run(&Config::new(0), &data).contains("at least one anchor"));
    let empty = Matrix::new(5, 0, vec![]).unwrap();
    assert!(run(&Config::new(2), &empty).contains("dimension 0"));
    let mut cfg = Config::new(4);
    cfg.pq_bytes = 5;
    assert!(run(&cfg, &data).contains("one byte per dimension"));
    assert!(
        Matrix::new(1, 2, vec![1.0, f32::NAN])
            .unwrap_err()
            .to_string()
            .contains("non-finite")
    );
}

/// `Matrix::from_slice` copies on several threads (parts of 2^20 values) and reports the
/// first non-finite value as `Matrix::new` does, whichever part holds it.
#[test]
fn from_slice_copies_in_parts_and_finds_the_first_bad_value() {
    let (rows, cols) = (3 << 18, 5); // 3.75 * 2^20 values: four parts where cores allow
    let data: Vec<f32> = (0..rows * cols).map(|i| (i % 977) as f32 - 300.5).collect();
    let m = Matrix::from_slice(rows, cols, &data).unwrap();
    assert_eq!((m.rows, m.cols), (rows, cols));
    assert!(m.data == data);
    for bad in [rows * cols - 1, 3 << 20, (1 << 20) + 7, 2] {
        let mut d = data.clone();
        d[bad] = f32::INFINITY;
        if bad > 5 {
            d[bad + 1 - (bad % 2)] = f32::NAN;
        }
        let first = d.iter().position(|v| !v.is_finite()).unwrap();
        let want = Matrix::new(rows, cols, d.clone()).unwrap_err().to_string();
        let got = Matrix::from_slice(rows, cols, &d).unwrap_err().to_string();
        assert_eq!(got, want);
        assert!(got.contains(&format!("vector {}", first / cols)), "{got}");
    }
    assert!(
        Matrix::from_slice(2, 3, &[0.0; 5])
            .unwrap_err()
            .to_string()
            .contains("cannot form 2 x 3")
    );
}

fn small_index() -> (Matrix, Vec<u8>) {
    let cpu = backend_cpu::CpuBackend::new();
    let data = vlc_anneal::synthetic::gaussian_mixture(600, 12, 10, 0.1, 3);
    let mut cfg = Config::new(19);
    cfg.pq_bytes = 5;
    cfg.iterations = 6;
    let out = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "vlc-index-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("i.vlc");
    out.index.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (data, bytes)
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn an_index_file_round_trips_through_mmap() {
    let (data, bytes) = small_index();
    let dir = std::env::temp_dir().join(format!("vlc-mmap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("i.vlc");
    std::fs::write(&path, &bytes).unwrap();
    let index = Index::open(&path).unwrap();
    let h = &index.header;
    assert_eq!(
        (h.n, h.d, h.m, h.pq_bytes, h.assignment_bits),
        (600, 12, 19, 5, 5)
    );
    assert_eq!(index.file_size(), bytes.len());
    // The header's MSE is the decompressed vectors' error (counted by the coder from its f32
    // distances, so agreeing with the float64 recount to f32 rounding).
    let mse = index.reconstruction_mse(&data);
    assert!(
        (mse - h.mse).abs() <= 1e-6 * h.mse.max(1e-3),
        "{mse} vs {}",
        h.mse
    );
    let back = index.decompress().unwrap();
    let direct: f64 = (0..data.rows)
        .map(|i| {
            data.row(i)
                .iter()
                .zip(back.row(i))
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>()
        })
        .sum::<f64>()
        / data.rows as f64;
    assert!((direct - mse).abs() <= 1e-9 * mse.max(1.0));
    // Residual codes make the reconstruction better than the anchors alone.
    assert!(
        mse < h.energy,
        "MSE {mse} vs anchor-only energy {}",
        h.energy
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_or_corrupted_index_files_are_errors() {
    let (_, bytes) = small_index();
    for cut in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
        assert!(
            Index::from_bytes(bytes[..cut].to_vec(), "t").is_err(),
            "cut at {cut}"
        );
    }
    let mut wrong_version = bytes.clone();
    wrong_version[8] = 2;
    assert!(
        Index::from_bytes(wrong_version, "t")
            .unwrap_err()
            .to_string()
            .contains("version")
    );
    let mut flipped = bytes.clone();
    flipped[200] ^= 0x10;
    assert!(
        Index::from_bytes(flipped, "t")
            .unwrap_err()
            .to_string()
            .contains("checksum")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Random damage anywhere (the fuzz target's job, in miniature): an error, never a panic.
    /// For part of the cases the checksum is re-sealed, as an adversary would, so the damage
    /// reaches the parser: then the file may even parse, and must search without a panic.
    #[test]
    fn damaged_index_files_never_panic(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>(), reseal in any::<bool>()) {
        static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let bytes = BYTES.get_or_init(|| small_index().1);
        let mut b = bytes.clone();
        for (at, v) in edits {
            let at = at % b.len();
            b[at] ^= v | 1;
        }
        let keep = b.len() - cut % 64;
        b.truncate(keep);
        if !reseal {
            prop_assert!(Index::from_bytes(b, "t").is_err());
        } else if b.len() >= 8 {
            let end = b.len();
            let crc = crc32fast::hash(&b[..end - 8]);
            b[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
            let started = std::time::Instant::now();
            if let Ok(index) = Index::from_bytes(b, "t") {
                let d = index.header.d;
                let q = Matrix::new(1, d, vec![0.25; d]).unwrap();
                let _ = index.search(&q, 5, 3);
            }
            prop_assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
    }
}

#[test]
fn assignments_pack_into_ceil_log2_m_bits() {
    use vlc_anneal::index::{assignment_bits, pack_bits, unpack_bit};
    for (m, bits) in [
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 2),
        (255, 8),
        (256, 8),
        (257, 9),
        (1000, 10),
        (4096, 12),
    ] {
        assert_eq!(assignment_bits(m), bits, "m = {m}");
        let values: Vec<u32> = (0..777u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % m as u32)
            .collect();
        let packed = pack_bits(&values, bits);
        assert_eq!(packed.len(), (777 * bits as usize).div_ceil(8));
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(unpack_bit(&packed, bits, i), v);
        }
    }
}

/// `.bvecs` reads as float32; neighbour ids come from `.ivecs` or integer `.npy` (either
/// order), and ids that cannot index the data are errors naming the query.
#[test]
fn bvecs_and_neighbour_files() {
    use vlc_anneal::vectors::{load_neighbors, parse_bvecs};
    let mut b = Vec::new();
    for row in [[1u8, 2, 255], [0, 7, 9]] {
        b.extend_from_slice(&3i32.to_le_bytes());
        b.extend_from_slice(&row);
    }
    let m = parse_bvecs(&b, "t").unwrap();
    assert_eq!((m.rows, m.cols), (2, 3));
    assert_eq!(m.data, vec![1.0, 2.0, 255.0, 0.0, 7.0, 9.0]);
    assert!(parse_bvecs(&b[..b.len() - 1], "t").is_err());

    let dir = std::env::temp_dir().join(format!("vlc-ids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let want = vec![vec![4u32, 1, 0], vec![2, 3, 9]];
    let mut iv = Vec::new();
    for row in &want {
        iv.extend_from_slice(&3i32.to_le_bytes());
        row.iter()
            .for_each(|&v| iv.extend_from_slice(&(v as i32).to_le_bytes()));
    }
    std::fs::write(dir.join("gt.ivecs"), &iv).unwrap();
    assert_eq!(load_neighbors(dir.join("gt.ivecs")).unwrap(), want);
    let c_order: Vec<u8> = want
        .iter()
        .flatten()
        .flat_map(|&v| (v as i64).to_le_bytes())
        .collect();
    std::fs::write(
        dir.join("gt.npy"),
        npy_with("<i8", false, "(2, 3)", &c_order, 1),
    )
    .unwrap();
    assert_eq!(load_neighbors(dir.join("gt.npy")).unwrap(), want);
    let f_order: Vec<u8> = (0..3)
        .flat_map(|j| want.iter().map(move |r| r[j]))
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(
        dir.join("f.npy"),
        npy_with("<u4", true, "(2, 3)", &f_order, 1),
    )
    .unwrap();
    assert_eq!(load_neighbors(dir.join("f.npy")).unwrap(), want);
    let mut negative = c_order.clone();
    negative[32..40].copy_from_slice(&(-1i64).to_le_bytes());
    std::fs::write(
        dir.join("neg.npy"),
        npy_with("<i8", false, "(2, 3)", &negative, 1),
    )
    .unwrap();
    let e = load_neighbors(dir.join("neg.npy")).unwrap_err().to_string();
    assert!(e.contains("query 1") && e.contains("-1"), "{e}");
    std::fs::write(
        dir.join("f.npy"),
        npy_with("<f4", false, "(2, 3)", &[0; 24], 1),
    )
    .unwrap();
    assert!(
        load_neighbors(dir.join("f.npy"))
            .unwrap_err()
            .to_string()
            .contains("<f4")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
