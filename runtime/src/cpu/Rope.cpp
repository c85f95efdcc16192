// Rotary position embeddings: the cos/sin tables of every #moe.rope kind,
// computed the way transformers 4.57 computes them (modeling_rope_utils.py
// and the models' RotaryEmbedding.forward), and their application.
//
// transformers computes inv_freq as a float32 tensor from Python-double
// parameters; every step below is one float32 operation in the same order,
// with the Python scalars rounded to float32 where torch rounds them. Two
// things cannot be bit-exact: torch's vectorised powf and cosf/sinf (SLEEF,
// within 1 ulp) are replaced by correctly rounded results (computed in double,
// rounded once), so about 1% of inv_freq entries and 5% of cos/sin entries
// differ from torch's in the last bit.
#include "IsaTarget.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>

namespace moert::cpu {
namespace {

using Kind = RopeParams::Kind;

constexpr double kPi = 3.14159265358979323846;

/// torch's f32 `base ** exponent`, rounded once.
float powF32(float base, float exponent) {
  return static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

/// `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))` (the default
/// inverse frequencies; `1.0 / t` is torch's f32 reciprocal).
std::vector<float> defaultInvFreq(float base, int64_t dim) {
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i)
    inv[i] = 1.0f / powF32(base, static_cast<float>(2 * i) / static_cast<float>(dim));
  return inv;
}

/// _compute_dynamic_ntk_parameters for a sequence length `seqLen` >
/// `maxPosition`. In the forward pass transformers passes seq_len as an int64
/// tensor, so the rescaled base is an f32 tensor: factor * L, / max, -
/// (factor - 1) are f32 operations, the power (a double exponent) is rounded
/// once, and the product with the Python base is f32.
std::vector<float> dynamicInvFreq(const RopeParams &p, int64_t seqLen) {
  const int64_t dim = p.rotaryDim;
  float ratio = static_cast<float>(p.factor) * static_cast<float>(seqLen);
  ratio = ratio / static_cast<float>(p.originalMaxPosition);
  ratio = ratio - static_cast<float>(p.factor - 1.0);
  float grown = static_cast<float>(std::pow(static_cast<double>(ratio),
                                            static_cast<double>(dim) / static_cast<double>(dim - 2)));
  float base = static_cast<float>(p.theta) * grown;
  return defaultInvFreq(base, dim);
}

/// The inverse frequencies at construction time (seq_len = None) for the
/// length-independent kinds, in f32 as transformers computes them.
std::vector<float> staticInvFreq(const RopeParams &p) {
  const int64_t dim = p.rotaryDim, half = dim / 2;
  const float base = static_cast<float>(p.theta);
  std::vector<float> inv = defaultInvFreq(base, dim);
  switch (p.kind) {
  case Kind::Default:
    break;
  case Kind::Linear: {
    // `inv_freq /= factor` (an f32 division, not positions / factor).
    const float factor = static_cast<float>(p.factor);
    for (float &f : inv)
      f = f / factor;
    break;
  }
  case Kind::Dynamic: {
    // At construction seq_len defaults to max_position_embeddings and the
    // Python-double formula leaves the base (all but) unchanged; evaluate it
    // literally so a factor that does not cancel exactly still matches.
    const double m = static_cast<double>(p.originalMaxPosition);
    const double grown = std::pow((p.factor * m / m) - (p.factor - 1.0),
                                  static_cast<double>(dim) / static_cast<double>(dim - 2));
    inv = defaultInvFreq(static_cast<float>(p.theta * grown), dim);
    break;
  }
  case Kind::Llama3: {
    const float factor = static_cast<float>(p.factor);
    const double old = static_cast<double>(p.originalMaxPosition);
    const float lowWavelen = static_cast<float>(old / p.lowFreqFactor);
    const float highWavelen = static_cast<float>(old / p.highFreqFactor);
    const float twoPi = static_cast<float>(2 * kPi);
    const float oldF = static_cast<float>(old), lowF = static_cast<float>(p.lowFreqFactor);
    const float span = static_cast<float>(p.highFreqFactor - p.lowFreqFactor);
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv[i];
      // `2 * math.pi / inv_freq` is torch's reciprocal(inv_freq) * 2pi.
      const float wavelen = (1.0f / f) * twoPi;
      const float scaled = wavelen > lowWavelen ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * oldF - lowF) / span;
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < highWavelen) && !(wavelen > lowWavelen);
      inv[i] = medium ? smoothed : scaled;
    }
    break;
  }
  case Kind::Yarn: {
    const float factor = static_cast<float>(p.factor);
    // find_correction_range in Python doubles, rounded outwards to integers
    // unless `truncate` is false (transformers' default is true).
    auto correctionDim = [&](double rotations) {
      return (static_cast<double>(dim) *
              std::log(static_cast<double>(p.originalMaxPosition) / (rotations * 2 * kPi))) /
             (2 * std::log(p.theta));
    };
    double low = correctionDim(p.betaFast), high = correctionDim(p.betaSlow);
    if (p.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high)
      high += 0.001; // transformers' guard against a zero-width ramp
    const float lowF = static_cast<float>(low), width = static_cast<float>(high - low);
    for (int64_t i = 0; i < half; ++i) {
      const float posFreq = powF32(base, static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrapolation = 1.0f / posFreq;
      const float interpolation = 1.0f / (factor * posFreq);
      const float ramp = std::clamp((static_cast<float>(i) - lowF) / width, 0.0f, 1.0f);
      const float extrapolationFactor = 1.0f - ramp;
      inv[i] = interpolation * (1.0f - extrapolationFactor) + extrapolation * extrapolationFactor;
    }
    break;
  }
  }
  return inv;
}

