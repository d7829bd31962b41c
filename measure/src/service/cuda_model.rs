//! The model every way runs on CUDA: four GEMMs through cuBLAS and two ReLUs
//! (a hand-written PTX kernel), with the input copied in from pinned host
//! memory and the output copied out to the client's pinned buffer.
//!
//! ```text
//!  x ← input                 (host to device, rows × hidden)
//!  h ← relu(x · W1)          (hidden → inner)
//!  x ← h · W2                (inner → hidden, into the input's buffer)
//!  h ← relu(x · W3)
//!  y ← h · W4                (inner → out)
//!  output[client] ← y        (device to host)
//! ```
//!
//! It works on raw device pointers and raw streams, so that each way orders
//! and awaits the same work its own way. cuBLAS (`libcublas.so`) is loaded
//! at run time through cudarc: [`CudaModel::new`] says so when it is
//! missing (put `/usr/local/cuda/lib64` on `LD_LIBRARY_PATH`). One cuBLAS
//! handle per stream, made on first use and bound to that stream: a handle
//! is used by one enqueue at a time (its lock), and never moves between
//! streams.
//!
//! Weights and input are filled with constants, so that every output
//! element of a request is the same known value
//! ([`expected_output`](CudaModel::expected_output)):
//! [`output_matches`](CudaModel::output_matches) checks a request's result.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as blas;
use cudarc::driver::sys::{self as cu, CUdeviceptr, CUfunction, CUmodule, CUstream};
use cudarc::driver::{CudaContext, DriverError};
use streamalloc::DriverCall;
use streamalloc::RawStream;
use streamalloc::gpu::{GpuError, GpuResult};

use super::timeline::Timeline;
use super::{Dims, ModelKernels, RequestIo, RequestKernels};

/// `y = max(y, 0)` over `n` floats, one thread per element (what nvcc
/// emits for the obvious CUDA C, PTX ISA 7.0: any driver since CUDA 11 JITs it).
const RELU_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry relu_f32(
	.param .u64 relu_f32_param_0,
	.param .u32 relu_f32_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .f32 	%f<3>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [relu_f32_param_0];
	ld.param.u32 	%r2, [relu_f32_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.f32 	%f1, [%rd4];
	max.f32 	%f2, %f1, 0f00000000;
	st.global.f32 	[%rd4], %f2;
$L__BB0_2:
	ret;
}
"#;

/// The byte every weight is filled with (each weight is then
/// `f32::from_bits(0x3c3c3c3c)` ≈ 0.0115).
const WEIGHT_BYTE: u8 = 0x3c;
/// Every input element.
const INPUT_VALUE: f32 = 0.5;

/// A cuBLAS handle, used under its lock only.
struct Blas(blas::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread as long as one thread
// uses it at a time; every use is under the `Mutex` that holds it.
unsafe impl Send for Blas {}

/// Pinned host memory from `cuMemHostAlloc`, freed on drop.
struct Pinned {
    ptr: *mut c_void,
    bytes: usize,
}

// SAFETY: the pointer is plain host memory owned by this value; the model
// reads it only through the driver's copies, ordered by the callers.
unsafe impl Send for Pinned {}
// SAFETY: as for `Send`: shared access hands out the address only.
unsafe impl Sync for Pinned {}

/// The model of the service, on CUDA (see the module documentation).
pub struct CudaModel {
    ctx: Arc<CudaContext>,
    dims: Dims,
    /// W1 (hidden × inner), W2 (inner × hidden), W3 (hidden × inner),
    /// W4 (inner × out), row-major.
    weights: [CUdeviceptr; 4],
    module: CUmodule,
    relu: CUfunction,
    handles: Mutex<HashMap<u64, Arc<Mutex<Blas>>>>,
    /// The input of every request (read only, by the copies in).
    input: Pinned,
    /// One output buffer per client.
    outputs: Vec<Pinned>,
    /// Timing events around each request while a level is recorded
    /// (`--diag`).
    timeline: Timeline,
}

// SAFETY: the raw handles (module, function, device pointers) are immutable
// after `new` and valid until `drop`; the driver accepts them from any
// thread of the context, which every call binds first.
unsafe impl Send for CudaModel {}
// SAFETY: as for `Send`; the mutable parts (cuBLAS handles) are behind locks.
unsafe impl Sync for CudaModel {}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("dims", &self.dims)
            .field("clients", &self.outputs.len())
            .finish_non_exhaustive()
    }
}

