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

Burst mode (issue 37, docs/ARCHITECTURE.md §9): `--burst ACTION` connects `--clients` clients, then all of them
press the same button at the same instant (a barrier), `--rounds` times; it reports p50/p95 latency, the wall time
of each burst (release to last answer) and errors, and a lone user's latency (`--single` requests one after the
other, before the bursts; with several arms every server is up at once and the arms take turns, ABBA).
`--compare` runs the same against a server with ATLAS_BATCH=0 (every request alone, as before batching) in the
same run, and reports the ratios; `--modes 0,1,gradio` also runs Translate through
Gradio's own `batch=True` (the alternative measured in §9). `--distinct` gives each client its own input (the
action's text without its first i mod 6 words: mixed lengths) instead of the same one. Each client's session is
opened before the burst, as a browser's page load opens it (Gradio builds a session's state on its first event:
0.1-0.3 s of the event loop each here); `--cold` leaves that to the press itself. The clients speak the page's own
protocol (bench/_server.PageClient; `--client gradio`: gradio_client sessions, which cost this machine as much CPU
as the server). `--floor` also bursts bench/_floor_app.py, a Gradio app that does no work: Gradio's own share.
  python bench/load.py --burst translate --clients 32 --compare   # p95 <= 3 s, wall <= 3.5 s
  python bench/load.py --burst classify --clients 32 --compare    # p95 <= 1 s
  python bench/load.py --burst generate_20 --clients 32 --compare  # gpt-tiny, 20 new tokens: p95 <= 4 s
"""

from __future__ import annotations

import argparse
import contextlib
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
    FLOOR_ACTIONS,
    Action,
    AppServer,
    PageClient,
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
# issue 37: 32 simultaneous presses on a 2-core CPU (p95 and wall in seconds; None: no target)
BURST_TARGETS = {"translate": (3.0, 3.5), "classify": (1.0, None), "generate": (4.0, None)}
SINGLE_SLOWDOWN = 1.10  # a lone user's latency with batching on, at most this times the unbatched one


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


def _distinct(action: Action, i: int) -> Action:
    """The action with client i's own input: its text without the first i mod 6 words (other lengths)."""
    def args() -> tuple[Any, ...]:
        first, *rest = action.args()
        if isinstance(first, str):
            words = first.split()
            first = " ".join(words[min(i % 6, len(words) - 1):])
        return (first, *rest)
    return Action(action.name, action.api, args, action.needs)


# What opens a client's session before the burst: a browser's page load runs the app's load event, which makes
# Gradio build the session's state (0.1-0.3 s of the server's event loop for this app's ~400 components); a class
# presses the button on pages already open. A cheap action does the same for an API client.
OPEN_SESSION = Action("playground", "playground", lambda: (6, 8, 0, "causal", True))


