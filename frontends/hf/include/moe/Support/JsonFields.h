//===- JsonFields.h - typed reads of JSON object fields --------*- C++ -*-===//
//
// The one reader behind config.json (frontends/hf) and --cluster files
// (compiler). Every failure is a one-line error naming the file and the
// dotted field: "FILE: field 'outer.inner': message".
//
//===----------------------------------------------------------------------===//
#ifndef MOE_SUPPORT_JSONFIELDS_H
#define MOE_SUPPORT_JSONFIELDS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace moe::json_fields {

/// "a string", "an object", ...: the kind of a value, for error messages.
inline const char *kindName(const llvm::json::Value &v) {
  using llvm::json::Value;
  switch (v.kind()) {
  case Value::Null: return "null";
  case Value::Boolean: return "a boolean";
  case Value::Number: return "a number";
  case Value::String: return "a string";
  case Value::Array: return "an array";
  case Value::Object: return "an object";
  }
  return "a value";
}

/// The deepest nesting of arrays and objects a JSON input may have: llvm::json
/// parses recursively, so a deeper one would overflow the stack.
constexpr int kMaxJsonDepth = 256;

/// The error for `text` nested deeper than kMaxJsonDepth, or success (a scan
/// outside strings; malformed text is left to the parser).
inline llvm::Error checkJsonDepth(llvm::StringRef text, llvm::StringRef path) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                       "%s: JSON nested deeper than %d levels",
                                       path.str().c_str(), kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return llvm::Error::success();
}

/// What Python's json (transformers' reader) refuses or reads differently,
/// and llvm::json accepts: numbers with a leading zero or '+', and objects
/// with two members of one name (Python keeps the last, llvm::json the
/// first). Checked with nlohmann::json, which follows RFC 8259 strictly.
/// (The compiler is built without exceptions: a SAX pass, which reports
/// errors by return value.)
class StrictJsonChecker {
public:
  using json = nlohmann::json;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t &) { return true; }
  bool string(json::string_t &) { return true; }
  bool binary(json::binary_t &) { return true; }
  bool start_object(std::size_t) {
    keys.emplace_back();
    return true;
  }
  bool key(json::string_t &key) {
    if (!keys.empty() && !keys.back().insert(key).second) {
      duplicate = key.size() > 80 ? key.substr(0, 80) + "..." : key;
      return false;
    }
    return true;
  }
  bool end_object() {
    keys.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string &,
                   const nlohmann::detail::exception &ex) {
    // "[json.exception.parse_error.101] parse error at line 3, column 20: ..."
    error = llvm::StringRef(ex.what()).split("] ").second.str();
    return false;
  }

  std::vector<std::unordered_set<std::string>> keys;
  std::string duplicate, error;
};

inline llvm::Error checkStrictJson(llvm::StringRef text, llvm::StringRef path) {
  StrictJsonChecker checker;
  nlohmann::json::sax_parse(text.begin(), text.end(), &checker);
  if (!checker.error.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: malformed JSON: %s", path.str().c_str(),
                                   checker.error.c_str());
  if (!checker.duplicate.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: duplicate key '%s' (JSON readers disagree on "
                                   "which value counts)",
                                   path.str().c_str(), checker.duplicate.c_str());
  return llvm::Error::success();
}

/// Reads an input file of at most `maxBytes`: a regular file (a FIFO or a
/// device would block or never end), named in every error.
inline llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readInputFile(llvm::StringRef path, uint64_t maxBytes) {
  llvm::sys::fs::file_status status;
  if (std::error_code ec = llvm::sys::fs::status(path, status))
    return llvm::createStringError(ec, "%s: cannot read: %s", path.str().c_str(),
                                   ec.message().c_str());
  if (status.type() != llvm::sys::fs::file_type::regular_file)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: not a regular file", path.str().c_str());
  if (status.getSize() > maxBytes)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(), "%s: %llu bytes, more than the %llu a file of its kind may have",
        path.str().c_str(), static_cast<unsigned long long>(status.getSize()),
        static_cast<unsigned long long>(maxBytes));
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return llvm::createStringError(buffer.getError(), "%s: cannot read: %s",
                                   path.str().c_str(), buffer.getError().message().c_str());
  return std::move(*buffer);
}

/// Parses `text` as a JSON object. Errors: "FILE:LINE:COLUMN: malformed JSON:
/// message" and "FILE: expected a JSON object at the top level but got ...".
inline llvm::Expected<llvm::json::Object> parseObject(llvm::StringRef text,
                                                      llvm::StringRef path) {
  if (llvm::Error e = checkJsonDepth(text, path))
    return std::move(e);
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  if (!parsed) {
    // llvm::json reports "[LINE:COLUMN, byte=N]: message"; say it the way
    // compilers do: "FILE:LINE:COLUMN: malformed JSON: message".
    std::string raw = llvm::toString(parsed.takeError());
    llvm::StringRef rest(raw), position;
    if (rest.consume_front("[")) {
      std::tie(position, rest) = rest.split(", byte=");
      rest = rest.split("]: ").second;
    }
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(), "%s:%s: malformed JSON: %s",
        path.str().c_str(), position.str().c_str(), rest.str().c_str());
  }
  // What llvm::json accepts but Python's json reads otherwise or refuses.
  if (llvm::Error e = checkStrictJson(text, path))
    return std::move(e);
  llvm::json::Object *object = parsed->getAsObject();
  if (!object)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: expected a JSON object at the top "
                                   "level but got %s",
                                   path.str().c_str(), kindName(*parsed));
  return std::move(*object);
}

