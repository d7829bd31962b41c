//! Virtual memory management on the simulated device: capacity shared with
//! the pool, the held high-water mark, and the checks a caller-managed
//! arena relies on (unmapping memory still in use, reuse not ordered after
//! a free, access to unmapped memory).

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::{Access, AllocTag, Device, DeviceMemoryResource, SimResource};

const G: usize = 2 << 20;

fn at(ptr: u64, access: Access) -> MemAccess {
    MemAccess { ptr, access }
}

#[test]
fn physical_memory_shares_the_capacity_and_counts_in_the_peak() {
    let gpu = SimGpu::builder().manual().capacity(8 * G).build();
    assert_eq!(gpu.vm_granularity().unwrap(), G);
    let device = Device::simulated(&gpu, 1);
    let resource = SimResource::new(&device);
    let s = device.stream(0).unwrap();
    let block = resource.allocate(4 * G, s, AllocTag::UNTAGGED).unwrap();
    let a = gpu.mem_create(2 * G).unwrap();
    let b = gpu.mem_create(2 * G).unwrap();
    assert_eq!(gpu.held_bytes(), 8 * G);
    assert!(
        matches!(
            gpu.mem_create(G),
            Err(streamalloc::gpu::GpuError::OutOfMemory { .. })
        ),
        "the pool and the handles share one capacity"
    );
    gpu.mem_release(a).unwrap();
    gpu.mem_release(b).unwrap();
    assert_eq!(gpu.held_bytes(), 4 * G);
    assert_eq!(gpu.peak_held_bytes(), 8 * G);
    gpu.reset_peak_held();
    assert_eq!(gpu.peak_held_bytes(), 4 * G);
    resource.deallocate(block).unwrap();
    assert_eq!(gpu.physical_handles(), 0);
}

#[test]
fn bad_mappings_are_refused() {
    let gpu = SimGpu::builder().manual().build();
    let va = gpu.address_reserve(4 * G).unwrap();
    assert!(
        gpu.address_reserve(G + 1).is_err(),
        "not a granule multiple"
    );
    assert!(gpu.mem_create(G / 2).is_err(), "not a granule multiple");
    let h = gpu.mem_create(G).unwrap();
    // The simulated device checks every argument itself: safe calls.
    assert!(gpu.mem_map(va + 512, G, h).is_err(), "unaligned");
    assert!(gpu.mem_map(va, 2 * G, h).is_err(), "size of another handle");
    assert!(gpu.mem_set_access(va, G).is_err(), "nothing mapped");
    gpu.mem_map(va, G, h).unwrap();
    assert!(gpu.address_free(va, 4 * G).is_err(), "still mapped");
    gpu.mem_unmap(va, G).unwrap();
    gpu.mem_release(h).unwrap();
    assert!(gpu.mem_release(h).is_err(), "released twice");
    gpu.address_free(va, 4 * G).unwrap();
    assert!(gpu.races().is_empty());
}

/// Hostile ranges and handles through the safe calls: a clear error, no
/// panic (a range past `u64::MAX` overflowed the reservation check), and
/// nothing changed.
#[test]
fn hostile_ranges_and_handles_are_refused_and_change_nothing() {
    let gpu = SimGpu::builder().manual().build();
    let va = gpu.address_reserve(2 * G).unwrap();
    let h = gpu.mem_create(2 * G).unwrap();
    let top = u64::MAX - G as u64 + 1; // aligned, and `top + 2 G` wraps
    assert!(gpu.mem_map(top, 2 * G, h).is_err(), "past u64::MAX");
    assert!(gpu.mem_set_access(top, 2 * G).is_err());
    assert!(gpu.mem_unmap(top, 2 * G).is_err());
    assert!(gpu.address_free(top, 2 * G).is_err());
    assert!(gpu.address_free(va, G).is_err(), "part of a reservation");
    let foreign = streamalloc::gpu::RawPhysical::new(h.get() + 1000);
    assert!(gpu.mem_map(va, 2 * G, foreign).is_err(), "never made");
    assert!(gpu.mem_release(foreign).is_err(), "never made");
    // Nothing changed: the real range and handle still work.
    gpu.mem_map(va, 2 * G, h).unwrap();
    gpu.mem_set_access(va, 2 * G).unwrap();
    gpu.mem_unmap(va, 2 * G).unwrap();
    gpu.mem_release(h).unwrap();
    gpu.address_free(va, 2 * G).unwrap();
    assert_eq!(gpu.physical_handles(), 0);
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

#[test]
fn a_device_without_virtual_memory_says_so() {
    let gpu = SimGpu::builder().manual().vm_granularity(0).build();
    assert!(gpu.vm_granularity().is_err());
    assert!(gpu.address_reserve(G).is_err());
    assert!(gpu.mem_create(G).is_err());
}

/// A mapped, accessible granule and a stream.
fn mapped(gpu: &SimGpu) -> (u64, streamalloc::RawStream, streamalloc::RawStream) {
    let va = gpu.address_reserve(G).unwrap();
    let h = gpu.mem_create(G).unwrap();
    gpu.mem_map(va, G, h).unwrap();
    gpu.mem_set_access(va, G).unwrap();
    gpu.mem_release(h).unwrap();
    (va, gpu.create_stream(), gpu.create_stream())
}

#[test]
fn unmapping_memory_that_queued_work_uses_is_reported() {
    let gpu = SimGpu::builder().manual().build();
    let (va, s, _) = mapped(&gpu);
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    gpu.note_subfree(va, s);
    // Deliberately wrong (the kernel has not run, manual mode): the
    // simulated device takes it and reports it.
    gpu.mem_unmap(va, G).unwrap();
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::UnmapInUse);
    // Memory no longer mapped is an invalid address.
    gpu.launch_kernel(s, &[at(va, Access::Read)]).unwrap();
    assert_eq!(gpu.take_races()[0].kind, RaceKind::InvalidAddress);
}

