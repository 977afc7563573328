//! `cargo xtask ptx [--check]`: compiles every `cuda/*.cu` with nvcc to
//! `crates/backend-cuda/ptx/NAME.ptx`, stamped with a hash of its sources (the `.cu` file and
//! every `.cuh` it includes). `--check` needs no nvcc: it recomputes the hashes and fails when
//! a source changed without its PTX, a PTX file has no source, or a PTX file's ISA is newer
//! than the CUDA 13.0 driver accepts (9.0).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// nvcc's target: PTX for compute capability 8.0, which every newer GPU JIT-compiles.
const ARCH: &str = "compute_80";
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

fn ptx_path(cu: &Path) -> PathBuf {
    let stem = cu
        .file_stem()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    root()
        .join("crates/backend-cuda/ptx")
        .join(format!("{stem}.ptx"))
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
        let out = ptx_path(cu);
        let want = match source_hash(cu) {
            Ok(h) => h,
            Err(e) => {
                bad.push(format!("{}: cannot hash: {e}", cu.display()));
                continue;
            }
        };
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
                "{} changed since its PTX was built (hash {want}, PTX stamped {got})",
                cu.display()
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
    if let Ok(dir) = std::fs::read_dir(root().join("crates/backend-cuda/ptx")) {
        for e in dir.filter_map(|e| e.ok()) {
            let stem = e
                .path()
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned());
            if let Some(stem) = stem {
                if !srcs
                    .iter()
                    .any(|s| s.file_stem().is_some_and(|f| f.to_string_lossy() == stem))
                {
                    bad.push(format!("{} has no source in cuda/", e.path().display()));
                }
            }
        }
    }
    if bad.is_empty() {
        println!(
            "xtask ptx --check: {} PTX files match their sources",
            srcs.len()
        );
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
        let out = ptx_path(cu);
        let tmp = out.with_extension("ptx.tmp");
        let status = Command::new(&nvcc)
            .args(["-ptx", &format!("-arch={ARCH}"), "-O3", "-lineinfo"])
            .arg(format!("-I{}", root().join("cuda").display()))
            .arg(cu)
            .arg("-o")
            .arg(&tmp)
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("xtask ptx: nvcc failed on {}", cu.display());
            return ExitCode::FAILURE;
        }
        let body = match std::fs::read_to_string(&tmp) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("xtask ptx: {e}");
                return ExitCode::FAILURE;
            }
        };
        let _ = std::fs::remove_file(&tmp);
        if !matches!(isa(&body), Some(v) if v <= MAX_ISA) {
            eprintln!(
                "xtask ptx: {} came out as PTX ISA {:?}, newer than 9.0: pin nvidia-nvvm==13.0.*",
                cu.display(),
                isa(&body)
            );
            return ExitCode::FAILURE;
        }
        let name = cu.file_name().expect("name").to_string_lossy().into_owned();
        let hash = source_hash(cu).expect("readable");
        // nvcc stamps its own build comments; ours name the source and hash.
        let stamped = format!(
            "// Generated by `cargo xtask ptx` from cuda/{name} ({ARCH}); do not edit.\n{STAMP}{hash}\n{body}"
        );
        if let Err(e) = std::fs::write(&out, stamped) {
            eprintln!("xtask ptx: writing {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        println!(
            "xtask ptx: cuda/{name} -> {}",
            out.strip_prefix(root()).unwrap_or(&out).display()
        );
    }
    ExitCode::SUCCESS
}
