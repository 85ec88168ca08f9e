#include "coordinator/feed/status_feed.hpp"

namespace factory::feed {

// Generated from coordinator/feed/dashboard/ (coordinator/CMakeLists.txt).
extern const char kDashboardHtml[];
extern const char kDashboardJs[];
extern const char kDashboardCss[];

const std::vector<DashboardFile>& dashboard_files() {
  static const std::vector<DashboardFile> files = {
      {"/", "text/html; charset=utf-8", kDashboardHtml},
      {"/dashboard/app.js", "text/javascript; charset=utf-8", kDashboardJs},
      {"/dashboard/style.css", "text/css; charset=utf-8", kDashboardCss},
  };
  return files;
}

}  // namespace factory::feed
