#include "coordinator/shared/api_tokens.hpp"

namespace factory::shared {

Status SharedApiTokens::add(const coordinator::StoredApiToken& token) {
  if (auto r = db_->run("api_token_add", {token.id, token.sha256, token.created_at}); !r)
    return r.error();
  return {};
}

Result<std::vector<coordinator::StoredApiToken>> SharedApiTokens::all() const {
  auto rows = db_->run("api_token_all", {});
  if (!rows) return rows.error();
  std::vector<coordinator::StoredApiToken> out;
  out.reserve(rows->size());
  for (const Row& r : *rows)
    out.push_back({r.at(0).value_or(""), r.at(1).value_or(""), r.at(2).value_or("")});
  return out;
}

}  // namespace factory::shared
