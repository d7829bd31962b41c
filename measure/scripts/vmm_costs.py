# VMM driver-call costs on this GPU (ctypes over libcuda), for the cache's page policy.
import ctypes as C, time, sys
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise SystemExit(f"{what} failed: {r}")
ck(cu.cuInit(0), "init")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "devget")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "setcur")
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Flags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32", C.c_void_p), ("allocFlags", Flags)]
class Access(C.Structure): _fields_ = [("location", Loc), ("flags", C.c_int)]
prop = Prop(); prop.type = 1; prop.location.type = 1; prop.location.id = 0
gran = C.c_size_t(); ck(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "gran")
rec = C.c_size_t(); ck(cu.cuMemGetAllocationGranularity(C.byref(rec), C.byref(prop), 1), "gran rec")
P = gran.value; print("granularity min", P, "recommended", rec.value)
N = 512
va = C.c_ulonglong(); ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(4 * N * P), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve")
acc = Access(); acc.location.type = 1; acc.location.id = 0; acc.flags = 3
def t(label, f, n):
    t0 = time.perf_counter_ns(); r = f(); dt = (time.perf_counter_ns() - t0) / n; print(f"{label:55s} {dt/1000:9.2f} us each"); return r
hs = [C.c_ulonglong() for _ in range(N)]
def create():
    for h in hs: ck(cu.cuMemCreate(C.byref(h), C.c_size_t(P), C.byref(prop), C.c_ulonglong(0)), "create")
def mapall(base):
    for i, h in enumerate(hs): ck(cu.cuMemMap(C.c_ulonglong(base + i * P), C.c_size_t(P), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
def access_each(base):
    for i in range(N): ck(cu.cuMemSetAccess(C.c_ulonglong(base + i * P), C.c_size_t(P), C.byref(acc), C.c_size_t(1)), "access")
def access_runs(base, run):
    for i in range(0, N, run): ck(cu.cuMemSetAccess(C.c_ulonglong(base + i * P), C.c_size_t(P * run), C.byref(acc), C.c_size_t(1)), "access run")
def unmap_each(base):
    for i in range(N): ck(cu.cuMemUnmap(C.c_ulonglong(base + i * P), C.c_size_t(P)), "unmap")
def unmap_runs(base, run):
    for i in range(0, N, run): ck(cu.cuMemUnmap(C.c_ulonglong(base + i * P), C.c_size_t(P * run)), "unmap run")
free0 = C.c_size_t(); tot = C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(free0), C.byref(tot))
t(f"cuMemCreate, one {P>>20} MiB page", create, N)
free1 = C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(free1), C.byref(tot)); print("device free dropped by", (free0.value - free1.value) >> 20, "MiB after create")
base = va.value
t("cuMemMap, one page", lambda: mapall(base), N)
t("cuMemSetAccess, one page", lambda: access_each(base), N)
t("cuMemUnmap, one page", lambda: unmap_each(base), N)
# Steal cycle: map at a new address + set access + unmap (pages moved one by one).
def steal(src, dst):
    for i, h in enumerate(hs):
        ck(cu.cuMemMap(C.c_ulonglong(dst + i * P), C.c_size_t(P), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        ck(cu.cuMemSetAccess(C.c_ulonglong(dst + i * P), C.c_size_t(P), C.byref(acc), C.c_size_t(1)), "acc")
        ck(cu.cuMemUnmap(C.c_ulonglong(dst + i * P), C.c_size_t(P)), "unmap")
t("map + set access + unmap of one page (a steal)", lambda: steal(base, base + N * P), N)
for run in (8, 32):
    mapall(base)
    t(f"cuMemSetAccess over a run of {run} pages, per page", lambda: access_runs(base, run), N)
    t(f"cuMemUnmap over a run of {run} pages, per page", lambda: unmap_runs(base, run), N)
# Is memory usable? a memset through a mapped range.
mapall(base); access_runs(base, N)
t("cuMemsetD8 of the whole mapped range (sync)", lambda: ck(cu.cuMemsetD8_v2(C.c_ulonglong(base), C.c_ubyte(7), C.c_size_t(N * P)), "memset"), 1)
unmap_runs(base, N)
t("cuMemRelease, one page", lambda: [ck(cu.cuMemRelease(h), "rel") for h in hs], N)
ck(cu.cuMemAddressFree(C.c_ulonglong(base), C.c_size_t(4 * N * P)), "addrfree")
# Large pages: 32 MiB handles.
P2 = 16 * P; hs2 = [C.c_ulonglong() for _ in range(32)]
t("cuMemCreate, one 32 MiB handle", lambda: [ck(cu.cuMemCreate(C.byref(h), C.c_size_t(P2), C.byref(prop), C.c_ulonglong(0)), "c") for h in hs2], 32)
va2 = C.c_ulonglong(); ck(cu.cuMemAddressReserve(C.byref(va2), C.c_size_t(32 * P2), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve2")
def steal2():
    for i, h in enumerate(hs2):
        a = va2.value + i * P2
        ck(cu.cuMemMap(C.c_ulonglong(a), C.c_size_t(P2), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        ck(cu.cuMemSetAccess(C.c_ulonglong(a), C.c_size_t(P2), C.byref(acc), C.c_size_t(1)), "acc")
        ck(cu.cuMemUnmap(C.c_ulonglong(a), C.c_size_t(P2)), "unmap")
t("map + set access + unmap of one 32 MiB handle", steal2, 32)
print("cuMemAllocAsync pairs for comparison:")
s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 1), "stream")
p = C.c_ulonglong()
def pairs(n, sz):
    for _ in range(n):
        ck(cu.cuMemAllocAsync(C.byref(p), C.c_size_t(sz), s), "a"); ck(cu.cuMemFreeAsync(p, s), "f")
pairs(100, 1 << 20)
t("cuMemAllocAsync+cuMemFreeAsync 1 MiB (python overhead incl.)", lambda: pairs(2000, 1 << 20), 2000)
