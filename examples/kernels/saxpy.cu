// y[i] = a * x[i] + y[i] for i < n: the kernel of examples/kernel.rs.
//
// saxpy.ptx next to it is this file compiled for sm_90 (PTX ISA 8.0). It is
// committed so that running the example needs neither nvcc nor NVRTC:
//
//   nvcc -ptx -arch=sm_90 -o examples/kernels/saxpy.ptx examples/kernels/saxpy.cu

extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
