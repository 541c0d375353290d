"""The layout of a training run's work directory, named in one place: the recipe, the training loop, the CLI, the
ship script and the GPU session script ask a WorkDir for a path instead of spelling it
(tests/test_work_dir.py greps the rest of the code for these names).

    <work>/train_prompts.json, heldout_prompts.json, prompt_settings.json   the prompt stage
    <work>/data/                                                            training replies (+ cached features)
    <work>/heldout/                                                         greedy replies to the held-out prompts
    <work>/state-<name>/                                                    a drafter's training state (resumable)
    <work>/best-<name>/                                                     the best drafter by held-out tau
    <work>/<name>-loss.jsonl, <name>-heldout.jsonl                          its loss and held-out curves
    <work>/<name>-run.json                                                  its resolved settings (config.TrainRun)
    <work>/.portable-spec.lock, .train-<name>.portable-spec.lock            the data lock, a drafter's training lock

<name> is the output checkpoint's folder name (`--out .../depth_causal` -> "depth_causal").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from portable_spec.core.outputs import LOCK_FILE


@dataclass(frozen=True)
class WorkDir:
    root: Path
    LOSS_LOG = "-loss.jsonl"  # <name> + this: what scripts/plot_loss_curves.py strips to label a curve

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # -- the data stages ---------------------------------------------------------------------------
    @property
    def train_prompts(self) -> Path:
        return self.root / "train_prompts.json"

    @property
    def heldout_prompts(self) -> Path:
        return self.root / "heldout_prompts.json"

    @property
    def prompt_settings(self) -> Path:
        return self.root / "prompt_settings.json"

    @property
    def replies(self) -> Path:
        """The training replies and, with cached features, their features (replies.py, features.py)."""
        return self.root / "data"

    @property
    def heldout_replies(self) -> Path:
        return self.root / "heldout"

    def prompts_prepared(self) -> bool:
        """The prompt stage is done (a later run needs no data set, e.g. on a machine without it)."""
        return self.train_prompts.is_file()

    # -- one drafter's training -----------------------------------------------------------------------
    def run_config(self, name: str) -> Path:
        """The run's resolved settings, as `portable-spec train --config` reads them."""
        return self.root / f"{name}-run.json"

    def state(self, name: str) -> Path:
        return self.root / f"state-{name}"

    def best(self, name: str) -> Path:
        return self.root / f"best-{name}"

    def loss_log(self, name: str) -> Path:
        return self.root / f"{name}{self.LOSS_LOG}"

    def heldout_log(self, name: str) -> Path:
        return self.root / f"{name}-heldout.jsonl"

    # -- locks ------------------------------------------------------------------------------------------
    @property
    def data_lock(self) -> Path:
        """Held while a run writes the shared data (prompts, replies, features)."""
        return self.root / LOCK_FILE

    def training_lock(self, name: str) -> Path:
        """Held while a run trains `name` (its state and logs): kinds may train at once on one work dir."""
        return self.root / f".train-{name}{LOCK_FILE}"


def changed_settings(
    saved: Mapping,
    asked: Mapping,
    keys: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
    words: tuple[str, str] = ("saved", "asked"),
    flags: bool = False,
) -> list[str]:
    """The one comparison behind every "same settings or refuse" rule of a work dir (a resumed or warm-started run,
    prepared prompts, replies, cached features, --init-from): `key: saved X, asked Y` for each setting of `keys`
    (default: both sides') that differs, `ignore` left out; `flags` names keys as the flags that set them."""
    ignored = set(ignore)
    names = sorted(set(saved) | set(asked)) if keys is None else list(keys)
    return [
        f"{name.replace('_', '-') if flags else name}: {words[0]} {saved.get(name)!r}, {words[1]} {asked.get(name)!r}"
        for name in names
        if name not in ignored and saved.get(name) != asked.get(name)
    ]
