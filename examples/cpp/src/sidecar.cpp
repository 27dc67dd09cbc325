// Reading `<engine>.json`, the sidecar of the engine file contract (dmae-fast-engine/1).
#include <cmath>
#include <fstream>
#include <sstream>

#include "dmae_smooth/engine.h"
#include "dmae_smooth/error.h"
#include "json.h"

namespace dmae_smooth {
namespace {

constexpr const char* kFormat = "dmae-fast-engine/1";

class Fields {
 public:
  Fields(const json::Object& object, std::string where) : object_(object), where_(std::move(where)) {}

  const json::Value* find(const std::string& name) const {
    const auto it = object_.find(name);
    return it == object_.end() ? nullptr : &it->second;
  }
  const json::Value& get(const std::string& name) const {
    const json::Value* value = find(name);
    if (value == nullptr) fail("has no field \"" + name + "\"");
    return *value;
  }
  std::string text(const std::string& name) const {
    const std::string* s = get(name).string();
    if (s == nullptr) fail("field \"" + name + "\" is not a string");
    return *s;
  }
  std::int64_t integer(const json::Value& value, const std::string& name) const {
    const double* d = value.number();
    if (d == nullptr || *d != std::floor(*d) || *d < 0 || *d > 9.0e15) {
      fail("field \"" + name + "\" is not a non-negative integer");
    }
    return static_cast<std::int64_t>(*d);
  }
  std::int64_t integer(const std::string& name) const { return integer(get(name), name); }
  [[noreturn]] void fail(const std::string& what) const { throw UserError(where_ + " " + what); }

 private:
  const json::Object& object_;
  std::string where_;
};

}  // namespace

std::int64_t EngineInfo::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : input_shape) n *= d;
  return n;
}

EngineInfo read_engine_info(const std::string& engine_path) {
  const std::string path = engine_path + ".json";
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UserError("cannot read the engine sidecar " + path + " (every engine file needs one)");
  std::stringstream buffer;
  buffer << file.rdbuf();
  json::Value document;
  try {
    document = json::parse(buffer.str());
  } catch (const std::runtime_error& error) {
    throw UserError("engine sidecar " + path + " is not valid JSON: " + error.what());
  }
  if (document.object() == nullptr) throw UserError("engine sidecar " + path + " is not a JSON object");
  const Fields fields(*document.object(), "engine sidecar " + path);
  if (fields.text("format") != kFormat) {
    fields.fail("has format \"" + fields.text("format") + "\", expected \"" + kFormat + "\"");
  }
  EngineInfo info;
  info.path = engine_path;
  info.kind = fields.text("kind");
  info.input = fields.text("input");
  info.input_name = fields.text("input_name");
  info.output_name = fields.text("output_name");
  info.precision = fields.text("precision");
  if (fields.text("input_dtype") != "float32") fields.fail("input_dtype is not float32");
  const json::Array* shape = fields.get("input_shape").array();
  if (shape == nullptr || shape->empty()) fields.fail("field \"input_shape\" is not a list of sizes");
  for (const json::Value& size : *shape) info.input_shape.push_back(fields.integer(size, "input_shape"));
  info.num_classes = fields.integer("num_classes");
  if (info.num_classes < 1) fields.fail("field \"num_classes\" must be at least 1");
  if (const json::Value* sigma = fields.find("sigma"); sigma != nullptr && !sigma->is_null()) {
    if (sigma->number() == nullptr || !(*sigma->number() > 0)) fields.fail("field \"sigma\" is not > 0");
    info.sigma = *sigma->number();
  }
  const json::Object* batch = fields.get("batch").object();
  if (batch == nullptr) fields.fail("field \"batch\" is not an object");
  info.batch_max = Fields(*batch, "engine sidecar " + path + " batch").integer("max");
  if (info.batch_max < 1) fields.fail("batch max must be at least 1");
  return info;
}

}  // namespace dmae_smooth
