// Results files exactly as dmae_fast/run/results.py writes them: tab-separated, Cohen et al.'s
// columns first (idx label predict radius correct time), then ours; one row per image.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "dmae_smooth/certify.h"

namespace dmae_smooth {

inline constexpr const char* kCertifyHeader =
    "idx\tlabel\tpredict\tradius\tcorrect\ttime\tn0\tn\tnA\tpA_lower\tsigma\tprocedure";
inline constexpr const char* kPredictHeader =
    "idx\tlabel\tpredict\tcorrect\ttime\tn\tcount1\tcount2\tpvalue\tsigma";
inline constexpr const char* kFixedNProcedure = "cohen-fixed-n";  // the `procedure` column
inline constexpr const char* kSoundSuffix = " sound";  // ... followed by this with --sound

// Numbers that carry a guarantee are never rounded in its favour (dmae_fast/run/results.py):
// radius and pA_lower: the exact value rounded DOWN to `decimals` places ("0.799640");
std::string format_floor(double value, int decimals);
// p-values: the exact value rounded UP to `digits` significant digits ("1.00005e-03").
std::string format_ceil_significant(double value, int digits);
// Python's repr(float): the shortest string that reads back as the same double.
std::string format_repr(double value);
// Python's str(datetime.timedelta(seconds=seconds)), e.g. "0:00:01.500000".
std::string format_duration(double seconds);

std::string certify_row(std::int64_t idx, std::int64_t label, const Certificate& c, double seconds,
                        double sigma, bool sound = false);
std::string predict_row(std::int64_t idx, std::int64_t label, const Prediction& p, double seconds,
                        double sigma);

// Writes a results file row by row, each row pushed to the disk. A new file must not
// exist; with `overwrite` the rows go to `<path>.partial`, renamed over `path` by commit().
class ResultsWriter {
 public:
  ResultsWriter(const std::string& path, const std::string& header, bool overwrite);
  ~ResultsWriter();  // without commit(), an overwrite leaves the old file untouched
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  void write(const std::string& line);
  void commit();

 private:
  std::string path_, target_;
  std::FILE* file_ = nullptr;
};

}  // namespace dmae_smooth
