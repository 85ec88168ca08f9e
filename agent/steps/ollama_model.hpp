#pragma once
// Step kind `ollama_model`: a model pulled into Ollama, loaded, and running
// on the GPU (runbook step 5: `ollama pull`, `ollama run`, `ollama ps` shows
// "100% GPU").
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   model:            "llama3.2:1b"
//   require_full_gpu: true   (default) fail unless /api/ps shows size_vram == size
//
// check:  GET /api/tags lists the model.
// apply:  POST /api/pull {"model", "stream": true}; the NDJSON progress
//         (completed/total per layer) is summed into one percentage and sent
//         through ctx.progress at most twice a second. Ollama resumes a
//         partial download, so a retry after a crash does not start over.
// verify: the model is listed; POST /api/generate with no prompt loads it
//         (keep_alive 10m); GET /api/ps must show it with size_vram == size.
// Diagnoses: model_not_found (the server's error), model_download_interrupted,
//   model_partly_on_cpu ("1.2 GB of 1.6 GB on the GPU, 25% on the CPU"),
//   ollama_not_answering.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_ollama_model(const StepSpec& spec);

}  // namespace factory::agent::steps