/// How a field whose value is null reads: as if it were absent (config.json,
/// where transformers writes null for unset fields), or as a value of the
/// wrong kind (--cluster files).
enum class Nulls { AreAbsent, AreValues };

/// Typed access to the fields of one JSON object. Required reads fail on a
/// missing field; reads with a fallback return it for an absent one.
class Fields {
public:
  Fields(const llvm::json::Object &object, llvm::StringRef path,
         std::string prefix = "", Nulls nulls = Nulls::AreAbsent)
      : objectPtr(&object), path(path), prefix(std::move(prefix)),
        nulls(nulls) {}

  llvm::Error fail(llvm::StringRef field, const llvm::Twine &message) const {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: field '%s': %s", path.str().c_str(),
                                   (prefix + field).str().c_str(),
                                   message.str().c_str());
  }

  /// Present (and, under Nulls::AreAbsent, not null).
  bool has(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    return v &&
           (nulls == Nulls::AreValues || v->kind() != llvm::json::Value::Null);
  }

  /// Present with the value null (where null and absent mean different
  /// things, e.g. DeepSeek's q_lora_rank: absent takes the class default,
  /// null means none).
  bool isNull(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    return v && v->kind() == llvm::json::Value::Null;
  }

  /// Fails on the first field not in `known`.
  llvm::Error checkKnown(llvm::ArrayRef<llvm::StringRef> known) const {
    for (const auto &kv : *objectPtr)
      if (!llvm::is_contained(known, llvm::StringRef(kv.first)))
        return fail(kv.first, "unknown field; expected one of " +
                                  llvm::join(known, ", "));
    return llvm::Error::success();
  }

  /// A required integer (floats with an integral value, like 1e4, accepted).
  llvm::Expected<int64_t> integer(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    if (!v)
      return fail(field, "missing (required)");
    if (std::optional<int64_t> i = v->getAsInteger())
      return *i;
    if (std::optional<double> d = v->getAsNumber()) {
      // Integral and within int64 (the cast of anything else is undefined).
      if (*d >= -9.2e18 && *d <= 9.2e18 &&
          *d == static_cast<double>(static_cast<int64_t>(*d)))
        return static_cast<int64_t>(*d);
      return fail(field, llvm::formatv("expected an integer but got {0}", *d));
    }
    return fail(field,
                llvm::Twine("expected an integer but got ") + kindName(*v));
  }
  /// A required integer > 0 ("expected a value > 0 but got N").
  llvm::Expected<int64_t> positive(llvm::StringRef field) const {
    llvm::Expected<int64_t> i = integer(field);
    if (i && *i <= 0)
      return fail(field, llvm::formatv("expected a value > 0 but got {0}", *i));
    return i;
  }
  llvm::Expected<int64_t> positiveOr(llvm::StringRef field,
                                     int64_t fallback) const {
    return has(field) ? positive(field) : llvm::Expected<int64_t>(fallback);
  }
  llvm::Expected<int64_t> nonNegativeOr(llvm::StringRef field,
                                        int64_t fallback) const {
    if (!has(field))
      return fallback;
    llvm::Expected<int64_t> i = integer(field);
    if (i && *i < 0)
      return fail(field,
                  llvm::formatv("expected a value >= 0 but got {0}", *i));
    return i;
  }
  /// A required integer > 0, every failure worded "expected a positive
  /// integer but got ..." (integral floats below 2^63 accepted).
  llvm::Expected<int64_t> positiveInteger(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    if (!v)
      return fail(field, "missing (required)");
    std::optional<int64_t> i = v->getAsInteger();
    if (!i) {
      std::optional<double> d = v->getAsNumber();
      if (d && *d == std::floor(*d) && *d > 0 && *d < 9.2e18)
        i = int64_t(*d);
      else
        return fail(field, llvm::Twine("expected a positive integer but got ") +
                               (d ? llvm::formatv("{0}", *d).str()
                                  : std::string(kindName(*v))));
    }
    if (*i <= 0)
      return fail(field,
                  llvm::formatv("expected a positive integer but got {0}", *i));
    return *i;
  }

  llvm::Expected<double> number(llvm::StringRef field, double fallback) const {
    return orFallback<double>(
        field, fallback, "a number",
        [](const llvm::json::Value &v) { return v.getAsNumber(); });
  }
  /// An optional number > 0 ("expected a value > 0 but got X").
  llvm::Expected<double> positiveNumber(llvm::StringRef field,
                                        double fallback) const {
    llvm::Expected<double> d = number(field, fallback);
    if (d && !(*d > 0))
      return fail(field, llvm::formatv("expected a value > 0 but got {0}", *d));
    return d;
  }
  /// A required finite number > 0 ("expected a positive number ...").
  llvm::Expected<double> finitePositive(llvm::StringRef field) const {
    return finite(field, /*allowZero=*/false);
  }
  /// A required finite number >= 0 ("expected a non-negative number ...").
  llvm::Expected<double> finiteNonNegative(llvm::StringRef field) const {
    return finite(field, /*allowZero=*/true);
  }

  llvm::Expected<bool> boolean(llvm::StringRef field, bool fallback) const {
    return orFallback<bool>(
        field, fallback, "true or false",
        [](const llvm::json::Value &v) { return v.getAsBoolean(); });
  }
  llvm::Expected<std::string> string(llvm::StringRef field,
                                     llvm::StringRef fallback) const {
    return orFallback<std::string>(
        field, fallback.str(), "a string",
        [](const llvm::json::Value &v) { return v.getAsString(); });
  }

  /// A required nested object; its fields are named "field.inner".
  llvm::Expected<Fields> object(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    if (!v)
      return fail(field, "missing (required)");
    return sub(field, *v);
  }
  /// An optional nested object (absent, or null under Nulls::AreAbsent:
  /// std::nullopt).
  llvm::Expected<std::optional<Fields>> nested(llvm::StringRef field) const {
    if (!has(field))
      return std::nullopt;
    llvm::Expected<Fields> f = sub(field, *get(field));
    if (!f)
      return f.takeError();
    return std::optional<Fields>(std::move(*f));
  }

  /// The list at `field`; null when it is absent or not a list.
  const llvm::json::Array *array(llvm::StringRef field) const {
    const llvm::json::Value *v = get(field);
    return v ? v->getAsArray() : nullptr;
  }
  /// An integer or a list of integers (absent: empty).
  llvm::Expected<std::vector<int64_t>> integers(llvm::StringRef field) const {
    std::vector<int64_t> out;
    if (!has(field))
      return out;
    const llvm::json::Value *v = get(field);
    if (std::optional<int64_t> i = v->getAsInteger())
      return std::vector<int64_t>{*i};
    if (const llvm::json::Array *a = v->getAsArray()) {
      for (const llvm::json::Value &e : *a) {
        std::optional<int64_t> i = e.getAsInteger();
        if (!i)
          return fail(field,
                      llvm::Twine("expected a list of integers but found ") +
                          kindName(e));
        out.push_back(*i);
      }
      return out;
    }
    return fail(field,
                llvm::Twine("expected an integer or a list of integers but "
                            "got ") +
                    kindName(*v));
  }

