// LatestHealth at the store's edges: the JSON the API, the feed and the
// database hold (store.hpp).
#include "common/durations.hpp"
#include "common/json_writer.hpp"
#include "coordinator/store/store.hpp"

namespace factory::store {

nlohmann::json LatestHealth::to_json() const {
  nlohmann::json j = sample.to_json();
  j["received_at"] = received_at;
  return j;
}

std::string LatestHealth::to_text() const {
  std::string text = sample.to_text();
  // The sample's object, "received_at" beside its keys.
  text.pop_back();
  text += ",\"received_at\":";
  append_json_string(text, received_at);
  text += '}';
  return text;
}

std::optional<LatestHealth> LatestHealth::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  auto decoded = proto::decode_health_sample(j);
  if (!decoded.value) return std::nullopt;
  LatestHealth h{std::move(*decoded.value), ""};
  auto at = j.find("received_at");
  if (at != j.end() && at->is_string() && parse_rfc3339(at->get<std::string>()))
    h.received_at = at->get<std::string>();
  return h;
}

}  // namespace factory::store
