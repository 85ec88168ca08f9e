"""STAND-IN for the Ollama server (`ollama serve`) in the simulated guest.

Started by the guest simulator's systemctl stand-in (`systemctl start ollama`),
on 127.0.0.1 only. It speaks the parts of Ollama's REST API the agent uses,
with Ollama's own JSON shapes (docs/api.md in github.com/ollama/ollama):

  GET  /api/version   {"version": <the version the install script recorded>}
  GET  /api/tags      the models pulled so far
  POST /api/pull      {"model", "stream"}: NDJSON progress, chunked, as Ollama
                      streams it ("pulling manifest", one "pulling <digest>" line
                      per step with total/completed, "verifying sha256 digest",
                      "writing manifest", "success"); a partial download is
                      resumed by the next pull; an unknown name streams
                      "pulling manifest" then {"error": "pull model manifest:
                      file does not exist"} (what Ollama relays from the registry)
  POST /api/generate  {"model", "keep_alive"} with no prompt loads the model
                      ({"done_reason": "load"}); unknown -> 404 {"error": ...}
                      With a prompt it also answers: streamed by default
                      (application/x-ndjson, one {"model", "created_at",
                      "response": <token>, "done": false} per token, then
                      {"done": true, "done_reason": "stop" | "length",
                      "context", "total_duration", "load_duration",
                      "prompt_eval_count", "prompt_eval_duration",
                      "eval_count", "eval_duration"}), or one object with
                      "stream": false; options.num_predict caps the tokens
  POST /api/chat      {"model", "messages", "stream"}: the same, each chunk
                      carrying "message": {"role": "assistant", "content"}
  GET  /v1/models     OpenAI's list, as Ollama's openai/openai.go makes it:
                      {"object": "list", "data": [{"id", "object": "model",
                      "created", "owned_by": "library"}]} ("data": null when
                      nothing is pulled, as Ollama's nil slice encodes)
  GET  /v1/models/M   one such model; unknown -> 404
  POST /v1/chat/completions
                      non-streaming (the default): a "chat.completion" with
                      choices[0].message and usage; "stream": true:
                      text/event-stream, one `data: {"object":
                      "chat.completion.chunk", "choices": [{"index": 0,
                      "delta": {"role": "assistant", "content"},
                      "finish_reason": null}]}` per token, a last chunk with
                      finish_reason "stop" (or "length"), a usage chunk when
                      stream_options.include_usage, then `data: [DONE]`
  POST /v1/completions
                      the same for "text_completion" (choices[0].text)
  GET  /api/ps        loaded models with size and size_vram: all of the model on
                      the GPU when the simulated guest had its nvidia module
                      loaded and the GPU bound to it when this server started
                      (Ollama discovers GPUs at startup), none otherwise

The answer is a fixed sentence made from the prompt (answer_for), split into
tokens the way a model streams them (a word with its leading space). An
unknown or not-pulled model is 404 as Ollama says it: {"error": "model \"M\"
not found, try pulling it first"} on /api, the same message in OpenAI's error
object {"error": {"message", "type": "not_found_error", "param": null,
"code": null}} on /v1 (middleware/openai.go's writeError); /v1/models/M
says "model 'M' not found" (Ollama's /api/show). A prompt for a model not
loaded loads it first (counted as ollama.load.<model>), as Ollama does.

What it does NOT do: download or run any model (sizes are the real models'
approximate sizes, digests are made up except the 12-character model ID the
runbook's `ollama ps` shows), embeddings/show/create/push/delete, or auth.

State under <root>/.guestsim/state/ollama/ (models.json, partial/, loaded.json,
gpu-resident) survives a restart, like Ollama's model store. Counters in
<root>/.guestsim/state/counters/ (one integer per file, flock'ed like the bash
stand-ins): ollama.pull_request.<model>, ollama.download_complete.<model>,
ollama.bytes.<model>, ollama.load.<model>; ollama.authorization_seen
(requests that carried an Authorization header: a proxy in front must not
pass the customer's key on), ollama.answers (prompts answered) and
ollama.stream_abandoned (an answer stream whose reader went away before its
end). Every request is
logged on stderr as it is answered ("ollama_server: "POST /api/chat
HTTP/1.1" 200 -"): what a test reads to show a request never got here.
(No counter counts every request: a plan run again must leave the counters
as they were, and its checks read /api/tags and /api/ps.)

Failure knobs, files in <root>/.guestsim/knobs/:
  ollama_pull_cut        N: the pull stream is cut (connection closed mid-body)
                         once the download passes N percent
  ollama_vram_fraction   F (0..1): only this fraction of a model fits on the GPU
  ollama_pull_delay      seconds between progress lines (default 0.01)
  ollama_token_delay     seconds between streamed answer tokens (default 0.005)
  ollama_answer_cut      N: an answer stream is cut (connection closed, no
                         final chunk) after N tokens, as when the runner dies

  /usr/bin/python3 ollama_server.py --root SIM_ROOT --port PORT [--pidfile F]
"""
import argparse
import datetime
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def made_up_digest(seed, prefix=""):
    h = hashlib.sha256(seed.encode()).hexdigest()
    return "sha256:" + (prefix + h)[:64]


