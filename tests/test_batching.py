"""Batched serving (issue 37 §1, docs/ARCHITECTURE.md §9): requests that arrive together for one model and action
run as one padded batch, and each answer equals the same request served alone (text and token ids equal,
probabilities and every attention array within 1e-5); a bad, cancelled or abandoned request costs the others
nothing. No wall-clock assertions."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future
from pathlib import Path

import numpy as np
import pytest

import models
from models.decoding.lockstep import GenerateRequest, generate_many
from serving import batcher as batching
from serving import catalogue, store
from tabs.classify import classify_batch
from tabs.translate import translate_batch

ATOL = 1e-5
# eight inputs of different lengths (the tiny tokenizers know these words)
TEXTS = ["a warm film", "a man rides a bike", "the film", "a warm , funny and beautifully acted film",
         "two dogs play in the snow", "a", "the man in a red jacket rides his old bike down the street", "funny"]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints: Path):
    return {name: models.load(tiny_checkpoints / name) for name in ("translator-en-de", "sst2", "gpt-tiny")}


def gated(run):
    """A Batcher whose first batch (one warm-up item) waits for ``gate``: everything submitted meanwhile queues,
    so the next batch takes it all at once, exactly as a burst arriving during a running batch does."""
    gate, blocked, seen = threading.Event(), threading.Event(), []

    def wrapped(items):
        if items == ["warm-up"]:
            blocked.set()
            gate.wait(30)
            return ["warm"]
        seen.append(list(items))
        return run(items)

    batcher = batching.Batcher(wrapped, max_size=32, name="test")
    warm: list[Future] = []
    threading.Thread(target=lambda: warm.append(batcher.submit("warm-up")), daemon=True).start()  # runs alone
    assert blocked.wait(30)  # a batch is running: what comes next queues
    return batcher, gate, seen, warm


def at_once(run, items, cancel: tuple[int, ...] = ()):
    """Submit ``items`` from one thread each while a batch runs, then let it finish: (futures, the batches run).
    The threads queue in whatever order the scheduler runs them, so a batch's order is not the items' order."""
    batcher, gate, seen, warm = gated(run)
    futures: list[Future | None] = [None] * len(items)

    def submit(i):
        futures[i] = batcher.submit(items[i])

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in cancel:
        assert futures[i].cancel()  # still queued: cancellable
    gate.set()
    deadline = time.monotonic() + 30
    while not warm and time.monotonic() < deadline:
        time.sleep(0.01)
    assert warm[0].result(30) == "warm"
    for i, f in enumerate(futures):
        if i not in cancel:
            f.exception(60)  # wait for every answer
    return futures, seen


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.allclose(a, b, atol=ATOL, rtol=0)


def same_translation(a, b) -> None:
    assert a.text == b.text and a.source_tokens == b.source_tokens and a.target_tokens == b.target_tokens
    # beam scores are cumulative log-probabilities (a sum over up to 127 steps): within 1e-5 or 1e-6 of their size
    assert a.chosen == b.chosen and a.score == pytest.approx(b.score, abs=ATOL, rel=1e-6)
    for sa, sb in zip(a.beam, b.beam, strict=True):
        assert sa.tokens == sb.tokens and sa.parents == sb.parents and sa.finished == sb.finished
        assert np.allclose(sa.scores, sb.scores, atol=ATOL, rtol=1e-6)
    for kind in ("encoder", "decoder", "cross"):
        assert close(a.attention[kind].weights, b.attention[kind].weights), kind
        assert a.attention[kind].queries == b.attention[kind].queries


def same_classification(a, b) -> None:
    assert a.tokens == b.tokens and a.labels == b.labels and a.notice == b.notice
    assert close(a.probs, b.probs)
    assert close(a.attention["encoder"].weights, b.attention["encoder"].weights)


def same_generation(a, b) -> None:
    assert a.ids == b.ids and a.tokens == b.tokens and a.text == b.text and a.prompt_len == b.prompt_len
    assert close(a.attention["decoder"].weights, b.attention["decoder"].weights)
    assert np.allclose(a.surprisal, b.surprisal, atol=ATOL, rtol=0, equal_nan=True)
    for sa, sb in zip(a.steps, b.steps, strict=True):
        assert sa.candidates == sb.candidates and sa.chosen == sb.chosen
        assert close(np.asarray(sa.probs), np.asarray(sb.probs))
        assert sa.chosen_prob == pytest.approx(sb.chosen_prob, abs=ATOL)


def generate_solo(net, r: GenerateRequest):
    return net.generate(r.text, max_new_tokens=r.max_new_tokens, strategy=r.strategy, temperature=r.temperature,
                        top_k=r.top_k, top_p=r.top_p, seed=r.seed)


# ------------------------------------------------------------------------------- batched = alone, 8 at once
def test_eight_translations_at_once_equal_each_alone(tiny) -> None:
    net = tiny["translator-en-de"]
    items = [(text, 1 if i % 3 == 0 else 5) for i, text in enumerate(TEXTS)]  # greedy and beam search mixed
    futures, seen = at_once(lambda batch: translate_batch(net, batch), items)
    assert [len(b) for b in seen] == [8]  # one batch
    for (text, beam), future in zip(items, futures):
        same_translation(future.result(), net.translate(text, beam_size=beam))


def test_eight_classifications_at_once_equal_each_alone(tiny) -> None:
    net = tiny["sst2"]
    futures, seen = at_once(lambda batch: classify_batch(net, batch), TEXTS)
    assert [len(b) for b in seen] == [8]
    for text, future in zip(TEXTS, futures):
        same_classification(future.result(), net.classify(text))


def test_eight_generations_at_once_equal_each_alone(tiny) -> None:
    net = tiny["gpt-tiny"]
    requests = [GenerateRequest(text, 3 + 2 * i, "sample" if i % 2 else "greedy", 0.9, 20 * (i % 3), 0.95, seed=i)
                for i, text in enumerate(TEXTS)]
    futures, seen = at_once(lambda batch: generate_many(net, batch), requests)
    assert [len(b) for b in seen] == [8]
    for r, future in zip(requests, futures):
        same_generation(future.result(), generate_solo(net, r))


def test_handlers_at_once_answer_as_alone(tiny_checkpoints: Path, monkeypatch) -> None:
    """The tabs' own handlers, 8 threads at once through the model store's batchers, against each alone."""
    from tabs.classify import classify
    from tabs.generate import generate
    from tabs.translate import translate

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    monkeypatch.setattr(batching, "BATCHING", True)
    cases = [(translate, lambda out: out[6], same_translation),  # the kept Result of each handler's outputs
             (classify, lambda out: out[5]["result"], same_classification),
             (generate, lambda out: out[6]["result"], same_generation)]
    for handler, kept, same in cases:
        answers: list = [None] * len(TEXTS)

        def run(i, handler=handler, answers=answers):
            answers[i] = handler(TEXTS[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(TEXTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for text, answer in zip(TEXTS, answers):
            same(kept(answer), kept(handler(text)))
    assert {action for _, action in store.MODELS._batchers} == {"translate", "classify", "generate"}


# ------------------------------------------------------------------------------------------- hostile cases
def test_zero_size_batches(tiny) -> None:
    assert translate_batch(tiny["translator-en-de"], []) == []
    assert classify_batch(tiny["sst2"], []) == []
    assert generate_many(tiny["gpt-tiny"], []) == []
    assert tiny["translator-en-de"].translate_many([]) == [] and tiny["sst2"].classify_many([]) == []
    # every request of a batch cancelled before it ran: the batch function is never called with nothing
    futures, seen = at_once(lambda batch: [x * 2 for x in batch], [1, 2, 3], cancel=(0, 1, 2))
    assert seen == [] and all(f.cancelled() for f in futures)


def test_a_bad_request_fails_alone(tiny) -> None:
    """An input the model refuses is that request's error; the rest of its batch is answered as alone."""
    net, clf, lm = tiny["translator-en-de"], tiny["sst2"], tiny["gpt-tiny"]
    items = [(TEXTS[0], 5), ([], 5), (TEXTS[1], 5)]  # no tokens at all
    futures, seen = at_once(lambda batch: translate_batch(net, batch), items)
    assert [len(b) for b in seen] == [3]
    with pytest.raises(ValueError):
        futures[1].result()
    same_translation(futures[0].result(), net.translate(TEXTS[0], 5))
    same_translation(futures[2].result(), net.translate(TEXTS[1], 5))

    futures, _ = at_once(lambda batch: classify_batch(clf, batch), [TEXTS[2], [], TEXTS[3]])
    with pytest.raises(ValueError):
        futures[1].result()
    same_classification(futures[2].result(), clf.classify(TEXTS[3]))

    requests = [GenerateRequest(TEXTS[4], 5), GenerateRequest(TEXTS[4], 5, strategy="bogus"), GenerateRequest([], 5),
                GenerateRequest(TEXTS[0], 4)]
    futures, _ = at_once(lambda batch: generate_many(lm, batch), requests)
    for i in (1, 2):
        with pytest.raises(ValueError):
            futures[i].result()
    same_generation(futures[0].result(), generate_solo(lm, requests[0]))
    same_generation(futures[3].result(), generate_solo(lm, requests[3]))


