#pragma once
// How admin commands reach a running coordinator: the API address, CA and
// admin token all come from the same --config the server reads, so on the
// coordinator's host no other flag is needed (--server / --token-file override).
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "coordinator/cli/context.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/config/coordinator_config.hpp"

namespace factory::cli {

class AdminClient {
 public:
  static Result<AdminClient> from(const GlobalOptions& g);
  // Returns the decoded JSON body of a 2xx answer; otherwise the server's
  // error message as one line.
  Result<nlohmann::json> call(const std::string& method, const std::string& path,
                              const nlohmann::json& body = nullptr) const;
  // One Server-Sent Event (GET /v1/events): comments and heartbeats are
  // not events.
  struct ServerEvent {
    std::string id, type, data;
  };
  // Follows `path` as an event stream, resuming after last_event_id when it
  // is not empty: on_open once the coordinator accepted it, on_event for
  // each event until it returns false. Ends with the stream: ok when
  // on_event stopped it or the coordinator ended it (a dropped reader, a
  // restart), else why it broke.
  Status follow(const std::string& path, const std::string& last_event_id,
                const std::function<void()>& on_open,
                const std::function<bool(const ServerEvent&)>& on_event) const;
  const coordinator::CoordinatorConfig& config() const { return cfg_; }
  const std::string& base_url() const { return base_; }

 private:
  coordinator::CoordinatorConfig cfg_;
  std::string base_, token_, ca_pem_;
};

// An API path from its segments, each percent-encoded:
// api_path({"v1", "tenants", name, "retry"}) is "/v1/tenants/<name>/retry"
// whatever the name holds ('/', '?', '%', ..), and the coordinator routes
// it as one segment.
std::string api_path(std::initializer_list<std::string_view> segments);

// One call for a command that needs nothing else of the client: connects
// with the global options and returns the answer, or why there is none.
Result<nlohmann::json> call_coordinator(const GlobalOptions& g, const std::string& method,
                                        const std::string& path,
                                        const nlohmann::json& body = nullptr);

// A command that lists what the API answers to GET `path`: -o json|yaml
// prints the answer as it is, the table format hands it to print_table_of.
// Returns the exit status.
int list_from_coordinator(const GlobalOptions& g, const std::string& path, OutputFormat out,
                          const std::function<void(const nlohmann::json&)>& print_table_of);

}  // namespace factory::cli
