#include "coordinator/tenants/endpoint_keys.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/pki.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

// A named key: 40 characters of [a-z0-9] as the default key, with its own
// prefix so that a pasted one says which kind it is.
std::string new_named_key() {
  return "fmk-" + pki::random_token_chars(40);
}

net::HttpResponseOut keys_reply(const Result<json>& r, int ok_status = 200) {
  if (r) return coordinator::json_response(*r, ok_status);
  return net::HttpResponseOut::error(http_status_for(r.error()), errc_name(r.error().code),
                                     r.error().message);
}

template <class F>
net::HttpResponseOut keys_guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& ex) {
    spdlog::error("keys: {} failed with an exception: {}", what, ex.what());
    return net::HttpResponseOut::error(500, "internal",
                                       std::string("internal error in ") + what + ": " + ex.what());
  }
}

Status key_limit_of(const json& v, const char* field, std::optional<std::int64_t>& out) {
  if (v.is_null()) return {};
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > kMaxKeyLimit)
    return Error(Errc::invalid_argument, std::string(field) + ": want an integer from 1 to " +
                                             std::to_string(kMaxKeyLimit));
  out = v.get<std::int64_t>();
  return {};
}

json named_key_json(const store::EndpointKey& k) {
  json j = {{"name", k.name.value_or("")}, {"created_at", k.created_at.value_or("")}};
  if (k.rpm) j["rpm"] = *k.rpm;
  if (k.tpm) j["tpm"] = *k.tpm;
  return j;
}

}  // namespace

Status validate_key_name(const std::string& name) {
  auto ok_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  };
  if (name.empty() || name.size() > 63 || name[0] == '-' ||
      !std::all_of(name.begin(), name.end(), ok_char))
    return Error(Errc::invalid_argument,
                 "a key name is 1 to 63 characters of a-z, 0-9 and '-', not beginning with '-'");
  return {};
}

Result<store::TenantRecord> EndpointKeys::endpoint_tenant(const std::string& tenant) const {
  if (auto st = enroll::validate_tenant_name(tenant); !st.ok()) return st.error();
  auto rec = store_.get_tenant(tenant);
  if (!rec) return Error(Errc::not_found, "no tenant named " + tenant);
  if (!rec->endpoint)
    return Error(Errc::failed_precondition,
                 "tenant " + tenant + " serves no model endpoint: it has no keys");
  return *rec;
}

Result<json> EndpointKeys::create(const KeyRequest& r) {
  std::lock_guard lk(mu_);
  if (auto st = validate_key_name(r.name); !st.ok()) return st.error();
  if (r.name == kDefaultKeyName)
    return Error(Errc::already_exists,
                 "\"default\" is the tenant's own key: `factory tenant credentials " + r.tenant +
                     " --rotate` replaces it");
  for (const auto* l : {&r.rpm, &r.tpm})
    if (*l && (**l < 1 || **l > kMaxKeyLimit))
      return Error(Errc::invalid_argument,
                   "a limit is an integer from 1 to " + std::to_string(kMaxKeyLimit));
  auto rec = endpoint_tenant(r.tenant);
  if (!rec) return rec.error();
  const auto& keys = rec->endpoint->keys;
  if (keys) {
    for (const auto& k : *keys)
      if (k.name == r.name)
        return Error(Errc::already_exists, "tenant " + r.tenant + " has a key named " + r.name +
                                               " already: revoke it first to replace it");
    if (keys->size() >= kMaxEndpointKeys)
      return Error(Errc::failed_precondition,
                   "tenant " + r.tenant + " has " + std::to_string(keys->size()) +
                       " named keys, the most it may have: revoke one first");
  }
  store::EndpointKey k;
  k.name = r.name;
  k.created_at = now_str();
  k.rpm = r.rpm;
  k.tpm = r.tpm;
  json out = named_key_json(k);
  out["tenant"] = r.tenant;
  out["key"] = r.name;
  out["dry_run"] = r.dry_run;
  if (r.dry_run) return out;
  const std::string fresh = new_named_key();
  k.sha256 = pki::sha256_hex(fresh);
  auto changed = store_.update_tenant(r.tenant, [&](store::TenantRecord& t) -> Status {
    if (!t.endpoint) return Error(Errc::failed_precondition, "the tenant's endpoint is gone");
    if (!t.endpoint->keys) t.endpoint->keys.emplace();
    for (const auto& o : *t.endpoint->keys)
      if (o.name == r.name) return Error(Errc::already_exists, "a key named " + r.name + " exists");
    t.endpoint->keys->push_back(k);
    return {};
  });
  if (!changed) return changed.error().with_context("recording the key of tenant " + r.tenant);
  const bool told = agents_.push_endpoint(r.tenant);
  out["api_key"] = fresh;
  out["guest_told"] = told;
  if (!told) out["note"] = "the guest's agent is not connected: the key works once it reconnects";
  spdlog::info("keys: created key {} of tenant {} (guest {})", r.name, r.tenant,
               told ? "told" : "not connected");
  return out;
}