fn driver(call: DriverCall, e: DriverError) -> GpuError {
    GpuError::driver(call, e.0 as i32, format!("{e:?}"))
}

fn cublas(what: &str, status: blas::cublasStatus_t) -> GpuResult<()> {
    if status == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::driver(
            DriverCall::Launch,
            status as i32,
            format!("{what}: {status:?}"),
        ))
    }
}

impl CudaModel {
    /// Loads cuBLAS and the ReLU kernel on `ctx`, allocates and fills the
    /// weights, the shared pinned input and one pinned output buffer per
    /// client (`clients` of them). Synchronizes once, at the end.
    ///
    /// # Errors
    /// `libcublas` not found (a clear message, no panic), or a driver error.
    pub fn new(ctx: &Arc<CudaContext>, dims: Dims, clients: usize) -> GpuResult<Self> {
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { blas::is_culib_present() } {
            return Err(GpuError::driver(
                DriverCall::Init,
                0,
                "libcublas not found: put the CUDA libraries (/usr/local/cuda/lib64) on LD_LIBRARY_PATH",
            ));
        }
        ctx.bind_to_thread()
            .map_err(|e| driver(DriverCall::Init, e))?;
        let src = CString::new(RELU_PTX).expect("the PTX has no NUL");
        // SAFETY: `src` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { cudarc::driver::result::module::load_data(src.as_ptr().cast()) }
            .map_err(|e| driver(DriverCall::Launch, e))?;
        let name = CString::new("relu_f32").expect("no NUL");
        // SAFETY: `module` was just loaded and holds `relu_f32`.
        let relu = unsafe { cudarc::driver::result::module::get_function(module, name) }
            .map_err(|e| driver(DriverCall::Launch, e))?;
        let mut model = CudaModel {
            ctx: ctx.clone(),
            dims,
            weights: [0; 4],
            module,
            relu,
            handles: Mutex::new(HashMap::new()),
            input: Pinned {
                ptr: std::ptr::null_mut(),
                bytes: 0,
            },
            outputs: Vec::new(),
            timeline: Timeline::default(),
        };
        let (h, i, o) = (dims.hidden, dims.inner, dims.out);
        for (w, elems) in model.weights.iter_mut().zip([h * i, i * h, h * i, i * o]) {
            let bytes = elems * 4;
            // SAFETY: a plain allocation; freed in `drop`.
            *w = unsafe { cudarc::driver::result::malloc_sync(bytes) }
                .map_err(|e| driver(DriverCall::AllocAsync, e))?;
            // SAFETY: `*w` holds `bytes` bytes; the null stream orders the
            // fill before the synchronize below.
            unsafe { cu::cuMemsetD8_v2(*w, WEIGHT_BYTE, bytes) }
                .result()
                .map_err(|e| driver(DriverCall::MemsetAsync, e))?;
        }
        model.input = pinned(dims.max_rows() * h * 4)?;
        // SAFETY: `input` holds max_rows × hidden floats, written only here.
        let input = unsafe {
            std::slice::from_raw_parts_mut(model.input.ptr.cast::<f32>(), dims.max_rows() * h)
        };
        input.fill(INPUT_VALUE);
        for _ in 0..clients {
            model.outputs.push(pinned(dims.max_rows() * o * 4)?);
        }
        // SAFETY: no argument; waits for the fills.
        unsafe { cu::cuCtxSynchronize() }
            .result()
            .map_err(|e| driver(DriverCall::StreamSynchronize, e))?;
        Ok(model)
    }

