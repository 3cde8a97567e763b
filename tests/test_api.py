"""The HTTP API through gradio_client against a launched server."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def _figure_data(value) -> list[dict]:
    """Traces of a gr.Plot value, with Plotly's binary arrays ({dtype, bdata, shape}) decoded."""
    plot = value["plot"] if isinstance(value, dict) and "plot" in value else value
    data = json.loads(plot)["data"] if isinstance(plot, str) else plot["data"]
    for trace in data:
        for key, val in trace.items():
            if isinstance(val, dict) and "bdata" in val:
                arr = np.frombuffer(base64.b64decode(val["bdata"]), dtype=np.dtype(val["dtype"]))
                shape = val.get("shape")
                if isinstance(shape, str):
                    shape = [int(n) for n in shape.split(",")]
                trace[key] = arr.reshape(shape) if shape else arr
    return data


def test_playground_api_main_input_alone(client) -> None:
    fig, entropy, summary = client.predict(5, api_name="/playground")
    data = _figure_data(fig)
    assert [t["type"] for t in data] == ["heatmap"] * 8
    weights = np.array(data[7]["z"], dtype=float)
    assert weights.shape == (5, 5)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=5e-3)
    assert "entropy" in summary


def test_playground_api_causal_unscaled(client) -> None:
    fig, _, summary = client.predict(4, 64, 3, "causal", False, api_name="/playground")
    weights = np.array(_figure_data(fig)[7]["z"], dtype=float)
    assert np.allclose(np.triu(np.nan_to_num(weights), 1), 0)
    assert "Scale factor: **1**" in summary
