// The one exception type for problems with the user's input: its message is one line.
#pragma once

#include <stdexcept>
#include <string>

namespace dmae_smooth {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

// A classifier that returns NaN or infinite logits is never certified (argmax would count
// them as votes for an arbitrary class).
inline constexpr const char* kNonFiniteLogits =
    "the classifier returned NaN or infinite logits: refusing to certify a non-finite classifier";

}  // namespace dmae_smooth