# The "registry": models this stand-in can pull. Download sizes are the real
# models' approximate sizes; llama3.2:1b's loaded size is the 1.6 GB its
# `ollama ps` shows in the runbook (l4-runbook/tenant1-ollama-ps.txt), and its
# ID there, baf6a787fdff, starts its digest.
REGISTRY = {
    "llama3.2:1b": {
        "digest": made_up_digest("llama3.2:1b", "baf6a787fdff"),
        "layers": [("model", 1321082688), ("template", 1429), ("license", 7711),
                   ("license-2", 6016), ("params", 96)],
        "loaded_size": 1610612736,
        "details": {"parent_model": "", "format": "gguf", "family": "llama",
                    "families": ["llama"], "parameter_size": "1.2B",
                    "quantization_level": "Q8_0"},
    },
    "qwen2.5:0.5b": {
        "digest": made_up_digest("qwen2.5:0.5b"),
        "layers": [("model", 397807936), ("system", 68), ("template", 1482),
                   ("license", 11343), ("params", 358)],
        "loaded_size": 1033322496,
        "details": {"parent_model": "", "format": "gguf", "family": "qwen2",
                    "families": ["qwen2"], "parameter_size": "494.03M",
                    "quantization_level": "Q4_K_M"},
    },
}


def normalize(name):
    base = name.rsplit("/", 1)[-1]
    return name if ":" in base else name + ":latest"


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat()


def unix_of(rfc3339):
    try:
        return int(datetime.datetime.fromisoformat(rfc3339).timestamp())
    except (TypeError, ValueError):
        return int(time.time())


def answer_for(prompt):
    """The stand-in's answer: a fixed sentence that quotes the prompt's first
    words, so a test can tell answers to different prompts apart."""
    words = " ".join((prompt or "").split()[:6])
    return ("The guest simulator's Ollama read \"%s\" and answers with this fixed sentence, "
            "since no model runs here." % words)


def tokens_of(text):
    """Splits text the way a model streams it: each word with its leading space."""
    return re.findall(r"\s*\S+", text)


def compact(obj):
    """JSON as Go's encoding/json writes it (no spaces), for streamed chunks."""
    return json.dumps(obj, separators=(",", ":"))


def word_count(text):
    return len((text or "").split())


class ClientGone(Exception):
    """The reader of an answer stream went away."""


def parse_keep_alive(v):
    """Ollama's keep_alive: a duration string ("10m", "1h30m", "300s"), a
    number of seconds, or negative for "forever". Returns seconds or None."""
    if v is None:
        return 300.0
    if isinstance(v, (int, float)):
        return None if v < 0 else float(v)
    s = str(v).strip()
    if s.startswith("-"):
        return None
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(h|m|s|ms)?", s):
        f = float(num)
        total += {"h": 3600, "m": 60, "s": 1, "ms": 0.001, None: 1, "": 1}[unit] * f
    return total


