#include "coordinator/kube/client.hpp"

#include <map>
#include <thread>

#include "common/net/http_client.hpp"
#include "coordinator/kube/status_error.hpp"
#include "coordinator/kube/url_encode.hpp"

namespace factory::kube {

namespace {

std::string query(const std::vector<std::pair<std::string, std::string>>& params) {
  std::string q;
  for (const auto& [k, v] : params) {
    if (v.empty()) continue;
    q += q.empty() ? "?" : "&";
    q += k + "=" + url_encode(v);
  }
  return q;
}

std::string meta(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains("metadata") || !obj["metadata"].is_object()) return "";
  const auto& m = obj["metadata"];
  if (!m.contains(key) || !m[key].is_string()) return "";
  return m[key].get<std::string>();
}

Result<Resource> resource_of(const json& obj) {
  if (!obj.is_object() || !obj.contains("apiVersion") || !obj.contains("kind") ||
      !obj["apiVersion"].is_string() || !obj["kind"].is_string())
    return Error(Errc::invalid_argument, "a Kubernetes object needs apiVersion and kind");
  return resource_for(Kind{obj["apiVersion"].get<std::string>(), obj["kind"].get<std::string>()});
}

// Transport failures, said in terms of the Kubernetes API and its config.
Error transport_error(const Error& e, const ClusterAccess& a) {
  std::string hint = a.in_cluster ? "is the API server up?" : "is the kubeconfig's server right?";
  switch (e.code) {
    case Errc::unavailable:
    case Errc::timeout:
      return Error(e.code, "cannot reach the Kubernetes API at " + e.message + " (" + hint + ")");
    case Errc::unauthenticated:
      return Error(e.code, "cannot trust the Kubernetes API at " + e.message +
                               (a.in_cluster ? " (is ca.crt the cluster's CA?)"
                                             : " (is the kubeconfig's certificate-authority this "
                                               "cluster's CA?)"));
    case Errc::invalid_argument:
      return Error(e.code, a.source + ": " + e.message);
    default:
      return Error(e.code, "the Kubernetes API at " + e.message);
  }
}

std::string object_key(const json& obj) {
  return meta(obj, "namespace") + "/" + meta(obj, "name");
}

}  // namespace

struct KubeClient::Call {
  std::string method;
  RequestInfo info;
  std::string path;  // with query
  std::string content_type;
  std::string body;
};

KubeClient::KubeClient(ClusterAccess access, std::chrono::milliseconds request_timeout)
    : access_(std::move(access)), timeout_(request_timeout) {}

Result<json> KubeClient::call(const Call& c) {
  net::HttpRequest req;
  req.method = c.method;
  req.url = access_.server + c.path;
  req.timeout = timeout_;
  req.headers["Accept"] = "application/json";
  if (!c.content_type.empty()) req.headers["Content-Type"] = c.content_type;
  auto token = current_token(access_);
  if (!token) return token.error();
  if (!token->empty()) req.headers["Authorization"] = "Bearer " + *token;
  req.body = c.body;
  auto resp = net::HttpClient(access_.tls).request(req);
  if (!resp) return transport_error(resp.error(), access_);
  if (resp->status < 200 || resp->status >= 300) {
    RequestInfo info = c.info;
    info.server = access_.server;
    return status_error(resp->status, resp->body, info);
  }
  auto doc = json::parse(resp->body, nullptr, false);
  if (doc.is_discarded())
    return Error(Errc::protocol, "the Kubernetes API at " + access_.server + " answered " +
                                     c.method + " " + c.path + " with non-JSON");
  return doc;
}

std::string KubeClient::namespace_of(const Resource& r, const json& obj) const {
  if (!r.namespaced) return "";
  std::string ns = meta(obj, "namespace");
  return ns.empty() ? access_.default_namespace : ns;
}

Result<json> KubeClient::version() {
  Call c{"GET", {"get", Resource{"", "", "", "version", false}, "", ""}, "/version", "", ""};
  return call(c);
}