void checkParams(const RopeParams &p, int64_t maxPositions) {
  if (p.rotaryDim <= 0 || p.rotaryDim % 2 != 0)
    inputError("rope: rotary_dim must be positive and even, got {}", p.rotaryDim);
  if (!(p.theta > 0))
    inputError("rope: theta must be positive, got {}", p.theta);
  if (maxPositions < 0)
    inputError("rope: negative table size {}", maxPositions);
  if (p.kind != Kind::Default && !(p.factor > 0))
    inputError("rope: factor must be positive, got {}", p.factor);
  bool needsOriginal = p.kind == Kind::Dynamic || p.kind == Kind::Llama3 || p.kind == Kind::Yarn;
  if (needsOriginal && p.originalMaxPosition <= 0)
    inputError("rope: this scaling kind needs original_max_position > 0");
  if (p.kind == Kind::Dynamic && p.rotaryDim <= 2)
    inputError("rope: dynamic scaling needs rotary_dim > 2");
  if (p.kind == Kind::Llama3 && !(p.highFreqFactor > p.lowFreqFactor))
    inputError("rope: llama3 needs high_freq_factor > low_freq_factor");
  if (!(p.attentionFactor > 0) || !std::isfinite(p.attentionFactor))
    inputError("rope: attention_factor must be finite and positive, got {}", p.attentionFactor);
}

