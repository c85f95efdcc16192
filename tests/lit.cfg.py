# lit configuration: IR tests (moe-opt), frontend and tool tests (moec, moert),
# end-to-end tests. Tools come from the build tree, FileCheck and not from
# LLVM 19's tree.
import os
import lit.formats

config.name = "moe"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moe_obj_root, "tests")
config.excludes = ["Inputs", "fixtures", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

tool_dirs = [
    os.path.join(config.moe_obj_root, "tools", name) for name in ("moec", "moert", "moe-opt")
]
# MOE_MOERT_DIR: another moert (scripts/asan.sh runs end-to-end tests with
# its sanitized build) ahead of the build tree's.
if os.environ.get("MOE_MOERT_DIR"):
    tool_dirs.insert(0, os.path.abspath(os.environ["MOE_MOERT_DIR"]))
    config.available_features.add("sanitized-moert")
    for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
                 "OMPI_MCA_mca_base_component_disable_dlclose"):
        if name in os.environ:
            config.environment[name] = os.environ[name]
path = os.pathsep.join(tool_dirs + [config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path

config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%repo", config.moe_src_root))
config.substitutions.append(("%fixtures", os.path.join(config.moe_src_root, "tests", "fixtures")))
config.substitutions.append(("%expect-exit", "%s %s" % (
    config.python_executable, os.path.join(config.moe_src_root, "tests", "tools", "expect-exit.py"))))

# The reference configs live beside the repository (../shared/configs).
shared = os.path.normpath(os.path.join(config.moe_src_root, "..", "shared"))
if os.path.isdir(os.path.join(shared, "configs")):
    config.available_features.add("shared-configs")
    config.substitutions.append(("%shared", shared))
# Multi-rank runs: Open MPI's mpirun (scripts/setup.sh installs it).
import shutil
mpirun = shutil.which("mpirun", path=path)
if mpirun:
    config.available_features.add("mpi")
    # Each mpirun gets a TMPDIR (Open MPI session directory) of its own, so
    # concurrently running tests never race creating one.
    config.environment["MOE_MPIRUN"] = mpirun
    config.substitutions.append(("%mpirun", os.path.join(config.moe_src_root, "tests", "tools",
                                                         "mpirun-isolated")))
# The instruction-set levels of the CPU kernels this CPU runs (moert
# --version): features isa-generic, isa-avx2, isa-avx512, isa-avx512bf16.
moert_bin = shutil.which("moert", path=path)
if moert_bin:
    import subprocess, re
    out = subprocess.run([moert_bin, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"this CPU runs ([a-z0-9, ]+)\)", out)
    for level in (m.group(1).split(", ") if m else []):
        config.available_features.add("isa-" + level)
# Full-disk tests mount a small tmpfs in a mount namespace of their own.
import subprocess
try:
    if subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
        config.available_features.add("small-disk")
except OSError:
    pass
config.substitutions.append(("%deadline", "%s %s" % (
    config.python_executable, os.path.join(config.moe_src_root, "tests", "tools", "deadline.py"))))
if config.moe_have_cuda:
    config.available_features.add("cuda-toolkit")

# The CUDA target (docs/cuda.md). The CPU execution layer of tests/cuda-host
# builds emitted kernels with the host C++ compiler: no GPU, no CUDA toolkit.
config.substitutions.append(("%cuda-host-cxx", "%s -std=c++17 -O1 -shared -fPIC -include %s -x c++" % (
    getattr(config, "moe_cxx_compiler", "") or "c++",
    os.path.join(config.moe_src_root, "tests", "cuda-host", "cuda_host.h"))))
config.substitutions.append(("%cuda-host-exe", "%s -std=c++17 -O1 -include %s -x c++" % (
    getattr(config, "moe_cxx_compiler", "") or "c++",
    os.path.join(config.moe_src_root, "tests", "cuda-host", "cuda_host.h"))))
config.substitutions.append(("%cuda-host-check", os.path.join(config.moe_obj_root, "tests", "cuda-host", "cuda-host-check")))
# nvcc and cuobjdump (fatbin tests): the configured CUDA compiler, $MOE_NVCC,
# or /usr/local/cuda.
nvcc = os.environ.get("MOE_NVCC") or getattr(config, "moe_cuda_compiler", "") or "/usr/local/cuda/bin/nvcc"
if nvcc and os.access(nvcc, os.X_OK):
    config.available_features.add("nvcc")
    config.environment["MOE_NVCC"] = nvcc
    # Toolkits without cuobjdump: tests/tools/fatbin-list.py reads fatbins.
    cuobjdump = os.path.join(os.path.dirname(nvcc), "cuobjdump")
    if os.access(cuobjdump, os.X_OK):
        config.available_features.add("cuobjdump")
        config.substitutions.append(("%cuobjdump", cuobjdump))
# A GPU is visible (tests that run kernels on one).
if os.path.exists("/dev/nvidia0"):
    config.available_features.add("gpu")
# The CUDA driver without a GPU: the toolkit's stub libcuda (its cuInit says
# there is no driver) lets a test load every symbol the CUDA device uses.
if nvcc:
    cuda_lib = os.path.normpath(os.path.join(os.path.dirname(nvcc), "..", "lib64"))
    stubs = os.path.join(cuda_lib, "stubs")
    if config.moe_have_cuda and os.path.exists(os.path.join(stubs, "libcuda.so")):
        config.available_features.add("cuda-stubs")
        config.substitutions.append(("%cuda-stub-path", stubs + ":" + cuda_lib))
# A fake CUDA driver + cuBLAS that run on the host (tests/cuda-host/fake):
# moert's CUDA device end to end without a GPU. %fake-cuda-env puts it first
# on the library path, with the host compile of the kernels' source, a
# cache of the compiled kernels shared by the tests, and a stand-in nvcc.
fake_cuda = os.path.join(config.moe_obj_root, "tests", "cuda-host", "fake")
# %host-nvcc: moec with a stand-in nvcc, for plans whose fatbin no test
# reads (the fake driver builds the source; tests/cuda/Inputs/host-nvcc.sh).
host_nvcc = os.path.join(config.moe_src_root, "tests", "cuda", "Inputs", "host-nvcc.sh")
config.substitutions.append(("%host-nvcc", "env MOE_NVCC=%s" % host_nvcc))
if os.path.exists(os.path.join(fake_cuda, "libcuda.so.1")):
    config.available_features.add("fake-cuda")
    config.substitutions.append(("%fake-cuda-dir", fake_cuda))
    # MOE_NVCC: the fake driver never reads the fatbin, so moec's nvcc is
    # a stand-in here (tests/cuda/Inputs/host-nvcc.sh).
    config.substitutions.append(("%fake-cuda-env", "env LD_LIBRARY_PATH=%s MOE_FAKE_CUDA_CACHE=%s MOE_FAKE_CUDA_STATS=1 MOE_NVCC=%s" % (
        fake_cuda, os.path.join(fake_cuda, "kernel-cache"), host_nvcc)))
    config.substitutions.append(("%check-fixture", "%s %s" % (
        config.python_executable, os.path.join(config.moe_src_root, "tests", "tools", "check-fixture.py"))))
if "fake-cuda" in config.available_features and nvcc:
    config.substitutions.append(("%cuda-include", os.path.normpath(os.path.join(os.path.dirname(nvcc), "..", "include"))))
# The fake NCCL over MPI beside the fake driver (tests/cuda-host/fake,
# fake_nccl.cpp): multi-rank runs of the CUDA device under mpirun. The
# fake's environment reaches every rank by mpirun -x.
if "fake-cuda" in config.available_features and os.path.exists(os.path.join(fake_cuda, "libnccl.so.2")):
    config.available_features.add("fake-nccl")
    config.substitutions.append(("%fake-nccl-mpirun-args", "-x LD_LIBRARY_PATH -x MOE_FAKE_CUDA_CACHE -x MOE_FAKE_CUDA_STATS"))
    config.substitutions.append(("%check-ranks", "%s %s" % (
        config.python_executable, os.path.join(config.moe_src_root, "tests", "tools", "check-ranks.py"))))
