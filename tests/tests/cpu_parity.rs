//! The whole parity suite on the CPU reference, against float64 on the host, with a fresh seed
//! each run (printed, so a failure can be replayed with `parity --seed`).

use hal_parity::{Suite, SuiteConfig, format_table};

#[test]
fn cpu_reference_matches_float64_on_every_primitive() {
    let cpu = backend_cpu::CpuBackend::new();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let report = Suite::new(&cpu, &cpu, true, SuiteConfig { cases: 12, seed }).run();
    println!(
        "seed {seed}\n{}",
        format_table(std::slice::from_ref(&report), &[])
    );
    assert!(report.rows.len() >= 25, "every primitive family has a row");
    assert!(
        report.passed(),
        "parity failures (seed {seed}):\n{}",
        format_table(std::slice::from_ref(&report), &[])
    );
}
