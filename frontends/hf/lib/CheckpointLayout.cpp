//===- CheckpointLayout.cpp - checkpoint tensor names per family -*- C++ -*-===//
//
// The tensor names and shapes each family's Hugging Face checkpoint holds, as
// the `transformers` modules register them (nn.Linear weights are [out, in]).
// Parameter counts are sums over this list, so they count exactly what a
// checkpoint stores.
//
//===----------------------------------------------------------------------===//
#include "moe/Frontend/HF/ModelConfig.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;
using namespace moe::hf;

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

TensorSpec moe::hf::blockScalesOf(const TensorSpec &weight) {
  TensorSpec s = weight;
  s.name += "_scale_inv";
  s.shape = {(weight.shape[0] + weight.fp8BlockRows - 1) / weight.fp8BlockRows,
             (weight.shape[1] + weight.fp8BlockCols - 1) / weight.fp8BlockCols};
  s.fp8BlockRows = s.fp8BlockCols = 0;
  s.blockScales = true;
  s.tpSplit = TensorSplit::Replicated;
  return s;
}

std::vector<TensorSpec> moe::hf::withBlockScales(std::vector<TensorSpec> specs) {
  std::vector<TensorSpec> out;
  out.reserve(specs.size());
  for (TensorSpec &s : specs) {
    const bool fp8 = s.isFp8();
    out.push_back(std::move(s));
    if (fp8)
      out.push_back(blockScalesOf(out.back()));
  }
  return out;
}

namespace {

/// "model.layers.3.mlp.experts.17.up_proj.weight" -> 17; -1 when the name
/// has no ".experts.<digits>." component.
int64_t expertIndexOf(StringRef name) {
  size_t pos = name.find(".experts.");
  if (pos == StringRef::npos)
    return -1;
  StringRef rest = name.substr(pos + strlen(".experts."));
  StringRef digits = rest.take_while([](char c) { return isDigit(c); });
  if (digits.empty() || !rest.drop_front(digits.size()).starts_with("."))
    return -1;
  int64_t e = -1;
  digits.getAsInteger(10, e);
  return e;
}

/// The module's last name component: "...self_attn.q_proj.weight" -> q_proj.
StringRef moduleName(StringRef name, bool &isBias) {
  isBias = name.ends_with(".bias");
  StringRef mod = name;
  if (!mod.consume_back(".weight"))
    mod.consume_back(".bias");
  return mod.rsplit('.').second.empty() ? mod : mod.rsplit('.').second;
}

/// What tensor and expert parallelism do with each tensor, from the module
/// it belongs to (the names are this file's own).
void classify(const ModelConfig &c, std::vector<TensorSpec> &specs) {
  for (TensorSpec &s : specs) {
    bool isBias = false;
    StringRef mod = moduleName(s.name, isBias);
    if (s.role == TensorRole::RoutedExperts) {
      s.expert = expertIndexOf(s.name);
      s.etpDim = (mod == "w2" || mod == "down_proj") ? 1 : 0;
    } else if (s.role == TensorRole::Other && s.layer >= 0) {
      if (mod == "q_proj" || mod == "k_proj" || mod == "v_proj" || mod == "q_b_proj" ||
          mod == "kv_b_proj" || mod == "gate_proj" || mod == "up_proj" || mod == "sinks")
        s.tpSplit = TensorSplit::Column;
      else if (mod == "o_proj" || mod == "down_proj")
        s.tpSplit = isBias ? TensorSplit::Replicated : TensorSplit::Row;
      else if ((mod == "q_norm" || mod == "k_norm") && c.qkNorm == QKNorm::Full)
        s.tpSplit = TensorSplit::Column;
    }
  }
}

class LayoutBuilder {
public:
  LayoutBuilder(std::vector<TensorSpec> &out, const ModelConfig &c)
      : out(out), fp8(c.fp8 ? &*c.fp8 : nullptr) {}

  void add(std::string name, std::vector<int64_t> shape,
           TensorRole role = TensorRole::Other) {
    out.push_back({std::move(name), std::move(shape), role, layer});
  }
  /// A norm: weight (and bias for LayerNorm).
  void norm(const std::string &prefix, int64_t size, bool bias) {
    add(prefix + ".weight", {size});
    if (bias)
      add(prefix + ".bias", {size});
  }
  void linear(const std::string &prefix, int64_t out, int64_t in, bool bias,
              TensorRole role = TensorRole::Other) {
    add(prefix + ".weight", {out, in}, role);
    // An FP8 checkpoint stores each nn.Linear's weight in blocks (the LM
    // head stays in the model's dtype).
    if (fp8 && role != TensorRole::LMHead && fp8->quantizes(this->out.back().name)) {
      this->out.back().fp8BlockRows = fp8->blockRows;
      this->out.back().fp8BlockCols = fp8->blockCols;
    }
    if (bias)
      add(prefix + ".bias", {out}, role);
  }
  /// A gated MLP with the given projection names.
  void mlp(const std::string &prefix, int64_t hidden, int64_t inter,
           StringRef gate, StringRef up, StringRef down, bool bias = false,
           TensorRole role = TensorRole::Other) {
    linear(prefix + "." + gate.str(), inter, hidden, bias, role);
    linear(prefix + "." + up.str(), inter, hidden, bias, role);
    linear(prefix + "." + down.str(), hidden, inter, bias, role);
  }

