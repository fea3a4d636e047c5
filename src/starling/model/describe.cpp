#include "starling/model/describe.h"

#include <cstdio>

#include "starling/model/build.h"

namespace starling::model {

std::string describe_model(const ModelConfig& c, int64_t batch) {
  // Builds the real model: shapes and bytes come from the DAG itself, not from a second formula.
  // The largest presets need their full fp32 size in memory for this.
  auto dag = build_model(c, 0);
  std::string out = dag->describe(batch, c.seq_len);
  char line[200];
  std::snprintf(line, sizeof line,
                "total: %.2fM parameters (%.1f MB fp32), %.3f GFLOP per trained token\n",
                static_cast<double>(c.num_params()) / 1e6,
                static_cast<double>(dag->params().bytes()) / 1e6, c.train_flops_per_token() / 1e9);
  return out + line;
}

}  // namespace starling::model