#[test]
fn unmapping_after_the_host_saw_the_work_complete_is_fine() {
    let gpu = SimGpu::builder().manual().build();
    let (va, s, _) = mapped(&gpu);
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    gpu.note_subfree(va, s);
    let e = gpu.event_create().unwrap();
    gpu.event_record(e, s).unwrap();
    assert!(!gpu.event_query(e).unwrap());
    gpu.run_until_idle();
    assert!(gpu.event_query(e).unwrap(), "the query tells the host");
    // The host saw everything on the memory complete.
    gpu.mem_unmap(va, G).unwrap();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

#[test]
fn suballocations_are_checked_like_allocations() {
    let gpu = SimGpu::builder().manual().build();
    let (va, s, t) = mapped(&gpu);
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    gpu.note_subfree(va, s);
    // Reuse on the freeing stream is ordered by the stream.
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
    // A use after the free is reported.
    gpu.note_subfree(va, s);
    gpu.launch_kernel(s, &[at(va, Access::Read)]).unwrap();
    assert_eq!(gpu.take_races()[0].kind, RaceKind::UseAfterFree);
    // Reuse on another stream without a wait races with the free.
    gpu.note_suballocation(va, 4096, t);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
}

/// An allocation undone as never used (the block a reservation's refused
/// try gives back) hands back the history it replaced: the next allocation
/// there must be ordered after the free before it, as if the undone one had
/// never been made. A false claim (the memory was used) is reported.
#[test]
fn an_undone_suballocation_gives_back_the_history_it_replaced() {
    use streamalloc::gpu::sim::SimOp;
    let gpu = SimGpu::builder().manual().build();
    let (va, s, t) = mapped(&gpu);
    let u = gpu.create_stream();
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    gpu.note_subfree(va, s);
    // `t` takes the memory behind a wait for the free, and gives it back
    // untouched.
    let e = gpu.event_create().unwrap();
    gpu.event_record(e, s).unwrap();
    gpu.stream_wait_event(t, e).unwrap();
    gpu.note_suballocation(va, 4096, t);
    gpu.note_suballocation_undone(va, t);
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
    // `u` takes it with no wait: it races the free on `s` (not `t`'s
    // allocation, which never happened as far as the memory goes).
    gpu.note_suballocation(va, 4096, u);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    assert!(
        matches!(races[0].earlier, Some((SimOp::Free, _))),
        "{races:#?}"
    );
    // Used, then claimed unused: reported.
    gpu.launch_kernel(u, &[at(va, Access::Write)]).unwrap();
    gpu.note_suballocation_undone(va, u);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert!(
        matches!(races[0].earlier, Some((SimOp::Kernel(Access::Write), _))),
        "{races:#?}"
    );
    gpu.run_until_idle();
}

/// A free whose caller says the GPU is done with the memory (the cache's
/// free of a buffer whose last launch settled) is checked against what the
/// host saw complete: a false claim is reported, a true one lets another
/// stream take the memory with no wait.
#[test]
fn a_free_claimed_complete_is_checked_against_what_the_host_saw() {
    let gpu = SimGpu::builder().manual().build();
    let (va, s, t) = mapped(&gpu);
    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    // Wrong: the kernel has not run.
    gpu.note_subfree_completed(va, s);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);

    gpu.note_suballocation(va, 4096, s);
    gpu.launch_kernel(s, &[at(va, Access::Write)]).unwrap();
    let e = gpu.event_create().unwrap();
    gpu.event_record(e, s).unwrap();
    gpu.run_until_idle();
    assert!(gpu.event_query(e).unwrap(), "the query tells the host");
    gpu.note_subfree_completed(va, s);
    // Another stream takes it, unordered on the device: the host's
    // observation orders it.
    gpu.note_suballocation(va, 4096, t);
    gpu.launch_kernel(t, &[at(va, Access::Write)]).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

/// One handle of three pages mapped at two addresses (`mem_map_part`, from
/// its start: the driver maps no other part): the memory goes back only
/// after the last mapping of it is unmapped.
fn mapped_twice(gpu: &SimGpu) -> (u64, u64, streamalloc::RawStream, streamalloc::RawStream) {
    let va = gpu.address_reserve(12 * G).unwrap();
    let h = gpu.mem_create(3 * G).unwrap();
    gpu.mem_map(va, 3 * G, h).unwrap();
    gpu.mem_set_access(va, 3 * G).unwrap();
    // The whole handle again, four pages further on.
    let alias = va + 4 * G as u64;
    gpu.mem_map_part(alias, 3 * G, h, 0).unwrap();
    gpu.mem_set_access(alias, 3 * G).unwrap();
    gpu.mem_release(h).unwrap();
    (va, alias, gpu.create_stream(), gpu.create_stream())
}

#[test]
fn a_handle_mapped_at_two_addresses_is_released_after_its_last_unmap() {
    let gpu = SimGpu::builder().manual().build();
    let (va, alias, _, _) = mapped_twice(&gpu);
    let free = va + 8 * G as u64;
    let h = gpu.mem_create(2 * G).unwrap();
    assert!(
        gpu.mem_map_part(free, G, h, G).is_err(),
        "a part from a non-zero offset (CUDA 13.0's driver refuses it)"
    );
    assert!(
        gpu.mem_map_part(free, 3 * G, h, 0).is_err(),
        "a part past the handle's end"
    );
    gpu.mem_release(h).unwrap();
    assert_eq!(gpu.held_bytes(), 3 * G);
    gpu.mem_unmap(va, 3 * G).unwrap();
    assert_eq!(gpu.held_bytes(), 3 * G, "still mapped at the alias");
    assert_eq!(gpu.physical_handles(), 1);
    gpu.mem_unmap(alias, 3 * G).unwrap();
    assert_eq!((gpu.held_bytes(), gpu.physical_handles()), (0, 0));
}

/// The same memory at two addresses is one memory to the race detector: a
/// block placed on the second address must be ordered after the free of
/// the one that used the first, as a reuse of the same range would; a
/// wait orders it; a block still live at the first address races with it.
#[test]
fn a_reuse_through_another_mapping_is_checked_against_the_old_uses() {
    let gpu = SimGpu::builder().manual().build();
    let (va, alias, s, t) = mapped_twice(&gpu);
    let old = va + G as u64 + 4096;
    gpu.note_suballocation(old, G, s);
    gpu.launch_kernel(s, &[at(old, Access::Write)]).unwrap();
    gpu.note_subfree(old, s);
    // On another stream with no ordering: the kernel of `s` may still run
    // on the same memory.
    gpu.note_suballocation(alias, 2 * G, t);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    assert_eq!(races[0].addr, alias, "reported where the new block is");

    // Ordered by a wait on an event recorded after the free: no race (the
    // way back too: the first address's new block waits for the free of
    // the second's).
    gpu.note_subfree(alias, t);
    let back = gpu.event_create().unwrap();
    gpu.event_record(back, t).unwrap();
    gpu.stream_wait_event(s, back).unwrap();
    gpu.note_suballocation(old, G, s);
    gpu.launch_kernel(s, &[at(old, Access::Write)]).unwrap();
    gpu.note_subfree(old, s);
    let e = gpu.event_create().unwrap();
    gpu.event_record(e, s).unwrap();
    gpu.stream_wait_event(t, e).unwrap();
    gpu.note_suballocation(alias, 2 * G, t);
    gpu.launch_kernel(t, &[at(alias, Access::Write)]).unwrap();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
    // The old address names freed memory now: a stale use is reported.
    gpu.launch_kernel(s, &[at(old, Access::Read)]).unwrap();
    assert_eq!(gpu.take_races().len(), 1);

    // A block live at the first address when the second is handed out
    // (on the same stream, after the free of the second's last block).
    gpu.note_subfree(alias, t);
    gpu.event_record(back, t).unwrap();
    gpu.stream_wait_event(s, back).unwrap();
    gpu.note_suballocation(va + 2 * G as u64, 4096, s);
    gpu.note_suballocation(alias + G as u64, 2 * G, s);
    let races = gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    // Page 0 of the handle: its last use, at the alias, was `t`'s, freed
    // on `t`; a block on `t` at the first address is ordered after it.
    gpu.note_suballocation(va, 4096, t);
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}