Result<json> KubeClient::get(const Kind& kind, const std::string& ns, const std::string& name) {
  auto r = resource_for(kind);
  if (!r) return r.error();
  return call({"GET", {"get", *r, ns, name}, r->object_path(ns, name), "", ""});
}

Result<json> KubeClient::list(const Kind& kind, const std::string& ns, const ListOptions& opts) {
  auto r = resource_for(kind);
  if (!r) return r.error();
  std::string path = r->collection_path(ns) + query({{"labelSelector", opts.label_selector},
                                                     {"fieldSelector", opts.field_selector}});
  return call({"GET", {"list", *r, r->namespaced ? ns : "", ""}, path, "", ""});
}

// Writes ask the server for strict field validation: an unknown field is an
// error (a typo in a VM spec must not be silently dropped).
Result<json> KubeClient::create(const json& obj, const WriteOptions& opts) {
  auto r = resource_of(obj);
  if (!r) return r.error();
  std::string ns = namespace_of(*r, obj);
  std::string path = r->collection_path(ns) + query({{"fieldManager", kFieldManager},
                                                     {"fieldValidation", "Strict"},
                                                     {"dryRun", opts.dry_run ? "All" : ""}});
  json body = obj;
  if (r->namespaced) body["metadata"]["namespace"] = ns;
  return call(
      {"POST", {"create", *r, ns, meta(obj, "name")}, path, "application/json", body.dump()});
}

Result<json> KubeClient::update(const json& obj, const WriteOptions& opts) {
  auto r = resource_of(obj);
  if (!r) return r.error();
  std::string ns = namespace_of(*r, obj);
  std::string name = meta(obj, "name");
  if (name.empty()) return Error(Errc::invalid_argument, "update: the object has no metadata.name");
  std::string path = r->object_path(ns, name) + query({{"fieldManager", kFieldManager},
                                                       {"fieldValidation", "Strict"},
                                                       {"dryRun", opts.dry_run ? "All" : ""}});
  json body = obj;
  if (r->namespaced) body["metadata"]["namespace"] = ns;
  return call({"PUT", {"update", *r, ns, name}, path, "application/json", body.dump()});
}

Result<json> KubeClient::update_status(const json& obj, const WriteOptions& opts) {
  auto r = resource_of(obj);
  if (!r) return r.error();
  std::string ns = namespace_of(*r, obj);
  std::string name = meta(obj, "name");
  if (name.empty())
    return Error(Errc::invalid_argument, "update status: the object has no metadata.name");
  std::string path =
      r->object_path(ns, name) + "/status" +
      query({{"fieldManager", kFieldManager}, {"dryRun", opts.dry_run ? "All" : ""}});
  json body = obj;
  if (r->namespaced) body["metadata"]["namespace"] = ns;
  return call({"PUT", {"update", *r, ns, name}, path, "application/json", body.dump()});
}

Result<json> KubeClient::apply(const json& obj, const ApplyOptions& opts) {
  auto r = resource_of(obj);
  if (!r) return r.error();
  std::string ns = namespace_of(*r, obj);
  std::string name = meta(obj, "name");
  if (name.empty()) return Error(Errc::invalid_argument, "apply: the object has no metadata.name");
  std::string path = r->object_path(ns, name) + query({{"fieldManager", kFieldManager},
                                                       {"fieldValidation", "Strict"},
                                                       {"force", opts.force ? "true" : ""},
                                                       {"dryRun", opts.dry_run ? "All" : ""}});
  json body = obj;
  if (r->namespaced) body["metadata"]["namespace"] = ns;
  // JSON is YAML, so the apply patch can be sent as the JSON it already is.
  return call(
      {"PATCH", {"patch", *r, ns, name}, path, "application/apply-patch+yaml", body.dump()});
}