/// One head's rotation: transformers' x * cos + rotate_half(x) * sin, every
/// product and sum rounded to f32 (no fused multiply-add: this file is
/// compiled with -ffp-contract=off). rotate_half pairs (i, i + half);
/// interleaved pairs (2i, 2i + 1), kept in place (transformers' DeepSeek-V3,
/// apply_rotary_pos_emb_interleave, also de-interleaves the result to
/// (evens, odds); q and k get the same permutation, so every q.k product,
/// the only use of the result, is the same).
struct ScalarRotation {
  static void rotateHalf(float *v, const float *c, const float *s, int64_t begin, int64_t half) {
    for (int64_t i = begin; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
  static void rotatePairs(float *v, const float *c, const float *s, int64_t begin, int64_t half) {
    for (int64_t i = begin; i < half; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c[i] - b * s[i];
      v[2 * i + 1] = b * c[i] + a * s[i];
    }
  }
};

#ifdef MOERT_X86
struct Avx512Rotation {
  MOERT_AVX512 static void rotateHalf(float *v, const float *c, const float *s, int64_t, int64_t half) {
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 k = half - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (half - i)) - 1);
      const __m512 a = _mm512_maskz_loadu_ps(k, v + i), b = _mm512_maskz_loadu_ps(k, v + i + half);
      const __m512 cv = _mm512_maskz_loadu_ps(k, c + i), sv = _mm512_maskz_loadu_ps(k, s + i);
      _mm512_mask_storeu_ps(v + i, k, _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sv)));
      _mm512_mask_storeu_ps(v + i + half, k,
                            _mm512_add_ps(_mm512_mul_ps(b, cv), _mm512_mul_ps(a, sv)));
    }
  }
  /// 8 pairs per vector: cos and sin duplicated to both lanes of a pair,
  /// the pair swapped; even lanes take the difference, odd lanes the sum.
  MOERT_AVX512 static void rotatePairs(float *v, const float *c, const float *s, int64_t,
                                       int64_t half) {
    const __m512i pairs = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    for (int64_t i = 0; i < half; i += 8) {
      const int64_t left = std::min<int64_t>(8, half - i);
      const __mmask8 k8 = static_cast<__mmask8>((1u << left) - 1);
      const __mmask16 k16 = static_cast<__mmask16>((1u << (2 * left)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(k16, v + 2 * i);
      const __m512 cv = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, c + i)));
      const __m512 sv = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, s + i)));
      const __m512 p = _mm512_mul_ps(x, cv), q = _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), sv);
      const __m512 y = _mm512_mask_sub_ps(_mm512_add_ps(p, q), __mmask16(0x5555), p, q);
      _mm512_mask_storeu_ps(v + 2 * i, k16, y);
    }
  }
};

/// AVX2: whole vectors, the scalar rotation for the rest.
struct Avx2Rotation {
  MOERT_AVX2 static void rotateHalf(float *v, const float *c, const float *s, int64_t, int64_t half) {
    const int64_t full = half / 8 * 8;
    for (int64_t i = 0; i < full; i += 8) {
      const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
      const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
      _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
      _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv)));
    }
    ScalarRotation::rotateHalf(v, c, s, full, half);
  }
  /// 4 pairs per vector; addsub: even lanes p - q, odd lanes p + q.
  MOERT_AVX2 static void rotatePairs(float *v, const float *c, const float *s, int64_t,
                                     int64_t half) {
    const __m256i pairs = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
    const int64_t full = half / 4 * 4;
    for (int64_t i = 0; i < full; i += 4) {
      const __m256 x = _mm256_loadu_ps(v + 2 * i);
      const __m256 cv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(c + i)), pairs);
      const __m256 sv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(s + i)), pairs);
      const __m256 p = _mm256_mul_ps(x, cv), q = _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), sv);
      _mm256_storeu_ps(v + 2 * i, _mm256_addsub_ps(p, q));
    }
    ScalarRotation::rotatePairs(v, c, s, full, half);
  }
};
#endif

/// Rotates every head of rows [begin, end).
template <class Rotation>
void rotateRows(float *x, int64_t begin, int64_t end, int64_t heads, int64_t headDim,
                int64_t ldx, int64_t half, bool interleaved, const int32_t *positions,
                const float *cosTable, const float *sinTable) {
  for (int64_t t = begin; t < end; ++t) {
    const float *c = cosTable + positions[t] * half;
    const float *s = sinTable + positions[t] * half;
    for (int64_t h = 0; h < heads; ++h) {
      float *v = x + t * ldx + h * headDim;
      if (interleaved)
        Rotation::rotatePairs(v, c, s, 0, half);
      else
        Rotation::rotateHalf(v, c, s, 0, half);
    }
  }
}

} // namespace