class Sim:
    """The simulated guest this server runs in."""

    def __init__(self, root):
        self.root = root
        self.gdir = os.path.join(root, ".guestsim")
        self.state = os.path.join(self.gdir, "state", "ollama")
        os.makedirs(os.path.join(self.state, "partial"), exist_ok=True)
        self.lock = threading.Lock()
        # Ollama looks for GPUs when it starts.
        self.gpu_usable = self._gpu_usable()

    def _gpu_usable(self):
        if not os.path.isdir(os.path.join(self.root, "sys/module/nvidia")):
            return False
        devs = os.path.join(self.root, "sys/bus/pci/devices")
        for d in sorted(os.listdir(devs)) if os.path.isdir(devs) else []:
            p = os.path.join(devs, d)
            try:
                vendor = open(os.path.join(p, "vendor")).read().strip()
                cls = open(os.path.join(p, "class")).read().strip()
            except OSError:
                continue
            link = os.path.join(p, "driver")
            if vendor == "0x10de" and cls.startswith("0x03") and os.path.islink(link) \
                    and os.path.basename(os.readlink(link)) == "nvidia":
                return True
        return False

    def knob(self, name):
        try:
            return open(os.path.join(self.gdir, "knobs", name)).read().strip()
        except OSError:
            return None

    def count(self, name, by=1):
        d = os.path.join(self.gdir, "state", "counters")
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, name)
        with open(f + ".lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                n = int(open(f).read().strip() or 0)
            except OSError:
                n = 0
            with open(f + ".tmp", "w") as out:
                out.write("%d\n" % (n + by))
            os.replace(f + ".tmp", f)

    def version(self):
        try:
            return open(os.path.join(self.state, "version")).read().strip()
        except OSError:
            return "0.0.0"

    def _load(self, name, default):
        try:
            return json.load(open(os.path.join(self.state, name)))
        except (OSError, ValueError):
            return default

    def _save(self, name, value):
        p = os.path.join(self.state, name)
        with open(p + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(p + ".tmp", p)

    def models(self):
        return self._load("models.json", {})

    def add_model(self, name):
        with self.lock:
            m = self.models()
            m[name] = {"modified_at": now_rfc3339()}
            self._save("models.json", m)

    def partial(self, name):
        return self._load(os.path.join("partial", name.replace("/", "_") + ".json"), {})

    def save_partial(self, name, value):
        self._save(os.path.join("partial", name.replace("/", "_") + ".json"), value)

    def clear_partial(self, name):
        try:
            os.remove(os.path.join(self.state, "partial", name.replace("/", "_") + ".json"))
        except OSError:
            pass

    def loaded(self):
        now = time.time()
        return {k: v for k, v in self._load("loaded.json", {}).items()
                if v.get("expires") is None or v["expires"] > now}

    def set_loaded(self, value):
        self._save("loaded.json", value)
        marker = os.path.join(self.state, "gpu-resident")
        if any(v["size_vram"] > 0 for v in value.values()):
            open(marker, "w").close()
        elif os.path.exists(marker):
            os.remove(marker)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ollama-guestsim"
    sim = None  # set in main

    def log_message(self, fmt, *args):
        sys.stderr.write("ollama_server: " + (fmt % args) + "\n")

    def parse_request(self):
        ok = super().parse_request()
        if ok:
            # Ollama ignores it; a proxy in front must not hand it the customer's key.
            if self.headers.get("Authorization"):
                self.sim.count("ollama.authorization_seen")
        return ok

    # --- helpers
    def send_json(self, status, obj):
        body = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def start_answer_stream(self, content_type):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def answer_chunk(self, data):
        """One chunk of an answer stream; ClientGone when its reader left."""
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError:  # BrokenPipeError, ConnectionResetError
            self.close_connection = True
            raise ClientGone()

    def send_openai_error(self, status, message):
        # middleware/openai.go's writeError: openai.NewError's type by status.
        etype = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        body = (json.dumps({"error": {"message": message, "type": etype, "param": None,
                                      "code": None}}) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def cut(self):
        """Closes the connection mid-body, the way a dropped download looks."""
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    # --- routes
    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        sim = self.sim
        if self.path == "/":
            body = b"Ollama is running"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/api/version":
            self.send_json(200, {"version": sim.version()})
        elif self.path == "/api/tags":
            out = []
            for name, meta in sorted(sim.models().items()):
                reg = REGISTRY[name]
                out.append({"name": name, "model": name, "modified_at": meta["modified_at"],
                            "size": sum(s for _, s in reg["layers"]), "digest": reg["digest"][7:],
                            "details": reg["details"]})
            self.send_json(200, {"models": out})
        elif self.path == "/v1/models":
            data = [self.openai_model(name, meta) for name, meta in sorted(sim.models().items())]
            self.send_json(200, {"object": "list", "data": data or None})
        elif self.path.startswith("/v1/models/") and "/" not in self.path[len("/v1/models/"):]:
            raw = urllib.parse.unquote(self.path[len("/v1/models/"):])
            meta = sim.models().get(normalize(raw))
            if meta is None:
                self.send_openai_error(404, "model '%s' not found" % raw)
            else:
                self.send_json(200, self.openai_model(raw, meta))
        elif self.path == "/api/ps":
            out = []
            for name, l in sorted(self.sim.loaded().items()):
                reg = REGISTRY[name]
                expires = l.get("expires")
                out.append({"name": name, "model": name, "size": l["size"],
                            "digest": reg["digest"][7:], "details": reg["details"],
                            "expires_at": datetime.datetime.fromtimestamp(
                                expires if expires else 4102444800,
                                datetime.timezone.utc).astimezone().isoformat(),
                            "size_vram": l["size_vram"], "context_length": 4096})
            self.send_json(200, {"models": out})
        else:
            self.send_404()

    @staticmethod
    def openai_model(name, meta):
        base = name.rsplit("/", 1)
        owner = base[0].rsplit("/", 1)[-1] if len(base) == 2 else "library"
        return {"id": name, "object": "model", "created": unix_of(meta.get("modified_at")),
                "owned_by": owner}

    def send_404(self):
        body = b"404 page not found"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = self.body()
        if req is None:
            self.send_json(400, {"error": "invalid character looking for beginning of value"})
            return
        if self.path == "/api/pull":
            self.pull(req)
        elif self.path == "/api/generate":
            self.generate(req)
        elif self.path == "/api/chat":
            self.chat(req)
        elif self.path == "/v1/chat/completions":
            self.openai_chat(req)
        elif self.path == "/v1/completions":
            self.openai_completion(req)
        else:
            self.send_404()

    def pull(self, req):
        sim = self.sim
        raw = req.get("model") or req.get("name") or ""
        name = normalize(raw)
        stream = req.get("stream", True)
        sim.count("ollama.pull_request." + name)
        reg = REGISTRY.get(name)
        if not stream:
            # Non-streaming pulls are not used by the agent; answer as Ollama
            # does for an error, and refuse the rest plainly.
            if reg is None:
                self.send_json(500, {"error": "pull model manifest: file does not exist"})
            else:
                self.send_json(501, {"error": "guestsim: only streamed pulls are simulated"})
            return
        self.start_stream()
        self.chunk({"status": "pulling manifest"})
        if reg is None:
            self.chunk({"error": "pull model manifest: file does not exist"})
            self.end_stream()
            return
        delay = float(sim.knob("ollama_pull_delay") or 0.01)
        cut_at = sim.knob("ollama_pull_cut")
        cut_at = float(cut_at) if cut_at not in (None, "") else None
        present = name in sim.models()
        done = {} if present else sim.partial(name)
        total_all = sum(s for _, s in reg["layers"])
        downloaded = [0]
        try:
            for layer, total in reg["layers"]:
                digest = made_up_digest(name + "/" + layer)
                short = digest[7:19]
                have = total if present else int(done.get(digest, 0))
                step = max(total // 20, 1)
                while True:
                    self.chunk({"status": "pulling " + short, "digest": digest,
                                "total": total, "completed": have})
                    if have >= total:
                        break
                    nxt = min(total, have + step)
                    downloaded[0] += nxt - have
                    have = nxt
                    done[digest] = have
                    sim.save_partial(name, done)
                    so_far = sum(int(done.get(made_up_digest(name + "/" + l), 0))
                                 for l, _ in reg["layers"])
                    if cut_at is not None and 100.0 * so_far / total_all >= cut_at:
                        self.cut()
                        return
                    time.sleep(delay)
        finally:
            # Bytes "transferred", also when the client went away mid-pull:
            # a resumed pull must not count them again.
            if downloaded[0]:
                sim.count("ollama.bytes." + name, downloaded[0])
        self.chunk({"status": "verifying sha256 digest"})
        self.chunk({"status": "writing manifest"})
        if not present:
            sim.add_model(name)
            sim.clear_partial(name)
            sim.count("ollama.download_complete." + name)
        self.chunk({"status": "success"})
        self.end_stream()

    def generate(self, req):
        sim = self.sim
        name = normalize(req.get("model") or "")
        if name not in sim.models():
            self.send_json(404, {"error": 'model "%s" not found, try pulling it first' % name})
            return
        reg = REGISTRY[name]
        keep = parse_keep_alive(req.get("keep_alive"))
        with sim.lock:
            loaded = sim.loaded()
            if keep == 0:
                loaded.pop(name, None)
            else:
                size = reg["loaded_size"]
                frac = float(sim.knob("ollama_vram_fraction") or 1.0) if sim.gpu_usable else 0.0
                loaded[name] = {"size": size, "size_vram": int(size * max(0.0, min(1.0, frac))),
                                "expires": None if keep is None else time.time() + keep}
                sim.count("ollama.load." + name)
            sim.set_loaded(loaded)
        prompt = req.get("prompt") or ""
        if not prompt:
            out = {"model": name, "created_at": now_rfc3339(), "response": "", "done": True,
                   "done_reason": "unload" if keep == 0 else "load"}
            self.send_json(200, out)
            return
        self.answer_ollama(req, prompt, lambda tok: {"response": tok})

    # --- answers
    def loaded_model(self, raw):
        """The model a prompt is for, loaded as Ollama loads it on first use;
        None when it is not pulled."""
        sim = self.sim
        name = normalize(raw or "")
        if name not in sim.models():
            return None
        reg = REGISTRY[name]
        with sim.lock:
            loaded = sim.loaded()
            if name not in loaded:
                size = reg["loaded_size"]
                frac = float(sim.knob("ollama_vram_fraction") or 1.0) if sim.gpu_usable else 0.0
                loaded[name] = {"size": size, "size_vram": int(size * max(0.0, min(1.0, frac))),
                                "expires": time.time() + 300}
                sim.set_loaded(loaded)
                sim.count("ollama.load." + name)
        return name

    def answer_tokens(self, prompt, limit):
        toks = tokens_of(answer_for(prompt))
        reason = "stop"
        if isinstance(limit, int) and 0 < limit < len(toks):
            toks, reason = toks[:limit], "length"
        return toks, reason

    def token_delay(self):
        return float(self.sim.knob("ollama_token_delay") or 0.005)

    def stream_tokens(self, toks, emit):
        """emit(tok) per token, paced; counts an abandoned stream. The
        ollama_answer_cut knob closes the connection after that many tokens,
        as when the runner dies (ClientGone ends the answer there too)."""
        delay = self.token_delay()
        cut = self.sim.knob("ollama_answer_cut")
        cut = int(cut) if cut not in (None, "") else None
        for i, tok in enumerate(toks):
            if cut is not None and i >= cut:
                self.cut()
                raise ClientGone()
            try:
                emit(tok)
            except ClientGone:
                self.sim.count("ollama.stream_abandoned")
                raise
            time.sleep(delay)

    def answer_ollama(self, req, prompt, piece):
        """/api/generate and /api/chat: piece(tok) is the part that differs."""
        model = req.get("model") or ""
        if self.loaded_model(model) is None:
            self.send_json(404, {"error": 'model "%s" not found, try pulling it first' % model})
            return
        self.sim.count("ollama.answers")
        opts = req.get("options") or {}
        toks, reason = self.answer_tokens(prompt, opts.get("num_predict"))
        t0 = time.time()
        prompt_count = word_count(prompt)

        def final(text):
            took = int((time.time() - t0) * 1e9) + 1
            out = {"model": model, "created_at": now_rfc3339()}
            out.update(piece(text))
            out.update({"done": True, "done_reason": reason, "total_duration": took + 1500000,
                        "load_duration": 1500000, "prompt_eval_count": prompt_count,
                        "prompt_eval_duration": 250000, "eval_count": len(toks),
                        "eval_duration": took})
            if "response" in out:
                out["context"] = list(range(1, prompt_count + len(toks) + 1))
            return out

        if req.get("stream", True) is False:
            self.send_json(200, final("".join(toks)))
            return
        self.start_answer_stream("application/x-ndjson")

        def emit(tok):
            obj = {"model": model, "created_at": now_rfc3339()}
            obj.update(piece(tok))
            obj["done"] = False
            self.answer_chunk((compact(obj) + "\n").encode())
        try:
            self.stream_tokens(toks, emit)
            self.answer_chunk((compact(final("")) + "\n").encode())
            self.end_stream()
        except ClientGone:
            pass

    def chat(self, req):
        msgs = req.get("messages") or []
        prompt = next((m.get("content") or "" for m in reversed(msgs)
                       if isinstance(m, dict) and m.get("role") == "user"), "")
        self.answer_ollama(req, prompt,
                           lambda tok: {"message": {"role": "assistant", "content": tok}})

    def openai_answer(self, req, prompt, prompt_count, kind):
        """/v1/chat/completions (kind "chat") and /v1/completions ("text")."""
        model = req.get("model") or ""
        if self.loaded_model(model) is None:
            self.send_openai_error(404, 'model "%s" not found, try pulling it first' % model)
            return
        self.sim.count("ollama.answers")
        toks, reason = self.answer_tokens(prompt, req.get("max_tokens"))
        seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:6], 16) % 999
        ident = ("chatcmpl-%d" if kind == "chat" else "cmpl-%d") % seed
        created = int(time.time())
        usage = {"prompt_tokens": prompt_count, "completion_tokens": len(toks),
                 "total_tokens": prompt_count + len(toks)}
        head = {"id": ident, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": created, "model": model, "system_fingerprint": "fp_ollama"}

        def choice(text, finish, stream):
            if kind == "text":
                return {"text": text, "index": 0, "finish_reason": finish}
            msg = {"role": "assistant", "content": text}
            return ({"index": 0, "delta": msg, "finish_reason": finish} if stream
                    else {"index": 0, "message": msg, "finish_reason": finish})

        if not req.get("stream", False):
            out = dict(head)
            out["choices"] = [choice("".join(toks), reason, False)]
            out["usage"] = usage
            self.send_json(200, out)
            return
        if kind == "chat":
            head["object"] = "chat.completion.chunk"
        self.start_answer_stream("text/event-stream")

        def event(obj):
            self.answer_chunk(b"data: " + compact(obj).encode() + b"\n\n")

        def emit(tok):
            c = dict(head)
            c["created"] = int(time.time())
            c["choices"] = [choice(tok, None, True)]
            event(c)
        try:
            self.stream_tokens(toks, emit)
            last = dict(head)
            last["choices"] = [choice("", reason, True)]
            event(last)
            if (req.get("stream_options") or {}).get("include_usage"):
                u = dict(head)
                u["choices"] = []
                u["usage"] = usage
                event(u)
            self.answer_chunk(b"data: [DONE]\n\n")
            self.end_stream()
        except ClientGone:
            pass

    def openai_chat(self, req):
        msgs = req.get("messages") or []
        if not msgs:
            self.send_openai_error(400, "[] is too short - 'messages'")
            return
        prompt = next((m.get("content") or "" for m in reversed(msgs)
                       if isinstance(m, dict) and m.get("role") == "user"
                       and isinstance(m.get("content"), str)), "")
        count = sum(word_count(m.get("content")) for m in msgs
                    if isinstance(m, dict) and isinstance(m.get("content"), str))
        self.openai_answer(req, prompt, count, "chat")

    def openai_completion(self, req):
        prompt = req.get("prompt") or ""
        self.openai_answer(req, prompt, word_count(prompt), "text")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "::1"])
    ap.add_argument("--pidfile")
    a = ap.parse_args()
    Handler.sim = Sim(a.root)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in a.host else socket.AF_INET

    srv = Server((a.host, a.port), Handler)
    if a.pidfile:
        with open(a.pidfile + ".tmp", "w") as f:
            f.write("%d\n" % os.getpid())
        os.replace(a.pidfile + ".tmp", a.pidfile)
    sys.stderr.write("ollama_server: listening on %s:%d (gpu usable: %s)\n"
                     % (a.host, a.port, Handler.sim.gpu_usable))
    srv.serve_forever()


if __name__ == "__main__":
    main()
