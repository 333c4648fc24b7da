"""Sections of the dynamic-routing (CapsNet) studies' pages."""

from __future__ import annotations

from pathlib import Path

from capsexp.results.events import load_events
from capsexp.results.runs import Run, group
from capsexp.results.study import StudyPage, matches

RECONSTRUCTIONS = "val/reconstructions"  # the image capsexp.callbacks.image_logging logs at each validation


def reconstructions(runs: list[Run], page: StudyPage, output: Path) -> str:
    """The paper's Fig. 5: the last validation's reconstructions of the first run of the reference
    configuration (else of the first configuration that logged them), written as ``reconstructions.png``."""
    configurations = group(runs)
    ordered = sorted(
        configurations, key=lambda c: not (page.reference and matches(page.reference, c.runs[0].overrides))
    )
    for configuration in ordered:
        for run in configuration.runs:
            events = load_events(run.folder, images=0)
            if RECONSTRUCTIONS not in events.Tags()["images"]:
                continue
            image = events.Images(RECONSTRUCTIONS)[-1]
            (output / "reconstructions.png").write_bytes(image.encoded_image_string)
            seed = f", seed {run.seed}" if run.seed is not None else ""
            return (
                "## Reconstructions (the paper's Fig. 5)\n\n"
                f"`{configuration.label}`{seed}, at step {image.step}: validation inputs (the top row of each pair) "
                "above each digit reconstructed from its own capsule (the two longest), in red and green, "
                "overlaid.\n\n![reconstructions](reconstructions.png)\n"
            )
    return ""
