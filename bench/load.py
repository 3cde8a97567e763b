"""Load benchmark (docs/ARCHITECTURE.md §5–6): concurrent gradio_client clients against one launched app.

Launches `python app.py` on a free loopback port, opens `--clients` gradio_client clients (one thread and
one session each), waits until all are connected, then each sends `--requests` requests one after the
other, mixing every tab's actions (client i's j-th request is action (i·R + j) mod the number of actions,
so the actions take turns across all requests).
Everything is bounded: a request waits at most `--request-timeout` s and the whole run stops by itself at
`--deadline` s after the start; requests not sent by then are counted as `skipped`.

Each request ends as exactly one of: `ok`; `busy`: the bounded queue (demo.queue(max_size=ATLAS_QUEUE))
turned it away: Gradio answers HTTP 503 and gradio_client raises `QueueError("Queue is full! Please try
again.")`; or an error (`timeouts` is the part of them that ran out of time). A client that cannot even
connect adds one to `connect_errors`. So: requests = ok + busy + errors − connect_errors, and
requests + skipped = clients × requests-per-client.

The server's peak RSS is the largest sampled VmRSS of its process tree (every 0.1 s) or its VmHWM,
in MiB. After the run the page must still answer 200 (`server_up`).

Runs (targets recorded, never asserted in tests):
  python bench/load.py --clients 32 --requests 10                # 0 errors, peak RSS < 2 GB
  python bench/load.py --clients 128 --requests 2 --expect-busy  # excess turned away; server stays up
`--queue` / `--concurrency` set ATLAS_QUEUE / ATLAS_CONCURRENCY for the server (default: the app's).
The last stdout line is one JSON object with `requests`, `errors` and `peak_rss_mb`. Exit status 1 when
the server went down, a request failed, or (with --expect-busy) nothing was turned away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import (  # noqa: E402
    Action,
    AppServer,
    available,
    call,
    client_for,
    machine_info,
    outcome_of,
    percentile,
    rounded,
    select_actions,
)

TARGET_PEAK_RSS_MB = 2048


class Tally:
    """Outcomes of every request, shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.busy_by_action: Counter[str] = Counter()
        self.messages: list[str] = []
        self.connect_s: list[float] = []

    def add(self, outcome: str, action: str | None = None, seconds: float | None = None,
            message: str | None = None) -> None:
        with self.lock:
            self.counts[outcome] += 1
            if outcome == "ok" and action is not None and seconds is not None:
                self.latency[action].append(seconds)
            if outcome == "busy" and action is not None:
                self.busy_by_action[action] += 1
            if message is not None and len(self.messages) < 5:
                self.messages.append(message[:300])


