// SHA-256 (FIPS 180-4), for the digest of sound-table files: no dependency beyond the standard library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace dmae_smooth {

// The SHA-256 digest of `size` bytes at `data`.
std::array<std::uint8_t, 32> sha256(const void* data, std::size_t size);

}  // namespace dmae_smooth
