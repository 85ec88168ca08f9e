#include "coordinator/cli/follow.hpp"

#include <iostream>
#include <map>
#include <thread>

#include "common/durations.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

int follow(const GlobalOptions& g, const FollowSpec& spec) {
  auto client = AdminClient::from(g);
  if (!client) return fail(client.error());
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, std::string> seen;
  std::string last_error;
  while (true) {
    auto r = client->call("GET", spec.path);
    const std::string t = "[" +
                          format_duration(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::steady_clock::now() - start)) +
                          "]";
    if (!r) {
      // A coordinator restarting carries on from its journals: keep following.
      if (r.error().code != Errc::unavailable) return fail(r.error());
      if (r.error().message != last_error) std::cerr << t << " " << r.error().message << "\n";
      last_error = r.error().message;
    } else {
      last_error.clear();
      for (const auto& e : r->value("tenants", nlohmann::json::array())) {
        const std::string line = spec.state_line(e);
        std::string& before = seen[spec.tenant_of(e)];
        if (line != before)
          std::cerr << t << " " << display_text(spec.tenant_of(e)) << ": " << display_text(line)
                    << "\n";
        before = line;
      }
      if (auto status = spec.judge(*r, t)) return *status;
    }
    if (std::chrono::steady_clock::now() - start >= spec.timeout)
      return fail(Error(Errc::timeout, spec.on_timeout));
    std::this_thread::sleep_for(spec.poll);
  }
}

}  // namespace factory::cli