  TensorSpec &last() { return out.back(); }

  int64_t layer = -1;

private:
  std::vector<TensorSpec> &out;
  const ModelConfig::Fp8Quantization *fp8;
};

std::string layerPrefix(int64_t i) { return formatv("model.layers.{0}", i).str(); }

void llamaAttention(LayoutBuilder &b, const ModelConfig &c, const std::string &p) {
  int64_t q = c.numHeads * c.headDim, kv = c.numKVHeads * c.headDim;
  b.linear(p + ".q_proj", q, c.hiddenSize, c.qkvBias);
  b.linear(p + ".k_proj", kv, c.hiddenSize, c.qkvBias);
  b.linear(p + ".v_proj", kv, c.hiddenSize, c.qkvBias);
  b.linear(p + ".o_proj", c.hiddenSize, q, c.oBias);
  if (c.qkNorm == QKNorm::PerHead) {
    b.norm(p + ".q_norm", c.headDim, false);
    b.norm(p + ".k_norm", c.headDim, false);
  } else if (c.qkNorm == QKNorm::Full) {
    b.norm(p + ".q_norm", q, false);
    b.norm(p + ".k_norm", kv, false);
  }
}

void mlaAttention(LayoutBuilder &b, const ModelConfig &c, const std::string &p) {
  int64_t h = c.hiddenSize, heads = c.numHeads;
  int64_t qHead = c.qkNopeHeadDim + c.qkRopeHeadDim;
  if (c.qLoraRank > 0) {
    b.linear(p + ".q_a_proj", c.qLoraRank, h, c.qkvBias);
    b.norm(p + ".q_a_layernorm", c.qLoraRank, false);
    b.linear(p + ".q_b_proj", heads * qHead, c.qLoraRank, false);
  } else {
    b.linear(p + ".q_proj", heads * qHead, h, false);
  }
  b.linear(p + ".kv_a_proj_with_mqa", c.kvLoraRank + c.qkRopeHeadDim, h, c.qkvBias);
  b.norm(p + ".kv_a_layernorm", c.kvLoraRank, false);
  b.linear(p + ".kv_b_proj", heads * (c.qkNopeHeadDim + c.vHeadDim), c.kvLoraRank,
           false);
  b.linear(p + ".o_proj", h, heads * c.vHeadDim, c.oBias);
}

/// Per-expert tensors `<prefix>.experts.<e>.<gate|up|down>`.
void routedExperts(LayoutBuilder &b, const ModelConfig &c, const std::string &p,
                   StringRef gate, StringRef up, StringRef down) {
  for (int64_t e = 0; e < c.numExperts; ++e)
    b.mlp(formatv("{0}.experts.{1}", p, e).str(), c.hiddenSize,
          c.moeIntermediateSize, gate, up, down, false, TensorRole::RoutedExperts);
}

/// One decoder layer of the Llama-style families that the importer supports.
void decoderLayer(LayoutBuilder &b, const ModelConfig &c, int64_t i) {
  std::string p = layerPrefix(i);
  b.layer = i;
  int64_t h = c.hiddenSize;
  b.norm(p + ".input_layernorm", h, c.norm == NormKind::LayerNorm);
  if (c.isMLA())
    mlaAttention(b, c, p + ".self_attn");
  else
    llamaAttention(b, c, p + ".self_attn");
  b.norm(p + ".post_attention_layernorm", h, c.norm == NormKind::LayerNorm);

  StringRef type = c.modelType;
  if (!c.moeLayers[i]) {
    b.mlp(p + ".mlp", h, c.intermediateSize, "gate_proj", "up_proj", "down_proj",
          c.mlpBias);
    return;
  }
  if (type == "mixtral" || type == "phimoe") {
    b.linear(p + ".block_sparse_moe.gate", c.numExperts, h, false);
    routedExperts(b, c, p + ".block_sparse_moe", "w1", "w3", "w2");
    return;
  }
  // DeepSeek's router weight is a parameter of its gate module, not an
  // nn.Linear (never FP8).
  if (type.starts_with("deepseek"))
    b.add(p + ".mlp.gate.weight", {c.numExperts, h});
  else
    b.linear(p + ".mlp.gate", c.numExperts, h, false);
  if (c.scoreCorrectionBias) {
    b.add(p + ".mlp.gate.e_score_correction_bias", {c.numExperts});
    b.last().storedF32 = c.correctionBiasF32;
  }
  routedExperts(b, c, p + ".mlp", "gate_proj", "up_proj", "down_proj");
  if (type == "qwen2_moe") {
    b.mlp(p + ".mlp.shared_expert", h, c.sharedExpertIntermediateSize,
          "gate_proj", "up_proj", "down_proj");
    b.linear(p + ".mlp.shared_expert_gate", 1, h, false);
  } else if (c.numSharedExperts > 0) {
    b.mlp(p + ".mlp.shared_experts", h, c.sharedExpertIntermediateSize,
          "gate_proj", "up_proj", "down_proj");
  }
}

void gptOssLayer(LayoutBuilder &b, const ModelConfig &c, int64_t i) {
  std::string p = layerPrefix(i);
  b.layer = i;
  int64_t h = c.hiddenSize, e = c.numExperts, inter = c.moeIntermediateSize;
  b.norm(p + ".input_layernorm", h, false);
  llamaAttention(b, c, p + ".self_attn");
  b.add(p + ".self_attn.sinks", {c.numHeads});
  b.norm(p + ".post_attention_layernorm", h, false);
  b.linear(p + ".mlp.router", e, h, true);
  const TensorRole r = TensorRole::RoutedExperts;
  b.add(p + ".mlp.experts.gate_up_proj", {e, h, 2 * inter}, r);
  b.add(p + ".mlp.experts.gate_up_proj_bias", {e, 2 * inter}, r);
  b.add(p + ".mlp.experts.down_proj", {e, inter, h}, r);
  b.add(p + ".mlp.experts.down_proj_bias", {e, h}, r);
}

void graniteLayer(LayoutBuilder &b, const ModelConfig &c, int64_t i) {
  std::string p = layerPrefix(i);
  b.layer = i;
  int64_t h = c.hiddenSize, e = c.numExperts, inter = c.moeIntermediateSize;
  b.norm(p + ".input_layernorm", h, false);
  llamaAttention(b, c, p + ".self_attn");
  b.norm(p + ".post_attention_layernorm", h, false);
  b.linear(p + ".block_sparse_moe.router.layer", e, h, false);
  const TensorRole r = TensorRole::RoutedExperts;
  b.add(p + ".block_sparse_moe.input_linear.weight", {e, 2 * inter, h}, r);
  b.add(p + ".block_sparse_moe.output_linear.weight", {e, h, inter}, r);
}

void dbrxLayout(LayoutBuilder &b, const ModelConfig &c) {
  int64_t d = c.hiddenSize, e = c.numExperts, ffn = c.moeIntermediateSize;
  b.add("transformer.wte.weight", {c.vocabSize, d}, TensorRole::Embedding);
  for (int64_t i = 0; i < c.numLayers; ++i) {
    b.layer = i;
    std::string p = formatv("transformer.blocks.{0}", i).str();
    b.norm(p + ".norm_attn_norm.norm_1", d, false);
    b.linear(p + ".norm_attn_norm.attn.Wqkv",
             (c.numHeads + 2 * c.numKVHeads) * c.headDim, d, false);
    b.linear(p + ".norm_attn_norm.attn.out_proj", d, d, false);
    b.norm(p + ".norm_attn_norm.norm_2", d, false);
    b.linear(p + ".ffn.router.layer", e, d, false);
    for (StringRef w : {"w1", "v1", "w2"})
      b.add((p + ".ffn.experts.mlp." + w).str(), {e * ffn, d},
            TensorRole::RoutedExperts);
  }
  b.layer = -1;
  b.norm("transformer.norm_f", d, false);
  if (!c.tieWordEmbeddings)
    b.add("lm_head.weight", {c.vocabSize, d}, TensorRole::LMHead);
}

/// T5-style blocks; in Switch Transformers every other block's FF is sparse
/// (block i is sparse when i % 2 == 1, as `transformers` builds it).
void switchLayout(LayoutBuilder &b, const ModelConfig &c) {
  int64_t d = c.hiddenSize, inner = c.numHeads * c.headDim, ff = c.intermediateSize;
  b.add("shared.weight", {c.vocabSize, d}, TensorRole::Embedding);
  auto attention = [&](const std::string &p, bool relativeBias) {
    for (StringRef w : {"q", "k", "v"})
      b.linear(p + "." + w.str(), inner, d, false);
    b.linear(p + ".o", d, inner, false);
    if (relativeBias)
      b.add(p + ".relative_attention_bias.weight", {32, c.numHeads});
  };
  auto feedForward = [&](const std::string &p, int64_t block) {
    if (block % 2 == 1) {
      b.linear(p + ".mlp.router.classifier", c.numExperts, d, false);
      for (int64_t e = 0; e < c.numExperts; ++e) {
        std::string ep = formatv("{0}.mlp.experts.expert_{1}", p, e).str();
        b.linear(ep + ".wi", ff, d, false, TensorRole::RoutedExperts);
        b.linear(ep + ".wo", d, ff, false, TensorRole::RoutedExperts);
      }
    } else {
      b.linear(p + ".mlp.wi", ff, d, false);
      b.linear(p + ".mlp.wo", d, ff, false);
    }
    b.norm(p + ".layer_norm", d, false);
  };
  for (StringRef stack : {"encoder", "decoder"}) {
    bool decoder = stack == "decoder";
    for (int64_t i = 0; i < c.numLayers; ++i) {
      b.layer = i;
      std::string p = formatv("{0}.block.{1}.layer", stack, i).str();
      attention(p + ".0.SelfAttention", i == 0);
      b.norm(p + ".0.layer_norm", d, false);
      if (decoder) {
        attention(p + ".1.EncDecAttention", false);
        b.norm(p + ".1.layer_norm", d, false);
      }
      feedForward(p + (decoder ? ".2" : ".1"), i);
    }
    b.layer = -1;
    b.norm((stack + ".final_layer_norm").str(), d, false);
  }
  if (!c.tieWordEmbeddings)
    b.add("lm_head.weight", {c.vocabSize, d}, TensorRole::LMHead);
}

} // namespace