    /// The value of every output element.
    pub fn expected_output(&self) -> f32 {
        expected_output(self.dims, INPUT_VALUE)
    }

    /// Whether client `client`'s output holds the expected value in its
    /// first `rows` rows (to 0.1 %). Read it only after the request's work
    /// completed.
    pub fn output_matches(&self, client: usize, rows: usize) -> bool {
        let Some(out) = self.outputs.get(client) else {
            return false;
        };
        let n = (rows * self.dims.out).min(out.bytes / 4);
        // SAFETY: `out` holds at least `n` floats; the caller says the copy
        // into it has completed, and no other request of this client runs.
        let got = unsafe { std::slice::from_raw_parts(out.ptr.cast::<f32>(), n) };
        let want = self.expected_output();
        got.iter().all(|v| (v - want).abs() <= want.abs() * 1e-3)
    }

    /// The timing events around each request (see [`Timeline`]).
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The model's widths.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// Makes the cuBLAS handle of `stream` now (it is otherwise made on the
    /// stream's first request, inside a measurement).
    ///
    /// # Errors
    /// A cuBLAS error.
    ///
    /// # Safety
    /// `stream` is a live stream of this model's context.
    pub unsafe fn prepare_stream(&self, stream: CUstream) -> GpuResult<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver(DriverCall::Init, e))?;
        self.handle(stream).map(drop)
    }

    /// The cuBLAS handle of `stream`, made and bound to it on first use.
    fn handle(&self, stream: CUstream) -> GpuResult<Arc<Mutex<Blas>>> {
        let mut map = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = map.get(&(stream as u64)) {
            return Ok(h.clone());
        }
        let handle = cudarc::cublas::result::create_handle().map_err(|e| {
            GpuError::driver(DriverCall::Init, e.0 as i32, format!("cublasCreate: {e:?}"))
        })?;
        // SAFETY: `handle` was just created; `stream` is a live stream of
        // this context (the caller's).
        let set = unsafe { blas::cublasSetStream_v2(handle, stream as blas::cudaStream_t) };
        if let Err(e) = cublas("cublasSetStream", set) {
            // SAFETY: created above, used by no one.
            unsafe { blas::cublasDestroy_v2(handle) };
            return Err(e);
        }
        let h = Arc::new(Mutex::new(Blas(handle)));
        map.insert(stream as u64, h.clone());
        Ok(h)
    }

    /// Queues one request on `stream`: the input copied in, the model, the
    /// output copied out to client `client`'s pinned buffer.
    ///
    /// # Errors
    /// An unknown client, too many rows, a driver or cuBLAS error.
    ///
    /// # Safety
    /// `stream` is a live stream of this model's context; `x`, `h`, `y` are
    /// live device allocations of at least rows × hidden, rows × inner and
    /// rows × out floats, ordered on `stream` (their allocation and every
    /// other use come before it in stream order), and kept until the work
    /// completes; client `client` sends no other request until then.
    pub unsafe fn enqueue_raw(
        &self,
        stream: CUstream,
        [x, h, y]: [CUdeviceptr; 3],
        rows: usize,
        client: usize,
    ) -> GpuResult<()> {
        let out = self.outputs.get(client).ok_or_else(|| {
            GpuError::driver(
                DriverCall::Launch,
                0,
                format!("no output buffer for client {client}"),
            )
        })?;
        self.check_rows(rows)?;
        let d = self.dims;
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver(DriverCall::Launch, e))?;
        // SAFETY: `stream` is live (this function's contract).
        let mark = unsafe { self.timeline.start(stream) };
        // SAFETY: `input` holds max_rows × hidden floats ≥ rows × hidden;
        // it is pinned and never written after `new`. `x` holds rows ×
        // hidden floats (the caller's contract).
        unsafe { cu::cuMemcpyHtoDAsync_v2(x, self.input.ptr, rows * d.hidden * 4, stream) }
            .result()
            .map_err(|e| driver(DriverCall::CopyAsync, e))?;
        // SAFETY: this function's contract is the model's.
        unsafe { self.queue_model(stream, [x, h, y], rows)? };
        // SAFETY: `out` holds max_rows × out floats ≥ rows × out, pinned;
        // the client sends one request at a time, so nothing else writes or
        // reads it until this request completes.
        let copied = unsafe { cu::cuMemcpyDtoHAsync_v2(out.ptr, y, rows * d.out * 4, stream) }
            .result()
            .map_err(|e| driver(DriverCall::CopyAsync, e));
        // SAFETY: the stream `mark` was recorded on.
        unsafe { self.timeline.end(mark, stream) };
        copied
    }

    /// Queues the model alone on `stream`, reading the input the caller
    /// copied into `x` and leaving the result in `y` (the staged service,
    /// whose ways copy in and out themselves).
    ///
    /// # Errors
    /// Too many rows, a driver or cuBLAS error.
    ///
    /// # Safety
    /// `stream` is a live stream of this model's context; `x`, `h`, `y` are
    /// live device allocations of at least rows × hidden, rows × inner and
    /// rows × out floats, ordered on `stream` (their allocation, the copy
    /// into `x` and every other use come before it in stream order), and
    /// kept until the work completes.
    pub unsafe fn enqueue_model_raw(
        &self,
        stream: CUstream,
        buffers: [CUdeviceptr; 3],
        rows: usize,
    ) -> GpuResult<()> {
        self.check_rows(rows)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver(DriverCall::Launch, e))?;
        // SAFETY: this function's contract is the model's.
        unsafe { self.queue_model(stream, buffers, rows) }
    }

    fn check_rows(&self, rows: usize) -> GpuResult<()> {
        if rows > self.dims.max_rows() {
            return Err(GpuError::driver(
                DriverCall::Launch,
                0,
                format!("{rows} rows > the model's {}", self.dims.max_rows()),
            ));
        }
        Ok(())
    }

    /// The four GEMMs and two ReLUs of a request on `stream` (the context
    /// bound, the rows checked).
    ///
    /// # Safety
    /// As [`enqueue_model_raw`](Self::enqueue_model_raw).
    unsafe fn queue_model(
        &self,
        stream: CUstream,
        [x, h, y]: [CUdeviceptr; 3],
        rows: usize,
    ) -> GpuResult<()> {
        let d = self.dims;
        let blas = self.handle(stream)?;
        let blas = blas.lock().unwrap_or_else(|p| p.into_inner());
        let [w1, w2, w3, w4] = self.weights;
        let gemm = |a: CUdeviceptr, b: CUdeviceptr, c: CUdeviceptr, n_out: usize, k: usize| {
            // Row-major C[rows × n_out] = B[rows × k] · A[k × n_out] is, in
            // cuBLAS's column-major terms, Cᵀ = Aᵀ · Bᵀ with no transposes.
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: a, b, c are live device buffers of at least k × n_out,
            // rows × k and rows × n_out floats; the handle is ours (locked)
            // and bound to `stream`; alpha and beta outlive the call (host
            // pointer mode reads them before it returns).
            let status = unsafe {
                blas::cublasSgemm_v2(
                    blas.0,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    n_out as i32,
                    rows as i32,
                    k as i32,
                    &alpha,
                    a as *const f32,
                    n_out as i32,
                    b as *const f32,
                    k as i32,
                    &beta,
                    c as *mut f32,
                    n_out as i32,
                )
            };
            cublas("cublasSgemm", status)
        };
        let relu = |p: CUdeviceptr, n: usize| {
            let mut ptr = p;
            let mut len = n as u32;
            let mut params = [
                (&mut ptr as *mut CUdeviceptr).cast::<c_void>(),
                (&mut len as *mut u32).cast::<c_void>(),
            ];
            let blocks = n.div_ceil(256) as u32;
            // SAFETY: `relu_f32(u64 ptr, u32 n)` takes exactly these two
            // parameters, which live across the call; `p` holds `n` floats.
            unsafe {
                cu::cuLaunchKernel(
                    self.relu,
                    blocks,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .map_err(|e| driver(DriverCall::Launch, e))
        };
        gemm(w1, x, h, d.inner, d.hidden)?;
        relu(h, rows * d.inner)?;
        gemm(w2, h, x, d.hidden, d.inner)?;
        gemm(w3, x, h, d.inner, d.hidden)?;
        relu(h, rows * d.inner)?;
        gemm(w4, h, y, d.out, d.inner)
    }
}

impl RequestKernels for CudaModel {
    fn enqueue(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        let raw = stream.get() as CUstream;
        // SAFETY: the streamalloc way calls this from a `launch` on a
        // stream of its CUDA pool (this context's), declaring x, h, y as
        // written: the launch ordered them on the stream, their buffers
        // outlive the launch's completion future, which the request awaits
        // before its client sends again.
        unsafe {
            self.enqueue_raw(
                raw,
                [io.x.ptr(), io.h.ptr(), io.y.ptr()],
                io.rows,
                io.client,
            )
        }
    }
}

impl ModelKernels for CudaModel {
    fn enqueue_model(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        let raw = stream.get() as CUstream;
        // SAFETY: the staged streamalloc way calls this from a `launch` on
        // a stream of its CUDA pool (this context's), declaring x, h, y as
        // written, after queuing the copy into x on the same stream: the
        // launch ordered them there, and their buffers outlive the copy out
        // of y, which the request awaits before dropping them.
        unsafe { self.enqueue_model_raw(raw, [io.x.ptr(), io.h.ptr(), io.y.ptr()], io.rows) }
    }
}

/// The value of every output element of a request whose input elements
/// are all `input` (positive: both ReLUs then pass everything, so the
/// output is `input` times the product of the layers' sums).
pub fn expected_output(dims: Dims, input: f32) -> f32 {
    let w = f32::from_bits(u32::from_ne_bytes([WEIGHT_BYTE; 4]));
    let (h, i) = (dims.hidden as f32, dims.inner as f32);
    let h1 = (input * w * h).max(0.0);
    let x2 = h1 * w * i;
    let h2 = (x2 * w * h).max(0.0);
    h2 * w * i
}

fn pinned(bytes: usize) -> GpuResult<Pinned> {
    // SAFETY: a plain pinned allocation (flags 0: readable by the host at
    // full speed); freed in `Pinned::drop`.
    let ptr = unsafe { cudarc::driver::result::malloc_host(bytes, 0) }
        .map_err(|e| driver(DriverCall::AllocAsync, e))?;
    Ok(Pinned { ptr, bytes })
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: from `cuMemHostAlloc`, freed once; the model's owner
            // synchronized the work that used it (see `CudaModel::drop`).
            let _ = unsafe { cudarc::driver::result::free_host(self.ptr) };
        }
    }
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: waits for every request's work before anything it used goes.
        let _ = unsafe { cu::cuCtxSynchronize() }.result();
        for (_, h) in self
            .handles
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let h = h.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: no work is queued with it any more; destroyed once.
            unsafe { blas::cublasDestroy_v2(h.0) };
        }
        for w in self.weights {
            if w != 0 {
                // SAFETY: from `malloc_sync`, unused after the synchronize.
                let _ = unsafe { cudarc::driver::result::free_sync(w) };
            }
        }
        // SAFETY: the function's work completed; the module goes once.
        let _ = unsafe { cudarc::driver::result::module::unload(self.module) };
    }
}
