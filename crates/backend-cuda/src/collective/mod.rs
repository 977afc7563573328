//! The collectives over NCCL ([`hal::collective`]'s contract).
//!
//! - `nccl.rs`: the library, opened at run time, and its entry points.
//! - `rendezvous.rs`: how the ranks of several processes receive rank 0's id.
//! - here: [`NcclCommunicator`], one rank: its backend handle (device and stream) and its
//!   NCCL communicator. Collectives go to the backend's stream, so they are ordered with its
//!   kernels as any launch is.
//!
//! Overlapped all-reduces ([`Communicator::all_reduce_overlapped`]) go to a second stream
//! of the communicator's own: it waits for an event recorded on the backend's stream, and
//! [`Communicator::wait_overlapped`] makes the backend's stream wait for an event recorded
//! after them. Their buffers are held until that wait is enqueued, so the backend's pool
//! (ordered on its stream) cannot hand their memory out while they run. A collective in order
//! waits for the overlapped ones first, so NCCL's operations run in the order they were called.
//!
//! NVLink multicast (NVLS) stays off: [`NcclCommunicator`]'s constructors set
//! `NCCL_NVLS_ENABLE=0` unless the variable is set already.

mod nccl;
mod rendezvous;

pub use nccl::LIBRARY_VARIABLE;
pub use rendezvous::Rendezvous;

use crate::{CudaBackend, CudaBuffer};
use cudarc::driver::{result as drv, sys};
use hal::collective::{CollectiveOp, Communicator};
use hal::validate::{CollectiveKind, collective};
use hal::{Error, Result, View};
use nccl::{Comm, Nccl, UniqueId};
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One rank of an NCCL group (see the module docs).
pub struct NcclCommunicator {
    backend: CudaBackend,
    nccl: &'static Nccl,
    /// The NCCL communicator; null once aborted. One call at a time goes through it.
    comm: Mutex<Comm>,
    rank: usize,
    size: usize,
    side: Side,
    /// Buffers of overlapped all-reduces not yet waited for.
    pending: Mutex<Vec<CudaBuffer>>,
}

/// The stream overlapped all-reduces run on, and the events that order it with the
/// backend's stream.
struct Side {
    stream: sys::CUstream,
    /// Recorded on the backend's stream before an overlapped all-reduce.
    ready: sys::CUevent,
    /// Recorded on the side stream when the backend's stream is to wait for it.
    done: sys::CUevent,
}

impl Side {
    fn new(backend: &CudaBackend) -> Result<Side> {
        backend.dev.bind()?;
        let err = |what| move |e| crate::device::driver_error(what, e);
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        Ok(Side {
            stream: drv::stream::create(drv::stream::StreamKind::NonBlocking)
                .map_err(err("cuStreamCreate"))?,
            ready: drv::event::create(flags).map_err(err("cuEventCreate"))?,
            done: drv::event::create(flags).map_err(err("cuEventCreate"))?,
        })
    }
}

// SAFETY: the communicator handle is used under its mutex only; NCCL allows a communicator
// to move between threads as long as calls on it do not overlap.
unsafe impl Send for NcclCommunicator {}

/// The NCCL library's version (for example 22803 for 2.28.3), opening it if no communicator
/// has yet: [`hal::Error::Unavailable`] where it cannot be found, saying where it was looked
/// for and how to name it ([`LIBRARY_VARIABLE`]).
pub fn nccl_version() -> Result<i32> {
    Ok(nccl::nccl()?.version)
}

fn keep_nvls_off() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: set before NCCL reads its environment (on a communicator's creation), by
        // the thread that creates it; the collectives document that communicators are made
        // before other threads read the environment.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
}

