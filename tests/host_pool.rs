//! The pinned host pool on the simulated device: a block goes back to the
//! pool only once the host saw its copies complete, a dropped copy future
//! proves nothing, the cap and `trim`, statistics per tag, bad input, and
//! the race detector watching host memory.

mod common;

use common::{CountingWaker, drive, poll_once};
use streamalloc::gpu::sim::{RaceKind, SimGpu, SimOp};
use streamalloc::{Access, AllocTag, ResourceError};
use streamalloc::{HostPool, HostPoolConfig};

const TAG: AllocTag = AllocTag("staging");
/// 1024 f32: one page, the smallest size class.
const LEN: usize = 1024;
const CLASS: usize = 4096;

fn pool(f: &common::Fixture<SimGpu>, config: HostPoolConfig) -> HostPool {
    HostPool::new(&f.device, config)
}

#[test]
fn round_trip_then_the_block_is_reused_without_a_pin() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);

    let mut input = host.allocate::<f32>(LEN, TAG).unwrap();
    assert!(
        input.as_slice().unwrap().iter().all(|&x| x == 0.0),
        "a new block is zeroed"
    );
    input.as_mut_slice().unwrap().fill(2.0);
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut to_dev = res.copy_to_device(&input, &mut dev, s).unwrap();
    drive(&gpu, &mut to_dev).unwrap();
    let mut to_host = res.copy_to_host(&dev, &mut input, s).unwrap();
    drive(&gpu, &mut to_host).unwrap();
    // The simulated device stores no data: the host side keeps its bytes.
    assert_eq!(input.as_slice().unwrap()[LEN - 1], 2.0);
    assert_eq!(input.pending_copies(), 0);
    drop(input);

    let stats = host.stats();
    assert_eq!(
        (stats.idle_bytes, stats.pending_bytes, stats.in_use_bytes),
        (CLASS, 0, 0)
    );
    let again = host.allocate::<u32>(LEN, TAG).unwrap();
    assert_eq!(
        again.as_slice().unwrap()[0],
        2.0f32.to_bits(),
        "the same block, as left"
    );
    let stats = host.stats();
    assert_eq!((stats.pins, stats.reuses), (1, 1));
    assert_eq!(stats.held_bytes, CLASS);
    drop((again, dev));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_block_waits_for_its_copy_before_it_is_handed_out_again() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);

    let dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut out = host.allocate::<f32>(LEN, TAG).unwrap();
    let copy = res.copy_to_host(&dev, &mut out, s).unwrap();
    drop(copy);
    // Dropped while the copy is queued (the manual device ran nothing).
    drop(out);
    let stats = host.stats();
    assert_eq!((stats.idle_bytes, stats.pending_bytes), (0, CLASS));
    let other = host.allocate::<f32>(LEN, TAG).unwrap();
    assert_eq!(host.stats().pins, 2, "the pending block was not handed out");
    assert_eq!(host.trim().unwrap(), 0, "a pending block is not unpinned");
    assert_eq!(gpu.host_bytes(), 2 * CLASS);

    // The drop asked for a notification: once the device runs it, the
    // block is idle, with no one awaiting anything.
    gpu.run_until_idle();
    let stats = host.stats();
    assert_eq!((stats.idle_bytes, stats.pending_bytes), (CLASS, 0));
    assert_eq!(host.trim().unwrap(), CLASS);
    assert_eq!(gpu.host_bytes(), CLASS);
    drop((other, dev));
    assert_eq!(host.trim().unwrap(), CLASS);
    assert_eq!(gpu.host_bytes(), 0);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn the_host_side_is_refused_while_a_copy_may_touch_it() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();

    // The device reads it: the host may read, not write.
    let mut to_dev = res.copy_to_device(&buf, &mut dev, s).unwrap();
    assert!(buf.as_slice().is_ok());
    assert_eq!(
        buf.as_mut_slice().unwrap_err(),
        ResourceError::HostBufferBusy { pending: 1 }
    );
    drive(&gpu, &mut to_dev).unwrap();
    assert!(buf.as_mut_slice().is_ok());

    // The device writes it: the host may do neither.
    let mut to_host = res.copy_to_host(&dev, &mut buf, s).unwrap();
    assert!(matches!(
        buf.as_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));
    assert!(matches!(
        buf.as_mut_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));
    drive(&gpu, &mut to_host).unwrap();
    assert!(buf.as_slice().is_ok());
    drop((buf, dev));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_cancelled_copy_future_proves_nothing() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();
    let (_c, waker) = CountingWaker::new();

    let mut copy = res.copy_to_host(&dev, &mut buf, s).unwrap();
    assert!(poll_once(&mut copy, &waker).is_pending());
    drop(copy); // settles its point "Ok" for its owner; the GPU ran nothing
    assert_eq!(buf.pending_copies(), 1);
    assert!(matches!(
        buf.as_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));

    // `ready` makes a point of its own and awaits it.
    let mut ready = Box::pin(buf.ready());
    drive(&gpu, &mut ready).unwrap();
    drop(ready);
    assert_eq!(buf.pending_copies(), 0);
    assert!(buf.as_slice().is_ok());
    drop((buf, dev));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn copies_on_two_streams_are_refused_unless_both_only_read() {
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let (a, b) = (f.stream(0), f.stream(1));
    let mut da = res.try_allocate_buffer::<f32>(LEN, a, TAG).unwrap();
    let mut db = res.try_allocate_buffer::<f32>(LEN, b, TAG).unwrap();
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();

    // Two reads of the host buffer on two streams: fine.
    let mut ra = res.copy_to_device(&buf, &mut da, a).unwrap();
    let mut rb = res.copy_to_device(&buf, &mut db, b).unwrap();
    // A write on a while b's read is unseen: refused, nothing queued.
    let calls = gpu.call_count(streamalloc::DriverCall::MemcpyHostAsync);
    assert_eq!(
        res.copy_to_host(&da, &mut buf, a).unwrap_err(),
        ResourceError::HostBufferBusy { pending: 1 }
    );
    assert_eq!(
        gpu.call_count(streamalloc::DriverCall::MemcpyHostAsync),
        calls
    );
    drive(&gpu, &mut ra).unwrap();
    drive(&gpu, &mut rb).unwrap();
    // Seen complete: the write goes, and a read on b waits for it.
    let mut wa = res.copy_to_host(&da, &mut buf, a).unwrap();
    assert!(matches!(
        res.copy_to_device(&buf, &mut db, b),
        Err(ResourceError::HostBufferBusy { pending: 1 })
    ));
    drive(&gpu, &mut wa).unwrap();
    drop((buf, da, db));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn the_cap_holds_and_trim_gives_idle_blocks_back() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let host = pool(&f, HostPoolConfig::new().cap(2 * CLASS));

    let a = host.allocate::<u8>(CLASS, TAG).unwrap();
    let b = host.allocate::<u8>(100, AllocTag("small")).unwrap();
    let before = host.stats();
    assert_eq!(
        host.allocate::<u8>(1, TAG).unwrap_err(),
        ResourceError::HostPoolFull {
            requested: CLASS,
            cap: 2 * CLASS,
            held: 2 * CLASS
        }
    );
    assert_eq!(host.stats(), before, "a refused allocation changes nothing");
    assert_eq!(before.tag(TAG).current_bytes, CLASS);
    assert_eq!(before.tag(AllocTag("small")).current_bytes, CLASS);

    drop(a);
    // The idle block serves the next request of its class.
    let c = host.allocate::<u8>(CLASS, TAG).unwrap();
    assert_eq!(host.stats().pins, 2);
    drop((b, c));
    assert_eq!(host.stats().idle_bytes, 2 * CLASS);
    // A larger class unpins idle blocks to fit under the cap.
    let big = host.allocate::<u8>(2 * CLASS, AllocTag("big")).unwrap();
    let stats = host.stats();
    assert_eq!(
        (stats.held_bytes, stats.unpins, stats.idle_bytes),
        (2 * CLASS, 2, 0)
    );
    assert_eq!(gpu.host_bytes(), 2 * CLASS);
    assert_eq!(stats.tag(TAG).allocations, 2);
    assert_eq!(stats.tag(TAG).peak_bytes, CLASS);
    assert_eq!(stats.peak_held_bytes, 2 * CLASS);
    drop(big);
    assert_eq!(host.trim().unwrap(), 2 * CLASS);
    assert_eq!((host.stats().held_bytes, gpu.host_bytes()), (0, 0));
}

