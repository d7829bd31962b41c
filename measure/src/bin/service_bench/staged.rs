//! `--staged`: the service with real input and output copies (issue 35,
//! item 2), the ways of [`streamalloc_measure::service::staged`] in one
//! process: streamalloc through a `HostPool`, cudarc and cuda-async with
//! pinned buffers per client. Each level (`--clients`, `--rounds`,
//! `--requests` as in the plain mode; the ways in a rotating order) checks
//! every result on the host. Writes `staged.csv` (every round) and
//! `staged.md` (per way and clients, the round with the median
//! requests/s) into `--out`.
//!
//! On the simulated device only the streamalloc way runs, its copies move
//! no data (results unchecked), and the race detector must find nothing:
//! the CI smoke test of the mode.

use std::io::Write;
use std::sync::Arc;

use streamalloc::{Device, HostPool, HostPoolConfig};
use streamalloc_measure::service::cuda_model::CudaModel;
use streamalloc_measure::service::staged::streamalloc_way::{self as pooled, StagedLevel};
use streamalloc_measure::service::staged::{self, StagedRow, cudarc_way};
use streamalloc_measure::service::{Dims, SimKernels};

use super::{
    Args, BoxResult, STREAMS, cuda_context, finish_level, medians, requests_per_client, run_rounds,
    sim_stack, streamalloc_stack,
};

/// The staged mode on the simulated device: the streamalloc way only.
pub(super) async fn on_sim(args: &Args) -> BoxResult<()> {
    let (gpu, device, res) = sim_stack(args)?;
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    println!("staged: results unchecked on the simulated device (its copies move no data)");
    println!("\n{}", staged::table_header());
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let level = StagedLevel {
            dims: Dims::BENCH,
            clients,
            requests_per_client: requests_per_client(args, clients).min(64),
            seed: args.seed,
            verify: false,
        };
        let row = pooled::run_level(&res, &pool, &kernels, level)
            .await
            .map_err(|e| e as Box<dyn std::error::Error>)?;
        println!("{}", row.markdown_row());
        rows.push((0, row));
    }
    let races = gpu.races();
    println!("race detector: {} race(s)", races.len());
    let stats = pool.stats();
    println!(
        "host pool: {} pins, {} reuses, {} B in use at the end",
        stats.pins, stats.reuses, stats.in_use_bytes
    );
    finish_level(&res, 0).await?;
    write_outputs(args, &rows, "simulated device")?;
    if !races.is_empty() || stats.in_use_bytes != 0 {
        return Err("races or host buffers in use on the simulated device".into());
    }
    Ok(())
}

/// The staged ways on CUDA.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    Streamalloc,
    Cudarc,
    #[cfg(feature = "peer-cuda-async")]
    CudaAsync,
}

/// The staged mode on CUDA: the three ways, every result checked.
pub(super) async fn on_cuda(args: &Args) -> BoxResult<()> {
    let ctx = cuda_context()?;
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let model = Arc::new(CudaModel::new(&ctx, Dims::BENCH, max_clients)?);
    let streams = (0..STREAMS)
        .map(|_| ctx.new_stream())
        .collect::<Result<Vec<_>, _>>()?;
    let mut pins = cudarc_way::Pins::new(&ctx, Dims::BENCH, max_clients)?;
    #[cfg(feature = "peer-cuda-async")]
    let mut peer = {
        use streamalloc_measure::service::cuda_async_way::CudaAsyncWay;
        use streamalloc_measure::service::staged::cuda_async_way::StagedCudaAsync;
        let started = CudaAsyncWay::new(&ctx, model.clone(), STREAMS)
            .and_then(|way| StagedCudaAsync::new(Arc::new(way), &ctx, model.clone(), max_clients));
        match started {
            Ok(p) => Some(p),
            Err(e) => {
                println!("cuda-async: could not start ({e}); its rows are left out");
                None
            }
        }
    };
    let ways: Vec<Way> = [
        Way::Streamalloc,
        Way::Cudarc,
        #[cfg(feature = "peer-cuda-async")]
        Way::CudaAsync,
    ]
    .into_iter()
    .filter(|w| {
        #[cfg(feature = "peer-cuda-async")]
        if *w == Way::CudaAsync {
            return peer.is_some();
        }
        let _ = w;
        true
    })
    .collect();
    #[cfg(not(feature = "peer-cuda-async"))]
    println!("cuda-async: not built (build with --features peer-cuda-async and CUDA_TOOLKIT_PATH)");
    println!(
        "staged: every request's input written on the host, copied in and its result copied out and checked; \
         peers pin {} MiB per client beforehand",
        (pins.bytes() / max_clients.max(1)) >> 20
    );

    let level = async |way: Way, clients: usize, per: usize| -> BoxResult<StagedRow> {
        let row = match way {
            Way::Streamalloc => {
                // A fresh device per level, as the plain way's (its memory
                // pool keeps what it reserved), and a pool on it.
                let device = Device::cuda(0, STREAMS)?;
                let res = streamalloc_stack(&device, &model, args.policy)?;
                let pool = HostPool::new(&device, HostPoolConfig::new());
                let level = StagedLevel {
                    dims: Dims::BENCH,
                    clients,
                    requests_per_client: per,
                    seed: args.seed,
                    verify: true,
                };
                let row = pooled::run_level(&res, &pool, &model, level).await;
                finish_level(&res, clients).await?;
                row
            }
            Way::Cudarc => {
                cudarc_way::run_level(&ctx, &streams, &model, &mut pins, clients, per, args.seed)
                    .await
            }
            #[cfg(feature = "peer-cuda-async")]
            Way::CudaAsync => match peer.as_mut() {
                Some(p) => p.run_level(clients, per, args.seed).await,
                None => Err("cuda-async did not start".into()),
            },
        };
        row.map_err(|e| format!("{way:?} at {clients} clients: {e}").into())
    };
    let header = staged::table_header();
    let rows = run_rounds(args, &ways, header, level, StagedRow::markdown_row).await?;
    let card = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
    write_outputs(args, &rows, &card)
}

fn write_outputs(args: &Args, rows: &[(usize, StagedRow)], device: &str) -> BoxResult<()> {
    let mut csv = std::fs::File::create(args.out.join("staged.csv"))?;
    writeln!(csv, "round,{}", staged::csv_header())?;
    for (round, r) in rows {
        writeln!(csv, "{round},{}", r.csv_row())?;
    }
    let med = medians(rows, |r| &r.row);
    let mut md = std::fs::File::create(args.out.join("staged.md"))?;
    writeln!(
        md,
        "Inference service with real input and output copies on {device}: per way and clients, \
         the round (of {}) with the median requests/s.\n",
        args.rounds
    )?;
    writeln!(md, "{}", staged::table_header())?;
    println!("\n{}", staged::table_header());
    for r in &med {
        writeln!(md, "{}", r.markdown_row())?;
        println!("{}", r.markdown_row());
    }
    println!("wrote {}", args.out.display());
    Ok(())
}
