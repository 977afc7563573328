use super::*;

#[test]
fn every_shader_file_is_embedded_and_included_files_exist() {
    let on_disk: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shaders"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".wgsl"))
            .collect();
    for n in &on_disk {
        assert!(FILES.iter().any(|f| f.name == n), "{n} is not embedded");
    }
    assert_eq!(on_disk.len(), FILES.len());
    for f in FILES {
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