Result<json> KubeClient::merge_patch(const Kind& kind, const std::string& ns,
                                     const std::string& name, const json& patch,
                                     const WriteOptions& opts) {
  auto r = resource_for(kind);
  if (!r) return r.error();
  std::string path = r->object_path(ns, name) + query({{"fieldManager", kFieldManager},
                                                       {"fieldValidation", "Strict"},
                                                       {"dryRun", opts.dry_run ? "All" : ""}});
  return call({"PATCH",
               {"patch", *r, r->namespaced ? ns : "", name},
               path,
               "application/merge-patch+json",
               patch.dump()});
}

Status KubeClient::remove(const Kind& kind, const std::string& ns, const std::string& name) {
  auto r = resource_for(kind);
  if (!r) return r.error();
  json body = {
      {"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Background"}};
  auto res = call({"DELETE",
                   {"delete", *r, r->namespaced ? ns : "", name},
                   r->object_path(ns, name),
                   "application/json",
                   body.dump()});
  if (!res) return res.error();
  return {};
}

Result<WatchEvent> parse_watch_line(std::string_view line) {
  auto ev = json::parse(line, nullptr, false);
  if (ev.is_discarded() || !ev.is_object())
    return Error(Errc::protocol, "the server sent a line that is not a JSON event");
  auto type = ev.find("type");
  if (type == ev.end() || !type->is_string())
    return Error(Errc::protocol, "the server sent an event without a type");
  auto obj = ev.find("object");
  if (obj == ev.end() || !obj->is_object())
    return Error(Errc::protocol, "the server sent a " + type->get<std::string>().substr(0, 32) +
                                     " event without an object");
  return WatchEvent{type->get<std::string>(), std::move(*obj)};
}

