#include "agent/steps/gpu_present.hpp"

#include "agent/diagnose/known.hpp"
#include "agent/guest/facts.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

namespace {

class GpuPresent final : public Step {
 public:
  GpuPresent(std::uint32_t vendor, long long min_count) : vendor_(vendor), min_count_(min_count) {}

  Result<bool> check(StepContext& ctx) override {
    return static_cast<long long>(matching(ctx.env).size()) >= min_count_;
  }

  StepOutcome apply(StepContext& ctx) override { return verify(ctx); }

  StepOutcome verify(StepContext& ctx) override {
    auto gpus = matching(ctx.env);
    if (static_cast<long long>(gpus.size()) >= min_count_) {
      std::string msg;
      for (const auto& g : gpus)
        msg += (msg.empty() ? "" : ", ") + g.id() + " at " + g.address +
               (g.driver.empty() ? "" : " (" + g.driver + ")");
      return StepOutcome::success(std::to_string(gpus.size()) + " GPU(s) on the PCI bus: " + msg);
    }
    nlohmann::json seen = nlohmann::json::array();
    for (const auto& f : scan_pci_bus(ctx.env)) seen.push_back(f.to_json());
    auto d = diagnoses::gpu_not_on_pci_bus(seen);
    std::string found = std::to_string(gpus.size()) + " of " + std::to_string(min_count_);
    return StepOutcome::failure(d.summary + " (found " + found + ")", {}, d);
  }

 private:
  std::vector<PciFunction> matching(const GuestEnv& env) const {
    std::vector<PciFunction> out;
    for (auto& f : scan_pci_bus(env))
      if (f.vendor == vendor_ && (f.class_code >> 16) == 0x03) out.push_back(std::move(f));
    return out;
  }

  std::uint32_t vendor_;
  long long min_count_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_gpu_present(const StepSpec& spec) {
  auto p = normalized_params("gpu_present", spec);
  if (!p) return p.error();
  auto vendor =
      static_cast<std::uint32_t>(std::stoul((*p)["vendor"].get<std::string>(), nullptr, 16));
  return std::unique_ptr<Step>(new GpuPresent(vendor, (*p)["min_count"].get<long long>()));
}

}  // namespace factory::agent::steps