RopeTable::RopeTable(const RopeParams &params, int64_t maxPositions)
    : p(params), maxPositions(maxPositions) {
  checkParams(p, maxPositions);
  const int64_t half = p.rotaryDim / 2;
  const std::vector<float> inv = staticInvFreq(p);
  // cos/sin are f32 tensors multiplied by the Python-double attention factor
  // (an f32 multiply; exact when it is 1).
  const float scaling = static_cast<float>(p.attentionFactor);
  cosTable.resize(static_cast<size_t>(maxPositions * half));
  sinTable.resize(cosTable.size());
  parallelFor(maxPositions, [&](int64_t begin, int64_t end) {
    for (int64_t pos = begin; pos < end; ++pos) {
      // Dynamic NTK: transformers rescales the base from the longest sequence
      // of the forward call (max(position_ids) + 1). A fixed table cannot know
      // the call, so position `pos` uses the length pos + 1: this equals
      // transformers for every position within original_max_position and for
      // token-by-token decoding beyond it (where each key is rotated in the
      // step that produced it); a prefill longer than original_max_position
      // differs (there transformers uses the full length for all positions).
      std::vector<float> grown;
      const float *freq = inv.data();
      if (p.kind == Kind::Dynamic && pos + 1 > p.originalMaxPosition) {
        grown = dynamicInvFreq(p, pos + 1);
        freq = grown.data();
      }
      const float position = static_cast<float>(pos);
      for (int64_t i = 0; i < half; ++i) {
        // freqs = inv_freq @ position_ids: one f32 product.
        const double angle = static_cast<double>(freq[i] * position);
        cosTable[pos * half + i] = static_cast<float>(std::cos(angle)) * scaling;
        sinTable[pos * half + i] = static_cast<float>(std::sin(angle)) * scaling;
      }
    }
  }, 64);
}

void RopeTable::apply(float *x, int64_t tokens, int64_t width, int64_t headDim,
                      const int32_t *positions, int64_t ldx) const {
  const int64_t rotary = p.rotaryDim, half = rotary / 2;
  if (headDim <= 0 || width % headDim != 0)
    inputError("rope: width {} is not a multiple of head_dim {}", width, headDim);
  if (rotary > headDim)
    inputError("rope: rotary_dim {} exceeds head_dim {}", rotary, headDim);
  if (ldx == 0)
    ldx = width;
  for (int64_t t = 0; t < tokens; ++t)
    if (positions[t] < 0 || positions[t] >= maxPositions)
      inputError("rope: position {} outside the table [0, {})", positions[t], maxPositions);
  const int64_t heads = width / headDim;
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    const float *c = cosTable.data(), *s = sinTable.data();
#ifdef MOERT_X86
    if (activeIsa() >= Isa::Avx512)
      return rotateRows<Avx512Rotation>(x, begin, end, heads, headDim, ldx, half, p.interleaved,
                                        positions, c, s);
    if (activeIsa() >= Isa::Avx2)
      return rotateRows<Avx2Rotation>(x, begin, end, heads, headDim, ldx, half, p.interleaved,
                                      positions, c, s);
#endif
    rotateRows<ScalarRotation>(x, begin, end, heads, headDim, ldx, half, p.interleaved,
                               positions, c, s);
  }, 16);
}

void RopeTable::applyTransposed(float *x, int64_t tokens, int64_t width, int64_t headDim,
                                const int32_t *positions) const {
  const int64_t half = p.rotaryDim / 2;
  if (headDim <= 0 || width % headDim != 0 || p.rotaryDim > headDim)
    inputError("rope_grad: width {} is not a multiple of head_dim {} or rotary_dim {} exceeds it",
               width, headDim, p.rotaryDim);
  for (int64_t t = 0; t < tokens; ++t)
    if (positions[t] < 0 || positions[t] >= maxPositions)
      inputError("rope_grad: position {} outside the table [0, {})", positions[t], maxPositions);
  // Each pair went through [c -s; s c]; its transpose is [c s; -s c].
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cosTable.data() + positions[t] * half;
      const float *s = sinTable.data() + positions[t] * half;
      for (int64_t h = 0; h < width / headDim; ++h) {
        float *v = x + t * width + h * headDim;
        for (int64_t i = 0; i < half; ++i) {
          float &a = p.interleaved ? v[2 * i] : v[i];
          float &b = p.interleaved ? v[2 * i + 1] : v[i + half];
          const float a0 = a, b0 = b;
          a = a0 * c[i] + b0 * s[i];
          b = b0 * c[i] - a0 * s[i];
        }
      }
    }
  }, 16);
}

} // namespace moert::cpu
