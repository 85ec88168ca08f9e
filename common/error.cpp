#include "common/error.hpp"

#include <cstring>

namespace factory {

const char* errc_name(Errc c) {
  switch (c) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::not_found:
      return "not_found";
    case Errc::already_exists:
      return "already_exists";
    case Errc::conflict:
      return "conflict";
    case Errc::permission_denied:
      return "permission_denied";
    case Errc::unauthenticated:
      return "unauthenticated";
    case Errc::failed_precondition:
      return "failed_precondition";
    case Errc::unavailable:
      return "unavailable";
    case Errc::timeout:
      return "timeout";
    case Errc::io:
      return "io";
    case Errc::protocol:
      return "protocol";
    case Errc::internal:
      return "internal";
  }
  return "unknown";
}

Error errno_error(const std::string& what, int err) {
  return Error(Errc::io, what + ": " + std::strerror(err));
}

}  // namespace factory
