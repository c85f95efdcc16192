// llama-logits: the logits llama.cpp computes for one prompt, for
// bench/compare.py's agreement check before any peer timing is trusted.
// Built by bench/peers/setup.sh against the libllama it builds (public API
// of include/llama.h only).
//
//   llama-logits MODEL.gguf OUT.f32 ID,ID,...
// writes float32 logits [prompt length][vocab], row-major, to OUT.f32,
// computed with an F32 KV cache and without flash attention.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: llama-logits MODEL.gguf OUT.f32 ID,ID,...\n");
    return 2;
  }
  std::vector<llama_token> ids;
  std::stringstream list(argv[3]);
  for (std::string item; std::getline(list, item, ',');)
    ids.push_back(static_cast<llama_token>(std::atoi(item.c_str())));
  llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model *model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama-logits: cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(ids.size() < 64 ? 64 : ids.size());
  cp.n_threads = cp.n_threads_batch = 2;
  // An F32 KV cache and no flash attention (llama.cpp's CPU defaults round K
  // and V to F16): this check is about the model's weights and math being the
  // same, not the cache's precision.
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context *ctx = llama_init_from_model(model, cp);
  llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(ids.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama-logits: llama_decode failed\n");
    return 1;
  }
  int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE *out = std::fopen(argv[2], "wb");
  for (size_t i = 0; i < ids.size(); ++i)
    std::fwrite(llama_get_logits_ith(ctx, static_cast<int32_t>(i)), sizeof(float), vocab, out);
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
