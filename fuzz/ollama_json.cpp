// What the guest's Ollama answers (agent/guest/ollama_api.hpp): the guest is
// the customer's, so its Ollama may be anything. The first byte picks the
// reader: /api/tags, /api/ps (then every model's GPU share, as health and
// `factory status` compute it), or a pull's NDJSON stream, line by line into
// the layer-summing progress. Nothing may throw; percentages stay in 0..100.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "agent/guest/ollama_api.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace factory::agent;
  if (size < 1) return 0;
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      (void)parse_tags(body);
      break;
    case 1:
      if (auto ps = parse_ps(body))
        for (const auto& m : *ps) {
          int p = m.gpu_percent();
          if (p < 0 || p > 100) std::abort();
        }
      break;
    default: {
      PullProgress progress;
      std::size_t at = 0;
      while (at <= body.size()) {
        std::size_t nl = body.find('\n', at);
        if (nl == std::string::npos) nl = body.size();
        auto e = parse_pull_line(body.substr(at, nl - at));
        if (e && *e) progress.add(**e);
        at = nl + 1;
      }
      if (progress.percent() < 0 || progress.percent() > 100) std::abort();
    }
  }
  return 0;
}
