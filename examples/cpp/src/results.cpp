#include "dmae_smooth/results.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

#include "dmae_smooth/error.h"

namespace dmae_smooth {

namespace {

// glibc's printf prints the exact decimal expansion of a double when asked for enough
// digits (a double has at most 767 significant and 1,074 fractional digits).
constexpr int kExactDigits = 1100;

void require_non_negative(double value, const char* what) {
  if (!std::isfinite(value) || value < 0) {
    throw UserError("cannot write " + format_repr(value) + " as " + what + " (finite and >= 0 only)");
  }
}

}  // namespace

std::string format_floor(double value, int decimals) {
  require_non_negative(value, "a radius or bound");
  std::vector<char> buffer(400 + kExactDigits);
  std::snprintf(buffer.data(), buffer.size(), "%.*f", kExactDigits, value);
  const std::string text(buffer.data());
  const std::size_t point = text.find('.');
  return decimals > 0 ? text.substr(0, point + 1 + decimals) : text.substr(0, point);  // truncation = floor
}

std::string format_ceil_significant(double value, int digits) {
  require_non_negative(value, "a p-value");
  std::vector<char> buffer(32 + kExactDigits);
  std::snprintf(buffer.data(), buffer.size(), "%.*e", value == 0 ? digits - 1 : kExactDigits, value);
  const std::string text(buffer.data());
  if (value == 0) return text;  // "0.00000e+00"
  const std::size_t e = text.find('e');
  int exponent = std::stoi(text.substr(e + 1));
  const std::string all = text.substr(0, 1) + text.substr(2, e - 2);  // every digit of the mantissa
  std::string kept = all.substr(0, digits);
  if (all.find_first_not_of('0', digits) != std::string::npos) {  // anything cut off: round up
    int i = digits - 1;
    while (i >= 0 && kept[i] == '9') kept[i--] = '0';
    if (i < 0) {
      kept = "1" + std::string(digits - 1, '0');
      ++exponent;
    } else {
      ++kept[i];
    }
  }
  char tail[16];
  std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return kept.substr(0, 1) + (digits > 1 ? "." + kept.substr(1) : "") + tail;
}

std::string format_repr(double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string scientific(buffer, result.ptr);  // e.g. "-2.5e-01": shortest digits
  const std::size_t e = scientific.find('e');
  const int exponent = std::stoi(scientific.substr(e + 1));
  const bool negative = scientific[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (scientific[i] != '.') digits += scientific[i];
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {  // repr switches to exponent notation here
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + tail;
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  const auto point = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= point) return out + digits + std::string(point - digits.size(), '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

std::string format_duration(double seconds) {
  double whole = 0.0;
  const double fraction = std::modf(seconds, &whole);
  auto total = static_cast<long long>(whole);
  auto micro = static_cast<long long>(std::nearbyint(fraction * 1e6));  // half to even, as Python
  if (micro >= 1000000) {
    ++total;
    micro -= 1000000;
  }
  const long long days = total / 86400, rest = total % 86400;
  char buffer[96];
  int n = 0;
  if (days != 0) n = std::snprintf(buffer, sizeof buffer, "%lld day%s, ", days, days == 1 ? "" : "s");
  n += std::snprintf(buffer + n, sizeof buffer - n, "%lld:%02lld:%02lld", rest / 3600, rest / 60 % 60, rest % 60);
  if (micro != 0) std::snprintf(buffer + n, sizeof buffer - n, ".%06lld", micro);
  return buffer;
}

std::string certify_row(std::int64_t idx, std::int64_t label, const Certificate& c, double seconds,
                        double sigma, bool sound) {
  const std::string tab = "\t";
  return std::to_string(idx) + tab + std::to_string(label) + tab + std::to_string(c.prediction) + tab +
         format_floor(c.radius, 6) + tab + std::to_string(c.prediction == label ? 1 : 0) + tab +
         format_duration(seconds) + tab + std::to_string(c.n0) + tab + std::to_string(c.n) + tab +
         std::to_string(c.n_a) + tab + format_floor(c.p_a_lower, 10) + tab + format_repr(sigma) +
         tab + kFixedNProcedure + (sound ? kSoundSuffix : "") + "\n";
}

std::string predict_row(std::int64_t idx, std::int64_t label, const Prediction& p, double seconds,
                        double sigma) {
  const std::string tab = "\t";
  return std::to_string(idx) + tab + std::to_string(label) + tab + std::to_string(p.prediction) + tab +
         std::to_string(p.prediction == label ? 1 : 0) + tab + format_duration(seconds) + tab +
         std::to_string(p.n) + tab + std::to_string(p.count1) + tab + std::to_string(p.count2) + tab +
         format_ceil_significant(p.pvalue, 6) + tab + format_repr(sigma) + "\n";
}

ResultsWriter::ResultsWriter(const std::string& path, const std::string& header, bool overwrite)
    : path_(path), target_(overwrite ? path + ".partial" : path) {
  struct stat info {};
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw UserError(path + " is a directory, not a results file");
  }
  file_ = std::fopen(target_.c_str(), overwrite ? "w" : "wx");
  if (file_ == nullptr) {
    if (errno == EEXIST) throw UserError(path + " exists; pass --overwrite to replace it");
    throw UserError("cannot create " + target_ + ": " + std::strerror(errno));
  }
  write(header + "\n");
}

ResultsWriter::~ResultsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void ResultsWriter::write(const std::string& line) {
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    throw UserError("cannot write " + target_ + ": " + std::strerror(errno));
  }
}

void ResultsWriter::commit() {
  if (file_ == nullptr) return;
  const bool failed = std::fclose(file_) != 0;
  file_ = nullptr;
  if (failed) throw UserError("cannot write " + target_ + ": " + std::strerror(errno));
  if (target_ != path_ && std::rename(target_.c_str(), path_.c_str()) != 0) {
    throw UserError("cannot rename " + target_ + " to " + path_ + ": " + std::strerror(errno));
  }
}

}  // namespace dmae_smooth
