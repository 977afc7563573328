use super::*;

#[test]
fn every_shader_file_is_embedded_and_included_files_exist() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shaders");
    let mut on_disk = Vec::new();
    for family in std::fs::read_dir(root).unwrap() {
        let family = family.unwrap();
        if !family.file_type().unwrap().is_dir() {
            continue;
        }
        let folder = family.file_name().into_string().unwrap();
        for e in std::fs::read_dir(family.path()).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".wgsl") {
                on_disk.push(format!("{folder}/{name}"));
            }
        }
    }
    for p in &on_disk {
        assert!(FILES.iter().any(|f| &f.path() == p), "{p} is not embedded");
    }
    assert_eq!(on_disk.len(), FILES.len());
    // Kernels name files by their file name alone: no two may share one.
    for f in FILES {
        assert_eq!(FILES.iter().filter(|g| g.name == f.name).count(), 1);
        for inc in includes(f.text) {
            file(inc);
        }
    }
}

#[test]
fn slots_are_replaced_and_defaults_keep_line_numbers() {
    let m = compose("unary.wgsl", None, &[], Entry::Strided, Features::default());
    let unary = file("unary.wgsl").text;
    assert!(m.source.starts_with(unary));
    assert_eq!(m.locate(3), ("unary.wgsl", 3));
    let n = unary.lines().count();
    assert_eq!(m.locate(n + 1).0, "prelude.wgsl");
    let r = compose(
        "unary.wgsl",
        Some(&io(&[DType::F16], DType::BF16)),
        &[("op", "fn op(v: f32) -> f32 { return exp(v); }".into())],
        Entry::Contiguous,
        Features::default(),
    );
    assert!(r.source.contains("return exp(v);"));
    assert!(!r.source.contains("return -v;"));
    assert!(r.source.contains("f32_to_bf16"));
    assert!(r.source.contains("contiguous_base1 + i32(t)"));
    assert!(!r.source.contains("// @slot op"));
}
