"""The figure builder (viz.common.Fig): the app's unvalidated build gives the same JSON as plotly's validated
one for every figure family, and Fig's subplot grid is the one plotly's make_subplots lays out."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from viz import common, playground
from viz.common import Fig

_spec = importlib.util.spec_from_file_location("bench_payload", Path(__file__).parents[1] / "bench" / "payload.py")
payload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(payload)


def _playground_cases():
    steps = playground.compute_steps(seq_len=6, d_k=8, seed=0, mask="causal")
    yield "playground", "steps", lambda: playground.playground_figure(steps)
    yield "playground", "entropy vs d_k", lambda: playground.entropy_figure(playground.entropy_vs_dk(), 8)


CASES = [c for c in payload.largest_cases() if "HTML" not in c[1]] + list(_playground_cases())


@pytest.mark.parametrize("family,name,build", CASES, ids=[c[1] for c in CASES])
def test_fast_build_gives_the_validated_json(family, name, build, monkeypatch):
    specs: list[dict] = []
    original = Fig.build

    def record(self, validate=None):
        specs.append(json.loads(json.dumps({"data": self.data, "layout": self.layout}, default=_array)))
        return original(self, validate=True)

    monkeypatch.setattr(Fig, "build", record)
    build()
    assert specs, f"{family}/{name} did not go through Fig"
    monkeypatch.setattr(Fig, "build", original)
    fig_fast = build()
    fig_checked = go.Figure(fig_fast.to_dict())  # plotly validates every property here
    assert json.loads(fig_fast.to_json()) == json.loads(fig_checked.to_json())


def _array(x):
    return np.asarray(x).tolist()


def test_the_tests_validate_every_figure():
    assert common.VALIDATE  # tests/conftest.py sets ATLAS_VALIDATE_FIGURES=1
    with pytest.raises(ValueError, match="colourscale"):
        Fig(dict(type="heatmap", z=[[1]], colourscale="Blues")).build()


@pytest.mark.parametrize("rows,cols,kw", [(1, 4, dict(horizontal_spacing=0.04, shared_yaxes=True)),
                                          (2, 4, dict(horizontal_spacing=0.07, vertical_spacing=0.16)),
                                          (1, 2, {}), (3, 2, {})])
def test_grid_matches_make_subplots(rows, cols, kw):
    titles = [f"t{i}" for i in range(rows * cols)]
    ours = Fig(rows=rows, cols=cols, subplot_titles=titles, **kw)
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            ours.add_trace(dict(type="scatter", x=[r], y=[c]), row=r, col=c)
    ref = make_subplots(rows=rows, cols=cols, subplot_titles=titles, **kw)
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            ref.add_trace(go.Scatter(x=[r], y=[c]), row=r, col=c)
    a, b = ours.build(validate=True).to_plotly_json(), ref.to_plotly_json()
    for name in [k for k in b["layout"] if k.startswith(("xaxis", "yaxis"))]:
        for key in ("domain", "anchor", "matches", "showticklabels"):
            got, want = a["layout"][name].get(key), b["layout"][name].get(key)
            if key == "domain":
                np.testing.assert_allclose(got, want, atol=1e-9)
            else:
                assert got == want, (name, key)
    assert [(t.get("xaxis"), t.get("yaxis")) for t in a["data"]] == [(t.get("xaxis"), t.get("yaxis"))
                                                                       for t in b["data"]]
    ta = [(x["text"], round(x["x"], 9), round(x["y"], 9)) for x in a["layout"]["annotations"]]
    tb = [(x["text"], round(x["x"], 9), round(x["y"], 9)) for x in b["layout"]["annotations"]]
    assert ta == tb


def test_magic_underscores_and_merging_leave_constants_alone():
    before = json.dumps(common.TEMPLATE)
    fig = Fig(dict(type="bar", x=[1], y=[2]))
    common.base_layout(fig, "T", height=300)
    fig.update_layout(title_font_size=22, paper_bgcolor="#eee", template=dict(layout=dict(font=dict(size=9))))
    fig.update_xaxes(title_text="x", tickfont=dict(size=11))
    built = fig.build(validate=True)
    assert built.layout.title.text == "T" and built.layout.title.font.size == 22 and built.layout.height == 300
    assert built.layout.paper_bgcolor == "#eee" and built.layout.xaxis.title.text == "x"
    assert built.layout.template.layout.font.size == 9 and built.layout.template.layout.font.family == common.FONT
    assert json.dumps(common.TEMPLATE) == before


def test_the_private_validate_argument_still_skips_validation():
    """viz.common.figure_from_spec relies on plotly's private ``_validate``: if a plotly upgrade renames or
    drops it, or it stops skipping validation, this fails and says what to do."""
    spec = {"data": [{"type": "heatmap", "z": [[1]], "colourscale": "Blues"}], "layout": {"title": {"text": "t"}}}
    try:
        fig = common.figure_from_spec(spec, validate=False)
    except (TypeError, ValueError) as err:
        pytest.fail(f"plotly no longer accepts go.Figure(..., _validate=False) ({err}); make "
                    "viz.common.figure_from_spec build go.Figure(spec) instead")
    assert json.loads(fig.to_json())["data"][0]["colourscale"] == "Blues", (
        "go.Figure(..., _validate=False) validated the figure: the fast build is gone, see figure_from_spec")
    with pytest.raises(ValueError, match="colourscale"):
        common.figure_from_spec(spec, validate=True)
