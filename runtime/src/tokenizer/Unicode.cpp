// UTF-8 and the Unicode properties the tokenizer needs. Validation and
// decoding are written here (they are the hot path and their rule must be
// exactly the maximal-subpart one); categories and normal forms come from
// utf8proc (Debian's libutf8proc).
#include "Parts.h"
#include "moert/Error.h"

#include <utf8proc.h>

#include <cstdlib>

namespace moert::tokenizer {

namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD"; // U+FFFD
}

std::string validUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    // Length and the range of the second byte (Unicode table 3-7).
    size_t length = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) length = 2;
    else if (b == 0xE0) length = 3, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) length = 3;
    else if (b == 0xED) length = 3, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) length = 3;
    else if (b == 0xF0) length = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) length = 4;
    else if (b == 0xF4) length = 4, hi = 0x8F;
    if (length == 0) { // never a lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    size_t good = 1; // bytes of a valid prefix
    while (good < length && i + good < n) {
      const unsigned char c = p[i + good];
      const bool ok = good == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok)
        break;
      ++good;
    }
    if (good == length) {
      out.append(s.data() + i, length);
    } else {
      out += kReplacement; // one for the maximal invalid subpart
    }
    i += good;
  }
  return out;
}

char32_t codePointAt(std::string_view s, size_t i, size_t *length) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data()) + i;
  if (p[0] < 0x80) {
    *length = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *length = 2;
    return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *length = 3;
    return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *length = 4;
  return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void appendUtf8(std::string &out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool isWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool isWordChar(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D)
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
  case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
  case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
  case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
  case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
    return true;
  default:
    return false;
  }
}

bool isNumeric(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
  case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
    return true;
  default:
    return false;
  }
}

std::string normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
  case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
  case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
  case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
  case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t *out = nullptr;
  utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0)
    runtimeError("Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<char *>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

} // namespace moert::tokenizer
