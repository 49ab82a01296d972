"""What `opdiff run` hands every process of the launch: one JSON object in OPDIFF_RUN_CONFIG.

    {"dump": {"dump_path": "./dump/npu", "task": "statistics", "level": "mix", "step": [0, 1]},
     "config_path": null, "monitor": null, "model": null}

`dump` holds PrecisionDebugger's arguments (`config_path`, when given, is read in each process
with `dump`'s keys winning); `monitor` is `{"path": ...}` for `opdiff.Monitor` on every step;
`model` the class name of the module to record when the first module called is not it;
`control` a JSON file read again at every step boundary when it changed: `{"steps": [120, 121]}`
records those steps from then on, `{"steps": []}` records nothing more (until it changes).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..errors import ConfigError
from . import ENV


@dataclass
class RunSettings:
    dump: dict[str, Any] = field(default_factory=dict)
    config_path: Optional[str] = None
    monitor: Optional[dict[str, Any]] = None
    model: Optional[str] = None
    control: Optional[str] = None

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> "RunSettings":
        try:
            raw = json.loads(text)
            return cls(dump=dict(raw.get("dump") or {}), config_path=raw.get("config_path"),
                       monitor=raw.get("monitor"), model=raw.get("model"), control=raw.get("control"))
        except (ValueError, AttributeError, TypeError) as exc:
            raise ConfigError(f"{ENV} is not opdiff run's JSON ({exc}); unset it") from None

    @classmethod
    def from_env(cls) -> Optional["RunSettings"]:
        text = os.environ.get(ENV)
        return cls.decode(text) if text else None

    def debugger_config(self):
        """The validated DumpConfig these settings give (a ConfigError when they are wrong)."""
        from ..config import DumpConfig

        if self.config_path:
            return DumpConfig.from_file(self.config_path, **self.dump)
        return DumpConfig.create(**self.dump)


__all__ = ["RunSettings"]
