"""Shared by bench/latency.py and bench/load.py: launch `python app.py` as a user would, and watch it.

`AppServer` starts the app on a free loopback port (optionally over another checkpoint folder, through
ATLAS_CHECKPOINTS), times process start → first HTTP 200 of the page, samples the resident memory of the
server's whole process tree, and stops it. The actions every benchmark calls through `gradio_client`
live here too, so the latency and load figures measure the same requests.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "fashion").glob("*.png"))
# 20 words (docs/ARCHITECTURE.md §6: "translate, 20 words, beam 5, with attention").
SENTENCE_20 = "A young man in a red jacket is riding his old bicycle slowly down the busy street near the park."
SST2 = "a warm , funny and beautifully acted film , though the ending drags a little ."
AGNEWS = "The central bank raised interest rates again on Tuesday, citing stubborn inflation."
PROMPT = "A man in a blue shirt is riding a bicycle down the"
PROMPT_20 = "Two dogs play in the snow . A man in a red"  # gpt-tiny writes all 20 new tokens (PROMPT ends after 3)
# 40 gpt-tiny tokens each, the same but for one word: the activation-patching actions
PATCH_CLEAN = ("A man in a blue shirt is riding a bicycle down the street . A woman in a red coat walks her dog on the "
               "beach . Two dogs play in the snow . Two dogs play in the")
PATCH_CORRUPTED = PATCH_CLEAN.replace("in the snow .", "in the water .")
# About 30 MiniLM tokens ([CLS] and [SEP] included), and the largest input MiniLM reads (256 tokens).
SST2_30 = ("a warm , funny and beautifully acted film about two sisters , though the ending drags a little and "
           "the music is far too loud .")
LONGEST = " ".join(["a warm , funny film , though the ending drags ."] * 40)
MINILM = "MiniLM (pretrained, fine-tuned)"


# ------------------------------------------------------------------------------------ the actions
@dataclass(frozen=True)
class Action:
    """One API call: `name` is the benchmark's key (`<name>_p50_s`), `api` the app's api_name."""

    name: str
    api: str
    args: Callable[[], tuple[Any, ...]]  # built per call (file inputs need a fresh handle_file)
    needs: str = ""  # a checkpoint that may not be there yet (the action is then left out and reported)


def _image(index: int) -> Any:
    from gradio_client import handle_file

    return handle_file(str(EXAMPLES[index % len(EXAMPLES)]))


# The baseline: the same kinds of request against bench/_floor_app.py, which does no work.
FLOOR_ACTIONS: list[Action] = [
    Action("floor_text", "echo", lambda: (SST2,)),
    Action("floor_upload", "upload", lambda: (_image(9),)),
]
FILE_INPUT_APIS = {"classify_image"}  # actions that upload a file: compared with floor_upload

ACTIONS: list[Action] = [
    Action("translate", "translate", lambda: (SENTENCE_20, 5)),
    Action("classify_sst2", "classify", lambda: (SST2, "SST-2 sentiment")),
    Action("classify_agnews", "classify", lambda: (AGNEWS, "AG News topic")),
    Action("classify_image_vit_fashion", "classify_image", lambda: (_image(9), "vit-fashion")),
    Action("classify_image_swin_fashion", "classify_image", lambda: (_image(7), "swin-fashion")),
    Action("swin_windows", "swin_windows", lambda: (8, 4, 2, 3)),
    Action("positional_encoding", "positional_encoding", lambda: (64, 128)),
    Action("playground", "playground", lambda: (6, 8, 0, "causal", True)),
    Action("trained_swin", "trained_swin", lambda: ("ankle-boot", 1, 0)),
    Action("vit_positions", "vit_positions", lambda: ()),
    Action("generate", "generate", lambda: (PROMPT, 20), needs="gpt-tiny"),
    Action("head_roles", "head_roles", lambda: ("gpt-tiny", 50, 0), needs="gpt-tiny"),
    # the last layer's last head (gpt-tiny's layer 3 head 7), last token -> the first: one score split, timed
    Action("attention_why_gpt_tiny", "attention_why", lambda: (PATCH_CLEAN, "gpt-tiny", -1, -1, -1, 0),
           needs="gpt-tiny"),
    Action("patch_heads_gpt_tiny_40", "patch", lambda: (PATCH_CLEAN, PATCH_CORRUPTED, "gpt-tiny", "", "heads"),
           needs="gpt-tiny"),
    Action("patch_positions_gpt_tiny_40", "patch",
           lambda: (PATCH_CLEAN, PATCH_CORRUPTED, "gpt-tiny", "", "positions"), needs="gpt-tiny"),
    # a lesson page (lesson 4, step 2: its question) and a reveal (step 3, a fixed choice list), over gpt-tiny
    Action("lesson", "lesson", lambda: (4, 2, "0"), needs="gpt-tiny"),
    Action("lesson_answer", "lesson_answer", lambda: (4, 3, "on the second copy", "0"), needs="gpt-tiny"),
]


# Run only when named (`--actions classify_minilm_30_ig`): the explanation latencies, kept out of the default mix.
NAMED_ONLY: list[Action] = [
    Action("classify_minilm_30", "classify", lambda: (SST2_30, "SST-2 sentiment", MINILM)),
    Action("classify_minilm_30_ig", "classify",
           lambda: (SST2_30, "SST-2 sentiment", MINILM, 0, "mean", "heatmap", "integrated_gradients", "")),
    Action("classify_minilm_256_ig", "classify",
           lambda: (LONGEST, "SST-2 sentiment", MINILM, 0, "mean", "heatmap", "integrated_gradients", "")),
    # issue 37's Generate burst: 20 new tokens each (greedy)
    Action("generate_20", "generate", lambda: (PROMPT_20, 20), needs="gpt-tiny"),
    # GPT-2 small (12 × 12 heads) from the Hub: run only where it is downloaded or downloadable
    Action("patch_heads_gpt2_small_40", "patch",
           lambda: (PATCH_CLEAN, PATCH_CORRUPTED, "openai-community/gpt2", "", "heads")),
]


def available(actions: list[Action], checkpoints: Path) -> tuple[list[Action], list[str]]:
    """The actions whose checkpoint is there, and the names of those left out for a missing one."""
    missing = [a.name for a in actions if a.needs and not (Path(checkpoints) / a.needs / "config.json").is_file()]
    return [a for a in actions if a.name not in missing], missing


def select_actions(spec: str | None) -> list[Action]:
    """`--actions a,b`: each item is an action name or an api_name (`classify` picks both tasks)."""
    if not spec:
        return list(ACTIONS)
    wanted = [s.strip().lstrip("/") for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if not any(w in (a.name, a.api) for a in ACTIONS + NAMED_ONLY)]
    if unknown:
        names = ", ".join(sorted({a.name for a in ACTIONS + NAMED_ONLY} | {a.api for a in ACTIONS}))
        raise SystemExit(f"unknown action(s) {', '.join(unknown)}; choose from {names}")
    return [a for a in ACTIONS if a.name in wanted or a.api in wanted] + [a for a in NAMED_ONLY if a.name in wanted]


def call(client: Any, action: Action, timeout: float | None = None) -> Any:
    """Submit one request and wait for it; a timeout cancels the job and raises TimeoutError."""
    job = client.submit(*action.args(), api_name="/" + action.api)
    try:
        return job.result(timeout=timeout)
    except TimeoutError:
        job.cancel()
        raise


def is_busy(err: BaseException) -> bool:
    """The bounded queue's "busy, try again" answer.

    Gradio answers a join on a full queue with HTTP 503 ("Queue is full. Max size is …"); gradio_client
    turns that into `gradio_client.utils.QueueError("Queue is full! Please try again.")`, raised from
    `job.result()` (older protocols send a `queue_full` message on the stream, which ends the same way).
    """
    from gradio_client.utils import QueueError

    return isinstance(err, QueueError) or "queue is full" in str(err).lower()


def outcome_of(err: BaseException) -> str:
    """"busy" (turned away by the bounded queue), "timeout" (ours or httpx's) or "error"."""
    import httpx

    if is_busy(err):
        return "busy"
    if isinstance(err, (TimeoutError, httpx.TimeoutException)):
        return "timeout"
    return "error"


def client_for(url: str, timeout: float = 180.0) -> Any:
    """A gradio_client session. download_files=False: output files (the .npz downloads) stay on the server
    as URLs, as in a browser. `timeout` replaces httpx's 5 s default for every HTTP call (config, upload,
    join, the event stream): under load a busy server answers an upload later than that, and a browser
    would wait; the request as a whole is bounded by `call(timeout=…)` anyway."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, analytics_enabled=False,
                  httpx_kwargs={"timeout": float(timeout)})


class PageClient:
    """Gradio's queue protocol (sse_v3) as the app's page speaks it, and no more: join the queue, read the session's
    event stream until the answer, over one kept-alive connection (an event declared with queue=False: one POST to
    run/<api_name>, as the page sends it). Same interface as gradio_client for `call`.

    Why: gradio_client opens a new HTTP client (with a TLS context) for every join and polls each pending job 20
    times a second; on this 2-core machine its 32 clients of a burst took 2.2-3.2 CPU-seconds a burst, as much as
    the server they measured (docs/ARCHITECTURE.md §9). A class's pages run on the students' machines, so
    `bench/load.py --burst` measures with this client by default (`--client gradio`: with gradio_client). Text,
    number and choice inputs only: uploads need gradio_client.
    """

    def __init__(self, url: str, timeout: float = 180.0) -> None:
        import httpx

        self.http = httpx.Client(base_url=url, timeout=timeout)
        config = self.http.get("config").raise_for_status().json()
        self.prefix = config.get("api_prefix", "/gradio_api")
        state = {c["id"] for c in config["components"] if c.get("type") == "state"}
        shown = {c["id"]: (c.get("props") or {}).get("value") for c in config["components"]}
        # per api_name: (fn_index, each input's page value, or None for a state input)
        self.endpoints = {d["api_name"]: (d["id"], [None if i in state else (shown.get(i),) for i in d["inputs"]])
                          for d in config["dependencies"] if d.get("api_name")}
        # events declared with queue=False, which the page POSTs to <prefix>/run/<api_name> instead of queueing
        self.direct = {d["api_name"] for d in config["dependencies"] if d.get("api_name") and d.get("queue") is False}
        self.session = os.urandom(6).hex()

    def submit(self, *args: Any, api_name: str) -> _PageJob:
        return _PageJob(self, api_name.lstrip("/"), args)

    def predict(self, *args: Any, api_name: str) -> Any:
        return self.submit(*args, api_name=api_name).result()

    def close(self) -> None:
        self.http.close()


class _PageJob:
    """One request of a PageClient; it runs when its result is asked for (in the asking thread)."""

    def __init__(self, client: PageClient, api: str, args: tuple[Any, ...]) -> None:
        self.client, self.api, self.args = client, api, args

    def cancel(self) -> None:
        pass  # the request ran (and ended) inside result()

    def result(self, timeout: float | None = None) -> Any:
        import json

        import httpx
        from gradio_client.exceptions import AppError
        from gradio_client.utils import QueueError

        c = self.client
        fn, shown = c.endpoints[self.api]
        values = iter(self.args)  # the arguments given, then what the page shows (a state input travels as null)
        data = [None if page is None else next(values, page[0]) for page in shown]
        if self.api in c.direct:  # an event outside the queue: one POST, answered in its response
            try:
                done = c.http.post(f"{c.prefix}/run/{self.api}", timeout=timeout,
                                   json={"data": data, "fn_index": fn, "session_hash": c.session, "event_data": None,
                                         "trigger_id": None})
            except httpx.TimeoutException as err:
                raise TimeoutError(f"{self.api}: no answer within {timeout} s") from err
            if done.status_code != 200:
                raise AppError(str(done.json().get("error") if done.headers.get("content-type", "").startswith(
                    "application/json") else done.text[:300]))
            return done.json()["data"]
        join = c.http.post(f"{c.prefix}/queue/join", json={"data": data, "fn_index": fn, "session_hash": c.session,
                                                            "event_data": None, "trigger_id": None}, timeout=timeout)
        if join.status_code == 503:
            raise QueueError("Queue is full! Please try again.")
        event = join.raise_for_status().json()["event_id"]
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with c.http.stream("GET", f"{c.prefix}/queue/data", params={"session_hash": c.session},
                               timeout=timeout) as stream:
                for line in stream.iter_lines():
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"{self.api}: no answer within {timeout} s")
                    if not line.startswith("data:"):
                        continue
                    message = json.loads(line[5:])
                    if message.get("msg") == "process_completed" and message.get("event_id") == event:
                        output = message.get("output") or {}
                        if not message.get("success"):
                            raise AppError(str(output.get("error")))
                        return output["data"]
                    if message.get("msg") in ("close_stream", "unexpected_error"):
                        break
        except httpx.TimeoutException as err:
            raise TimeoutError(f"{self.api}: no answer within {timeout} s") from err
        raise RuntimeError(f"{self.api}: the event stream ended without the answer")


# -------------------------------------------------------------------------------- stats and machine
def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def rounded(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def machine_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        info["loadavg_start"] = None
    # Figures from a machine that is already busy are not comparable with the targets (an idle 2-core CPU).
    cpus = info.get("cpu_affinity") or os.cpu_count() or 1
    info["busy_at_start"] = bool(info["loadavg_start"] and info["loadavg_start"][0] > 0.5 * cpus)
    if info["busy_at_start"]:
        print(f"warning: load average {info['loadavg_start'][0]} on {cpus} CPUs at start: the machine is busy, "
              "so these times are not comparable with the targets", file=sys.stderr)
    for pkg in ("gradio", "gradio_client", "torch"):
        try:
            info[f"{pkg}_version"] = version(pkg)
        except PackageNotFoundError:
            info[f"{pkg}_version"] = None
    return info


# ------------------------------------------------------------------------------- memory of a tree
def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return kids


def tree_rss_kb(pid: int) -> int:
    """VmRSS of a process and all its descendants, in KiB (0 once it is gone)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _status_kb(p, "VmRSS")
        todo.extend(_children(p))
    return total


class MemorySampler(threading.Thread):
    """Samples the tree's VmRSS every `interval` s; the peak also takes the server's own VmHWM (the
    kernel's high-water mark), which catches spikes between samples."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_kb = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak_kb = max(self.peak_kb, tree_rss_kb(self.pid), _status_kb(self.pid, "VmHWM"))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self.peak_kb = max(self.peak_kb, tree_rss_kb(self.pid), _status_kb(self.pid, "VmHWM"))
        self._stop_event.set()

    def now_mb(self) -> float:
        return round(tree_rss_kb(self.pid) / 1024, 1)

    def peak_mb(self) -> float:
        return round(max(self.peak_kb, _status_kb(self.pid, "VmHWM")) / 1024, 1)


# ------------------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_ok(url: str, timeout: float = 5.0) -> bool:
    """True when the page answers HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback only)
            return response.status == 200
    except OSError:
        return False


