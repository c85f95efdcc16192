// Element types and non-owning views of tensors (weights are mmapped; their
// views point into the mapping).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace moert {

/// F8E4M3: float8_e4m3fn (safetensors' F8_E4M3), the storage of FP8
/// block-scaled weights; I8: symmetric int8 weights (moec compile
/// --weight-format int8, quantised at load). Both compute only through
/// their BlockScales.
enum class DType : uint8_t { F32, BF16, F16, I32, I64, F8E4M3, I8 };

/// Bytes per element.
size_t dtypeSize(DType t);
/// "F32", "BF16", ... as safetensors spells them.
const char *dtypeName(DType t);
/// Parses safetensors / plan spellings ("F32", "BF16", "F16", "I32", "I64",
/// and the lowercase "f32", "bf16", "f16", "float32", "bfloat16", "float16").
/// Returns false for anything else.
bool parseDType(std::string_view name, DType &out);

inline float bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
/// Round to nearest even, as torch does.
inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))
    return static_cast<uint16_t>((bits >> 16) | 0x40); // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
float f16ToFloat(uint16_t v);
/// float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
/// infinities, 0x7f / 0xff are NaN) to float, exactly.
float e4m3ToFloat(uint8_t v);
/// float to the nearest float8_e4m3fn (ties to even), saturating at +-448;
/// NaN stays NaN.
uint8_t floatToE4m3(float f);
uint16_t floatToF16(float f);
/// Rounds an f32 value through bf16 and back (models computed in bf16).
inline float roundBf16(float f) { return bf16ToFloat(floatToBf16(f)); }
/// v rounded to the nearest integer, ties to even (as torch.round), for
/// |v| < 2^22: the float addition rounds, branch-free, so loops of it
/// vectorise (std::nearbyint is a libm call below SSE4.1). int8 weights and
/// their GEMV's int16 x use it.
inline float roundHalfEven(float v) {
  constexpr float kShift = 12582912.0f; // 1.5 x 2^23
  return std::copysign((std::fabs(v) + kShift) - kShift, v);
}
/// |v|'s bits: finite values order as their magnitudes, infinities and
/// NaNs above them all (maxima that find a NaN, in loops that vectorise).
inline uint32_t magnitudeBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

/// The scales of a block-scaled weight, f32, one value per block of
/// blockRows x blockCols elements: an FP8 weight's (a rank's box of its
/// `<weight>_scale_inv`) or an int8 weight's (1 x 128 blocks, computed at
/// load). Element (r, c) of the weight's view is q(r, c) * data[((rowOrigin + r) /
/// blockRows) * stride + (colOrigin + c) / blockCols], where the origins
/// place the view's first element in the box's first block (a slice of the
/// weight need not start at a block's edge).
struct BlockScales {
  const float *data = nullptr;
  int64_t stride = 0;
  int64_t blockRows = 0, blockCols = 0;
  int64_t rowOrigin = 0, colOrigin = 0;
  /// The plan's dtype of the weight: a BF16 model's FP8 weights round their
  /// dequantised values to bf16 where its BF16 weights take bf16 products
  /// (src/cpu/GemmFp8.cpp); otherwise they multiply as exact f32 values.
  DType computeDtype = DType::F32;
  /// The plan's FP8 activations are dynamic (moec compile --fp8-activations
  /// dynamic): the rows this weight multiplies are quantised per 128
  /// columns to e4m3 first (src/cpu/GemmFp8.cpp, docs/quantization.md), and
  /// the products are exact f32 ones.
  bool quantiseActivations = false;
  float at(int64_t r, int64_t c) const {
    return data[((rowOrigin + r) / blockRows) * stride + (colOrigin + c) / blockCols];
  }
};

/// A read-only view of a tensor's bytes with its element type and shape.
struct TensorView {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void *data = nullptr;
  /// F8E4M3 and I8 weights: their block scales (owned by whoever bound the
  /// view).
  const BlockScales *blocks = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
  /// Element i as float (any float dtype; an FP8 or int8 weight's
  /// dequantised value).
  float at(int64_t i) const;
  /// Every element as float, at(i) for each i, into out[0, numel()).
  void toFloats(float *out) const;
};

/// Formats a shape as [a, b, c].
std::string shapeString(const std::vector<int64_t> &shape);

} // namespace moert
