#include "coordinator/shared/secrets.hpp"

#include "common/durations.hpp"

namespace factory::shared {

Result<std::optional<std::string>> SharedSecrets::get(const std::string& name) const {
  auto rows = db_->run("secret_get", {name});
  if (!rows) return rows.error().with_context("reading shared secret " + name);
  if (rows->empty() || !rows->front().at(0)) return std::optional<std::string>();
  return rows->front().at(0);
}

Result<std::string> SharedSecrets::get_or_create(
    const std::string& name, const std::function<Result<std::string>()>& make) const {
  auto kept = get(name);
  if (!kept) return kept.error();
  if (*kept) return std::move(**kept);
  auto made = make();
  if (!made) return made.error().with_context("making shared secret " + name);
  // Another replica may have written it since: then this does nothing, and
  // what is read back is that replica's.
  if (auto put = db_->run("secret_put", {name, *made, format_rfc3339(Clock::now())}); !put)
    return put.error().with_context("storing shared secret " + name);
  auto now = get(name);
  if (!now) return now.error();
  if (!*now)
    return Error(Errc::internal, "shared secret " + name + " was stored but cannot be read back");
  return std::move(**now);
}

}  // namespace factory::shared
