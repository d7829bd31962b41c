//! cuBLAS on owned buffers: `C = A·B` with cudarc's `Gemm`, the operands in
//! [`CudaBuffer`]s on two streams (A and B copied in on stream 0, the GEMM
//! on stream 1), ordered by the buffers. Needs a GPU and the `cublas`
//! feature (cuBLAS is loaded at run time, like libcuda).
//!
//! ```text
//! cargo run --example gemm --features cublas
//! ```

use std::error::Error;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use streamalloc::{AllocTag, CudaBuffer, Device, StreamOrderedResource};

const M: usize = 64;

fn main() -> Result<(), Box<dyn Error>> {
    // SAFETY: only tries to load the library by its usual names.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err("libcublas could not be loaded".into());
    }
    let device = Device::open_cuda(0, 2)?;
    let pool = device.streams().clone();
    let res = Arc::new(StreamOrderedResource::new(&device));
    let (io, compute) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    let (io_s, compute_s) = (pool.cuda_stream(io)?.clone(), pool.cuda_stream(compute)?);
    let blas = CudaBlas::new(compute_s.clone())?;

    // Column-major A (M×M) = i + j, B = identity·2: C must be 2·A.
    let a_host: Vec<f32> = (0..M * M).map(|k| (k % M + k / M) as f32).collect();
    let b_host: Vec<f32> = (0..M * M)
        .map(|k| if k % M == k / M { 2.0 } else { 0.0 })
        .collect();
    let alloc = |tag| res.allocate_buffer::<f32>(M * M, io, AllocTag(tag));
    let mut a = CudaBuffer::new(alloc("a")?)?;
    let mut b = CudaBuffer::new(alloc("b")?)?;
    let mut c = CudaBuffer::new(alloc("c")?)?;
    io_s.memcpy_htod(&a_host, &mut a)?;
    io_s.memcpy_htod(&b_host, &mut b)?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: M as i32,
        n: M as i32,
        k: M as i32,
        alpha: 1.0f32,
        lda: M as i32,
        ldb: M as i32,
        beta: 0.0,
        ldc: M as i32,
    };
    // SAFETY: every operand holds M×M floats, as the configuration says.
    unsafe { blas.gemm(cfg, &a, &b, &mut c) }?; // on stream 1, after the copies
    let c_host = io_s.clone_dtoh(&c)?; // stream 0 waits for the GEMM
    io_s.synchronize()?;
    let wrong = (0..M * M).filter(|&k| c_host[k] != 2.0 * a_host[k]).count();
    assert_eq!(wrong, 0, "{wrong} wrong elements");
    println!("cuBLAS SGEMM {M}x{M} through CudaBuffers: correct");
    drop((a, b, c));
    streamalloc::DeviceMemoryResource::reap_pending(&*res)?;
    assert_eq!(
        streamalloc::DeviceMemoryResource::bytes_outstanding(&*res),
        0
    );
    Ok(())
}
