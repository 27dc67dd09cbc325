#include "dmae_smooth/npy.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "dmae_smooth/error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "read_npy copies little-endian data as is: it needs a little-endian host"
#endif

namespace dmae_smooth {
namespace {

// The text of `'key': value` in the header dict: a quoted string, True/False or a tuple.
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
  const auto missing = [&] { return UserError(path + ": .npy header has no readable '" + key + "' entry"); };
  std::size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) at = header.find("\"" + key + "\"");
  if (at == std::string::npos) throw missing();
  at = header.find(':', at + key.size() + 2);
  at = header.find_first_not_of(" ", at == std::string::npos ? at : at + 1);
  if (at == std::string::npos) throw missing();
  const char open = header[at];
  const char close = open == '(' ? ')' : open;
  const std::size_t end = (open == '(' || open == '\'' || open == '"') ? header.find(close, at + 1)
                                                                     : header.find_first_of(",}", at) - 1;
  if (end == std::string::npos || end < at) throw missing();
  return header.substr(at, end - at + 1);
}

std::vector<std::int64_t> parse_shape(const std::string& tuple, const std::string& path) {
  if (tuple.size() < 2 || tuple.front() != '(') throw UserError(path + ": .npy shape " + tuple + " is not a tuple");
  std::vector<std::int64_t> shape;
  std::string digits;
  for (const char c : tuple.substr(1)) {
    if (c >= '0' && c <= '9') {
      digits += c;
    } else if (c == ',' || c == ')') {
      if (digits.size() > 15) throw UserError(path + ": .npy shape " + tuple + " is too large");
      if (!digits.empty()) shape.push_back(std::stoll(digits));
      digits.clear();
    } else if (c != ' ' && c != 'L') {
      throw UserError(path + ": cannot read the .npy shape " + tuple);
    }
  }
  return shape;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UserError("cannot read " + path);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    throw UserError(path + " is not a .npy file (save arrays with numpy.save)");
  }
  const auto major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_len = 0, offset = 0;
  auto byte = [&](std::size_t i) { return static_cast<std::size_t>(static_cast<unsigned char>(bytes[i])); };
  if (major == 1) {
    header_len = byte(8) | byte(9) << 8;
    offset = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    offset = 12;
  } else {
    throw UserError(path + ": unsupported .npy format version " + std::to_string(major));
  }
  if (offset + header_len > bytes.size()) throw UserError(path + ": truncated .npy header");
  const std::string header = bytes.substr(offset, header_len);
  NpyArray array;
  array.dtype = header_value(header, "descr", path);
  array.dtype = array.dtype.substr(1, array.dtype.size() - 2);
  if (header_value(header, "fortran_order", path) != "False") {
    throw UserError(path + ": Fortran-ordered arrays are not supported (save a C-ordered array)");
  }
  array.shape = parse_shape(header_value(header, "shape", path), path);
  std::size_t count = 1;
  for (const std::int64_t d : array.shape) count *= static_cast<std::size_t>(d);
  std::size_t item = 0;
  if (array.dtype == "<f4") {
    item = 4;
  } else if (array.dtype == "<i8") {
    item = 8;
  } else {
    throw UserError(path + ": dtype " + array.dtype +
                    " is not supported (images: float32 '<f4', labels: int64 '<i8')");
  }
  const std::size_t start = offset + header_len;
  if (bytes.size() - start != count * item) {
    throw UserError(path + ": holds " + std::to_string(bytes.size() - start) + " data bytes, its shape needs " +
                    std::to_string(count * item));
  }
  if (item == 4) {
    array.f32.resize(count);
    std::memcpy(array.f32.data(), bytes.data() + start, count * item);
  } else {
    array.i64.resize(count);
    std::memcpy(array.i64.data(), bytes.data() + start, count * item);
  }
  return array;
}

}  // namespace dmae_smooth