def _burst_round(url: str, actions: list[Action], request_timeout: float, cold: bool = False,
                 make_client: Any = client_for, opener: Action = OPEN_SESSION) -> tuple[list[float], list[str], float]:
    """Every client connects (and, unless ``cold``, opens its session as a page load does), then all send one
    request at the same instant: (latencies of the answered ones, error messages, wall seconds from the release to
    the last answer)."""
    n = len(actions)
    clients: list[Any] = [None] * n
    errors: list[str] = []
    lock = threading.Lock()
    latencies: list[float] = []
    released: list[float] = []
    ended: list[float] = []

    def connect(i: int) -> None:
        try:
            clients[i] = make_client(url, timeout=request_timeout)
            if not cold:
                call(clients[i], opener, timeout=request_timeout)
        except Exception as err:
            with lock:
                errors.append(f"connect: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=connect, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=request_timeout)
    barrier = threading.Barrier(n, action=lambda: released.append(time.monotonic()))

    def press(i: int) -> None:
        try:
            barrier.wait(timeout=request_timeout)
        except threading.BrokenBarrierError:
            pass
        if clients[i] is None:
            return
        t0 = time.monotonic()
        try:
            call(clients[i], actions[i], timeout=request_timeout)
            with lock:
                latencies.append(time.monotonic() - t0)
                ended.append(time.monotonic())
        except Exception as err:
            with lock:
                errors.append(f"{actions[i].name}: {type(err).__name__}: {err or 'no answer in time'}")
                ended.append(time.monotonic())

    threads = [threading.Thread(target=press, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=request_timeout + 10)
    for c in clients:
        if c is not None:
            c.close()
    wall = (max(ended) - released[0]) if ended and released else float("nan")
    return latencies, errors, wall


def lone_user(servers: dict[str, Any], action: Action, n: int, timeout: float, make_client: Any
              ) -> dict[str, list[float]]:
    """A lone user's latencies per arm: one warm-up call each (the model loads on first use: not measured), then
    ``n`` turns in which every arm answers one request, one at a time, the arms' order reversed every other turn
    (ABBA), so that a drift of the machine falls on every arm alike."""
    clients = {mode: make_client(server.url, timeout=timeout) for mode, server in servers.items()}
    try:
        for client in clients.values():
            call(client, action, timeout=timeout)
        times: dict[str, list[float]] = {mode: [] for mode in clients}
        order = list(clients)
        for turn in range(n):
            for mode in (order if turn % 2 == 0 else order[::-1]):
                t0 = time.monotonic()
                call(clients[mode], action, timeout=timeout)
                times[mode].append(time.monotonic() - t0)
        return times
    finally:
        for client in clients.values():
            client.close()


def burst(args: argparse.Namespace) -> int:
    """--burst ACTION: N clients press at the same instant; optionally beside the unbatched server (--compare)."""
    chosen, missing = available(select_actions(args.burst), args.checkpoints)
    if not chosen:
        raise SystemExit(f"--burst {args.burst}: its checkpoint is missing ({', '.join(missing)})")
    action = chosen[0]  # one button: `classify` is the SST-2 one
    key = action.api
    per_client = [(_distinct(action, i) if args.distinct else action) for i in range(args.clients)]
    report: dict[str, Any] = {"machine": machine_info(), "burst": action.name, "clients": args.clients,
                              "rounds": args.rounds, "distinct": args.distinct, "cold_sessions": args.cold,
                              "checkpoints": str(args.checkpoints)}
    names = {"0": "unbatched", "1": "batched", "gradio": "gradio_batch"}
    wanted = [m.strip() for m in (args.modes or ("0,1" if args.compare else "1")).split(",") if m.strip()]
    if "1" not in wanted or any(m not in names for m in wanted):
        raise SystemExit("--modes: a comma-separated list of 0 (unbatched), 1 (batched, required), gradio")
    modes = [(names[m], {"ATLAS_BATCH": m}) for m in wanted]
    make_client = PageClient if args.client == "page" else client_for
    report["client"] = args.client
    failed = False
    total_requests = total_errors = 0
    peak = 0.0
    for _, env in modes:
        if args.concurrency is not None:
            env["ATLAS_CONCURRENCY"] = str(args.concurrency)
    with contextlib.ExitStack() as stack:
        # Every arm's server is up at once, so a lone user's requests alternate between the arms in turns (ABBA...):
        # measured one arm after the other, the second ran on a machine in another state (load from the first
        # server's shutdown, another CPU frequency), which made the batcher look ×1.42 slower alone (issue 48).
        servers = {mode: stack.enter_context(AppServer(args.checkpoints, env=env, ready_timeout=180.0))
                   for mode, env in modes}
        single = lone_user(servers, action, args.single, args.request_timeout, make_client)
        for mode, server in servers.items():
            latencies: list[float] = []
            errors: list[str] = []
            walls = []
            for _ in range(args.rounds):
                lat, err, wall = _burst_round(server.url, per_client, args.request_timeout, args.cold, make_client)
                latencies += lat
                errors += err
                walls.append(round(wall, 3))
            up = server.alive()
            mode_peak = server.sampler.peak_mb() if server.sampler else None
            requests = args.clients * args.rounds
            total_requests += requests
            total_errors += len(errors)
            peak = max(peak, mode_peak or 0.0)
            failed |= bool(errors) or not up
            report[mode] = {
                f"{key}_p50_s": rounded(percentile(latencies, 50)), f"{key}_p95_s": rounded(percentile(latencies, 95)),
                f"{key}_wall_s": rounded(sorted(walls)[len(walls) // 2]), "walls_s": walls,
                "single_p50_s": rounded(percentile(single[mode], 50)), "requests": requests, "errors": len(errors),
                "first_errors": [e[:300] for e in errors[:5]], "server_up": up, "peak_rss_mb": mode_peak,
            }
            print(f"{mode}: {action.name} x {args.clients} at once, {args.rounds} round(s): p50 "
                  f"{report[mode][f'{key}_p50_s']} s, p95 {report[mode][f'{key}_p95_s']} s, wall {walls} s, "
                  f"{len(errors)} errors; lone user p50 {report[mode]['single_p50_s']} s", file=sys.stderr)
    report["single_alternated"] = True  # the lone-user arms in turns, every server up (not one after the other)
    if args.floor:  # Gradio's own cost of a burst: the same clients against an app that does no work
        floor_action = FLOOR_ACTIONS[0]
        with AppServer(script="bench/_floor_app.py") as server:
            latencies, walls = [], []
            for _ in range(args.rounds):
                lat, err, wall = _burst_round(server.url, [floor_action] * args.clients, args.request_timeout,
                                              args.cold, make_client, opener=floor_action)
                latencies += lat
                walls.append(round(wall, 3))
                failed |= bool(err)
        report["floor"] = {"p50_s": rounded(percentile(latencies, 50)), "p95_s": rounded(percentile(latencies, 95)),
                           "wall_s": rounded(sorted(walls)[len(walls) // 2]), "walls_s": walls}
        print(f"floor (a Gradio app that does no work): p50 {report['floor']['p50_s']} s, p95 "
              f"{report['floor']['p95_s']} s, wall {walls} s", file=sys.stderr)
    b = report["batched"]
    if "unbatched" in report:
        u = report["unbatched"]
        report["speedup_p95"] = rounded(u[f"{key}_p95_s"] / b[f"{key}_p95_s"]) if b[f"{key}_p95_s"] else None
        report["single_ratio"] = rounded(b["single_p50_s"] / u["single_p50_s"]) if u["single_p50_s"] else None
    p95_target, wall_target = BURST_TARGETS.get(key, (None, None))
    report.update({"requests": total_requests, "errors": total_errors, "peak_rss_mb": peak,
                   f"{key}_p95_s": b[f"{key}_p95_s"], f"{key}_wall_s": b[f"{key}_wall_s"],
                   "target_p95_s": p95_target, "target_wall_s": wall_target,
                   "target_single_ratio": SINGLE_SLOWDOWN})
    if args.clients == 32:  # the targets are for 32 clients
        report["meets_targets"] = (total_errors == 0
                                   and (p95_target is None or (b[f"{key}_p95_s"] or 1e9) <= p95_target)
                                   and (wall_target is None or (b[f"{key}_wall_s"] or 1e9) <= wall_target)
                                   and (report.get("single_ratio") or 0) <= SINGLE_SLOWDOWN)
    print(json.dumps(report))
    return 1 if failed else 0


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
    parser.add_argument("--burst", metavar="ACTION", default=None,
                        help="burst mode: every client presses ACTION (translate, classify, generate, ...) at once")
    parser.add_argument("--rounds", type=int, default=3, help="burst mode: bursts per server")
    parser.add_argument("--floor", action="store_true",
                        help="burst mode: also burst a Gradio app that does no work (bench/_floor_app.py): the floor")
    parser.add_argument("--client", choices=("page", "gradio"), default="page",
                        help="burst mode: the clients speak the page's protocol (bench/_server.PageClient, default) "
                             "or are gradio_client sessions")
    parser.add_argument("--single", type=int, default=10, help="burst mode: lone-user requests before the bursts")
    parser.add_argument("--compare", action="store_true",
                        help="burst mode: also run the unbatched server (ATLAS_BATCH=0) first, in the same run")
    parser.add_argument("--modes", default=None,
                        help="burst mode: ATLAS_BATCH values to run in order, e.g. 0,1,gradio (gradio: Translate "
                             "through Gradio's batch=True, the measured alternative); --compare is 0,1")
    parser.add_argument("--cold", action="store_true",
                        help="burst mode: each press opens its client's session (no page load before it)")
    parser.add_argument("--distinct", action="store_true", help="burst mode: each client its own input length")
    args = parser.parse_args(argv)
    if args.burst:
        return burst(args)
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