def test_a_batch_that_fails_as_a_whole_is_retried_one_by_one() -> None:
    def run(items):
        if "poison" in items:
            raise RuntimeError("the batch broke")
        return [x.upper() for x in items]

    futures, seen = at_once(run, ["a", "poison", "b"])
    assert [f.result() for i, f in enumerate(futures) if i != 1] == ["A", "B"]
    with pytest.raises(RuntimeError, match="the batch broke"):
        futures[1].result()
    assert sorted(seen[0]) == ["a", "b", "poison"] and sorted(map(tuple, seen[1:])) == [("a",), ("b",), ("poison",)]


def test_a_cancelled_request_in_the_middle_of_a_batch(tiny) -> None:
    """Cancelled while queued: left out of its batch, the others answered as alone."""
    net = tiny["sst2"]
    futures, seen = at_once(lambda batch: classify_batch(net, batch), TEXTS[:5], cancel=(2,))
    assert len(seen) == 1 and sorted(seen[0]) == sorted([TEXTS[0], TEXTS[1], TEXTS[3], TEXTS[4]])  # any order
    with pytest.raises(CancelledError):
        futures[2].result()
    for i in (0, 1, 3, 4):
        same_classification(futures[i].result(), net.classify(TEXTS[i]))


def test_an_abandoned_request_while_its_batch_runs(tiny) -> None:
    """A caller that stops waiting (a closed browser tab) while its batch runs: the others are answered and the
    batcher serves the next request."""
    net = tiny["translator-en-de"]
    started = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    calls: list[int] = []

    def run(batch):
        n = len(calls)
        calls.append(len(batch))
        if n < 2:
            started[n].set()
            release[n].wait(30)
        return translate_batch(net, batch)

    batcher = batching.Batcher(run, name="test")
    first: list[Future] = []
    threading.Thread(target=lambda: first.append(batcher.submit((TEXTS[0], 3))), daemon=True).start()  # runs alone
    assert started[0].wait(30)
    queued = [batcher.submit((TEXTS[i], 3)) for i in (1, 2)]  # wait behind it: the next batch
    release[0].set()
    assert started[1].wait(30)  # the batch of the two queued requests is running
    with pytest.raises(TimeoutError):
        queued[0].result(timeout=0.01)  # its caller gives up
    assert not queued[0].cancel()  # too late to cancel: it runs, and its answer goes to nobody
    release[1].set()
    same_translation(queued[1].result(60), net.translate(TEXTS[2], beam_size=3))
    same_translation(first[0].result(60), net.translate(TEXTS[0], beam_size=3))
    same_translation(batcher((TEXTS[5], 3), timeout=60), net.translate(TEXTS[5], beam_size=3))  # still serving
    assert calls == [1, 2, 1]


