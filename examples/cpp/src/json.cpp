#include "json.h"

#include <cstdlib>
#include <stdexcept>

namespace dmae_smooth::json {

const Array* Value::array() const {
  const auto* p = std::get_if<std::shared_ptr<Array>>(&data);
  return p ? p->get() : nullptr;
}

const Object* Value::object() const {
  const auto* p = std::get_if<std::shared_ptr<Object>>(&data);
  return p ? p->get() : nullptr;
}

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  Value document() {
    Value value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the value");
    return value;
  }

 private:
  const std::string& text_;
  std::size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(what + " at byte " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    if (pos_ == text_.size()) fail("unexpected end of input");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  Value parse_value(int depth) {
    if (depth > 64) fail("nesting too deep");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Value{parse_string()};
    if (literal("null")) return Value{nullptr};
    if (literal("true")) return Value{true};
    if (literal("false")) return Value{false};
    return Value{parse_number()};
  }

  Value parse_object(int depth) {
    auto object = std::make_shared<Object>();
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return Value{object};
    }
    while (true) {
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      expect(':');
      (*object)[key] = parse_value(depth + 1);
      if (peek() == '}') {
        ++pos_;
        return Value{object};
      }
      expect(',');
    }
  }

  Value parse_array(int depth) {
    auto array = std::make_shared<Array>();
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return Value{array};
    }
    while (true) {
      array->push_back(parse_value(depth + 1));
      if (peek() == ']') {
        ++pos_;
        return Value{array};
      }
      expect(',');
    }
  }

  double parse_number() {
    const char* start = text_.c_str() + pos_;
    char* end = nullptr;
    const double value = std::strtod(start, &end);
    if (end == start) fail("expected a value");
    pos_ += static_cast<std::size_t>(end - start);
    return value;
  }

  // Strings: escapes are decoded; \uXXXX becomes UTF-8 (surrogate pairs included).
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, code_point()); break;
        default: fail("bad escape in string");
      }
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("bad \\u escape");
    const std::string digits = text_.substr(pos_, 4);
    char* end = nullptr;
    const unsigned long v = std::strtoul(digits.c_str(), &end, 16);
    if (end != digits.c_str() + 4) fail("bad \\u escape");
    pos_ += 4;
    return static_cast<unsigned>(v);
  }

  unsigned code_point() {
    unsigned cp = hex4();
    if (cp >= 0xD800 && cp < 0xDC00 && literal("\\u")) {
      const unsigned low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("bad surrogate pair");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
};

}  // namespace

Value parse(const std::string& text) { return Parser(text).document(); }

}  // namespace dmae_smooth::json
