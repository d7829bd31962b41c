# Can one physical handle be mapped at two addresses at once (the "aliasing"
# of notes/fragmentation-floors.md), and does each mapping see the other's
# writes and outlive the other's unmap? ctypes over libcuda, on the GPU
# machine:  python3 measure/scripts/vmm_alias_probe.py
# Prints one line per check and "alias probe: OK" (exit 0), or what failed
# (exit 1).
import ctypes as C, sys, time
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        print(f"alias probe: FAILED at {what}: CUresult {r}")
        sys.exit(1)
ck(cu.cuInit(0), "init")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "devget")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "setcur")
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Flags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32", C.c_void_p), ("allocFlags", Flags)]
class Access(C.Structure): _fields_ = [("location", Loc), ("flags", C.c_int)]
prop = Prop(); prop.type = 1; prop.location.type = 1; prop.location.id = 0
gran = C.c_size_t(); ck(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "granularity")
P = gran.value
acc = Access(); acc.location.type = 1; acc.location.id = 0; acc.flags = 3
N = 4  # pages in the handle
h = C.c_ulonglong(); ck(cu.cuMemCreate(C.byref(h), C.c_size_t(N * P), C.byref(prop), C.c_ulonglong(0)), "create")
va = C.c_ulonglong(); ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(4 * N * P), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve")
a, b = va.value, va.value + 2 * N * P  # two places, a gap between them
def mapped(addr, what):
    t0 = time.perf_counter_ns()
    ck(cu.cuMemMap(C.c_ulonglong(addr), C.c_size_t(N * P), C.c_size_t(0), h, C.c_ulonglong(0)), f"map {what}")
    ck(cu.cuMemSetAccess(C.c_ulonglong(addr), C.c_size_t(N * P), C.byref(acc), C.c_size_t(1)), f"set access {what}")
    return (time.perf_counter_ns() - t0) / 1000
print(f"map + access at A: {mapped(a, 'A'):.1f} us")
print(f"map + access of the same handle at B (A still mapped): {mapped(b, 'B'):.1f} us")
def read(addr):
    out = (C.c_ubyte * 16)()
    ck(cu.cuMemcpyDtoH_v2(out, C.c_ulonglong(addr + N * P - 16), C.c_size_t(16)), "read")
    return bytes(out)
ck(cu.cuMemsetD8_v2(C.c_ulonglong(a), C.c_ubyte(0x5A), C.c_size_t(N * P)), "memset through A")
ck(cu.cuCtxSynchronize(), "sync")
seen = read(b)
print("B sees A's write:", seen == b"\x5a" * 16)
ck(cu.cuMemUnmap(C.c_ulonglong(a), C.c_size_t(N * P)), "unmap A")
ck(cu.cuMemsetD8_v2(C.c_ulonglong(b), C.c_ubyte(0x3C), C.c_size_t(N * P)), "memset through B after A's unmap")
ck(cu.cuCtxSynchronize(), "sync")
kept = read(b)
print("B still works after A's unmap:", kept == b"\x3c" * 16)
free0, tot = C.c_size_t(), C.c_size_t(); ck(cu.cuMemGetInfo_v2(C.byref(free0), C.byref(tot)), "meminfo")
ck(cu.cuMemRelease(h), "release (B still mapped)")
ck(cu.cuMemUnmap(C.c_ulonglong(b), C.c_size_t(N * P)), "unmap B")
free1 = C.c_size_t(); ck(cu.cuMemGetInfo_v2(C.byref(free1), C.byref(tot)), "meminfo")
print(f"device memory given back after the last unmap: {(free1.value - free0.value) >> 20} MiB (handle {(N * P) >> 20} MiB)")
ck(cu.cuMemAddressFree(va, C.c_size_t(4 * N * P)), "address free")
ok = seen == b"\x5a" * 16 and kept == b"\x3c" * 16
print("alias probe:", "OK" if ok else "FAILED (a mapping did not see the memory)")
sys.exit(0 if ok else 1)