Status KubeClient::watch(const Kind& kind, const std::string& ns, const WatchOptions& opts,
                         const std::function<bool(const WatchEvent&)>& on_event) {
  using Clock = std::chrono::steady_clock;
  auto r = resource_for(kind);
  if (!r) return r.error();
  const std::string list_ns = r->namespaced ? ns : "";
  const auto deadline = Clock::now() + opts.timeout;
  const std::string what = r->qualified() + (list_ns.empty() ? "" : " in namespace " + list_ns);

  // What we last knew of each object, so a re-list after 410 Gone can be
  // reported as the changes it implies.
  std::map<std::string, json> known;
  std::string rv = opts.resource_version;
  bool stop = false;

  auto deliver = [&](const std::string& type, const json& obj) {
    if (stop) return;
    if (!on_event({type, obj})) stop = true;
  };

  auto relist = [&]() -> Status {
    auto l = list(kind, list_ns, {opts.label_selector, opts.field_selector});
    if (!l) return l.error();
    std::map<std::string, json> now;
    for (auto item : l->value("items", json::array())) {
      // List items of built-in kinds come without kind/apiVersion.
      item["kind"] = r->kind;
      item["apiVersion"] = r->api_version();
      now[object_key(item)] = item;
    }
    for (const auto& [key, obj] : now) {
      auto it = known.find(key);
      if (it == known.end())
        deliver("ADDED", obj);
      else if (meta(it->second, "resourceVersion") != meta(obj, "resourceVersion"))
        deliver("MODIFIED", obj);
    }
    for (const auto& [key, obj] : known)
      if (!now.count(key)) deliver("DELETED", obj);
    known = std::move(now);
    rv = meta(*l, "resourceVersion");
    return {};
  };

  if (rv.empty()) {
    if (auto st = relist(); !st) return st.error().with_context("watch " + what);
    if (stop) return {};
  }

  auto delay = opts.retry_delay;
  net::HttpClient http(access_.tls);
  while (!stop) {
    if (opts.cancelled && opts.cancelled()) return {};
    auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    auto server_timeout = std::min(left, opts.max_request);
    if (server_timeout.count() < 1) server_timeout = std::chrono::seconds(1);

    net::HttpRequest req;
    req.url = access_.server + r->collection_path(list_ns) +
              query({{"watch", "1"},
                     {"resourceVersion", rv},
                     {"allowWatchBookmarks", "true"},
                     {"timeoutSeconds", std::to_string(server_timeout.count())},
                     {"labelSelector", opts.label_selector},
                     {"fieldSelector", opts.field_selector}});
    // The server ends the request at timeoutSeconds; allow it that long
    // between events (bookmarks are not guaranteed to come sooner).
    req.timeout = server_timeout + std::chrono::seconds(15);
    req.headers["Accept"] = "application/json";
    auto token = current_token(access_);
    if (!token) return token.error();
    if (!token->empty()) req.headers["Authorization"] = "Bearer " + *token;

    int status = 0;
    std::string error_body, line_buf;
    bool gone = false;
    Status stream_error;
    auto on_line = [&](const std::string& line) -> bool {
      if (opts.cancelled && opts.cancelled()) {
        stop = true;
        return false;
      }
      if (line.empty()) return true;
      auto ev = parse_watch_line(line);
      if (!ev) {
        stream_error = Error(Errc::protocol, "watch " + what + ": " + ev.error().message);
        return false;
      }
      const std::string& type = ev->type;
      const json& obj = ev->object;
      if (type == "BOOKMARK") {
        if (auto v = meta(obj, "resourceVersion"); !v.empty()) rv = v;
        return true;
      }
      if (type == "ERROR") {
        // A metav1.Status; its code is an integer when the server is sane.
        const int code =
            obj.contains("code") && obj["code"].is_number_integer() ? obj["code"].get<int>() : 500;
        if (code == 410) {
          gone = true;
          return false;
        }
        RequestInfo info{"watch", *r, list_ns, "", access_.server};
        stream_error = status_error(code, obj.dump(), info);
        return false;
      }
      if (type != "ADDED" && type != "MODIFIED" && type != "DELETED") return true;  // newer types
      if (auto v = meta(obj, "resourceVersion"); !v.empty()) rv = v;
      if (type == "DELETED")
        known.erase(object_key(obj));
      else
        known[object_key(obj)] = obj;
      deliver(type, obj);
      return !stop;
    };
    auto res = http.stream(
        req,
        [&](std::string_view chunk) {
          if (status != 200) {
            if (error_body.size() < 64 * 1024) error_body.append(chunk);
            return true;
          }
          line_buf.append(chunk);
          size_t nl;
          while ((nl = line_buf.find('\n')) != std::string::npos) {
            std::string line = line_buf.substr(0, nl);
            line_buf.erase(0, nl + 1);
            if (!on_line(line)) return false;
          }
          return true;
        },
        [&](const net::HttpResponse& head) {
          status = head.status;
          return true;
        });
    if (stop) return {};
    if (!stream_error.ok()) return stream_error.error();
    if (!res) {
      auto e = transport_error(res.error(), access_);
      // Refused credentials or an untrusted server do not get better by retrying.
      if (e.code == Errc::unauthenticated || e.code == Errc::invalid_argument) return e;
      // A dropped stream: resume from the last version seen.
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
          delay, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
      delay = std::min<std::chrono::milliseconds>(delay * 2, std::chrono::seconds(5));
      continue;
    }
    if (status == 410) gone = true;
    if (status != 200 && !gone) {
      RequestInfo info{"watch", *r, list_ns, "", access_.server};
      return status_error(status, error_body, info);
    }
    delay = opts.retry_delay;
    if (gone) {
      if (auto st = relist(); !st) return st.error().with_context("watch " + what);
    }
    // Otherwise the server ended the request at timeoutSeconds: go on.
  }
  if (stop) return {};
  return Error(
      Errc::timeout,
      "watch " + what + ": gave up after " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(opts.timeout).count()) +
          "s");
}

Result<KubeClient> connect(const AccessOptions& opts) {
  auto access = resolve_access(opts);
  if (!access) return access.error();
  return KubeClient(std::move(*access));
}

}  // namespace factory::kube