def test_unbatched_mode_serves_in_the_calling_thread(tiny, monkeypatch) -> None:
    monkeypatch.setattr(batching, "BATCHING", False)
    net = tiny["sst2"]
    same_classification(store.batched("sst2", "classify", classify_batch, net, TEXTS[0]), net.classify(TEXTS[0]))
    with pytest.raises(ValueError):
        store.batched("sst2", "classify", classify_batch, net, [])
    assert batching.batch_events("classify") == {}


@pytest.mark.slow
def test_burst_benchmark_runs_beside_the_unbatched_server(tiny_checkpoints: Path) -> None:
    """bench/load.py --burst end to end over the tiny checkpoints: both servers, every press answered."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "bench/load.py", "--burst", "classify", "--clients", "3", "--rounds", "1",
                          "--single", "1", "--compare", "--distinct", "--floor", "--checkpoints", str(tiny_checkpoints),
                          "--request-timeout", "90"], cwd=root, capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert report["burst"] == "classify_sst2" and report["requests"] == 6 and report["errors"] == 0
    for mode in ("unbatched", "batched"):
        assert report[mode]["requests"] == 3 and report[mode]["server_up"] is True
        assert report[mode]["classify_p95_s"] >= report[mode]["classify_p50_s"] > 0
    assert report["single_ratio"] > 0 and report["peak_rss_mb"] > 50
    assert report["client"] == "page" and report["floor"]["p95_s"] >= report["floor"]["p50_s"] > 0


def test_finish_runs_in_the_batch_thread_one_request_at_a_time(tiny) -> None:
    """Each request's ``finish`` runs in the batch's thread after the batch, never two at once; its answer is the
    finished one, and a failing finish fails only its own request."""
    net = tiny["sst2"]
    batcher, gate, seen, warm = gated(lambda batch: classify_batch(net, batch))
    lock, threads, overlap = threading.Lock(), set(), []

    def finish(tag):
        def done(result):
            if not lock.acquire(blocking=False):
                overlap.append(tag)
                lock.acquire()
            try:
                threads.add(threading.current_thread().name)
                if tag == "bad":
                    raise RuntimeError("figure failed")
                return tag, result
            finally:
                lock.release()
        return done

    tags = ["a", "bad", "b", "c"]
    futures = [None] * 4
    submitters = [threading.Thread(target=lambda i=i: futures.__setitem__(i, batcher.submit(TEXTS[i], finish(tags[i]))))
                  for i in range(4)]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join()
    gate.set()
    for i, tag in enumerate(tags):
        if tag == "bad":
            with pytest.raises(RuntimeError, match="figure failed"):
                futures[i].result(60)
            continue
        got_tag, result = futures[i].result(60)
        assert got_tag == tag
        same_classification(result, net.classify(TEXTS[i]))
    assert threads == {"batcher-test"} and not overlap
    assert sorted(len(b) for b in seen) == [4]


@pytest.mark.slow
def test_page_client_answers_as_gradio_client_does(tiny_checkpoints: Path) -> None:
    """bench/_server.PageClient (the burst benchmark's default client) gets the same answers as gradio_client,
    page defaults for the arguments it is not given, and the app's message for a refused input."""
    from gradio_client.exceptions import AppError

    from bench._server import AppServer, PageClient, call, client_for, select_actions

    with AppServer(tiny_checkpoints) as server:
        page, reference = PageClient(server.url, timeout=90), client_for(server.url, timeout=90)
        try:
            for action in select_actions("translate,classify_sst2,generate_20"):
                ours, theirs = call(page, action, timeout=90), call(reference, action, timeout=90)
                assert ours[:2] == list(theirs[:2]), action.name  # the answer and its notice
            with pytest.raises(AppError, match="type some text"):
                page.predict("", api_name="/classify")
        finally:
            page.close()
            reference.close()