impl NcclCommunicator {
    /// One process driving several GPUs: a group of one rank per backend, rank `r` on
    /// `backends[r]`. Drive each rank from its own thread (a rank's call may wait for its
    /// peers).
    pub fn for_backends(backends: Vec<CudaBackend>) -> Result<Vec<NcclCommunicator>> {
        let nccl = nccl::nccl()?;
        let ordinals: Vec<i32> = backends.iter().map(|b| b.ordinal() as i32).collect();
        for (i, o) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(o) {
                return Err(Error::InvalidArgument {
                    op: "NcclCommunicator::for_backends",
                    detail: format!("GPU {o} appears twice: a group takes each device once"),
                });
            }
        }
        if backends.is_empty() {
            return Err(Error::InvalidArgument {
                op: "NcclCommunicator::for_backends",
                detail: "no devices".into(),
            });
        }
        keep_nvls_off();
        let sides = backends.iter().map(Side::new).collect::<Result<Vec<_>>>()?;
        let mut comms = vec![std::ptr::null_mut(); backends.len()];
        // SAFETY: room for one communicator per device; the list holds distinct ordinals.
        nccl.check("ncclCommInitAll", std::ptr::null_mut(), unsafe {
            (nccl.comm_init_all)(comms.as_mut_ptr(), comms.len() as i32, ordinals.as_ptr())
        })?;
        let size = backends.len();
        Ok(backends
            .into_iter()
            .zip(comms)
            .zip(sides)
            .enumerate()
            .map(|(rank, ((backend, comm), side))| NcclCommunicator {
                side,
                backend,
                nccl,
                comm: Mutex::new(comm),
                rank,
                size,
                pending: Mutex::new(Vec::new()),
            })
            .collect())
    }

    /// One rank of a group formed by several processes: rank 0 makes the group's id and
    /// publishes it through `rendezvous`, the others fetch it; every rank then waits until
    /// all `size` have joined. `timeout` bounds the wait for the id.
    pub fn join(
        backend: CudaBackend,
        rendezvous: &Rendezvous,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        if size == 0 || rank >= size {
            return Err(Error::InvalidArgument {
                op: "NcclCommunicator::join",
                detail: format!("rank {rank} of a group of {size}"),
            });
        }
        let nccl = nccl::nccl()?;
        keep_nvls_off();
        let id = if rank == 0 {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: writes the 128-byte id.
            nccl.check("ncclGetUniqueId", std::ptr::null_mut(), unsafe {
                (nccl.get_unique_id)(&mut id)
            })?;
            rendezvous.publish(size, &id, timeout)?;
            id
        } else {
            rendezvous.fetch(size, timeout)?
        };
        let side = Side::new(&backend)?;
        backend.dev.bind()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: one communicator written; NCCL picks the device current on this thread,
        // which `bind` made the backend's.
        nccl.check("ncclCommInitRank", std::ptr::null_mut(), unsafe {
            (nccl.comm_init_rank)(&mut comm, size as i32, id, rank as i32)
        })?;
        Ok(NcclCommunicator {
            side,
            backend,
            nccl,
            comm: Mutex::new(comm),
            rank,
            size,
            pending: Mutex::new(Vec::new()),
        })
    }

    /// The NCCL version loaded (for example 22805 for 2.28.5).
    pub fn nccl_version(&self) -> i32 {
        self.nccl.version
    }

    fn enqueue(
        &self,
        kind: CollectiveKind,
        send: View<'_, CudaBuffer>,
        recv: View<'_, CudaBuffer>,
        launch: impl FnOnce(&Nccl, *const c_void, *mut c_void, Comm, nccl::Stream) -> u32,
    ) -> Result<()> {
        collective(kind, self.rank, self.size, send, recv)?;
        // After the overlapped ones, so NCCL runs its operations in the order called.
        self.wait_overlapped()?;
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if comm.is_null() {
            return Err(aborted(kind.name()));
        }
        self.backend.dev.bind()?;
        let status = launch(
            self.nccl,
            address(send) as *const c_void,
            address(recv) as *mut c_void,
            *comm,
            self.backend.dev.stream as nccl::Stream,
        );
        self.nccl.check(kind.name(), *comm, status)
    }

    /// Aborts the NCCL communicator (its pending operations end); later calls fail.
    fn abort(&self, comm: &mut Comm) {
        if !comm.is_null() {
            // SAFETY: a live communicator, not used again (nulled below).
            unsafe { (self.nccl.comm_abort)(*comm) };
            *comm = std::ptr::null_mut();
        }
    }
}

/// The device address of a contiguous view's first element.
fn address(v: View<'_, CudaBuffer>) -> u64 {
    v.buffer.ptr() + (v.layout.offset * v.dtype().size_in_bytes()) as u64
}

fn aborted(op: &'static str) -> Error {
    Error::Backend {
        backend: "cuda (NCCL)",
        detail: format!("{op}: the communicator was aborted after an earlier failure or timeout"),
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        // Let this rank's queued work finish (bounded), then free NCCL's resources. Abort
        // rather than destroy: destroying waits on peers that may be gone.
        let _ = self.synchronize(Duration::from_secs(60));
        let mut comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        self.abort(&mut comm);
        let _ = self.backend.dev.bind();
        // SAFETY: the side stream and events are this communicator's; after the abort no
        // NCCL operation uses them, and the destroys release them once their work is done.
        unsafe {
            let _ = drv::event::destroy(self.side.ready);
            let _ = drv::event::destroy(self.side.done);
            let _ = drv::stream::destroy(self.side.stream);
        }
    }
}

impl Communicator for NcclCommunicator {
    type Backend = CudaBackend;

    fn backend(&self) -> &CudaBackend {
        &self.backend
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        op: CollectiveOp,
        send: View<'_, CudaBuffer>,
        recv: View<'_, CudaBuffer>,
    ) -> Result<()> {
        let (count, dtype) = (send.layout.numel(), nccl::data_type(send.dtype()));
        self.enqueue(CollectiveKind::AllReduce, send, recv, |n, s, r, c, st| {
            // SAFETY: validated views inside live buffers of this device; the stream is the
            // backend's, which orders the call after the work that wrote `send`.
            unsafe { (n.all_reduce)(s, r, count, dtype, nccl::reduce_op(op), c, st) }
        })
    }

