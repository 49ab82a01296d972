"""The demo's scenarios by name: what each one tells, and which function plays it.

Kept free of torch so that `opdiff demo --list` answers at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from .story import COMPARE_ADVICE, OVERFLOW_ADVICE, Advice


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: str              # the seed document the story comes from ("-": none)
    summary: str           # one line for `opdiff demo --list`
    play: str              # name of the function in opdiff.demo.<module> that plays it
    advice: Advice = COMPARE_ADVICE     # "on your own model"
    module: str = "scenarios"

    def player(self):
        """The function `(out: Path, story: Story) -> DemoResult` that plays this scenario."""
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.play)


SCENARIOS = {s.name: s for s in (
    Scenario("iadd", "000", "3D-ResNet whose `+=` is slightly wrong in one block (default)",
             "play_iadd"),
    Scenario("lstm-backward", "001", "LSTM whose backward is wrong while its forward is right",
             "play_lstm_backward"),
    Scenario("fp16-overflow", "000",
             "fp16 autocast overflow: where inf is born, online and offline",
             "play_fp16_overflow", OVERFLOW_ADVICE),
    Scenario("bf16-healthy", "-", "bf16 autocast vs fp32: differences everywhere, no culprit",
             "play_bf16_healthy"),
    Scenario("wrong-weights", "-", "a checkpoint conversion changed one weight element by 1e-2: "
             "origin parameter, named by its FQN", "play_wrong_weights", module="origin_stories"),
    Scenario("dropout", "-", "the generator was seeded again after building the model: dropout "
             "masks differ, origin random", "play_dropout", module="origin_stories"),
)}
from . import trend_story  # noqa: E402,F401  registers "trend" (its own file, for clean merges)