Result<json> EndpointKeys::list(const std::string& tenant) const {
  auto rec = endpoint_tenant(tenant);
  if (!rec) return rec.error();
  const auto& e = *rec->endpoint;
  json keys = json::array();
  json def = {{"name", kDefaultKeyName}, {"created_at", e.rotated_at.value_or(rec->created_at)}};
  keys.push_back(def);
  if (e.keys)
    for (const auto& k : *e.keys) keys.push_back(named_key_json(k));
  if (e.usage) {
    const auto& total = e.usage->totals_since_creation();
    for (auto& k : keys) {
      auto it = total.find(k.value("name", ""));
      if (it == total.end()) continue;
      k["usage"] = {{"requests", it->second.requests},
                    {"errors", it->second.errors},
                    {"prompt_tokens", it->second.prompt_tokens},
                    {"completion_tokens", it->second.completion_tokens}};
    }
  }
  return json{{"tenant", tenant}, {"keys", std::move(keys)}};
}

Result<json> EndpointKeys::revoke(const std::string& tenant, const std::string& name,
                                  bool dry_run) {
  std::lock_guard lk(mu_);
  if (auto st = validate_key_name(name); !st.ok()) return st.error();
  if (name == kDefaultKeyName)
    return Error(Errc::failed_precondition,
                 "the default key cannot be revoked, only replaced: `factory tenant credentials " +
                     tenant + " --rotate`");
  auto rec = endpoint_tenant(tenant);
  if (!rec) return rec.error();
  const auto& keys = rec->endpoint->keys;
  if (!keys || std::none_of(keys->begin(), keys->end(),
                            [&](const store::EndpointKey& k) { return k.name == name; }))
    return Error(Errc::not_found, "tenant " + tenant + " has no key named " + name);
  json out = {{"tenant", tenant}, {"key", name}, {"dry_run", dry_run}, {"revoked", false}};
  if (dry_run) return out;
  auto changed = store_.update_tenant(tenant, [&](store::TenantRecord& t) -> Status {
    if (!t.endpoint || !t.endpoint->keys) return Error(Errc::not_found, "no key named " + name);
    auto& ks = *t.endpoint->keys;
    auto it = std::find_if(ks.begin(), ks.end(),
                           [&](const store::EndpointKey& k) { return k.name == name; });
    if (it == ks.end()) return Error(Errc::not_found, "no key named " + name);
    ks.erase(it);
    // Its name stays in the usage, so that the agent's last report of it,
    // which may come after this, is still counted (projection.cpp).
    if (!t.endpoint->usage) t.endpoint->usage.emplace();
    (void)t.endpoint->usage->add(name, {}, std::chrono::system_clock::now());
    return {};
  });
  if (!changed)
    return changed.error().with_context("revoking key " + name + " of tenant " + tenant);
  const bool told = agents_.push_endpoint(tenant);
  out["revoked"] = true;
  out["guest_told"] = told;
  if (!told)
    out["note"] =
        "the guest's agent is not connected: its proxy refuses every named key 3 s after losing "
        "the coordinator, and takes the current keys when it reconnects";
  spdlog::info("keys: revoked key {} of tenant {} (guest {})", name, tenant,
               told ? "told" : "not connected");
  return out;
}

void EndpointKeys::install_routes(coordinator::ApiRouter& r) {
  const coordinator::RouteOptions kBlocking{.blocking = true};
  r.add(
      "POST", "/v1/tenants/{name}/keys",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return keys_guarded("POST /v1/tenants/{name}/keys", [&] {
          const char* want =
              "want {\"name\": KEY, \"rpm\": N, \"tpm\": N, \"dry_run\": bool}, rpm, tpm and "
              "dry_run optional";
          auto body = json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() || !body.contains("name") ||
              !body["name"].is_string())
            return net::HttpResponseOut::error(400, "bad_request", want);
          KeyRequest kr;
          kr.tenant = p.at("name");
          for (const auto& [k, v] : body.items()) {
            Status st;
            if (k == "name")
              kr.name = v.get<std::string>();
            else if (k == "rpm")
              st = key_limit_of(v, "rpm", kr.rpm);
            else if (k == "tpm")
              st = key_limit_of(v, "tpm", kr.tpm);
            else if (k == "dry_run" && v.is_boolean())
              kr.dry_run = v.get<bool>();
            else
              return net::HttpResponseOut::error(400, "bad_request", want);
            if (!st.ok())
              return net::HttpResponseOut::error(400, "bad_request", st.error().message);
          }
          auto j = create(kr);
          return keys_reply(j, kr.dry_run ? 200 : 201);
        });
      },
      kBlocking);
  r.add(
      "GET", "/v1/tenants/{name}/keys",
      [this](auto&, const coordinator::PathParams& p) {
        return keys_guarded("GET /v1/tenants/{name}/keys",
                            [&] { return keys_reply(list(p.at("name"))); });
      },
      kBlocking);
  r.add(
      "DELETE", "/v1/tenants/{name}/keys/{key}",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return keys_guarded("DELETE /v1/tenants/{name}/keys/{key}", [&] {
          bool dry = false;
          if (auto it = req.query.find("dry_run"); it != req.query.end()) {
            if (it->second != "true" && it->second != "false")
              return net::HttpResponseOut::error(400, "bad_request", "dry_run: want true or false");
            dry = it->second == "true";
          }
          return keys_reply(revoke(p.at("name"), p.at("key"), dry));
        });
      },
      kBlocking);
}

}  // namespace factory::tenants
