//! The calling thread as one of rayon's: [`join_rayon_pool`].

use hal::Result;

/// Makes the calling thread the first of rayon's global pool (of `threads` threads in all, or
/// rayon's default for 0: `RAYON_NUM_THREADS`, else one per core), so that the backend's
/// parallel work started from this thread runs on it and on the pool's other threads.
///
/// Without it, every parallel pass a call makes from a thread outside the pool is handed to
/// the pool while the caller sleeps until it is done: a wake-up of a worker and then of the
/// caller, per pass. A step of small operations pays that often: the small GPT of
/// `bench --suite gpt --gpt-config small` took 18.2 ms a step that way and 15.0 ms with its
/// work on a pool thread (2 threads).
///
/// Call it once, early in `main`, before anything starts rayon's pool, from a thread that
/// outlives the pool's use (the main thread does). An error says why the pool could not be
/// built that way (most often: it already exists); the backend works the same either way,
/// only slower. On wasm32, which has no threads, it does nothing.
pub fn join_rayon_pool(threads: usize) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .build_global()
            .map_err(|e| hal::Error::Backend {
                backend: "cpu",
                detail: format!(
                    "join_rayon_pool({threads}): {e} (call it before anything uses rayon's pool)"
                ),
            })
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = threads;
        Ok(())
    }
}
