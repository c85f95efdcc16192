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
    config.substitutions.append(("%mpirun", mpirun))
config.substitutions.append(("%deadline", "%s %s" % (
    config.python_executable, os.path.join(config.moe_src_root, "tests", "tools", "deadline.py"))))
if config.moe_have_cuda:
    config.available_features.add("cuda-toolkit")