#[test]
fn bad_input_is_a_clear_error_and_changes_nothing() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let before = host.stats();

    assert_eq!(
        host.allocate::<f32>(0, TAG).unwrap_err(),
        ResourceError::EmptyHostBuffer
    );
    assert_eq!(
        host.allocate::<f64>(usize::MAX / 4, TAG).unwrap_err(),
        ResourceError::SizeOverflow {
            len: usize::MAX / 4,
            elem_size: 8
        }
    );
    // 1 PiB: past what the host can pin.
    assert!(matches!(
        host.allocate::<u8>(1 << 50, TAG).unwrap_err(),
        ResourceError::Driver {
            call: streamalloc::DriverCall::MemHostAlloc,
            ..
        }
    ));
    assert_eq!(host.stats(), before);
    assert_eq!(gpu.host_bytes(), 0);

    // Copies: lengths that differ, a pool of another backend.
    let buf = host.allocate::<f32>(LEN, TAG).unwrap();
    let mut short = res.try_allocate_buffer::<f32>(LEN - 1, s, TAG).unwrap();
    assert_eq!(
        res.copy_to_device(&buf, &mut short, s).unwrap_err(),
        ResourceError::OutOfBounds {
            start: 0,
            end: LEN,
            len: LEN - 1
        }
    );
    let other = common::sim(1);
    let foreign = pool(&other, HostPoolConfig::new())
        .allocate::<f32>(LEN, TAG)
        .unwrap();
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    assert_eq!(
        res.copy_to_device(&foreign, &mut dev, s).unwrap_err(),
        ResourceError::ForeignHostBuffer
    );
    assert_eq!(gpu.call_count(streamalloc::DriverCall::MemcpyHostAsync), 0);
    assert_eq!(buf.pending_copies(), 0);
    drop((buf, short, dev, foreign));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn the_race_detector_sees_host_memory_reused_under_a_copy() {
    // The seam directly, as a pool with a bug would call it.
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let raw = f.pool.raw(f.stream(0)).unwrap();
    let dev = gpu.alloc_async(4096, raw).unwrap();
    let mem = gpu.host_alloc(4096, None).unwrap();

    gpu.copy_to_host_async(mem.addr, dev, 4096, raw).unwrap();
    // The host writes the block while the copy may still write it.
    streamalloc::gpu::Gpu::note_host_access(&*gpu, mem.addr, Access::Write);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    assert_eq!(races[0].later, (SimOp::Host(Access::Write), usize::MAX));
    assert_eq!(races[0].earlier, Some((SimOp::Kernel(Access::Write), 0)));

    // Handed to a new owner while a copy to the device still reads it.
    gpu.copy_to_device_async(dev, mem.addr, 4096, raw).unwrap();
    streamalloc::gpu::Gpu::note_host_reuse(&*gpu, mem.addr);
    assert_eq!(gpu.take_races().len(), 1);

    // Once the host saw the stream done, both are fine.
    gpu.copy_to_host_async(mem.addr, dev, 4096, raw).unwrap();
    gpu.stream_synchronize(raw).unwrap();
    streamalloc::gpu::Gpu::note_host_reuse(&*gpu, mem.addr);
    streamalloc::gpu::Gpu::note_host_access(&*gpu, mem.addr, Access::Write);
    gpu.host_free(mem).unwrap();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    // A second free, or an unpinned range, is refused.
    assert!(gpu.host_free(mem).is_err());
    assert!(gpu.copy_to_host_async(mem.addr, dev, 16, raw).is_err());
}

