#!/usr/bin/env python3
"""PyTorch eager (transformers' MixtralForCausalLM) on the benchmark model.

  torch_bench.py logits CONFIG.json MODEL.safetensors OUT.f32 ID,ID,...
      float32 logits [prompt length][vocab] of one prompt, row-major
  torch_bench.py run CONFIG.json MODEL.safetensors [--threads N]
      prints JSON: prefill 512 and 128 tokens (best of 3, last position's
      logits only), decode 128 tokens after a 16-token prompt (greedy, KV
      cache), tokens/s, the same workload bench/moe_bench.cpp times for moert
  torch_bench.py train CONFIG.json MODEL.safetensors TOKENS.npy SEQ [--threads N]
                 [--optimizer] [--f32-masters]
      prints JSON: one training step (forward, loss = cross-entropy of the
      next token + router_aux_loss_coef x transformers' balancing loss,
      backward; with --optimizer also torch.optim.AdamW's step on the
      model's parameters in their dtype, torch's defaults; with --f32-masters
      the parameters and moments in f32 and the forward under torch.autocast's
      bf16, the mixed precision moert trains in) on the first
      SEQ + 1 tokens of TOKENS.npy, the median of 3 after a warm-up,
      tokens/s, and the warm-up's loss (before any update; bench/train-step.sh
      checks it against moert's first step on the same window)
"""
import contextlib
import json
import sys
import time

import torch
from safetensors.torch import load_file
from transformers import MixtralConfig, MixtralForCausalLM


def load(config_path, model_path):
    cfg = MixtralConfig(**json.load(open(config_path)))
    state = load_file(model_path)
    dtype = next(iter(state.values())).dtype
    with torch.device("meta"):
        model = MixtralForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    model.load_state_dict(state, strict=True)
    # load_state_dict does not touch non-persistent buffers (RoPE's inv_freq).
    model.model.rotary_emb.__init__(cfg)
    return model.eval()


def main():
    mode, config_path, model_path = sys.argv[1:4]
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
    torch.set_num_threads(threads)
    model = load(config_path, model_path)
    vocab = model.config.vocab_size
    if mode == "train":
        import numpy as np
        tokens = np.load(sys.argv[4]).astype(np.int64)
        seq = int(sys.argv[5])
        # --f32-masters: the mixed precision moert trains in (f32 master
        # weights and AdamW moments, bf16 products): f32 parameters, the
        # forward under torch.autocast's bf16 (the backward follows it).
        masters = "--f32-masters" in sys.argv
        if masters:
            model = model.float()
        precision = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if masters \
            else contextlib.nullcontext
        ids = torch.tensor(tokens[None, :seq])
        labels = torch.tensor(tokens[None, 1:seq + 1])
        coef = model.config.router_aux_loss_coef
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) \
            if "--optimizer" in sys.argv else None
        times, first_loss = [], None
        for _ in range(4):  # a warm-up, then 3
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            with precision():
                out = model(input_ids=ids, output_router_logits=True)
            loss = torch.nn.functional.cross_entropy(
                out.logits.float().reshape(-1, vocab), labels.reshape(-1)) + coef * out.aux_loss.float()
            if first_loss is None:  # before any update: the workloads' check
                first_loss = loss.item()
            loss.backward()
            if optimizer:
                optimizer.step()
            times.append(time.perf_counter() - t0)
        median = sorted(times[1:])[1]
        print(json.dumps({"torch": torch.__version__, "threads": threads, "loss": loss.item(),
                          "first_loss": first_loss,
                          "optimizer": "AdamW" if optimizer else None,
                          "precision": "f32 masters, autocast bf16" if masters else "bf16",
                          "seconds": median, "tokens_per_s": seq / median}))
        return
    with torch.inference_mode():
        if mode == "logits":
            ids = torch.tensor([[int(t) for t in sys.argv[5].split(",")]])
            model(ids).logits[0].float().numpy().tofile(sys.argv[4])
            return
        gen = torch.Generator().manual_seed(7)
        prompt = lambda n: torch.randint(0, vocab, (1, n), generator=gen)
        model(prompt(16), logits_to_keep=1)  # warm-up
        out = {"torch": torch.__version__, "threads": threads}
        for n in (512, 128):
            best = 1e30
            for _ in range(3):
                ids = prompt(n)
                t0 = time.perf_counter()
                model(ids, logits_to_keep=1)
                best = min(best, time.perf_counter() - t0)
            out[f"prefill{n}"] = n / best
        past = model(prompt(16), use_cache=True, logits_to_keep=1).past_key_values
        token = torch.tensor([[1]])
        t0 = time.perf_counter()
        for _ in range(128):
            r = model(token, past_key_values=past, use_cache=True)
            past = r.past_key_values
            token = r.logits[:, -1].argmax(-1, keepdim=True)
        out["decode128"] = 128 / (time.perf_counter() - t0)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