class AppServer:
    """`python app.py` on a free loopback port; use as a context manager (it always stops the app)."""

    def __init__(self, checkpoints: Path | str | None = None, env: dict[str, str] | None = None,
                 ready_timeout: float = 180.0, poll: float = 0.02, script: str = "app.py",
                 root: Path | None = None) -> None:
        self.script = script
        self.root = Path(root) if root is not None else ROOT  # another checkout's app (bench/latency.py --against)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.ready_timeout, self.poll = ready_timeout, poll
        self.env = dict(os.environ)
        self.env.update({"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(self.port),
                         "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        if checkpoints is not None:
            self.env["ATLAS_CHECKPOINTS"] = str(Path(checkpoints).resolve())
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.sampler: MemorySampler | None = None
        self.ready_s: float | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="atlas-bench-", suffix=".log")[1])

    def start(self) -> AppServer:
        log = self.log_path.open("w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, self.script], cwd=self.root, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT)
        log.close()  # the child keeps its own handle
        self.sampler = MemorySampler(self.proc.pid)
        self.sampler.start()
        deadline = t0 + self.ready_timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with code {self.proc.returncode} before serving:\n{self.log_tail()}")
            if page_ok(self.url, timeout=2.0):
                self.ready_s = time.perf_counter() - t0
                return self
            time.sleep(self.poll)
        raise TimeoutError(f"app did not answer at {self.url} within {self.ready_timeout:.0f} s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and page_ok(self.url)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> AppServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if exc[0] is None:
            self.log_path.unlink(missing_ok=True)  # keep the log when something went wrong
        else:
            print(f"server log kept at {self.log_path}", file=sys.stderr)
