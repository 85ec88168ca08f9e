#pragma once
// Secrets made once and shared by every replica: the agents' CA, the model
// endpoints' CA and the admin token (replica.hpp names them). Whoever writes
// first wins, whatever the others made meanwhile is thrown away, and every
// replica, starting together or years apart, reads the same value.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "coordinator/shared/database.hpp"

namespace factory::shared {

class SharedSecrets {
 public:
  explicit SharedSecrets(std::shared_ptr<const Database> db) : db_(std::move(db)) {}

  // The value kept under `name`, if any.
  Result<std::optional<std::string>> get(const std::string& name) const;
  // The value kept under `name`; when there is none, make() makes one and it
  // is offered (INSERT … ON CONFLICT DO NOTHING), then the value kept is read
  // back: the first writer's, which may not be the one make() made. make()
  // runs only when nothing was kept when asked. Errors: make()'s, or the
  // database's (its password in none).
  Result<std::string> get_or_create(const std::string& name,
                                    const std::function<Result<std::string>()>& make) const;

 private:
  std::shared_ptr<const Database> db_;
};

}  // namespace factory::shared
