"""A Hugging Face ViTForImageClassification folder (tests/parity_folders.py; its pixels, probabilities and attention
against transformers are tests/test_parity.py's) without its preprocessor_config.json is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families import photo  # noqa: F401 (the photo other tests import from here)


@pytest.fixture(scope="module")
def vit_folder(hf_folders) -> tuple[Path, object]:
    built = hf_folders.get("vit")
    return built.path, built.ref.model


def test_vit_folder_without_preprocessor_config_is_refused(vit_folder, tmp_path: Path) -> None:
    import shutil

    import models
    from models.io.checkpoint import CheckpointError

    folder, _ = vit_folder
    broken = tmp_path / "vit"
    shutil.copytree(folder, broken)
    (broken / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="preprocessor_config.json"):
        models.load(str(broken))