def run_client(index: int, url: str, actions: list[Action], n_requests: int, deadline: float,
               request_timeout: float, start: threading.Barrier, tally: Tally) -> None:
    client = None
    try:
        t0 = time.monotonic()
        client = client_for(url, timeout=request_timeout)
        with tally.lock:
            tally.connect_s.append(time.monotonic() - t0)
    except Exception as err:  # the server refused or was too slow even to hand out its config
        tally.add("connect_error", message=f"client {index} connect: {type(err).__name__}: {err}")
    try:
        start.wait(timeout=max(0.0, deadline - time.monotonic()))
    except threading.BrokenBarrierError:
        pass  # some client never arrived: go anyway
    if client is None:
        return
    try:
        for j in range(n_requests):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            action = actions[(index * n_requests + j) % len(actions)]
            t0 = time.monotonic()
            try:
                call(client, action, timeout=min(request_timeout, left))
                tally.add("ok", action.name, time.monotonic() - t0)
            except Exception as err:  # classified: busy, timeout, or an error reported with its message
                kind = outcome_of(err)
                tally.add(kind, action.name, message=None if kind == "busy" else
                          f"{action.name}: {type(err).__name__}: {err or 'no answer in time'}")
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints",
                        help="checkpoint folder (sets ATLAS_CHECKPOINTS; default: the repository's)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (threads)")
    parser.add_argument("--requests", type=int, default=10, help="requests per client")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds the whole run may take")
    parser.add_argument("--request-timeout", type=float, default=180.0, help="seconds one request may take")
    parser.add_argument("--actions", default=None, help="comma-separated action names or api_names (default: all)")
    parser.add_argument("--queue", type=int, default=None, help="ATLAS_QUEUE for the server (queue size)")
    parser.add_argument("--concurrency", type=int, default=None, help="ATLAS_CONCURRENCY for the server")
    parser.add_argument("--expect-busy", action="store_true",
                        help="over-capacity run: some requests must be turned away as busy")
    args = parser.parse_args(argv)
    actions, missing = available(select_actions(args.actions), args.checkpoints)
    env = {}
    if args.queue is not None:
        env["ATLAS_QUEUE"] = str(args.queue)
    if args.concurrency is not None:
        env["ATLAS_CONCURRENCY"] = str(args.concurrency)

    report: dict[str, Any] = {"machine": machine_info(), "clients": args.clients,
                              "requests_per_client": args.requests, "actions": [a.name for a in actions],
                              "atlas_queue": env.get("ATLAS_QUEUE", os.environ.get("ATLAS_QUEUE")),
                              "atlas_concurrency": env.get("ATLAS_CONCURRENCY", os.environ.get("ATLAS_CONCURRENCY")),
                              "checkpoints": str(args.checkpoints),
                              "left_out_missing_checkpoint": missing}
    tally = Tally()
    t_start = time.monotonic()
    with AppServer(args.checkpoints, env=env, ready_timeout=min(180.0, args.deadline)) as server:
        report["ready_s"] = rounded(server.ready_s, 3)
        report["rss_ready_mb"] = server.sampler.now_mb() if server.sampler else None
        deadline = t_start + args.deadline
        released: list[float] = []  # when every client had connected and the requests began
        barrier = threading.Barrier(args.clients, action=lambda: released.append(time.monotonic()))
        threads = [threading.Thread(target=run_client, daemon=True, name=f"client-{i}",
                                    args=(i, server.url, actions, args.requests, deadline, args.request_timeout,
                                          barrier, tally))
                   for i in range(args.clients)]
        t_load = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, deadline + 10 - time.monotonic()))  # the threads stop by themselves
        report["stuck_clients"] = sum(t.is_alive() for t in threads)
        t_end = time.monotonic()
        report["connect_all_s"] = round(released[0] - t_load, 2) if released else None
        report["load_s"] = round(t_end - (released[0] if released else t_load), 2)
        report["server_up"] = server.alive()
        report["rss_end_mb"] = server.sampler.now_mb() if server.sampler else None
        report["peak_rss_mb"] = server.sampler.peak_mb() if server.sampler else None

    with tally.lock:
        c = Counter(tally.counts)
        latency = {k: list(v) for k, v in tally.latency.items()}
    errors = c["error"] + c["timeout"] + c["connect_error"]
    requests = c["ok"] + c["busy"] + c["error"] + c["timeout"]
    report.update({
        "requests": requests, "ok": c["ok"], "busy": c["busy"], "errors": errors, "timeouts": c["timeout"],
        "connect_errors": c["connect_error"], "skipped": args.clients * args.requests - requests,
        "first_errors": tally.messages, "busy_by_action": dict(tally.busy_by_action),
        "connect_p50_s": rounded(percentile(tally.connect_s, 50)),
        "connect_p95_s": rounded(percentile(tally.connect_s, 95)),
        "throughput_rps": round(c["ok"] / report["load_s"], 2) if report["load_s"] else None,
    })
    for action in actions:
        times = latency.get(action.name, [])
        report[f"{action.name}_p50_s"] = rounded(percentile(times, 50))
        report[f"{action.name}_p95_s"] = rounded(percentile(times, 95))
        report[f"{action.name}_n"] = len(times)
    all_times = [t for v in latency.values() for t in v]
    report["p50_s"], report["p95_s"] = rounded(percentile(all_times, 50)), rounded(percentile(all_times, 95))
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    report["expect_busy"] = args.expect_busy
    report["target_peak_rss_mb"] = TARGET_PEAK_RSS_MB
    report["meets_targets"] = (report["server_up"] and errors == 0 and (report["peak_rss_mb"] or 0) < TARGET_PEAK_RSS_MB
                               and (c["busy"] > 0 if args.expect_busy else True))

    print(f"{requests} requests in {report['load_s']} s: {c['ok']} ok, {c['busy']} busy, {errors} errors "
          f"({c['timeout']} timeouts, {c['connect_error']} connect), {report['skipped']} skipped; "
          f"server up: {report['server_up']}; peak RSS {report['peak_rss_mb']} MiB", file=sys.stderr)
    for m in tally.messages:
        print(f"  error: {m}", file=sys.stderr)
    print(json.dumps(report))
    failed = not report["server_up"] or errors > 0 or (args.expect_busy and c["busy"] == 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
