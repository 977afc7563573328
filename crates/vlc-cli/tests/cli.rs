//! The `vlc` command as a careless user or an adversary meets it: it refuses to write over
//! its own input or into a folder that does not exist (before any work), clamps an absurd
//! `-k`, refuses `--nprobe 0`, and answers a crafted index at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn vlc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vlc"))
        .args(args)
        .output()
        .expect("vlc runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vlc-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `vlc compress NPY -o INDEX` on the CPU with `anchors` and `bytes`, quietly.
fn compress(npy: &str, index: &str, anchors: &str, bytes: &str) -> Output {
    let args = [
        "--anchors",
        anchors,
        "--bytes",
        bytes,
        "--backend",
        "cpu",
        "--quiet",
    ];
    vlc(&[&["compress", npy, "-o", index][..], &args].concat())
}

/// 200 x 8 vectors as .npy, and an index of them (8 anchors, 4 bytes).
fn fixture(dir: &Path) -> (String, String) {
    let data = vlc_anneal::synthetic::gaussian_mixture(200, 8, 5, 0.1, 4);
    let npy = dir.join("in.npy");
    data.save(&npy).unwrap();
    let index = dir.join("i.vlc");
    let (npy, index) = (npy.display().to_string(), index.display().to_string());
    let o = compress(&npy, &index, "8", "4");
    assert!(o.status.success(), "{}", text(&o));
    (npy, index)
}

#[test]
fn commands_refuse_to_write_over_their_own_input() {
    let dir = scratch("self");
    let (npy, index) = fixture(&dir);
    let (npy_before, index_before) = (std::fs::read(&npy).unwrap(), std::fs::read(&index).unwrap());
    let o = vlc(&["compress", &npy, "-o", &npy, "--backend", "cpu", "--quiet"]);
    assert!(
        !o.status.success() && text(&o).contains("is the input"),
        "{}",
        text(&o)
    );
    // Through another spelling of the same path.
    let other = format!("{}/./in.npy", dir.display());
    let o = vlc(&[
        "compress",
        &npy,
        "-o",
        &other,
        "--backend",
        "cpu",
        "--quiet",
    ]);
    assert!(
        !o.status.success() && text(&o).contains("is the input"),
        "{}",
        text(&o)
    );
    let o = vlc(&["decompress", &index, "-o", &index]);
    assert!(
        !o.status.success() && text(&o).contains("is the input"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&npy).unwrap(), npy_before);
    assert_eq!(std::fs::read(&index).unwrap(), index_before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_output_folder_is_reported_before_any_work() {
    let dir = scratch("folder");
    let (npy, _) = fixture(&dir);
    let out = dir.join("no/such/folder/o.vlc").display().to_string();
    let o = vlc(&["compress", &npy, "-o", &out, "--backend", "cpu", "--quiet"]);
    assert!(
        !o.status.success() && text(&o).contains("does not exist"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("wrote"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn absurd_search_arguments_get_answers_not_aborts() {
    let dir = scratch("search");
    let (npy, index) = fixture(&dir);
    for k in ["1000000000000", "4611686018427387904"] {
        let o = vlc(&["search", &index, &npy, "-k", k]);
        assert!(o.status.success(), "-k {k}: {}", text(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let first = stdout.lines().next().unwrap();
        assert_eq!(first.split_whitespace().count(), 1 + 200, "-k {k}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("exceeds"));
    }
    let o = vlc(&["search", &index, &npy, "--nprobe", "0"]);
    assert!(
        !o.status.success() && text(&o).contains("nprobe"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The body of a version-1 `.npy` file and its header's text.
fn npy_body(bytes: &[u8]) -> (String, &[u8]) {
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    (
        String::from_utf8_lossy(&bytes[10..10 + len]).into_owned(),
        &bytes[10 + len..],
    )
}

/// `--ids` and `--distances` write what the text output prints, as `queries x k` .npy files
/// padded with -1 and infinity; queries whose probed lists hold fewer than `k` vectors are
/// reported.
#[test]
fn search_writes_ids_and_distances_as_npy() {
    let dir = scratch("npy-out");
    let (npy, index) = fixture(&dir);
    let (ids, dist) = (dir.join("ids.npy"), dir.join("d.npy"));
    let args = ["-k", "60", "--nprobe", "1"];
    let printed = vlc(&[&["search", &index, &npy][..], &args].concat());
    assert!(printed.status.success(), "{}", text(&printed));
    let o = vlc(&[
        &["search", &index, &npy][..],
        &args,
        &[
            "--ids",
            ids.to_str().unwrap(),
            "--distances",
            dist.to_str().unwrap(),
        ],
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout.is_empty(), "printed as well: {}", text(&o));
    assert!(text(&o).contains("fewer than 60"), "{}", text(&o));
    let (id_bytes, d_bytes) = (std::fs::read(&ids).unwrap(), std::fs::read(&dist).unwrap());
    let ((ih, ib), (dh, db)) = (npy_body(&id_bytes), npy_body(&d_bytes));
    assert!(ih.contains("'<i8'") && ih.contains("(200, 60)"), "{ih}");
    assert!(dh.contains("'<f4'") && dh.contains("(200, 60)"), "{dh}");
    let id_at = |q: usize, j: usize| {
        i64::from_le_bytes(
            ib[(q * 60 + j) * 8..(q * 60 + j + 1) * 8]
                .try_into()
                .unwrap(),
        )
    };
    let d_at = |q: usize, j: usize| {
        f32::from_le_bytes(
            db[(q * 60 + j) * 4..(q * 60 + j + 1) * 4]
                .try_into()
                .unwrap(),
        )
    };
    let mut padded = 0;
    for (q, line) in String::from_utf8_lossy(&printed.stdout).lines().enumerate() {
        let hits: Vec<&str> = line.split_whitespace().skip(1).collect();
        for (j, hit) in hits.iter().enumerate() {
            let (i, d) = hit.split_once(':').unwrap();
            assert_eq!(id_at(q, j), i.parse::<i64>().unwrap(), "query {q} hit {j}");
            assert!(
                (d_at(q, j) - d.parse::<f32>().unwrap()).abs() <= 1e-5,
                "query {q}"
            );
        }
        for j in hits.len()..60 {
            assert_eq!((id_at(q, j), d_at(q, j)), (-1, f32::INFINITY));
            padded += 1;
        }
    }
    assert!(padded > 0, "no query came up short with nprobe 1");
    // The texmex formats hold the same results; other extensions are refused before searching.
    let (iv, fv) = (dir.join("ids.ivecs"), dir.join("d.fvecs"));
    let o = vlc(&[
        &["search", &index, &npy][..],
        &args,
        &[
            "--ids",
            iv.to_str().unwrap(),
            "--distances",
            fv.to_str().unwrap(),
        ],
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    let iv_bytes = std::fs::read(&iv).unwrap();
    assert_eq!(iv_bytes.len(), 200 * (4 + 4 * 60));
    let fv = vlc_anneal::Matrix::load(&fv)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(fv.contains("non-finite"), "padding is infinity: {fv}");
    for q in [0usize, 77, 199] {
        let rec = &iv_bytes[q * 244..(q + 1) * 244];
        assert_eq!(i32::from_le_bytes(rec[..4].try_into().unwrap()), 60);
        for j in 0..60 {
            let v = i32::from_le_bytes(rec[4 + 4 * j..8 + 4 * j].try_into().unwrap());
            assert_eq!(v as i64, id_at(q, j), "query {q} rank {j}");
        }
    }
    let o = vlc(&[
        &["search", &index, &npy, "--ids"][..],
        &[dir.join("x.txt").to_str().unwrap()],
    ]
    .concat());
    assert!(
        !o.status.success() && text(&o).contains(".ivecs"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `eval --query-file` with ground truth from a file gives the recall the exact search here
/// gives; ground truth of the wrong shape is refused.
#[test]
fn eval_takes_queries_and_ground_truth_of_its_own() {
    let dir = scratch("eval");
    let (npy, index) = fixture(&dir);
    let data = vlc_anneal::Matrix::load(&npy).unwrap();
    let queries = vlc_anneal::synthetic::gaussian_mixture(30, 8, 5, 0.1, 9);
    let qpath = dir.join("q.fvecs");
    queries.save(&qpath).unwrap();
    let truth = vlc_anneal::exact_knn(&data, &queries, 10);
    let mut iv = Vec::new();
    for row in &truth {
        iv.extend_from_slice(&10i32.to_le_bytes());
        row.iter()
            .for_each(|&v| iv.extend_from_slice(&(v as i32).to_le_bytes()));
    }
    let gt = dir.join("gt.ivecs");
    std::fs::write(&gt, &iv).unwrap();
    let recall = |o: &Output| {
        let t = text(o);
        t.lines()
            .find(|l| l.starts_with("recall@10"))
            .unwrap_or_else(|| panic!("{t}"))
            .to_string()
    };
    let q = qpath.to_str().unwrap();
    let exact = vlc(&["eval", &index, &npy, "--query-file", q]);
    let given = vlc(&[
        "eval",
        &index,
        &npy,
        "--query-file",
        q,
        "--truth",
        gt.to_str().unwrap(),
    ]);
    assert!(
        exact.status.success() && given.status.success(),
        "{}",
        text(&given)
    );
    assert_eq!(recall(&exact), recall(&given));
    assert!(recall(&given).contains("30 queries"), "{}", recall(&given));
    // Truth for other queries (one list short) is refused.
    std::fs::write(&gt, &iv[..iv.len() - 44]).unwrap();
    let o = vlc(&[
        "eval",
        &index,
        &npy,
        "--query-file",
        q,
        "--truth",
        gt.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("29 lists for 30 queries"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--metric cosine` is kept in the index (info names it) and eval measures recall by cosine.
#[test]
fn a_cosine_index_says_so_and_evaluates() {
    let dir = scratch("cosine");
    let npy = dir.join("in.npy");
    vlc_anneal::synthetic::gaussian_mixture(600, 8, 5, 0.1, 3)
        .save(&npy)
        .unwrap();
    let (npy, index) = (npy.to_str().unwrap(), dir.join("c.vlc"));
    let index = index.to_str().unwrap();
    let o = vlc(&[
        "compress",
        npy,
        "-o",
        index,
        "--anchors",
        "8",
        "--bytes",
        "4",
        "--backend",
        "cpu",
        "--metric",
        "cosine",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&vlc(&["info", index])).contains("metric            cosine"));
    let o = vlc(&["eval", index, npy, "--queries", "50"]);
    assert!(
        o.status.success() && text(&o).contains("recall@10"),
        "{}",
        text(&o)
    );
    let o = vlc(&["compress", npy, "-o", index, "--metric", "dot", "--quiet"]);
    assert!(
        !o.status.success() && text(&o).contains("l2, cosine or ip"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ids of one's own, given at compression, added and removed, come back from search.
#[test]
fn ids_through_compress_add_remove_and_search() {
    let dir = scratch("ids");
    let data = vlc_anneal::synthetic::gaussian_mixture(300, 8, 5, 0.1, 4);
    let (base, extra) = (
        vlc_anneal::Matrix::new(250, 8, data.data[..250 * 8].to_vec()).unwrap(),
        vlc_anneal::Matrix::new(50, 8, data.data[250 * 8..].to_vec()).unwrap(),
    );
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();
    base.save(p("base.npy")).unwrap();
    extra.save(p("extra.npy")).unwrap();
    let ids_file = |name: &str, ids: &[i64]| {
        let body: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bytes = vlc_anneal::vectors::npy_array_bytes("<i8", ids.len(), 1, &body);
        std::fs::write(p(name), bytes).unwrap();
        p(name)
    };
    let base_ids: Vec<i64> = (0..250).map(|i| 9_000_000_000 + i).collect();
    let extra_ids: Vec<i64> = (0..50).map(|i| 77 + i).collect();
    let (bi, ei) = (ids_file("b.npy", &base_ids), ids_file("e.npy", &extra_ids));
    let args = [
        "--anchors",
        "8",
        "--bytes",
        "4",
        "--backend",
        "cpu",
        "--quiet",
        "--ids",
    ];
    let o = vlc(&[
        &["compress", &p("base.npy"), "-o", &p("a.vlc")][..],
        &args,
        &[&bi],
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    let o = vlc(&[
        "add",
        &p("a.vlc"),
        &p("extra.npy"),
        "-o",
        &p("b.vlc"),
        "--ids",
        &ei,
        "--backend",
        "cpu",
    ]);
    assert!(
        o.status.success() && text(&o).contains("300 vectors (50 added)"),
        "{}",
        text(&o)
    );
    assert!(text(&vlc(&["info", &p("b.vlc")])).contains("stored"));
    // Each added vector finds itself, by its own id.
    let o = vlc(&[
        "search",
        &p("b.vlc"),
        &p("extra.npy"),
        "-k",
        "1",
        "--nprobe",
        "8",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let firsts: Vec<i64> = out
        .lines()
        .map(|l| {
            l.split('\t')
                .nth(1)
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let own = firsts
        .iter()
        .zip(&extra_ids)
        .filter(|(a, b)| a == b)
        .count();
    assert!(own >= 45, "{own} of 50 found themselves: {out}");
    // Removed by id: they no longer come back.
    let gone = ids_file("gone.npy", &extra_ids[..10]);
    let o = vlc(&["remove", &p("b.vlc"), "--ids", &gone, "-o", &p("c.vlc")]);
    assert!(
        o.status.success() && text(&o).contains("290 vectors (10 removed"),
        "{}",
        text(&o)
    );
    let o = vlc(&[
        "search",
        &p("c.vlc"),
        &p("extra.npy"),
        "-k",
        "3",
        "--nprobe",
        "8",
    ]);
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        for hit in line.split('\t').nth(1).unwrap().split_whitespace() {
            let id: i64 = hit.split(':').next().unwrap().parse().unwrap();
            assert!(!extra_ids[..10].contains(&id), "{id} came back");
        }
    }
    // Ids of the wrong count are refused before any work.
    let o = vlc(&[
        &["compress", &p("base.npy"), "-o", &p("d.vlc")][..],
        &args,
        &[&ei],
    ]
    .concat());
    assert!(
        !o.status.success() && text(&o).contains("50 ids for 250 vectors"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An index no smaller than its data says so.
#[test]
fn an_index_larger_than_its_data_is_noted() {
    let dir = scratch("tiny");
    let npy = dir.join("in.npy");
    vlc_anneal::synthetic::gaussian_mixture(300, 8, 5, 0.1, 2)
        .save(&npy)
        .unwrap();
    let index = dir.join("i.vlc");
    let o = compress(npy.to_str().unwrap(), index.to_str().unwrap(), "64", "8");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("not smaller"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_crafted_count_is_refused_at_once() {
    let dir = scratch("crafted");
    let npy = dir.join("in.npy");
    vlc_anneal::synthetic::gaussian_mixture(50, 4, 2, 0.1, 1)
        .save(&npy)
        .unwrap();
    let index = dir.join("one.vlc");
    let (npy, index) = (npy.display().to_string(), index.display().to_string());
    let o = compress(&npy, &index, "1", "0");
    assert!(o.status.success(), "{}", text(&o));
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let end = bytes.len();
    let crc = crc32fast_hash(&bytes[..end - 8]);
    bytes[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&index, &bytes).unwrap();
    let out = dir.join("out.npy").display().to_string();
    let started = Instant::now();
    for args in [vec!["info", &index], vec!["decompress", &index, "-o", &out]] {
        let o = vlc(&args);
        assert!(
            !o.status.success() && text(&o).contains("vectors claimed"),
            "{args:?}: {}",
            text(&o)
        );
    }
    assert!(!Path::new(&out).exists());
    assert!(started.elapsed() < Duration::from_secs(5));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// CRC-32 (IEEE), bit by bit: the test seals its crafted file without a dependency.
fn crc32fast_hash(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `--refine` keeps the vectors and `--rerank` uses them: each indexed vector searched for
/// is its own nearest at distance 0 (up to f16), which the codes alone do not give; an index
/// without them refuses `--rerank` before searching.
#[test]
fn rerank_uses_the_vectors_compress_refine_keeps() {
    let dir = scratch("rerank");
    let (npy, plain) = fixture(&dir);
    let kept = dir.join("k.vlc").display().to_string();
    let args = [
        "--anchors",
        "8",
        "--bytes",
        "2",
        "--backend",
        "cpu",
        "--quiet",
    ];
    let o = vlc(&[&["compress", &npy, "-o", &kept, "--refine"][..], &args].concat());
    assert!(o.status.success(), "{}", text(&o));
    let info = vlc(&["info", &kept]);
    assert!(text(&info).contains("kept (f16)"), "{}", text(&info));
    let o = vlc(&[
        "search", &kept, &npy, "-k", "1", "--nprobe", "8", "--rerank", "50",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    for (q, line) in String::from_utf8_lossy(&o.stdout).lines().enumerate() {
        let hit = line.split_whitespace().nth(1).unwrap();
        let (i, d) = hit.split_once(':').unwrap();
        assert_eq!(i.parse::<usize>().unwrap(), q, "{line}");
        assert!(d.parse::<f32>().unwrap() <= 1e-4, "{line}");
    }
    let o = vlc(&["search", &plain, &npy, "--rerank", "50"]);
    assert!(
        !o.status.success() && text(&o).contains("--refine"),
        "{}",
        text(&o)
    );
}

#[test]
fn compress_splits_over_devices_and_refuses_what_cannot_split() {
    let dir = scratch("devices");
    let (npy, _) = fixture(&dir);
    let index = dir.join("split.vlc").display().to_string();
    let args = [
        "--anchors",
        "8",
        "--bytes",
        "4",
        "--backend",
        "cpu",
        "--quiet",
    ];
    let o = vlc(&[
        &["compress", &npy, "-o", &index, "--devices", "3"][..],
        &args,
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    let info = vlc(&["info", &index]);
    assert!(text(&info).contains("200 x 8"), "{}", text(&info));
    // The index it wrote searches.
    let o = vlc(&["search", &index, &npy, "-k", "1", "--nprobe", "8"]);
    assert!(o.status.success(), "{}", text(&o));
    let exact = dir.join("exact.vlc").display().to_string();
    let o = vlc(&[
        &["compress", &npy, "-o", &exact, "--devices", "2", "--exact"][..],
        &args,
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    for bad in [&["--devices", "0"][..], &["--devices", "500"][..]] {
        let o = vlc(&[&["compress", &npy, "-o", &index][..], &args, bad].concat());
        assert!(!o.status.success(), "{bad:?} was accepted");
        assert!(text(&o).contains("devices"), "{bad:?}: {}", text(&o));
    }
}