    fn broadcast(
        &self,
        root: usize,
        send: View<'_, CudaBuffer>,
        recv: View<'_, CudaBuffer>,
    ) -> Result<()> {
        let (count, dtype) = (send.layout.numel(), nccl::data_type(send.dtype()));
        self.enqueue(
            CollectiveKind::Broadcast { root },
            send,
            recv,
            |n, s, r, c, st| {
                // SAFETY: as in all_reduce.
                unsafe { (n.broadcast)(s, r, count, dtype, root as i32, c, st) }
            },
        )
    }

    fn all_gather(&self, send: View<'_, CudaBuffer>, recv: View<'_, CudaBuffer>) -> Result<()> {
        let (count, dtype) = (send.layout.numel(), nccl::data_type(send.dtype()));
        self.enqueue(CollectiveKind::AllGather, send, recv, |n, s, r, c, st| {
            // SAFETY: as in all_reduce.
            unsafe { (n.all_gather)(s, r, count, dtype, c, st) }
        })
    }

    fn reduce_scatter(
        &self,
        op: CollectiveOp,
        send: View<'_, CudaBuffer>,
        recv: View<'_, CudaBuffer>,
    ) -> Result<()> {
        let (count, dtype) = (recv.layout.numel(), nccl::data_type(send.dtype()));
        self.enqueue(
            CollectiveKind::ReduceScatter,
            send,
            recv,
            |n, s, r, c, st| {
                // SAFETY: as in all_reduce.
                unsafe { (n.reduce_scatter)(s, r, count, dtype, nccl::reduce_op(op), c, st) }
            },
        )
    }

    fn all_reduce_overlapped(&self, op: CollectiveOp, buf: View<'_, CudaBuffer>) -> Result<()> {
        collective(CollectiveKind::AllReduce, self.rank, self.size, buf, buf)?;
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if comm.is_null() {
            return Err(aborted("all_reduce_overlapped"));
        }
        let dev = &self.backend.dev;
        dev.bind()?;
        let err = |what| move |e| crate::device::driver_error(what, e);
        // SAFETY: the events and streams are live (this communicator's and the backend's).
        unsafe {
            drv::event::record(self.side.ready, dev.stream).map_err(err("cuEventRecord"))?;
            drv::stream::wait_event(
                self.side.stream,
                self.side.ready,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(err("cuStreamWaitEvent"))?;
        }
        let at = address(buf);
        let count = buf.layout.numel();
        // SAFETY: a validated view of a live buffer of this device, held in `pending` until
        // the backend's stream waits for the side stream; the side stream starts after the
        // work that produced it.
        let status = unsafe {
            (self.nccl.all_reduce)(
                at as *const c_void,
                at as *mut c_void,
                count,
                nccl::data_type(buf.dtype()),
                nccl::reduce_op(op),
                *comm,
                self.side.stream as nccl::Stream,
            )
        };
        self.nccl.check("all_reduce_overlapped", *comm, status)?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf.buffer.clone());
        Ok(())
    }

    fn wait_overlapped(&self) -> Result<()> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.is_empty() {
            return Ok(());
        }
        let dev = &self.backend.dev;
        dev.bind()?;
        let err = |what| move |e| crate::device::driver_error(what, e);
        // SAFETY: live events and streams, as above.
        unsafe {
            drv::event::record(self.side.done, self.side.stream).map_err(err("cuEventRecord"))?;
            drv::stream::wait_event(
                dev.stream,
                self.side.done,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(err("cuStreamWaitEvent"))?;
        }
        // The backend's stream now follows the all-reduces: its pool may reuse their memory.
        pending.clear();
        Ok(())
    }

    fn synchronize(&self, timeout: Duration) -> Result<()> {
        self.wait_overlapped()?;
        let deadline = Instant::now() + timeout;
        let dev = &self.backend.dev;
        dev.bind()?;
        loop {
            // SAFETY: the backend's stream.
            let status = unsafe { cudarc::driver::sys::cuStreamQuery(dev.stream) };
            match status {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => break,
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => {
                    return Err(crate::device::driver_error(
                        "cuStreamQuery",
                        cudarc::driver::DriverError(e),
                    ));
                }
            }
            let mut comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
            if !comm.is_null()
                && let Err(e) = self.nccl.async_error(*comm)
            {
                self.abort(&mut comm);
                return Err(e);
            }
            if Instant::now() >= deadline {
                self.abort(&mut comm);
                return Err(Error::Backend {
                    backend: "cuda (NCCL)",
                    detail: format!(
                        "rank {} of {}: the collectives did not finish within {timeout:?} (a \
                         peer that never called, or called with other counts?); the \
                         communicator is aborted",
                        self.rank, self.size
                    ),
                });
            }
            drop(comm);
            std::thread::sleep(Duration::from_micros(50));
        }
        hal::Backend::synchronize(&self.backend)
    }
}
