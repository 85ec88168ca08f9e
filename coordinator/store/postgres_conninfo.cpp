#include "coordinator/store/postgres_conninfo.hpp"

#include <libpq-fe.h>

#include <string_view>

namespace factory::store {

std::string password_of(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  PQfreemem(err);
  std::string pw;
  for (auto* o = opts; o && o->keyword; ++o)
    if (std::string_view(o->keyword) == "password" && o->val) pw = o->val;
  PQconninfoFree(opts);
  return pw;
}

std::string scrub(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (auto at = text.find(secret); at != std::string::npos; at = text.find(secret, at))
    text.replace(at, secret.size(), "***");
  return text;
}

Result<std::string> describe_conninfo(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  // libpq's message may quote the string it could not parse: not repeated.
  PQfreemem(err);
  if (!opts)
    return Error(Errc::invalid_argument,
                 "store: the PostgreSQL connection string does not parse (a key=value list or "
                 "a postgres:// URI; it is not repeated here, it may hold a password)");
  std::string out;
  for (auto* o = opts; o->keyword; ++o) {
    std::string_view k = o->keyword;
    if (!o->val || !*o->val) continue;
    if (k == "host" || k == "hostaddr" || k == "port" || k == "dbname" || k == "user")
      out += (out.empty() ? "" : " ") + std::string(k) + "=" + o->val;
  }
  PQconninfoFree(opts);
  return "postgres " + (out.empty() ? std::string("(libpq's defaults)") : out);
}

std::string first_line(const char* msg) {
  std::string s = msg ? msg : "";
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s.empty() ? "no message" : s;
}

Result<PGconn*> open_connection(const std::string& conninfo, const char* app,
                                const std::string& who, const std::string& where,
                                const std::string& secret) {
  const char* keys[] = {"connect_timeout",
                        "application_name",
                        "keepalives_idle",
                        "keepalives_interval",
                        "keepalives_count",
                        "dbname",
                        nullptr};
  const char* vals[] = {"10", app, "10", "5", "3", conninfo.c_str(), nullptr};
  PGconn* c = PQconnectdbParams(keys, vals, 1);
  if (!c) return Error(Errc::internal, who + ": " + where + ": libpq is out of memory");
  if (PQstatus(c) != CONNECTION_OK) {
    Error e(
        Errc::unavailable,
        scrub(who + ": cannot connect to " + where + ": " + first_line(PQerrorMessage(c)), secret));
    PQfinish(c);
    return e;
  }
  PQsetNoticeProcessor(
      c, [](void*, const char*) {}, nullptr);
  return c;
}

}  // namespace factory::store
