// The one exception type for problems with the user's input: its message is one line.
#pragma once

#include <stdexcept>
#include <string>

namespace dmae_smooth {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dmae_smooth
