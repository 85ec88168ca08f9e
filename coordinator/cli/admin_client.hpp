#pragma once
// How admin commands reach a running coordinator: the API address, CA and
// admin token all come from the same --config the server reads, so on the
// coordinator's host no other flag is needed (--server / --token-file override).
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

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
  const coordinator::CoordinatorConfig& config() const { return cfg_; }
  const std::string& base_url() const { return base_; }

 private:
  coordinator::CoordinatorConfig cfg_;
  std::string base_, token_, ca_pem_;
};

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
