// A minimal JSON reader (RFC 8259 values) for engine sidecars; internal to the library.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace dmae_smooth::json {

struct Value;
using Array = std::vector<Value>;
using Object = std::map<std::string, Value>;

struct Value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      data;

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(data); }
  const double* number() const { return std::get_if<double>(&data); }
  const std::string* string() const { return std::get_if<std::string>(&data); }
  const Array* array() const;
  const Object* object() const;
};

// Parses a whole document; throws std::runtime_error("... at byte N") on malformed input.
Value parse(const std::string& text);

}  // namespace dmae_smooth::json
