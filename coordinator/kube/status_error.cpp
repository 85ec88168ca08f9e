#include "coordinator/kube/status_error.hpp"

#include <nlohmann/json.hpp>

namespace factory::kube {

using nlohmann::json;

namespace {

// A Status field as text; anything but a string (the API server's body is
// not ours to trust: a proxy's, or a broken server's) reads as "".
std::string text(const json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

json parse_status(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return json::object();
  return j;
}

// The server's message, or the causes of an Invalid status when it has no
// message; a non-JSON body (a proxy's HTML page) is cut to one short line.
std::string server_message(const json& st, const std::string& body) {
  std::string msg = text(st, "message");
  const json details = st.value("details", json::object());
  if (msg.empty() && details.is_object() && details.contains("causes") &&
      details["causes"].is_array()) {
    for (const auto& c : details["causes"]) {
      if (!msg.empty()) msg += "; ";
      msg += text(c, "field") + ": " + text(c, "message");
    }
  }
  if (msg.empty() && !st.contains("kind")) {
    msg = body.substr(0, 200);
    for (auto& ch : msg)
      if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return msg;
}

std::string where(const RequestInfo& req) {
  if (!req.resource.namespaced) return "";
  if (req.ns.empty()) return " in any namespace";
  return " in namespace " + req.ns;
}

std::string what(const RequestInfo& req) {
  std::string s = req.resource.qualified();
  if (!req.name.empty()) s += " \"" + req.name + "\"";
  if (req.resource.namespaced && !req.ns.empty()) s += " in namespace " + req.ns;
  return s;
}

// What is missing when an API group is not served: KubeVirt's and CDI's
// are installed with them; any other group's kind is a custom resource
// (the GPU Operator's ClusterPolicy, Factory's own Tenant), whose CRD is.
std::string missing_group_hint(const std::string& group) {
  if (group == "cdi.kubevirt.io") return "is CDI installed?";
  if (group == "kubevirt.io") return "is KubeVirt installed?";
  return "is its CustomResourceDefinition installed?";
}

}  // namespace

std::string status_reason(const std::string& body) {
  return text(parse_status(body), "reason");
}

Error status_error(int code, const std::string& body, const RequestInfo& req) {
  json st = parse_status(body);
  std::string msg = server_message(st, body);
  std::string reason = text(st, "reason");
  switch (code) {
    case 401:
      return Error(Errc::unauthenticated,
                   "unauthorized: the Kubernetes API at " + req.server +
                       " did not accept our credentials (expired token, or a client certificate "
                       "it does not trust?)");
    case 403:
      return Error(Errc::permission_denied, "forbidden: the coordinator's account cannot " +
                                                req.verb + " " + req.resource.qualified() +
                                                where(req) + ": grant it with RBAC (see deploy/)");
    case 404:
      // A 404 for the resource type itself (no such API) versus for an object.
      if (reason == "NotFound" && st.contains("details") && st["details"].contains("name"))
        return Error(Errc::not_found, msg);
      if (!req.resource.group.empty() &&
          (msg.empty() || msg.find("could not find the requested resource") != std::string::npos))
        return Error(Errc::not_found, "the Kubernetes API at " + req.server + " does not serve " +
                                          req.resource.qualified() + " (" +
                                          req.resource.api_version() +
                                          "): " + missing_group_hint(req.resource.group));
      return Error(Errc::not_found, msg.empty() ? what(req) + " not found" : msg);
    case 409:
      if (reason == "AlreadyExists")
        return Error(Errc::already_exists, msg.empty() ? what(req) + " already exists" : msg);
      return Error(Errc::conflict, msg.empty() ? what(req) + " changed meanwhile" : msg);
    case 410:
      return Error(Errc::conflict, msg.empty() ? "resource version too old (410 Gone)" : msg);
    case 400:
    case 415:
    case 422:
      return Error(Errc::invalid_argument,
                   msg.empty() ? "the API server refused " + what(req) : msg);
    case 429:
      return Error(Errc::unavailable,
                   "the Kubernetes API at " + req.server + " is throttling us (429): " + msg);
    default:
      break;
  }
  if (code >= 500)
    return Error(Errc::unavailable, "the Kubernetes API at " + req.server + " failed (" +
                                        std::to_string(code) + "): " + msg);
  return Error(Errc::protocol, "the Kubernetes API at " + req.server + " answered " +
                                   std::to_string(code) + " to " + req.verb + " " + what(req) +
                                   (msg.empty() ? "" : ": " + msg));
}

}  // namespace factory::kube
