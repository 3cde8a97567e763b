"""Attention Atlas figure library: numpy arrays + labels in, ``plotly.graph_objects.Figure`` out (the
token highlight returns an HTML string). Pure: imports numpy and plotly only (never torch, models or
gradio), so every figure builds the same in the app and in a notebook.

Budget (docs/ARCHITECTURE.md §6): every figure's ``len(fig.to_json())`` stays ≤ 2 MB for any input the app allows;
arrays travel as float32 (or uint8) typed arrays, hover text comes from hovertemplates and axis labels.
The attention playground figure lives in ``viz.playground``.
"""

from viz.attention import attention_heatmap, attention_zoom, head_view, model_view, select_head
from viz.common import TEMPLATE, max_pool, pool_blocks
from viz.generate import copy_losses, distribution_change, generation_highlight, logit_lens, step_candidates
from viz.images import image_attention, image_attention_grid, patch_map, query_patch_attention, topk_bars
from viz.positional import (
    learned_pe_grid,
    position_similarity,
    relative_bias_tables,
    rope_offset_scores,
    rope_rotation,
    similarity_matrix,
    sinusoidal_curves,
    sinusoidal_heatmap,
    t5_bias,
)
from viz.stats import entropy_heatmap, head_metric_scatter, head_share_heatmap, token_shares
from viz.swin import (
    all_window_masks,
    cyclic_shift,
    region_map,
    shifted_window_ids,
    window_attention_grid,
    window_attention_map,
    window_mask,
    window_partitions,
)
from viz.text import beam_tree, cross_alignment, token_highlight

__all__ = [
    "TEMPLATE", "all_window_masks", "attention_heatmap", "attention_zoom", "beam_tree", "copy_losses",
    "cross_alignment", "cyclic_shift", "distribution_change", "entropy_heatmap", "generation_highlight",
    "head_metric_scatter",
    "head_share_heatmap", "head_view", "image_attention", "image_attention_grid", "learned_pe_grid",
    "logit_lens", "max_pool", "model_view", "patch_map", "pool_blocks", "position_similarity",
    "query_patch_attention", "region_map", "relative_bias_tables", "rope_offset_scores", "rope_rotation", "select_head",
    "shifted_window_ids", "similarity_matrix", "sinusoidal_curves", "sinusoidal_heatmap", "step_candidates", "t5_bias",
    "token_highlight", "token_shares", "topk_bars", "window_attention_grid", "window_attention_map",
    "window_mask", "window_partitions",
]