#[test]
fn a_pending_block_comes_back_by_its_notification_alone() {
    // A threaded device, and nobody awaits or synchronizes anything: the
    // drop asked the stream for a notification, whose delivery is the fact
    // that brings the block back.
    let gpu = SimGpu::builder()
        .op_latency(std::time::Duration::from_millis(2))
        .build();
    let f = common::sim_with(gpu.clone(), 1);
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut out = host.allocate::<f32>(LEN, TAG).unwrap();
    drop(res.copy_to_host(&dev, &mut out, s).unwrap());
    drop(out);

    let guard = std::time::Instant::now();
    while host.stats().pending_bytes != 0 {
        assert!(guard.elapsed() < common::guard(20), "hang");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(host.stats().idle_bytes, CLASS);
    drop(dev);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    assert_eq!(gpu.blocking_calls_in_polls(), 0);
}

#[test]
fn host_handles_are_send_sync_unpin() {
    fn send_sync_unpin_static<T: Send + Sync + Unpin + 'static>() {}
    send_sync_unpin_static::<HostPool>();
    send_sync_unpin_static::<streamalloc::HostBuffer<f32>>();
    send_sync_unpin_static::<streamalloc::HostBuffer<[u8; 16]>>();
    send_sync_unpin_static::<streamalloc::HostPoolStats>();
}

#[test]
fn a_failed_pin_or_copy_changes_nothing() {
    use streamalloc::DriverCall;
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);

    let before = host.stats();
    gpu.fail_nth(DriverCall::MemHostAlloc, 1);
    assert!(matches!(
        host.allocate::<f32>(LEN, TAG),
        Err(ResourceError::Driver {
            call: DriverCall::MemHostAlloc,
            ..
        })
    ));
    assert_eq!(host.stats(), before);
    assert_eq!(gpu.host_bytes(), 0);

    // The driver refuses the copy: nothing queued, the buffer as it was.
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    gpu.fail_nth(DriverCall::MemcpyHostAsync, 1);
    assert!(matches!(
        res.copy_to_host(&dev, &mut buf, s),
        Err(ResourceError::Driver {
            call: DriverCall::MemcpyHostAsync,
            ..
        })
    ));
    assert_eq!(buf.pending_copies(), 0);
    assert!(buf.as_mut_slice().is_ok());
    // And it still copies afterwards.
    let mut copy = res.copy_to_device(&buf, &mut dev, s).unwrap();
    drive(&gpu, &mut copy).unwrap();
    drop(buf);
    assert_eq!(host.stats().idle_bytes, CLASS);

    // An unpin that fails: the block leaves the pool, counted as leaked.
    gpu.fail_nth(DriverCall::MemFreeHost, 1);
    assert_eq!(host.trim().unwrap(), 0);
    let stats = host.stats();
    assert_eq!(
        (stats.held_bytes, stats.leaked_bytes, stats.idle_bytes),
        (0, CLASS, 0)
    );
    drop(dev);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_copy_whose_use_cannot_be_recorded_keeps_its_block_from_everyone() {
    use streamalloc::DriverCall;
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();

    // The copy is queued, then its completion point cannot be made (its
    // event cannot be recorded): the copy will still run.
    let copies = gpu.call_count(DriverCall::MemcpyHostAsync);
    gpu.fail_nth(DriverCall::EventRecord, 1);
    assert!(res.copy_to_host(&dev, &mut buf, s).is_err());
    assert_eq!(gpu.call_count(DriverCall::MemcpyHostAsync), copies + 1);
    assert!(matches!(
        buf.as_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));
    drop(buf);
    let stats = host.stats();
    assert_eq!(
        (stats.leaked_bytes, stats.idle_bytes, stats.pending_bytes),
        (CLASS, 0, 0)
    );
    let next = host.allocate::<f32>(LEN, TAG).unwrap();
    assert_eq!(host.stats().pins, 2, "the leaked block is never handed out");
    drop((next, dev));
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_pending_block_comes_back_behind_a_parked_future_of_its_stream() {
    // A future parked at an earlier point of the stream: the first
    // notification covers only that point; the block's copy, later on the
    // stream, must still be seen complete by the notifications that follow.
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    let (_c, waker) = CountingWaker::new();
    let dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut parked = res.completion(s).unwrap();
    assert!(poll_once(&mut parked, &waker).is_pending());
    assert_eq!(res.parked_points(), 1);

    let mut out = host.allocate::<f32>(LEN, TAG).unwrap();
    drop(res.copy_to_host(&dev, &mut out, s).unwrap());
    drop(out);
    assert_eq!(host.stats().pending_bytes, CLASS);

    let guard = std::time::Instant::now();
    while host.stats().pending_bytes != 0 {
        assert!(
            guard.elapsed() < common::guard(20),
            "the block never came back"
        );
        gpu.run_until_idle();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(drive(&gpu, &mut parked), Ok(()));
    drop(dev);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// The type-erased handle (`into_any`, "every method still there") copies
/// too: the copies once asked for a sized resource.
#[test]
fn the_type_erased_handle_copies_too() {
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f).into_any();
    let host = pool(&f, HostPoolConfig::new());
    let s = f.stream(0);

    let mut staged = host.allocate::<f32>(LEN, TAG).unwrap();
    staged.as_mut_slice().unwrap().fill(3.0);
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut to_dev = res.copy_to_device(&staged, &mut dev, s).unwrap();
    drive(&gpu, &mut to_dev).unwrap();
    let mut to_host = res.copy_to_host(&dev, &mut staged, s).unwrap();
    assert_eq!(staged.pending_copies(), 1, "the copy out is noted");
    drive(&gpu, &mut to_host).unwrap();
    assert_eq!(staged.pending_copies(), 0);
    drop((staged, dev));
    assert_eq!(host.stats().idle_bytes, CLASS, "back to the pool, idle");
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
