#pragma once
// Step kind `ollama_install`: Ollama installed, enabled as a service, and
// answering its REST API at the pinned version (runbook step 5).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   version:     "0.40.2"                         the version to install and expect
//   install_url: https://ollama.com/install.sh    (default) Ollama's install script
//   service:     ollama                           (default) the systemd unit
//
// check:  `ollama --version` reports `version` and GET /api/version answers it.
// apply:  unless `ollama --version` already reports `version`: downloads the
//         install script with curl and runs it with OLLAMA_VERSION=<version>
//         (the runbook's `curl -fsSL https://ollama.com/install.sh | sh`,
//         but a failed download fails the step instead of piping nothing into
//         sh); then `systemctl enable --now <service>`.
// verify: GET /api/version == version, retried until the step's deadline
//         (at most 2 minutes): the service needs a moment to listen.
// Diagnoses: ollama_not_answering, ollama_version_mismatch, download_failed.
#include <memory>
#include <string>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_ollama_install(const StepSpec& spec);

// "ollama version is 0.40.2" (Ollama's own wording), "ollama version 0.40.2"
// (the runbook's capture) and "Warning: client version is 0.40.2" (no server
// running) -> "0.40.2"; "" when there is no version in the text.
std::string parse_ollama_cli_version(const std::string& output);

}  // namespace factory::agent::steps
