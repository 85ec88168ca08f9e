// Every frame an enrolled agent (a tenant's root) may send, through the
// coordinator's decoders (coordinator/agents/messages.hpp): the envelope,
// then the body by its type, as AgentSession does; a decoded event is
// serialized as the store keeps it and projected onto a tenant record that
// already holds earlier projections (so the bounds on steps and diagnoses
// are crossed too); a health body goes through the typed health sample
// (contract/health_sample.hpp). Nothing may throw, and whatever is kept must
// serialize back to JSON.
#include <cstddef>
#include <cstdint>

#include "contract/health_sample.hpp"
#include "contract/protocol.hpp"
#include "coordinator/agents/messages.hpp"
#include "coordinator/agents/projection.hpp"

namespace {
factory::store::TenantRecord& record() {
  static factory::store::TenantRecord r = [] {
    factory::store::TenantRecord t;
    t.name = "fuzz";
    t.phase = "enrolled";
    return t;
  }();
  // Bounded by the projection itself; reset now and then so the fuzzer also
  // sees an empty record.
  static unsigned n = 0;
  if (++n % 4096 == 0) r.status = factory::store::TenantStatus{};
  return r;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace factory;
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto env = proto::parse(frame);
  if (!env) return 0;
  const nlohmann::json& body = env->body;
  const std::string& type = env->type;
  if (type == proto::type::kHello) {
    auto d = coordinator::decode_hello(body);
    if (d.value) (void)d.value->hostname.size();
  } else if (type == proto::type::kHeartbeat) {
    (void)coordinator::decode_heartbeat(body);
  } else if (type == proto::type::kEnroll) {
    (void)coordinator::decode_enroll(body);
  } else if (type == proto::type::kRenew || type == proto::type::kEndpointCsr) {
    // An endpoint's CSR frame has the renewal's shape and decoder.
    (void)coordinator::decode_renew(body);
  } else if (type == proto::type::kHealth) {
    auto sample = proto::decode_health_sample(body);
    if (sample.value) (void)sample.value->to_json().dump();
  } else {
    auto d = coordinator::decode_event(body);
    if (d.value) {
      (void)d.value->to_json().dump();
      auto& r = record();
      if (coordinator::project_event(r, *d.value)) (void)r.status.to_json().dump();
      if (const auto* h = std::get_if<coordinator::HealthEvent>(&d.value->body)) {
        auto sample = proto::decode_health_sample(h->report);
        if (sample.value) (void)sample.value->to_json().dump();
      }
    }
  }
  return 0;
}
