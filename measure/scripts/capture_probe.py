# python3 measure/scripts/capture_probe.py  (on the GPU machine)
# Does a capturing stream's wait on an event recorded outside the capture
# fail, and does the failure invalidate the capture? With and without
# CU_EVENT_WAIT_EXTERNAL. ctypes over libcuda.
import ctypes as C
cu = C.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0: raise SystemExit(f"{what}: {r}")
ok(cu.cuInit(0), "init")
dev = C.c_int(); ok(cu.cuDeviceGet(C.byref(dev), 0), "dev")
ctx = C.c_void_p(); ok(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "ctx"); ok(cu.cuCtxSetCurrent(ctx), "set")
STATUS = {0: "NONE", 1: "ACTIVE", 2: "INVALIDATED"}
def status(s):
    st = C.c_int(); cid = C.c_uint64()
    r = cu.cuStreamGetCaptureInfo_v3(s, C.byref(st), C.byref(cid), None, None, None, None)
    return STATUS.get(st.value, st.value) if r == 0 else f"err {r}"
for flags in (0, 1):
    a = C.c_void_p(); b = C.c_void_p(); ok(cu.cuStreamCreate(C.byref(a), 1), "s"); ok(cu.cuStreamCreate(C.byref(b), 1), "s")
    e = C.c_void_p(); ok(cu.cuEventCreate(C.byref(e), 2), "ev")
    ok(cu.cuEventRecord(e, b), "record outside")
    ok(cu.cuStreamBeginCapture_v2(a, 2), "begin relaxed")
    r = cu.cuStreamWaitEvent(a, e, flags)
    print(f"wait flags={flags}: rc={r}; capture after: {status(a)}; other stream: {status(b)}")
    g = C.c_void_p(); r2 = cu.cuStreamEndCapture(a, C.byref(g))
    print(f"  end capture rc={r2}")
