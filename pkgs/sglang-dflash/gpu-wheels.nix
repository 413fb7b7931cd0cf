# The GPU wheel fixup table: one data table drives the fixup overlay (./fixups.nix),
# in the style of hf-nix's torch-bin version table. Pure data, evaluated by the tests
# with Nix 2.8 and checked against uv.lock (every name here must be locked).
#
# Fields of a `gpu` entry (all optional):
#   extraDeps     packages (besides the uv.lock dependency closure) whose shared
#                 libraries this wheel links; their nvidia/*/lib, nvidia/cu13/lib and
#                 torch/lib directories are added to autoPatchelf's search path.
#   ignoreMissing sonames (globs) that may stay unresolved at build time.
#   reason        why the entry exists.
#
# Every `gpu` entry additionally gets the driver fixup (driverLibs below): those
# libraries come from the NVIDIA driver at /run/opengl-driver/lib at run time and
# can never be in the sandbox; autoAddDriverRunpath appends that directory to RUNPATH.
{
  driverLibs = [
    "libcuda.so.1"
    "libnvidia-ml.so.1"
    "libnvidia-ptxjitcompiler.so.1"
    "libcudadebugger.so.1"
  ];

  gpu = {
    torch.reason = "libtorch_cuda links cuBLAS/cuDNN/NCCL/... from the nvidia-* CUDA 13 wheels (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib): upstream RPATHs are $ORIGIN/../../nvidia/..., which in Nix point into torch's own store path";
    triton.reason = "libtriton and its driver stub dlopen libcuda.so.1 from the driver";
    torchaudio = {
      extraDeps = [ "torch" ];
      reason = "links libtorch/libc10 from the torch wheel, which uv.lock does not list as its dependency";
    };
    torchvision = {
      extraDeps = [ "torch" ];
      reason = "links libtorch/libc10 and CUDA 13 runtime libraries";
    };
    torchcodec = {
      extraDeps = [ "torch" ];
      ignoreMissing = [
        "libavcodec.so.*"
        "libavdevice.so.*"
        "libavfilter.so.*"
        "libavformat.so.*"
        "libavutil.so.*"
        "libswresample.so.*"
        "libswscale.so.*"
      ];
      reason = "ships one core library per FFmpeg major version and dlopens the one it finds; SGLang's text serving never loads it";
    };
    torch-memory-saver = {
      extraDeps = [ "torch" ];
      ignoreMissing = [ "libcudart.so.12" ];
      reason = "preload library links the CUDA runtime and is LD_PRELOADed by SGLang's memory saver; the wheel ships a CUDA 12 and a CUDA 13 build of each hook (plus unsuffixed copies of the CUDA 12 ones for ROCm/XPU) and torch_memory_saver/utils.py picks `<hook>_cu<torch.version.cuda major>`: with the locked CUDA 13 torch only the _cu13 builds load, whose libcudart.so.13 nvidia-cuda-runtime provides; the CUDA 12 builds' libcudart.so.12 is never needed";
    };
    torch-c-dlpack-ext.reason = "links libtorch (dependency closure) and the CUDA runtime";
    sglang-kernel = {
      extraDeps = [ "torch" ];
      reason = "sgl_kernel's extensions link libtorch/libc10 and CUDA 13 libraries, but the wheel declares no dependencies in uv.lock";
    };
    sgl-deep-gemm = {
      extraDeps = [ "torch" ];
      reason = "JIT GEMM extension links libtorch and the CUDA runtime";
    };
    flash-attn-4.reason = "CuTe-DSL kernels reach the driver through cuda-bindings at run time";
    cuda-bindings.reason = "cuda.bindings dlopens libcuda.so.1 and links nvrtc/nvJitLink from nvidia/cu13/lib";
    cuda-core.reason = "extension modules link libcuda.so.1";
    cuda-tile.reason = "links the driver (libcuda.so.1)";
    nccl4py.reason = "binds libnccl from nvidia/nccl/lib and libcuda.so.1";
    apache-tvm-ffi.reason = "TVM FFI runtime used by FlashInfer/DeepGEMM JIT loads CUDA libraries at run time";
    tilelang.reason = "bundled TVM runtime links libcuda.so.1 and CUDA 13 libraries from torch's closure";
    tokenspeed-triton.reason = "Triton fork: same driver/libcuda needs as triton";
    tokenspeed-mla.reason = "CUDA extension links libtorch and the CUDA runtime";
    xgrammar.reason = "CUDA bitmask kernels link libtorch from the dependency closure";
    nvidia-cutlass-dsl-libs-base.reason = "CuTe DSL runtime links libcuda.so.1";
    nvidia-cutlass-dsl-libs-cu12.reason = "CuTe DSL runtime links libcuda.so.1";
    nvidia-cutlass-dsl-libs-cu13.reason = "CuTe DSL runtime links libcuda.so.1";
    nvidia-cublas.reason = "libcublasLt dlopens the driver";
    nvidia-cuda-cupti.reason = "CUPTI links libcuda.so.1";
    nvidia-cuda-runtime.reason = "cudart loads libcuda.so.1 from the driver";
    nvidia-cuda-nvrtc.reason = "nvrtc-builtins are found next to libnvrtc (nvidia/cu13/lib)";
    nvidia-cudnn-cu13 = {
      extraDeps = [ "nvidia-cublas" ];
      reason = "cuDNN sub-libraries link cuBLAS/cuBLASLt from nvidia/cu13/lib";
    };
    nvidia-cufft.reason = "cuFFT links nvJitLink (dependency closure)";
    nvidia-cufile.reason = "cuFile links libcuda.so.1";
    nvidia-curand.reason = "cuRAND links the driver";
    nvidia-cusolver.reason = "cuSOLVER links cuBLAS, cuSPARSE and nvJitLink (dependency closure; uv2nix#31)";
    nvidia-cusparse.reason = "cuSPARSE links nvJitLink (dependency closure)";
    nvidia-cusparselt-cu13.reason = "cuSPARSELt links libcuda.so.1";
    nvidia-nccl-cu13.reason = "NCCL links libcuda.so.1 and libnvidia-ml.so.1";
    nvidia-nvshmem-cu13 = {
      ignoreMissing = [
        "libmpi.so.*"
        "liboshmem.so.*"
        "libpmix.so.*"
        "libfabric.so.*"
        "libibverbs.so.*"
        "libmlx5.so.*"
      ];
      reason = "NVSHMEM bootstrap/transport plugins dlopen MPI/OpenSHMEM/PMIx/libfabric/IB verbs when that transport is chosen; single-node serving uses none";
    };
    nvidia-nvjitlink.reason = "nvJitLink is loaded by cuSPARSE/cuFFT/cuSOLVER and torch";
  };

  # Native libraries from nixpkgs that a wheel expects on the system: `pkgs` (nixpkgs
  # attribute names) go into the wheel's buildInputs, where autoPatchelf finds `sonames`;
  # `python = true` adds the Python set's interpreter (its libpython<pin>.so.1.0).
  # tests/nix/test_linkage.py checks every DT_NEEDED of the locked wheels against this.
  native = {
    numba = {
      pkgs = [ "tbb" ];
      sonames = [ "libtbb.so.12" ];
      reason = "numba's parallel backend (numba/np/ufunc/tbbpool) links libtbb (uv2nix docs, overriding wheels)";
    };
    # libz.so.1 is not in PEP 599's manylinux2014 library list (nixpkgs' manylinux2014 set
    # could not be read at the locked revision here), yet these wheels link it unbundled.
    numpy = {
      pkgs = [ "zlib" ];
      sonames = [ "libz.so.1" ];
      reason = "numpy.libs/libgfortran-*.so.5 (bundled by auditwheel) links it unbundled (libz.so.1, from nixpkgs' zlib)";
    };
    pillow = {
      pkgs = [ "zlib" ];
      sonames = [ "libz.so.1" ];
      reason = "PIL/_imaging and the bundled libpng16/libtiff/libfreetype link it unbundled (libz.so.1, from nixpkgs' zlib)";
    };
    llvmlite = {
      pkgs = [ "zlib" ];
      sonames = [ "libz.so.1" ];
      reason = "llvmlite/binding/libllvmlite.so links it unbundled (libz.so.1, from nixpkgs' zlib)";
    };
    nvidia-cudnn-cu13 = {
      pkgs = [ "zlib" ];
      sonames = [ "libz.so.1" ];
      reason = "libcudnn_{adv,cnn,engines_*,graph,heuristic,ops}.so.9 link it unbundled (libz.so.1, from nixpkgs' zlib)";
    };
    torchcodec = {
      python = true;
      reason = "its custom-op libraries (torchcodec/libtorchcodec_custom_ops<N>.so) link libpython; wheels for a CPython with a shared libpython expect it on the system";
    };
    nvidia-cufile = {
      pkgs = [ "rdma-core" ];
      sonames = [ "librdmacm.so.1" ];
      reason = "libcufile_rdma.so.1 (GPUDirect Storage over RDMA, loaded by libcufile when RDMA is configured) links librdmacm from rdma-core";
    };
    nvidia-nvshmem-cu13 = {
      pkgs = [ "ucx" ];
      sonames = [
        "libucp.so.0"
        "libucs.so.0"
      ];
      reason = "NVSHMEM's UCX transport plugin (nvidia/nvshmem/lib/nvshmem_transport_ucx.so.3, chosen with NVSHMEM_REMOTE_TRANSPORT=ucx) links UCX's libucp/libucs";
    };
  };

  # Files two wheels install at the same venv path (mkVirtualEnv raises FileCollisionError).
  collisions = {
    flashinfer-python = {
      remove = [ "build_backend.py" ];
      reason = "ships its PEP 517 backend shim at the top of site-packages; torch-c-dlpack-ext ships one too (CarlSchader/sglang-nix)";
    };
    torch-c-dlpack-ext = {
      remove = [ "build_backend.py" ];
      reason = "same stray site-packages/build_backend.py as flashinfer-python";
    };
    modelscope-hub = {
      removeBin = [ "modelscope" ];
      reason = "installs bin/modelscope, which the modelscope wheel also installs (CarlSchader/sglang-nix)";
    };
  };
}
