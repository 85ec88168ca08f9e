#pragma once
// The tenants as the status feed shows them: `GET /v1/tenants` (and so
// `factory status -o json`), and the record part of `GET /v1/tenants/{name}`.
// Each is its stored record (spec, phase, derived status) with its agent's
// live presence laid over the identity the store keeps.
#include <nlohmann/json.hpp>

#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

class TenantView {
 public:
  TenantView(const store::Store& store, const FeedState& state) : store_(store), state_(state) {}

  nlohmann::json tenant(const store::TenantRecord& t) const;
  // {"tenants": [...]}, every tenant in the store.
  nlohmann::json tenants() const;

 private:
  const store::Store& store_;
  const FeedState& state_;
};

}  // namespace factory::feed
