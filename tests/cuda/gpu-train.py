#!/usr/bin/env python3
"""gpu-train.py MOEC MOERT FIXTURES WORKDIR MODEL...: on a real GPU (ctest
label `gpu`, through gpu-run.py), compiles each fixture MODEL's training
plan with --target cuda, runs one micro-batch with `moert train` on the
CUDA device and checks every gradient against the transformers reference
(check-gradients.py: 1e-5, or float32 autograd's own error where larger;
2e-5 for qwen3_moe and olmoe, whose fixture routers amplify f32 rounding,
as tests/cuda/fake-e2e-train.test)."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))


def main():
    moec, moert, fixtures, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    failed = 0
    for model in sys.argv[5:]:
        folder = os.path.join(fixtures, model)
        plan = os.path.join(work, model + ".plan")
        grads = os.path.join(work, model + ".safetensors")
        subprocess.run([moec, "compile", os.path.join(folder, "config.json"), "--train",
                        "--seq-len", "16", "--micro-batch-size", "2", "--target", "cuda",
                        "-o", plan], check=True)
        subprocess.run([moert, "train", plan, "--device", "cuda", "--weights", folder, "--data",
                        os.path.join(folder, "train_tokens.npy"), "--grads-out", grads],
                       check=True)
        check = [sys.executable, os.path.join(here, "..", "tools", "check-gradients.py"),
                 "--fp32-error", os.path.join(folder, "train_reference.json")]
        if model in ("qwen3_moe", "olmoe"):
            check += ["--rtol", "2e-5"]
        failed += subprocess.run(check + [grads, os.path.join(folder, "train_grads.safetensors")]
                                 ).returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
