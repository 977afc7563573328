//! NCCL that cannot be found is a typed error naming where it was looked for and how to point
//! at it, never a panic (the library is opened at run time, so this runs without CUDA too).

#[test]
fn a_missing_nccl_says_where_it_looked_and_how_to_name_it() {
    let bogus = std::env::temp_dir().join("no-such-dir/libnccl.so.2");
    // SAFETY: the only test of this binary, before anything reads the environment.
    unsafe { std::env::set_var(backend_cuda::collective::LIBRARY_VARIABLE, &bogus) };
    match backend_cuda::nccl_version() {
        Err(hal::Error::Unavailable { reason, .. }) => {
            assert!(reason.contains(&bogus.display().to_string()), "{reason}");
            assert!(reason.contains("HAL_NCCL_LIBRARY"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
