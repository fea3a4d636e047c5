#include "starling/sched/plan_report.h"

#include <cstdio>
#include <sstream>

namespace starling::sched {

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.1f ms" : "%.2f s", s < 1 ? s * 1e3 : s);
  return buf;
}

std::string describe_plan(const CostTable& t, const PipelinePlan& p) {
  std::ostringstream out;
  out << "  stage  device      nodes                                      compute/mb   link "
         "on/mb\n";
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    const auto& d = t.devices[static_cast<size_t>(st.device)];
    char line[200];
    const std::string nodes = std::to_string(st.first) + "-" + std::to_string(st.last) + " (" +
                              t.nodes[static_cast<size_t>(st.first)].name + " .. " +
                              t.nodes[static_cast<size_t>(st.last)].name + ")";
    std::snprintf(
        line, sizeof line, "  %-5zu  %-10s  %-41s  %10s   %10s\n", s,
        (std::to_string(st.device) + " (x" + std::to_string(d.speed).substr(0, 4) + ")").c_str(),
        nodes.c_str(), format_seconds(st.compute_s).c_str(),
        s + 1 < p.stages.size() ? format_seconds(st.link_s).c_str() : "-");
    out << line;
  }
  // A star's uploads, where one is slower than the stage's compute and its own link: activations
  // forward and gradients back leave through it together.
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    if (st.egress_s > std::max(st.compute_s, st.link_s))
      out << "  stage " << s
          << " sends both ways through one upload: " << format_seconds(st.egress_s)
          << " per micro-batch\n";
  }
  out << "  slowest part " << format_seconds(p.bottleneck_s) << " per micro-batch; predicted step "
      << format_seconds(p.step_s) << " for " << t.micro_batches << " micro-batches ("
      << (t.one_f_one_b ? "1F1B" : "GPipe");
  if (t.one_f_one_b && t.extra_warmup > 0) out << ", " << t.extra_warmup << " extra warm-up";
  out << " played through; steady state " << format_seconds(p.steady_step_s) << ")\n";
  return out.str();
}

std::string describe_plan(const CostTable& t, const ReplicatedPlan& p) {
  std::ostringstream out;
  out << p.replicas << " replica" << (p.replicas == 1 ? "" : "s") << " of " << p.stages
      << " stages";
  if (p.replicas > 1) out << " (replica 0 shown; the others run the same cut)";
  out << ":\n" << describe_plan(t, p.pipelines.front());
  for (int r = 1; r < p.replicas; ++r) {
    out << "  replica " << r << " on devices";
    for (const auto& st : p.pipelines[static_cast<size_t>(r)].stages) out << " " << st.device;
    out << ": predicted step " << format_seconds(p.pipelines[static_cast<size_t>(r)].step_s)
        << "\n";
  }
  if (p.replicas > 1)
    out << "  averaging across replicas " << format_seconds(p.averaging_s) << ", adding "
        << format_seconds(p.sync_s) << " per step; ";
  else
    out << "  ";
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.2f", p.micro_batches_per_s);
  out << "predicted step " << format_seconds(p.step_s) << ", " << rate
      << " micro-batches/s in all\n";
  return out.str();
}

}  // namespace starling::sched
