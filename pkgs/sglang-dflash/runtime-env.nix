# What kernels compiled at run time need (FlashInfer JIT, Triton, torch NVRTC,
# DeepGEMM/TileLang): a CUDA toolkit matching the pinned CUDA major.minor, the
# driver's libcuda for Triton, and a library path with the driver FIRST so the
# host's libcuda.so.1 always wins over any stub. Used by the package's wrapper,
# the dev shell and (via passthru.runtimeEnv) the NixOS module.
{
  lib,
  pins,
  cudaPackages,
  addDriverRunpath,
  ninja,
}:
let
  driverLib = "${addDriverRunpath.driverLink}/lib";
  cudaMajorMinor =
    cudaPackages.cudaMajorMinorVersion or (lib.versions.majorMinor cudaPackages.cudaVersion);
  toolkit = cudaPackages.cudatoolkit;
  hostCC = cudaPackages.backendStdenv.cc;
in
assert lib.assertMsg (cudaMajorMinor == pins.cuda.version)
  "sglang-dflash: ${pins.cudaPackagesAttr} is CUDA ${cudaMajorMinor}, pins.toml says ${pins.cuda.version}";
{
  inherit toolkit driverLib;

  # Environment variables (name -> value).
  variables = {
    CUDA_HOME = "${toolkit}";
    CUDA_PATH = "${toolkit}";
    TRITON_LIBCUDA_PATH = driverLib;
    # sglang's and flashinfer's JIT builds do not always pass -I$CUDA_HOME/include.
    NVCC_PREPEND_FLAGS = "-I${toolkit}/include -L${toolkit}/lib";
  };

  # LD_LIBRARY_PATH: only the driver (libcuda.so.1, libnvidia-ml.so.1). Not the toolkit:
  # LD_LIBRARY_PATH beats RUNPATH, and the toolkit's libcudart/libcublas/libnvrtc would
  # shadow the CUDA 13 wheels uv.lock pins (nvidia-cublas etc.), which the autoPatchelf'd
  # RUNPATHs already name. torch's dlopen("libnvrtc.so.13") finds the copy libtorch_cuda
  # loaded. Triton uses the ptxas bundled in its wheel.
  libraryPath = [ driverLib ];

  # Programs the JIT builders call: nvcc, a host compiler nvcc accepts, ninja.
  path = [
    "${toolkit}/bin"
    "${hostCC}/bin"
    "${ninja}/bin"
  ];
}
