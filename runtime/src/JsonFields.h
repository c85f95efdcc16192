// Typed access to one JSON object of an input file (plan, manifest), with
// errors of the form "FILE: where.field: message". Internal to the runtime:
// not part of the public include directory.
#ifndef MOERT_SRC_JSONFIELDS_H
#define MOERT_SRC_JSONFIELDS_H

#include "moert/Error.h"
#include "moert/Tensor.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace moert {

/// Parses JSON text, refusing an object with two members of one name: JSON
/// leaves their meaning open (Python keeps the last, other readers the
/// first), so a file that has them means different things to different
/// tools. InputError "PATH: WHAT: duplicate key 'K'". Parse errors are
/// nlohmann's json::parse_error.
inline nlohmann::json parseJsonNoDuplicateKeys(const char *begin, const char *end,
                                               const std::string &path, const char *what) {
  std::vector<std::unordered_set<std::string>> keys; // per open object
  auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json &parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      keys.emplace_back();
    } else if (event == E::object_end) {
      keys.pop_back();
    } else if (event == E::key && !keys.empty()) {
      const std::string &key = parsed.get_ref<const std::string &>();
      if (!keys.back().insert(key).second)
        inputError("{}: {}: duplicate key '{}'", path, what,
                   key.size() > 80 ? key.substr(0, 80) + "..." : key);
    }
    return true;
  };
  return nlohmann::json::parse(begin, end, callback);
}

/// nlohmann's messages start with "[json.exception.parse_error.101] "; the
/// user needs only the part after it.
inline std::string jsonMessage(const nlohmann::json::exception &e) {
  std::string text = e.what();
  size_t end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

/// parseJsonNoDuplicateKeys of an object; InputError "PATH: WHAT is not
/// valid JSON: ..." or "... is a JSON array, expected an object".
inline nlohmann::json parseJsonObject(const std::string &path, const char *begin,
                                      const char *end, const char *what) {
  nlohmann::json value;
  try {
    value = parseJsonNoDuplicateKeys(begin, end, path, what);
  } catch (const nlohmann::json::exception &e) { // parse_error, and out_of_range for a number like 1e512
    inputError("{}: {} is not valid JSON: {}", path, what, jsonMessage(e));
  }
  if (!value.is_object())
    inputError("{}: {} is a JSON {}, expected an object", path, what, value.type_name());
  return value;
}

class JsonFields {
public:
  using json = nlohmann::json;

  /// `file` names the input in errors and must outlive this object and its
  /// children; `where` is the prefix of field names ("" or "model.").
  JsonFields(const json &object, const std::string &file, std::string where)
      : object(object), file(file), where(std::move(where)) {}

  [[noreturn]] void fail(const std::string &field, const std::string &message) const {
    inputError("{}: {}{}: {}", file, where, field, message);
  }
  /// "FILE: where.FIELD", the prefix of this field's errors.
  std::string fieldName(const std::string &field) const { return file + ": " + where + field; }
  const json &get(const std::string &field) const {
    auto it = object.find(field);
    if (it == object.end())
      fail(field, "missing");
    return *it;
  }
  bool has(const std::string &field) const { return object.contains(field); }
  /// Refuses a member not among `members` (the object's fields in
  /// moe/PlanSchema.h): "FILE: where.KEY: unknown field".
  template <size_t N> void onlyMembers(const char *const (&members)[N]) const {
    for (auto it = object.begin(); it != object.end(); ++it) {
      const std::string &key = it.key();
      bool known = false;
      for (const char *m : members)
        known = known || key == m;
      if (!known)
        fail(key.size() > 80 ? key.substr(0, 80) + "..." : key, "unknown field");
    }
  }

  int64_t integer(const std::string &field, int64_t min = INT64_MIN) const {
    const json &v = get(field);
    if (!v.is_number_integer())
      fail(field, "expected an integer");
    int64_t i = v.get<int64_t>();
    if (i < min)
      fail(field, fmt::format("expected a value >= {} but got {}", min, i));
    return i;
  }
  /// An integer in [min, max]; above max the error names the limit.
  int64_t bounded(const std::string &field, int64_t min, int64_t max) const {
    int64_t i = integer(field, min);
    if (i > max)
      fail(field, fmt::format("expected a value <= {} (moert's limit) but got {}", max, i));
    return i;
  }
  uint64_t unsignedInteger(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_number_unsigned())
      fail(field, "expected a non-negative integer");
    return v.get<uint64_t>();
  }
  double number(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_number())
      fail(field, "expected a number");
    return v.get<double>();
  }
  bool boolean(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_boolean())
      fail(field, "expected true or false");
    return v.get<bool>();
  }
  std::string string(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_string())
      fail(field, "expected a string");
    return v.get<std::string>();
  }
  std::vector<int64_t> integers(const std::string &field, int64_t min = INT64_MIN) const {
    const json &v = get(field);
    if (!v.is_array())
      fail(field, "expected an array of integers");
    std::vector<int64_t> out;
    for (const json &e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < min)
        fail(field, fmt::format("expected integers >= {}", min));
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  /// A shape: non-negative integers of at most 2^48.
  std::vector<int64_t> shape(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_array())
      fail(field, "expected an array of non-negative integers");
    std::vector<int64_t> out;
    for (const json &e : v) {
      if (!e.is_number_unsigned() || e.get<uint64_t>() > (uint64_t(1) << 48))
        fail(field, "expected an array of non-negative integers");
      out.push_back(static_cast<int64_t>(e.get<uint64_t>()));
    }
    return out;
  }
  /// A floating-point dtype: F32, BF16 or F16 (or, with `fp8`, the F8_E4M3
  /// of FP8 block-scaled weight slices).
  DType dtype(const std::string &field, bool fp8 = false) const {
    DType t;
    if (!parseDType(string(field), t) ||
        (t != DType::F32 && t != DType::BF16 && t != DType::F16 && !(fp8 && t == DType::F8E4M3)))
      fail(field, fmt::format("unsupported dtype '{}' (expected F32, BF16{})", string(field),
                              fp8 ? ", F16 or F8_E4M3" : " or F16"));
    return t;
  }
  const json &array(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_array())
      fail(field, "expected an array");
    return v;
  }
  /// The object in `field`.
  JsonFields child(const std::string &field) const {
    const json &v = get(field);
    if (!v.is_object())
      fail(field, "expected an object");
    return JsonFields(v, file, where + field + ".");
  }
  /// `value`, named `field` in errors, as an object.
  JsonFields child(const json &value, const std::string &field) const {
    if (!value.is_object())
      fail(field, "expected an object");
    return JsonFields(value, file, where + field + ".");
  }
  /// Element `i` of the array `field`, as an object (`i` must be in range).
  JsonFields element(const std::string &field, size_t i) const {
    const json &v = array(field)[i];
    if (!v.is_object())
      fail(fmt::format("{}[{}]", field, i), "expected an object");
    return JsonFields(v, file, fmt::format("{}{}[{}].", where, field, i));
  }

private:
  const json &object;
  const std::string &file;
  std::string where;
};

} // namespace moert

#endif // MOERT_SRC_JSONFIELDS_H
