//! NCCL, opened at run time: the handful of entry points the collectives use.
//!
//! cudarc's own NCCL bindings look for `libnccl.so` and a list of CUDA-versioned names, not
//! `libnccl.so.2` (the name NCCL's runtime packages install) nor a path the user names, and
//! panic where none loads; this table is opened once, from `HAL_NCCL_LIBRARY` if set, else
//! `libnccl.so.2` and `libnccl.so` through the dynamic loader's search (`LD_LIBRARY_PATH`,
//! the loader cache, the system folders), and its absence is [`hal::Error::Unavailable`].

use hal::{DType, Error, Result};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `ncclComm_t`.
pub(crate) type Comm = *mut c_void;
/// `cudaStream_t` (the driver's `CUstream`).
pub(crate) type Stream = *mut c_void;

/// `ncclUniqueId`: what rank 0 hands the other ranks to form a group.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub internal: [u8; 128],
}

/// The environment variable naming the NCCL library to open.
pub const LIBRARY_VARIABLE: &str = "HAL_NCCL_LIBRARY";

type Status = u32;
const SUCCESS: Status = 0;
const IN_PROGRESS: Status = 7;

pub(crate) struct Nccl {
    _lib: libloading::Library,
    pub version: c_int,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_last_error: unsafe extern "C" fn(Comm) -> *const c_char,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    pub comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status,
    pub comm_abort: unsafe extern "C" fn(Comm) -> Status,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut Status) -> Status,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    pub all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Status,
}

// SAFETY: a table of function pointers into a library that stays loaded; NCCL's entry points
// may be called from any thread.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: "cuda (NCCL)",
        reason,
    }
}

/// The library, opened on first use.
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(open)
        .as_ref()
        .map_err(|reason| unavailable(reason.clone()))
}

fn open() -> std::result::Result<Nccl, String> {
    let named = std::env::var_os(LIBRARY_VARIABLE);
    let candidates: Vec<std::ffi::OsString> = match &named {
        Some(path) => vec![path.clone()],
        None => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    };
    let mut tried = Vec::new();
    let mut lib = None;
    for c in &candidates {
        // SAFETY: opening NCCL runs its initialisers, which only set up the library itself.
        match unsafe { libloading::Library::new(c) } {
            Ok(l) => {
                lib = Some(l);
                break;
            }
            Err(e) => tried.push(format!("{} ({e})", c.to_string_lossy())),
        }
    }
    let Some(lib) = lib else {
        return Err(format!(
            "the NCCL library was not found (tried {}): install NCCL 2 (the libnccl2 package, or \
             PyTorch's nvidia-nccl wheel) and put its folder on LD_LIBRARY_PATH, or set {} to \
             the library's path",
            tried.join(", "),
            LIBRARY_VARIABLE
        ));
    };
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL's C entry point of that name, whose signature
            // (nccl.h, stable since 2.0) the field's type spells.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("the NCCL library lacks {}: {e}", $name))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> Status = sym!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: writes one int.
    if unsafe { get_version(&mut version) } != SUCCESS || version < 21000 {
        return Err(format!(
            "NCCL {version} is too old: the collectives need NCCL 2.10 or newer (its average)"
        ));
    }
    Ok(Nccl {
        version,
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: sym!("ncclGetLastError"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_init_all: sym!("ncclCommInitAll"),
        comm_abort: sym!("ncclCommAbort"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        reduce_scatter: sym!("ncclReduceScatter"),
        all_gather: sym!("ncclAllGather"),
        _lib: lib,
    })
}

impl Nccl {
    /// `Ok` for success; otherwise an error naming `what`, NCCL's code and its last message.
    pub fn check(&self, what: &str, comm: Comm, status: Status) -> Result<()> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: NCCL returns static, NUL-terminated strings.
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let name = text(unsafe { (self.get_error_string)(status) });
        let last = text(unsafe { (self.get_last_error)(comm) });
        Err(Error::Backend {
            backend: "cuda (NCCL)",
            detail: format!(
                "{what}: {name} ({status}){}",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ),
        })
    }

    /// An error the communicator met asynchronously (a peer gone, a network fault), if any.
    pub fn async_error(&self, comm: Comm) -> Result<()> {
        let mut status = SUCCESS;
        // SAFETY: a live communicator; writes one status.
        self.check("ncclCommGetAsyncError", comm, unsafe {
            (self.comm_get_async_error)(comm, &mut status)
        })?;
        if status == IN_PROGRESS {
            return Ok(());
        }
        self.check("the communicator", comm, status)
    }
}

/// NCCL's `ncclDataType_t` for a dtype the collectives carry (validated before).
pub(crate) fn data_type(d: DType) -> c_int {
    match d {
        DType::I32 => 2,
        DType::U32 => 3,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// NCCL's `ncclRedOp_t`.
pub(crate) fn reduce_op(op: hal::CollectiveOp) -> c_int {
    match op {
        hal::CollectiveOp::Sum => 0,
        hal::CollectiveOp::Max => 2,
        hal::CollectiveOp::Min => 3,
        hal::CollectiveOp::Mean => 4,
    }
}
