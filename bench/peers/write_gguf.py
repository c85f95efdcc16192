#!/usr/bin/env python3
"""Write a Mixtral-layout safetensors checkpoint as a GGUF file for llama.cpp.

Used by bench/compare.py so that llama.cpp runs the same random weights as
moert. convert_hf_to_gguf.py wants a tokenizer, which a random-weight model
does not have, so the GGUF is written here with PyPI's `gguf` writer, in the
layout llama.cpp's own converter produces for MixtralForCausalLM:

* architecture "llama"; q_proj / k_proj rows permuted the way its LlamaModel
  converter does (llama.cpp rotates adjacent pairs, HF rotates halves);
* experts stacked into blk.N.ffn_{gate,up,down}_exps (w1 = gate, w3 = up,
  w2 = down); norms and the router (ffn_gate_inp) stored as F32, the other
  matrices in the checkpoint's dtype (BF16 bits are copied, not rounded);
* a placeholder vocabulary of vocab_size tokens (SentencePiece type), so
  llama-bench can draw random token ids;
* with --q8_0, every matrix but the router quantised to Q8_0 (blocks of 32
  with an f16 scale: what llama.cpp's `llama-quantize ... Q8_0` writes),
  by the gguf package's own quantiser.

usage: write_gguf.py CONFIG.json MODEL.safetensors OUT.gguf [--q8_0]
"""
import json
import sys

import gguf
import numpy as np
import torch
from safetensors.torch import load_file


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main() -> None:
    config_path, model_path, out_path = sys.argv[1:4]
    q8_0 = "--q8_0" in sys.argv[4:]
    cfg = json.load(open(config_path))
    if cfg.get("model_type") != "mixtral":
        sys.exit(f"write_gguf.py: {config_path}: model_type {cfg.get('model_type')!r}, only mixtral is mapped")
    tensors = load_file(model_path)
    dtype = next(iter(tensors.values())).dtype
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_exp = cfg["num_local_experts"]
    head_dim = cfg.get("head_dim") or hidden // n_head

    def array(t: torch.Tensor, force_f32: bool = False):
        """(numpy array, raw ggml type or None)."""
        if force_f32 or t.dtype == torch.float32:
            return t.float().numpy(), None
        assert t.dtype == torch.bfloat16, t.dtype
        return t.view(torch.int16).numpy().view(np.uint16), gguf.GGMLQuantizationType.BF16

    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name("moe-bench random weights")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else
                    gguf.LlamaFileType.MOSTLY_BF16 if dtype == torch.bfloat16 else gguf.LlamaFileType.ALL_F32)
    # Placeholder vocabulary: <unk>, <s>, </s>, then one token per id.
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"<t{i}>".encode() for i in range(3, vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [1] * (vocab - 3))  # unknown, control, control, normal
    w.add_bos_token_id(cfg.get("bos_token_id", 1))
    w.add_eos_token_id(cfg.get("eos_token_id", 2))
    w.add_unk_token_id(0)

    def put(name, t, force_f32=False):
        if q8_0 and not force_f32:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(t.float().numpy(), q8), raw_dtype=q8)
            return
        data, raw = array(t, force_f32)
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw)

    put("token_embd.weight", tensors["model.embed_tokens.weight"])
    for i in range(layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", tensors[p + "input_layernorm.weight"], True)
        q = tensors[p + "self_attn.q_proj.weight"]
        k = tensors[p + "self_attn.k_proj.weight"]
        put(f"blk.{i}.attn_q.weight", torch.from_numpy(permute(q.float().numpy(), n_head)).to(q.dtype))
        put(f"blk.{i}.attn_k.weight", torch.from_numpy(permute(k.float().numpy(), n_kv)).to(k.dtype))
        put(f"blk.{i}.attn_v.weight", tensors[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", tensors[p + "post_attention_layernorm.weight"], True)
        put(f"blk.{i}.ffn_gate_inp.weight", tensors[p + "block_sparse_moe.gate.weight"], True)
        for hf, gg in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            stacked = torch.stack([tensors[f"{p}block_sparse_moe.experts.{e}.{hf}.weight"] for e in range(n_exp)])
            put(f"blk.{i}.ffn_{gg}_exps.weight", stacked)
    put("output_norm.weight", tensors["model.norm.weight"], True)
    put("output.weight", tensors["model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
