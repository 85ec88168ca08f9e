#pragma once
// The read-only API tokens of replicas that share a database: ApiAuth's
// store (api/auth.hpp), their SHA-256 only. A replica's checks read its
// memory, never the database; ApiAuth::refresh(), every few seconds on a
// thread of the replica's (replica.hpp), takes in what the others created.
#include <memory>

#include "coordinator/api/auth.hpp"
#include "coordinator/shared/database.hpp"

namespace factory::shared {

class SharedApiTokens final : public coordinator::ApiTokenStore {
 public:
  explicit SharedApiTokens(std::shared_ptr<const Database> db) : db_(std::move(db)) {}
  Status add(const coordinator::StoredApiToken& token) override;
  Result<std::vector<coordinator::StoredApiToken>> all() const override;

 private:
  std::shared_ptr<const Database> db_;
};

}  // namespace factory::shared
