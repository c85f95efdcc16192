#include "moert/Tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace moert {

size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: return 4;
  case DType::BF16: return 2;
  case DType::F16: return 2;
  case DType::I32: return 4;
  case DType::I64: return 8;
  case DType::F8E4M3: return 1;
  case DType::I8: return 1;
  }
  return 0;
}

const char *dtypeName(DType t) {
  switch (t) {
  case DType::F32: return "F32";
  case DType::BF16: return "BF16";
  case DType::F16: return "F16";
  case DType::I32: return "I32";
  case DType::I64: return "I64";
  case DType::F8E4M3: return "F8_E4M3";
  case DType::I8: return "I8";
  }
  return "?";
}

bool parseDType(std::string_view name, DType &out) {
  struct Spelling { std::string_view name; DType type; };
  static const Spelling spellings[] = {
      {"F32", DType::F32},     {"f32", DType::F32},       {"float32", DType::F32},
      {"BF16", DType::BF16},   {"bf16", DType::BF16},     {"bfloat16", DType::BF16},
      {"F16", DType::F16},     {"f16", DType::F16},       {"float16", DType::F16},
      {"I32", DType::I32},     {"i32", DType::I32},       {"I64", DType::I64},
      {"i64", DType::I64},     {"F8_E4M3", DType::F8E4M3},
      {"I8", DType::I8}};
  for (const Spelling &s : spellings)
    if (s.name == name) {
      out = s.type;
      return true;
    }
  return false;
}

float f16ToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0)
    value = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    value = mantissa ? NAN : INFINITY;
  else
    value = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  return sign ? -value : value;
}

uint16_t floatToF16(float f) {
  // Through the hardware conversion the compiler provides (_Float16 on x86-64
  // with GCC 12 is IEEE binary16, round to nearest even).
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

float e4m3ToFloat(uint8_t v) {
  const int exponent = (v >> 3) & 0xf, mantissa = v & 7;
  if (exponent == 0xf && mantissa == 7)
    return NAN;
  // Subnormals (exponent 0): mantissa / 8 * 2^-6.
  float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (v & 0x80) ? -value : value;
}

uint8_t floatToE4m3(float f) {
  if (std::isnan(f))
    return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  // The 127 finite magnitudes increase with their codes: the nearest one.
  uint8_t lo = 0, hi = 0x7e;
  if (a >= e4m3ToFloat(hi))
    return sign | hi;
  while (hi - lo > 1) {
    uint8_t mid = static_cast<uint8_t>((lo + hi) / 2);
    (e4m3ToFloat(mid) <= a ? lo : hi) = mid;
  }
  const float below = a - e4m3ToFloat(lo), above = e4m3ToFloat(hi) - a;
  const uint8_t code = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | code;
}

float TensorView::at(int64_t i) const {
  switch (dtype) {
  case DType::F32: return static_cast<const float *>(data)[i];
  case DType::BF16: return bf16ToFloat(static_cast<const uint16_t *>(data)[i]);
  case DType::F16: return f16ToFloat(static_cast<const uint16_t *>(data)[i]);
  case DType::I32: return static_cast<float>(static_cast<const int32_t *>(data)[i]);
  case DType::I64: return static_cast<float>(static_cast<const int64_t *>(data)[i]);
  case DType::F8E4M3: {
    float q = e4m3ToFloat(static_cast<const uint8_t *>(data)[i]);
    if (!blocks || shape.size() != 2)
      return q;
    return q * blocks->at(i / shape[1], i % shape[1]);
  }
  case DType::I8: {
    float q = static_cast<float>(static_cast<const int8_t *>(data)[i]);
    if (!blocks || shape.size() != 2)
      return q;
    return q * blocks->at(i / shape[1], i % shape[1]);
  }
  }
  return 0;
}

void TensorView::toFloats(float *out) const {
  const int64_t n = numel();
  switch (dtype) { // (loops the compiler vectorises, not a switch per element)
  case DType::F32:
    std::copy_n(static_cast<const float *>(data), n, out);
    return;
  case DType::BF16: {
    const auto *p = static_cast<const uint16_t *>(data);
    for (int64_t i = 0; i < n; ++i)
      out[i] = bf16ToFloat(p[i]);
    return;
  }
  default:
    for (int64_t i = 0; i < n; ++i)
      out[i] = at(i);
  }
}

std::string shapeString(const std::vector<int64_t> &shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

} // namespace moert
