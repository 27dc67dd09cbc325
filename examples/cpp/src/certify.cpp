#include "dmae_smooth/certify.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "dmae_smooth/stats.h"

namespace dmae_smooth {

std::uint64_t SamplingPlan::total() const {
  return std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
}

std::vector<PlanBatch> plan_batches(const SamplingPlan& plan, std::uint32_t batch) {
  std::vector<PlanBatch> batches;
  PlanBatch current;
  for (std::uint32_t stage = 0; stage < plan.sizes.size(); ++stage) {
    for (std::uint32_t sample = 0; sample < plan.sizes[stage]; ++sample) {
      current.stage.push_back(stage);
      current.sample.push_back(sample);
      if (current.size() == batch) batches.push_back(std::exchange(current, {}));
    }
  }
  if (current.size() > 0) batches.push_back(std::move(current));
  return batches;
}

Certificate certify_from_counts(const std::int64_t* selection, const std::int64_t* estimation,
                                std::int64_t num_classes, double alpha, double sigma) {
  const std::int64_t guess = std::max_element(selection, selection + num_classes) - selection;
  const std::int64_t n_a = estimation[guess];
  const std::int64_t n = std::accumulate(estimation, estimation + num_classes, std::int64_t{0});
  const std::int64_t n0 = std::accumulate(selection, selection + num_classes, std::int64_t{0});
  const double p_a_lower = clopper_pearson_lower(n_a, n, alpha);
  if (p_a_lower < 0.5) return {kAbstain, 0.0, n0, n, n_a, p_a_lower};
  return {guess, sigma * normal_ppf(p_a_lower), n0, n, n_a, p_a_lower};
}

Prediction predict_from_counts(const std::int64_t* counts, std::int64_t num_classes, double alpha) {
  const std::int64_t top = std::max_element(counts, counts + num_classes) - counts;
  std::int64_t count2 = 0;
  for (std::int64_t c = 0; c < num_classes; ++c) {
    if (c != top) count2 = std::max(count2, counts[c]);
  }
  const std::int64_t count1 = counts[top];
  const double pvalue = binomial_test_pvalue(count1, count1 + count2);
  const std::int64_t n = std::accumulate(counts, counts + num_classes, std::int64_t{0});
  return {pvalue <= alpha ? top : kAbstain, n, count1, count2, pvalue};
}

Certificate Smoother::certify(const float* image, std::uint32_t index, std::uint32_t n0,
                              std::uint32_t n, double alpha) {
  const std::vector<std::int64_t> counts =
      sampler_.counts(image, index, SamplingPlan::certify(n0, n), noise_);
  const std::int64_t k = sampler_.num_classes();
  return certify_from_counts(counts.data(), counts.data() + k, k, alpha, noise_.sigma);
}

Prediction Smoother::predict(const float* image, std::uint32_t index, std::uint32_t n,
                             double alpha) {
  const std::vector<std::int64_t> counts =
      sampler_.counts(image, index, SamplingPlan::predict(n), noise_);
  return predict_from_counts(counts.data(), sampler_.num_classes(), alpha);
}

}  // namespace dmae_smooth
