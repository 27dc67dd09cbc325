// NumPy .npy files (format versions 1-3): little-endian float32 or int64, C order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dmae_smooth {

struct NpyArray {
  std::string dtype;  // "<f4" or "<i8"
  std::vector<std::int64_t> shape;
  std::vector<float> f32;  // the data when dtype is "<f4"
  std::vector<std::int64_t> i64;  // the data when dtype is "<i8"
};

// Reads a .npy file; throws UserError (naming the file) for anything it cannot read,
// including other dtypes, big-endian data and Fortran order.
NpyArray read_npy(const std::string& path);

}  // namespace dmae_smooth
