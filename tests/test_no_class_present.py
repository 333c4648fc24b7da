"""A labelled folder predicted by a capsule model that finds no digit on some images: those rows say so
(not their best class), count as wrong in the accuracy, which says how it treats them, get the
``[label: right/wrong]`` tag on their line, and their figure names no prediction."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
from PIL import Image

from tests.helpers import TINY_RUN, run_cli_in_process, write_mnist


@pytest.mark.slow
def test_images_without_a_digit_count_as_wrong_and_are_said_so_everywhere(tmp_path):
    import capsexp
    from capsexp.use.explain import explain_figure
    from tests.test_trained_models import TINY_CAPSNET, predict_cli

    data_dir = write_mnist(tmp_path / "data")
    run = tmp_path / "run"
    trained = run_cli_in_process(
        *TINY_RUN,
        *TINY_CAPSNET,
        f"paths.data_dir={data_dir}",
        "trainer.max_steps=2",
        # A threshold of 0.013 (the midpoint of 0.026 and 0): two steps leave capsule lengths about it.
        "model.objective.m_pos=0.026",
        "model.objective.m_neg=0",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    images = tmp_path / "images"
    files = []
    for k in range(8):
        folder = images / str(k % 3)  # class folders: every image labelled
        folder.mkdir(parents=True, exist_ok=True)
        page = np.full((50, 40), 235, np.uint8)
        page[10 + k : 40, 15 : 20 + k] = 20
        files.append(folder / f"{k}.png")
        Image.fromarray(page).save(files[-1])
    model = capsexp.load(run)
    found = model.predict(files)
    best = found.scores.max(dim=1).values
    absent = {f"{k % 3}/{k}.png" for k in range(8) if best[k] < 0.013}
    assert 0 < len(absent) < 8  # both kinds of row are checked

    result = predict_cli(f"ckpt_path={run}", f"images={images}", f"hydra.run.dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "out" / "predictions.csv", newline="") as handle:
        rows = {row["file"]: row for row in csv.DictReader(handle)}
    right = 0
    for name, row in rows.items():
        if name in absent:
            assert row["predicted"] == "no digit found" and row["correct"] == "0", row
        else:
            assert row["predicted"] == row["top1"], row
            assert row["correct"] == str(int(row["top1"] == row["label"])), row
            right += row["top1"] == row["label"]
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines() if line.split(":")[0] in rows}
    assert lines.keys() == rows.keys()
    for name, line in lines.items():
        tag = "right" if rows[name]["correct"] == "1" else "wrong"
        assert line.endswith(f"[label {rows[name]['label']}: {tag}]"), line
        assert ("no digit found" in line) == (name in absent), line
    summary = (tmp_path / "out" / "summary.md").read_text()
    accuracy = re.search(r"Accuracy: \*\*([\d.]+)%\*\* \((\d+) of (\d+);([^)]*)\)", summary)
    assert (
        accuracy and float(accuracy[1]) == round(100 * right / 8, 2) and (accuracy[2], accuracy[3]) == (str(right), "8")
    )
    assert f"the {len(absent)} with no digit found count as wrong" in accuracy[4]
    assert f"| no digit found | {len(absent)} |" in summary

    for k in range(8):
        title = explain_figure(model, found, k, files[k].name).get_suptitle()
        if f"{k % 3}/{k}.png" in absent:
            assert "no digit found" in title and "predicted" not in title, title
        else:
            assert title == f"{k}.png: predicted {rows[f'{k % 3}/{k}.png']['top1']}", title
