"""Installs streamalloc's other hooks on PyTorch's current pluggable
allocator: `torch.cuda.empty_cache()`, `set_per_process_memory_fraction`
and `Tensor.record_stream` then reach streamalloc, and so do the begin and
end of each CUDA graph capture (`torch.cuda.graph`), after which
streamalloc asks the driver whether a stream is capturing only while a
capture is underway (`streamalloc_torch_announce_captures`), as PyTorch's
own allocator does, instead of at every allocation and free.

PyTorch offers these hooks only as C++ setters of `CUDAPluggableAllocator`
(`set_reset_fn`, `set_memory_fraction_fn`, `set_record_stream_fn`,
`set_init_fn`, `set_begin_allocate_to_pool`, `set_end_allocate_to_pool_fn`);
this module compiles two short extensions that call them with the functions
`libtorch_alloc.so` exports (the capture hooks apart, so that a PyTorch
whose graph-pool setters differ keeps the others). Install before the
first capture. It needs a C++ compiler,
ninja, and the CUDA runtime headers (the CUDA toolkit's, or the
`nvidia-cuda-runtime` wheel's that PyTorch depends on).

    import torch_hooks
    torch.cuda.memory.change_current_allocator(alloc)
    torch_hooks.install("target/release/libtorch_alloc.so")  # -> None, or why not
"""
import glob
import os
import sys

PRELUDE = r"""
#include <dlfcn.h>
#include <string>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

namespace pa = torch::cuda::CUDAPluggableAllocator;

// The library and the current allocator, or why not.
static std::string open_current(const std::string& lib, void** h,
                        std::shared_ptr<pa::CUDAPluggableAllocator>* current) {
  *h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (*h == nullptr) {
    return std::string("dlopen: ") + dlerror();
  }
  *current = std::dynamic_pointer_cast<pa::CUDAPluggableAllocator>(pa::getCurrentAllocator());
  if (!*current) {
    return "the current allocator is not a CUDAPluggableAllocator";
  }
  return "";
}
"""

CPP = PRELUDE + r"""
std::string install(const std::string& lib) {
  void* h;
  std::shared_ptr<pa::CUDAPluggableAllocator> current;
  auto why = open_current(lib, &h, &current);
  if (!why.empty()) {
    return why;
  }
  auto init = reinterpret_cast<void (*)(int)>(dlsym(h, "streamalloc_torch_init"));
  auto reset = reinterpret_cast<void (*)()>(dlsym(h, "streamalloc_torch_empty_cache"));
  auto fraction = reinterpret_cast<void (*)(double, int)>(dlsym(h, "streamalloc_torch_set_memory_fraction"));
  auto record = reinterpret_cast<void (*)(void*, cudaStream_t)>(dlsym(h, "streamalloc_torch_record_stream"));
  if (!init || !reset || !fraction || !record) {
    return "a streamalloc_torch_* symbol is missing";
  }
  current->set_init_fn(init);
  current->set_reset_fn(reset);
  current->set_memory_fraction_fn(fraction);
  current->set_record_stream_fn(record);
  return "";
}
"""

# Apart, so that a PyTorch whose graph-pool setters differ keeps the hooks
# above.
CAPTURE_CPP = PRELUDE + r"""
std::string install_capture(const std::string& lib) {
  void* h;
  std::shared_ptr<pa::CUDAPluggableAllocator> current;
  auto why = open_current(lib, &h, &current);
  if (!why.empty()) {
    return why;
  }
  auto begin = reinterpret_cast<void (*)(int)>(dlsym(h, "streamalloc_torch_capture_begin"));
  auto end = reinterpret_cast<void (*)(int)>(dlsym(h, "streamalloc_torch_capture_end"));
  auto announce = reinterpret_cast<void (*)()>(dlsym(h, "streamalloc_torch_announce_captures"));
  if (!begin || !end || !announce) {
    return "a streamalloc_torch_capture_* symbol is missing";
  }
  // CUDAGraph::capture_begin calls beginAllocateToPool before
  // cudaStreamBeginCapture, capture_end endAllocateToPool after
  // cudaStreamEndCapture: streamalloc asks the driver in between.
  current->set_begin_allocate_to_pool(
      [begin](int device, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) { begin(device); });
  current->set_end_allocate_to_pool_fn(
      [end](int device, c10::cuda::MempoolId_t) { end(device); });
  // Every capture of PyTorch's streams now goes through the two hooks
  // (streamalloc_torch_announce_captures's contract).
  announce();
  return "";
}
"""


def _cuda_includes():
    """Directories holding cuda_runtime_api.h: CUDA_HOME's, then the
    NVIDIA wheels' next to PyTorch."""
    found = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found += [d for d in [os.path.join(home, "include")] if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))]
    for site in sys.path:
        for header in glob.glob(os.path.join(site, "nvidia", "**", "cuda_runtime_api.h"), recursive=True):
            found.append(os.path.dirname(header))
    return list(dict.fromkeys(found))


def _build(name, source, function, includes):
    from torch.utils.cpp_extension import load_inline

    return load_inline(name=name, cpp_sources=source, functions=[function],
                       extra_include_paths=includes, extra_ldflags=["-ldl"], with_cuda=False,
                       verbose=False)


def install(lib_path):
    """Sets the hooks on the current allocator (call after
    `change_current_allocator`, before the first CUDA tensor). Returns
    None when all are installed, else the reason: the capture hooks'
    alone ("installed, but not the capture hooks: ...", the others in
    place), or the others'."""
    lib = os.path.abspath(lib_path)
    try:
        includes = _cuda_includes()
        if not includes:
            return "no cuda_runtime_api.h found (set CUDA_HOME)"
        why = _build("streamalloc_torch_hooks", CPP, "install", includes).install(lib)
        if why:
            return why
    except Exception as e:  # no compiler, no ninja, no headers: say so
        return f"{type(e).__name__}: {str(e)[-400:]}"
    try:
        why = _build("streamalloc_torch_capture_hooks", CAPTURE_CPP, "install_capture",
                     includes).install_capture(lib)
    except Exception as e:
        why = f"{type(e).__name__}: {str(e)[-400:]}"
    return f"installed, but not the capture hooks: {why}" if why else None