private:
  const llvm::json::Object *objectPtr;
  llvm::StringRef path;
  std::string prefix;
  Nulls nulls;

  const llvm::json::Value *get(llvm::StringRef field) const {
    return objectPtr->get(field);
  }

  /// `fallback` when the field is absent, else what `read` makes of it
  /// ("expected <what> but got ..." when it makes nothing).
  template <typename T, typename Read>
  llvm::Expected<T> orFallback(llvm::StringRef field, T fallback,
                               const char *what, Read read) const {
    if (!has(field))
      return fallback;
    const llvm::json::Value *v = get(field);
    if (auto x = read(*v))
      return T(*x);
    return fail(field,
                llvm::Twine("expected ") + what + " but got " + kindName(*v));
  }

  llvm::Expected<Fields> sub(llvm::StringRef field,
                             const llvm::json::Value &v) const {
    if (const llvm::json::Object *o = v.getAsObject())
      return Fields(*o, path, (prefix + field + ".").str(), nulls);
    return fail(field,
                llvm::Twine("expected an object but got ") + kindName(v));
  }

  llvm::Expected<double> finite(llvm::StringRef field, bool allowZero) const {
    const llvm::json::Value *v = get(field);
    if (!v)
      return fail(field, "missing (required)");
    std::optional<double> d = v->getAsNumber();
    if (!d)
      return fail(field, llvm::Twine("expected a positive number but got ") +
                             kindName(*v));
    if (!std::isfinite(*d) || (allowZero ? *d < 0 : *d <= 0))
      return fail(field,
                  llvm::formatv("expected a {0} number but got {1}",
                                allowZero ? "non-negative" : "positive", *d));
    return *d;
  }
};

} // namespace moe::json_fields

/// Assigns the value of the Expected `expected` to `out`, or returns its
/// error from the enclosing function: keeps field-by-field parsing readable.
#define MOE_ASSIGN(out, expected)                                              \
  do {                                                                         \
    auto _value = (expected);                                                  \
    if (!_value)                                                               \
      return _value.takeError();                                               \
    out = std::move(*_value);                                                  \
  } while (false)

#endif // MOE_SUPPORT_JSONFIELDS_H
