"""bench/latency.py, bench/load.py, bench/figures.py and bench/packed.py run end to end over the tiny
checkpoints (counts, keys; never times).

The five runs (latency; figures and packed, in process; load; an over-capacity load against a queue of one) start
together in one module fixture, each launching its own app, so the file costs about one run's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "latency": ["bench/latency.py", "--repeats", "2", "--warmup", "1",
                "--actions", "playground,classify_sst2,generate"],
    "figures": ["bench/figures.py", "--repeats", "1", "--actions", "classify_sst2,playground"],
    "load": ["bench/load.py", "--clients", "3", "--requests", "2", "--deadline", "150", "--request-timeout", "90"],
    # every linear layer packed, so the tiny models exercise the packed path
    "packed": ["bench/packed.py", "--repeats", "1", "--models", "translator-en-de,minilm-sst2", "--min-weights", "1"],
    # Queue of one, one worker, six clients submitting at once: most are turned away as busy.
    "busy": ["bench/load.py", "--clients", "6", "--requests", "2", "--queue", "1", "--concurrency", "1",
             "--expect-busy", "--deadline", "150", "--request-timeout", "90"],
}


@pytest.fixture(scope="module")
def runs(tiny_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("bench")
    env_torch = str(tmp_path_factory.mktemp("torch"))
    procs = {}
    for name, argv in RUNS.items():
        out, err = (folder / f"{name}.out").open("w"), (folder / f"{name}.err").open("w")
        env = {**os.environ, "TORCH_HOME": env_torch, "PYTHONUNBUFFERED": "1"}
        procs[name] = (subprocess.Popen([sys.executable, *argv, "--checkpoints", str(tiny_checkpoints)], cwd=ROOT,
                                        stdout=out, stderr=err, env=env), out, err)
    results = {}
    for name, (proc, out, err) in procs.items():
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
        stdout = (folder / f"{name}.out").read_text()
        stderr = (folder / f"{name}.err").read_text()
        lines = stdout.strip().splitlines()
        results[name] = {"rc": proc.returncode, "stderr": stderr,
                         "report": json.loads(lines[-1]) if lines else None}
    return results


def _report(runs: dict, name: str) -> dict:
    run = runs[name]
    assert run["report"] is not None, f"{name} printed nothing; stderr:\n{run['stderr'][-3000:]}"
    assert run["rc"] == 0, f"{name} exited {run['rc']}; stderr:\n{run['stderr'][-3000:]}"
    return run["report"]


@pytest.mark.slow
def test_latency_reports_each_action(runs) -> None:
    report = _report(runs, "latency")
    assert isinstance(report["ready_s"], float) and report["ready_s"] > 0
    for action in ("playground", "classify_sst2", "generate"):
        assert report[f"{action}_n"] == 2
        assert 0 < report[f"{action}_p50_s"] <= report[f"{action}_p95_s"]
    assert "translate_p50_s" not in report  # --actions picked a subset
    # the baseline, same run: a do-nothing Gradio app and the import of gradio
    assert report["floor_text_n"] == 2 and report["floor_upload_n"] == 2 and report["gradio_import_s"] > 0
    assert report["playground_above_floor_s"] == pytest.approx(
        report["playground_p50_s"] - report["floor_text_p50_s"], abs=2e-4)
    assert report["errors"] == {}
    assert report["machine"]["cpu_count"] >= 1 and len(report["machine"]["loadavg_start"]) == 3


def test_actions_of_a_missing_checkpoint_are_left_out(tmp_path: Path) -> None:
    from bench._server import ACTIONS, available

    kept, missing = available(ACTIONS, tmp_path)  # no gpt-tiny there
    needs_lm = ["generate", "head_roles", "attention_why_gpt_tiny", "patch_heads_gpt_tiny_40",
                "patch_positions_gpt_tiny_40", "lesson", "lesson_answer"]
    assert missing == needs_lm and len(kept) == len(ACTIONS) - len(needs_lm)
    (tmp_path / "gpt-tiny").mkdir()
    (tmp_path / "gpt-tiny" / "config.json").write_text("{}")
    assert available(ACTIONS, tmp_path) == (ACTIONS, [])


@pytest.mark.slow
def test_figures_bench_times_both_builds(runs) -> None:
    report = _report(runs, "figures")
    for action, n_figures in (("classify_sst2", 3), ("playground", 2)):
        assert report[f"{action}_figures"] == n_figures
        assert report[f"{action}_handler_ms"] > 0 and report[f"{action}_validated_ms"] > 0
        assert report[f"{action}_ratio"] == pytest.approx(
            report[f"{action}_validated_ms"] / report[f"{action}_handler_ms"], rel=0.05)
    assert not any(k.endswith("_error") for k in report) and "translate_handler_ms" not in report


@pytest.mark.slow
def test_load_counts_add_up(runs) -> None:
    report = _report(runs, "load")
    assert report["requests"] == 6 and report["ok"] == 6
    assert report["errors"] == 0 and report["busy"] == 0 and report["skipped"] == 0
    assert report["requests"] == report["ok"] + report["busy"] + report["errors"] - report["connect_errors"]
    assert sum(report[f"{a}_n"] for a in report["actions"]) == report["ok"]
    assert report["translate_n"] == 1 and report["swin_windows_n"] == 1  # the mix reaches every tab in turn
    assert report["server_up"] is True
    assert report["peak_rss_mb"] > 50 and report["peak_rss_mb"] >= report["rss_ready_mb"]


@pytest.mark.slow
def test_over_capacity_turns_clients_away_and_survives(runs) -> None:
    report = _report(runs, "busy")
    assert report["atlas_queue"] == "1" and report["atlas_concurrency"] == "1"
    assert report["busy"] >= 1 and report["ok"] >= 1
    assert report["errors"] == 0, report["first_errors"]
    assert report["requests"] + report["skipped"] == 6 * 2
    assert report["requests"] == report["ok"] + report["busy"]
    assert sum(report["busy_by_action"].values()) == report["busy"]
    assert report["server_up"] is True and report["peak_rss_mb"] > 0


def test_helpers() -> None:
    from gradio_client.utils import QueueError

    from bench._server import SENTENCE_20, is_busy, percentile, select_actions

    assert is_busy(QueueError("Queue is full! Please try again.")) and not is_busy(ValueError("boom"))
    assert percentile([], 50) is None and percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert [a.name for a in select_actions("classify")] == ["classify_sst2", "classify_agnews"]
    assert {a.api for a in select_actions(None)} == {"translate", "classify", "classify_image", "swin_windows",
                                                     "positional_encoding", "playground", "generate", "head_roles",
                                                     "attention_why", "patch", "lesson", "lesson_answer",
                                                     "trained_swin", "vit_positions"}
    with pytest.raises(SystemExit):
        select_actions("nope")
    assert len(SENTENCE_20.split()) == 20


@pytest.mark.slow
def test_packed_bench_compares_both_paths(runs) -> None:
    from models.decoding.packed import supported

    report = _report(runs, "packed")
    assert report["fbgemm"] is supported()
    for name in ("translator-en-de", "minilm-sst2"):
        assert report[f"{name}_plain_ms"] > 0 and report[f"{name}_packed_ms"] > 0
        assert report[f"{name}_same"] is True  # same translation / probabilities and attention
        assert (report[f"{name}_packed_layers"] > 0) is supported()


@pytest.mark.slow
def test_generate_bench_compares_with_transformers(capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "generate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--repeats", "1", "--layers", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["identical"] is True and report["new_tokens"] == 30 and report["layers"] == 1
    assert report["ours_s"] > 0 and report["reference_s"] > 0
    assert report["speedup"] == pytest.approx(report["reference_s"] / report["ours_s"], rel=0.05)


def test_kept_bench_compares_both_generate_paths() -> None:
    """bench/kept.py --quick: the Generate tab's whole-array and device-side paths on one 2,048-token generation
    draw the same figures, and the device side keeps less (sizes, not times, are asserted)."""
    done = subprocess.run([sys.executable, "bench/kept.py", "--quick", "--repeats", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "ATLAS_MAX_TOKENS": "2048"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["same"] is True and report["tokens"] == 2048
    assert report["kept_ratio"] > 10 and report["device"]["kept_mb"] < report["array"]["kept_mb"]
    assert set(report["device"]["redraw_ms"]) == set(report["array"]["redraw_ms"]) == {
        "heatmap_mean", "model_view", "head_view", "replay_step_2", "zoom_64", "zoom_1024"}


def test_class_bench_runs_a_small_class_end_to_end() -> None:
    """bench/class.py with 5 students: nothing fails, nothing is lost, not even across the server's kill (figures
    are never asserted: the JSON's keys and counts are)."""
    done = subprocess.run([sys.executable, "bench/class.py", "--students", "5", "--timeout", "90"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["students"] == 5 and report["errors"] == 0 and report["lost"] == 0
    assert report["sent"] == report["counts"] and sum(report["counts"].values()) == 5
    assert report["teacher_lag_s"] is not None and report["lost_after_restart"] == 0
    assert report["acked_before_kill"] >= 5 + 5 // 2 and report["csv_rows"] >= report["acked_before_kill"]


def test_generate_bench_qwen3_shape(capsys) -> None:
    """``--family qwen3``: the same comparison on Qwen3's shape (one layer here): identical ids and attention."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "generate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--family", "qwen3", "--repeats", "1", "--layers", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["family"] == "qwen3" and report["layers"] == 1 and report["new_tokens"] == 30
    assert report["identical"] is True and report["max_attention_diff"] < 1e-5


def test_lone_user_arms_take_turns(monkeypatch) -> None:
    """bench/load.py's lone-user arms alternate request by request (ABBA), every server up at once; measured one arm
    after the other, the second arm met another machine state (issue 48: a ×1.42 'batcher slowdown')."""
    import bench.load as load

    seen: list[str] = []

    class Server:
        def __init__(self, url: str) -> None:
            self.url = url

    class Client:
        def __init__(self, url: str, timeout: float) -> None:
            self.url = url

        def close(self) -> None:
            pass

    monkeypatch.setattr(load, "call", lambda client, action, timeout: seen.append(client.url))
    times = load.lone_user({"unbatched": Server("u"), "batched": Server("b")}, load.OPEN_SESSION, 4, 5.0, Client)
    assert seen == ["u", "b", "u", "b", "b", "u", "u", "b", "b", "u"]  # one warm-up each, then ABBA turns
    assert {k: len(v) for k, v in times.items()} == {"unbatched": 4, "batched": 4}


def test_idle_waits_for_the_load_to_settle(monkeypatch) -> None:
    """bench/latency.py --idle: each browser turn waits until the 1-minute load average falls to the given value."""
    import bench._browser as browser

    loads = iter([5.0, 4.0, 1.5, 1.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(browser.time, "sleep", lambda s: None)
    assert browser.settle(2.0) == 1.5