std::vector<TensorSpec> moe::hf::checkpointTensors(const ModelConfig &c) {
  std::vector<TensorSpec> out;
  LayoutBuilder b(out, c);
  StringRef type = c.modelType;
  if (type == "dbrx") {
    dbrxLayout(b, c);
    return out;
  }
  if (type == "switch_transformers") {
    switchLayout(b, c);
    return out;
  }
  b.add("model.embed_tokens.weight", {c.vocabSize, c.hiddenSize},
        TensorRole::Embedding);
  for (int64_t i = 0; i < c.numLayers; ++i) {
    if (type == "gpt_oss")
      gptOssLayer(b, c, i);
    else if (type == "granitemoe")
      graniteLayer(b, c, i);
    else
      decoderLayer(b, c, i);
  }
  b.layer = -1;
  bool biasedNorm = c.norm == NormKind::LayerNorm;
  b.norm("model.norm", c.hiddenSize, biasedNorm);
  if (!c.tieWordEmbeddings)
    // Phi-3.5-MoE's LM head carries a bias (lm_head_bias).
    b.linear("lm_head", c.vocabSize, c.hiddenSize, type == "phimoe",
             TensorRole::LMHead);
  classify(c, out);
  return out;
}

std::vector<TensorSpec> moe::hf::mtpTensors(const ModelConfig &c) {
  // DeepSeek-V3's multi-token-prediction module i is stored as decoder layer
  // numLayers + i: a full MoE layer plus enorm, hnorm, eh_proj and the
  // shared head's norm (its embedding and head share the main model's).
  std::vector<TensorSpec> out;
  if (c.numMTPLayers == 0)
    return out;
  ModelConfig extended = c;
  extended.numLayers = c.numLayers + c.numMTPLayers;
  extended.moeLayers.resize(extended.numLayers, true);
  LayoutBuilder b(out, c);
  for (int64_t i = c.numLayers; i < extended.numLayers; ++i) {
    decoderLayer(b, extended, i);
    std::string p = layerPrefix(i);
    b.norm(p + ".enorm", c.hiddenSize, false);
    b.norm(p + ".hnorm", c.hiddenSize, false);
    b.linear(p + ".eh_proj", c.hiddenSize, 2 * c.hiddenSize, false);
    b.norm(p + ".shared_head.norm", c.hiddenSize, false);
  }
  classify(c, out);
  return out;
}

ParamCounts moe::hf::countParameters(const ModelConfig &c) {
  ParamCounts counts;
  for (const TensorSpec &t : checkpointTensors(c)) {
    int64_t n = t.numel();
    counts.total += n;
    switch (t.role) {
    case TensorRole::Embedding:
      counts.embedding += n;
      break;
    case TensorRole::LMHead:
      counts.lmHead += n;
      break;
    case TensorRole::RoutedExperts:
      counts.routedExperts += n;
      break;
    case TensorRole::Other:
      break;
    }
  }
  // Each MoE layer runs k of its E experts for a token; every routed-expert
  // tensor holds E equal parts (one per expert), so the share is exact.
  int64_t activeExperts =
      c.isMoE() ? counts.routedExperts / c.numExperts * c.expertsPerToken : 0;
  counts.active = counts.total - counts.routedExperts + activeExperts;
  for (const TensorSpec &t : mtpTensors(c))
    counts.mtp += t.numel();
  return counts;
}
