//! `cargo xtask ptx [--check]`: compiles every `cuda/*.cu` with nvcc to
//! `crates/backend-cuda/ptx/NAME.ptx` (and the files in [`DUAL_TARGET`] also to
//! `NAME.sm90.ptx`), stamped with a hash of its sources (the `.cu` file and every `.cuh` it
//! includes). `--check` needs no nvcc: it recomputes the hashes and fails when
//! a source changed without its PTX, a PTX file has no source, or a PTX file's ISA is newer
//! than the CUDA 13.0 driver accepts (9.0).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// nvcc's target: PTX for compute capability 8.0, which every newer GPU JIT-compiles.
const ARCH: &str = "compute_80";
/// Sources also built for compute capability 9.0 (`NAME.sm90.ptx`), where their kernels use
/// Hopper's programmatic dependent launch (`GRID_DEPENDENCY` in `cuda/common.cuh`); the
/// backend loads that PTX on Hopper and newer.
const DUAL_TARGET: [&str; 2] = ["elementwise", "random"];
/// The newest PTX ISA a CUDA 13.0 driver loads.
const MAX_ISA: (u32, u32) = (9, 0);
const STAMP: &str = "// source-hash: ";

const INSTALL: &str = "nvcc was not found. Install CUDA 13.0's compiler from PyPI (all four pinned: an unpinned nvvm emits PTX ISA 9.5, which a 13.0 driver rejects):
  python3 -m pip install --target ~/.nvcc 'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-nvvm==13.0.*' 'nvidia-cuda-crt==13.0.*'
then set NVCC=~/.nvcc/nvidia/cu13/bin/nvcc (or put that folder on PATH).";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// FNV-1a 64 over each source's name and bytes, in a fixed order.
fn source_hash(cu: &Path) -> std::io::Result<String> {
    let mut files = vec![cu.to_path_buf()];
    let text = std::fs::read_to_string(cu)?;
    let dir = cu.parent().expect("cuda/");
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("#include \"") {
            let name = rest.trim_end_matches('"');
            files.push(dir.join(name));
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for &b in name.as_bytes().iter().chain(std::fs::read(f)?.iter()) {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(format!("{h:016x}"))
}

fn sources() -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("cuda"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    v.sort();
    Ok(v)
}

fn stem(cu: &Path) -> String {
    cu.file_stem()
        .expect("file name")
        .to_string_lossy()
        .into_owned()
}

/// The PTX files built from `cu`: (nvcc's `-arch`, path).
fn targets(cu: &Path) -> Vec<(&'static str, PathBuf)> {
    let (stem, dir) = (stem(cu), root().join("crates/backend-cuda/ptx"));
    let mut v = vec![(ARCH, dir.join(format!("{stem}.ptx")))];
    if DUAL_TARGET.contains(&stem.as_str()) {
        v.push(("compute_90", dir.join(format!("{stem}.sm90.ptx"))));
    }
    v
}

/// The `.version` line's ISA.
fn isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .find(|l| l.trim_start().starts_with(".version"))?;
    let v = line.split_whitespace().nth(1)?;
    let (a, b) = v.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub fn run(args: &[String]) -> ExitCode {
    let check = args.iter().any(|a| a == "--check");
    let srcs = match sources() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xtask ptx: cannot list cuda/: {e}");
            return ExitCode::FAILURE;
        }
    };
    if check {
        check_all(&srcs)
    } else {
        build_all(&srcs)
    }
}

fn check_all(srcs: &[PathBuf]) -> ExitCode {
    let mut bad = Vec::new();
    for cu in srcs {
        let want = match source_hash(cu) {
            Ok(h) => h,
            Err(e) => {
                bad.push(format!("{}: cannot hash: {e}", cu.display()));
                continue;
            }
        };
        for (_, out) in targets(cu) {
            let Ok(ptx) = std::fs::read_to_string(&out) else {
                bad.push(format!(
                    "{} has no PTX ({} is missing)",
                    cu.display(),
                    out.display()
                ));
                continue;
            };
            let got = ptx
                .lines()
                .find_map(|l| l.strip_prefix(STAMP))
                .unwrap_or("(none)");
            if got != want {
                bad.push(format!(
                    "{} changed since {} was built (hash {want}, PTX stamped {got})",
                    cu.display(),
                    out.display()
                ));
            }
            match isa(&ptx) {
                Some(v) if v <= MAX_ISA => {}
                other => bad.push(format!(
                    "{}: PTX ISA {other:?} is newer than {}.{} (the CUDA 13.0 driver's limit)",
                    out.display(),
                    MAX_ISA.0,
                    MAX_ISA.1
                )),
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(root().join("crates/backend-cuda/ptx")) {
        for e in dir.filter_map(|e| e.ok()) {
            let path = e.path();
            if !srcs
                .iter()
                .any(|cu| targets(cu).iter().any(|(_, out)| *out == path))
            {
                bad.push(format!("{} has no source in cuda/", path.display()));
            }
        }
    }
    if bad.is_empty() {
        let files: usize = srcs.iter().map(|cu| targets(cu).len()).sum();
        println!("xtask ptx --check: {files} PTX files match their sources");
        ExitCode::SUCCESS
    } else {
        for b in &bad {
            eprintln!("xtask ptx --check: {b}");
        }
        eprintln!("run `cargo xtask ptx` (needs nvcc) and commit crates/backend-cuda/ptx/");
        ExitCode::FAILURE
    }
}

fn build_all(srcs: &[PathBuf]) -> ExitCode {
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    if Command::new(&nvcc).arg("--version").output().is_err() {
        eprintln!("xtask ptx: {INSTALL}");
        return ExitCode::FAILURE;
    }
    let _ = std::fs::create_dir_all(root().join("crates/backend-cuda/ptx"));
    for cu in srcs {
        for (arch, out) in targets(cu) {
            if let Err(e) = build_one(&nvcc, cu, arch, &out) {
                eprintln!("xtask ptx: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn build_one(nvcc: &str, cu: &Path, arch: &str, out: &Path) -> Result<(), String> {
    let tmp = out.with_extension("ptx.tmp");
    let status = Command::new(nvcc)
        .args(["-ptx", &format!("-arch={arch}"), "-O3"])
        .arg(format!("-I{}", root().join("cuda").display()))
        .arg(cu)
        .arg("-o")
        .arg(&tmp)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        return Err(format!("nvcc failed on {} ({arch})", cu.display()));
    }
    let body = std::fs::read_to_string(&tmp).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&tmp);
    if !matches!(isa(&body), Some(v) if v <= MAX_ISA) {
        return Err(format!(
            "{} came out as PTX ISA {:?}, newer than 9.0: pin nvidia-nvvm==13.0.*",
            cu.display(),
            isa(&body)
        ));
    }
    let name = cu.file_name().expect("name").to_string_lossy().into_owned();
    let hash = source_hash(cu).map_err(|e| e.to_string())?;
    // nvcc stamps its own build comments; ours name the source and hash.
    let stamped = format!(
        "// Generated by `cargo xtask ptx` from cuda/{name} ({arch}); do not edit.\n{STAMP}{hash}\n{body}"
    );
    hal::durable::write_bytes_atomic(out, stamped.as_bytes())
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    println!(
        "xtask ptx: cuda/{name} ({arch}) -> {}",
        out.strip_prefix(root()).unwrap_or(out).display()
    );
    Ok(())
}
