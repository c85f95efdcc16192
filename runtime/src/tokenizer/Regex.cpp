// tokenizer.json patterns. `tokenizers` compiles its regexes with Oniguruma;
// moert runs them with PCRE2 (Debian's libpcre2, JIT-compiled), in UTF mode
// with Unicode properties. The two differ where Oniguruma's Unicode classes
// do: its \s is Unicode White_Space (with U+0085, without U+180E) and its \w
// includes marks, so both are rewritten to explicit sets before compiling.
// Matches iterate as Oniguruma's find_iter does (an empty match right after
// the previous match is skipped).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "Parts.h"

#include <pcre2.h>

#include <cctype>

namespace moert::tokenizer {

namespace {

constexpr const char *kSpaceSet =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr const char *kWordSet = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}\\p{Nl}\\x{200C}\\x{200D}";

/// Oniguruma's \s \S \w \W as PCRE2 sets, inside and outside classes.
std::string translate(const std::string &regex) {
  std::string out;
  int classDepth = 0;
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c == '\\' && i + 1 < regex.size()) {
      const char e = regex[i + 1];
      const char *set = e == 's' || e == 'S' ? kSpaceSet : e == 'w' || e == 'W' ? kWordSet : nullptr;
      if (set && (e == 's' || e == 'w')) {
        out += classDepth ? std::string(set) : "[" + std::string(set) + "]";
      } else if (set && classDepth == 0) {
        out += "[^" + std::string(set) + "]";
      } else {
        out += c; // \S \W inside a class keep PCRE2's meaning; any other escape as is
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[') {
      // A POSIX class [:name:] inside a class does not open one.
      if (classDepth > 0 && i + 1 < regex.size() && regex[i + 1] == ':') {
        size_t close = regex.find(":]", i + 2);
        if (close != std::string::npos) {
          out += regex.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      ++classDepth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < regex.size() && regex[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < regex.size() && regex[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (c == ']' && classDepth > 0)
      --classDepth;
    out += c;
  }
  return out;
}

std::string escapeLiteral(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u))
      out += '\\';
    out += c;
  }
  return out;
}

} // namespace

struct Pattern::Code {
  pcre2_code *code = nullptr;
  std::string where;
  ~Code() { pcre2_code_free(code); }
};

Pattern::Pattern(const JsonFields &fields, const std::string &field) {
  JsonFields pattern = fields.child(field);
  const std::string where = fields.fieldName(field);
  if (pattern.has("String"))
    compile(escapeLiteral(pattern.string("String")), where);
  else if (pattern.has("Regex"))
    compile(translate(pattern.string("Regex")), where);
  else
    fields.fail(field, "expected {\"String\": ...} or {\"Regex\": ...}");
}

Pattern Pattern::literal(std::string_view text, const std::string &where) {
  Pattern p;
  p.compile(escapeLiteral(text), where);
  return p;
}

Pattern Pattern::regex(const std::string &regex, const std::string &where) {
  Pattern p;
  p.compile(translate(regex), where);
  return p;
}

Pattern::Pattern(Pattern &&) noexcept = default;
Pattern::~Pattern() = default;

void Pattern::compile(const std::string &regex, const std::string &where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code = std::make_unique<Code>();
  code->where = where;
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!code->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    inputError("{}: not a regex this tokenizer can run (at offset {}): {}", where, offset,
               reinterpret_cast<const char *>(message));
  }
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE); // falls back to the interpreter
}

std::vector<Slice> Pattern::findMatches(std::string_view s) const {
  std::vector<Slice> out;
  if (s.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  pcre2_match_data *data = pcre2_match_data_create_from_pattern(code->code, nullptr);
  size_t previous = 0, searchFrom = 0;
  bool hadMatch = false;
  size_t lastMatchEnd = 0;
  while (searchFrom <= s.size()) {
    int rc = pcre2_match(code->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), searchFrom,
                         PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      pcre2_match_data_free(data);
      inputError("{}: the regex failed on the input: {}", code->where,
                 reinterpret_cast<const char *>(message));
    }
    const PCRE2_SIZE *v = pcre2_get_ovector_pointer(data);
    const size_t start = v[0], end = v[1];
    if (start == end && hadMatch && lastMatchEnd == end) {
      // Oniguruma's find_iter: skip one character and search again.
      if (searchFrom >= s.size())
        break;
      size_t length = 1;
      codePointAt(s, searchFrom, &length);
      searchFrom += length;
      continue;
    }
    if (previous != start)
      out.push_back({previous, start, false});
    out.push_back({start, end, true});
    previous = end;
    hadMatch = true;
    lastMatchEnd = end;
    searchFrom = end;
  }
  pcre2_match_data_free(data);
  if (previous != s.size())
    out.push_back({previous, s.size(), false});
  return out;
}

} // namespace moert::tokenizer
