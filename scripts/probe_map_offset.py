#!/usr/bin/env python3
"""Asks the driver which partial mappings of one physical allocation it
accepts: `cuMemMap` of part of a handle, at offset 0 and at a non-zero
offset (the move of `src/cache/arena/vmm.rs` maps holes at their offset
into their handle). Prints each call's CUresult. Run on the GPU machine."""
import ctypes as C

cu = C.CDLL("libcuda.so.1")


def check(name, r):
    print(f"{name}: {r}", flush=True)
    return r


class Location(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Location),
                ("win32HandleMetaData", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Location), ("flags", C.c_int)]


check("cuInit", cu.cuInit(0))
dev = C.c_int()
check("cuDeviceGet", cu.cuDeviceGet(C.byref(dev), 0))
ctx = C.c_void_p()
check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev))
check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
ver = C.c_int()
cu.cuDriverGetVersion(C.byref(ver))
print("driver version", ver.value)
prop = Prop(type=1, requestedHandleTypes=0, location=Location(1, 0))
gran = C.c_size_t()
check("granularity", cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0))
g = gran.value
print("granularity", g)
handle = C.c_ulonglong()
check("cuMemCreate 4 pages", cu.cuMemCreate(C.byref(handle), C.c_size_t(4 * g), C.byref(prop), C.c_ulonglong(0)))
base = C.c_ulonglong()
check("cuMemAddressReserve 32 pages", cu.cuMemAddressReserve(C.byref(base), C.c_size_t(32 * g), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)))
acc = Access(location=Location(1, 0), flags=3)
cases = [
    ("whole handle, offset 0", 0, 4, 0),
    ("2 pages at offset 0", 4, 2, 0),
    ("2 pages at offset 1 page", 8, 2, 1),
    ("1 page at offset 3 pages", 12, 1, 3),
    ("2 pages at offset 2 pages", 16, 2, 2),
]
for name, at, pages, off in cases:
    addr = C.c_ulonglong(base.value + at * g)
    r = check(f"cuMemMap {name}", cu.cuMemMap(addr, C.c_size_t(pages * g), C.c_size_t(off * g), handle, C.c_ulonglong(0)))
    if r == 0:
        check(f"  cuMemSetAccess {name}", cu.cuMemSetAccess(addr, C.c_size_t(pages * g), C.byref(acc), C.c_size_t(1)))
        check(f"  cuMemsetD8 {name}", cu.cuMemsetD8_v2(addr, C.c_ubyte(7), C.c_size_t(pages * g)))
        check("  cuCtxSynchronize", cu.cuCtxSynchronize())
        check(f"  cuMemUnmap {name}", cu.cuMemUnmap(addr, C.c_size_t(pages * g)))
check("cuMemRelease", cu.cuMemRelease(handle))
