"""What differs between the environments of two runs (versions, devices, flags, threads)."""
from __future__ import annotations

_MISSING = "(absent)"


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def environment_diff(target_meta: dict, golden_meta: dict) -> list[dict]:
    """[{"key", "target", "golden"}] for every fingerprint entry that differs, keys dotted
    (`torch.version`), sorted by key. Dumps without a fingerprint give []."""
    t = _flatten((target_meta or {}).get("environment") or {})
    g = _flatten((golden_meta or {}).get("environment") or {})
    diff = []
    for key in sorted(set(t) | set(g)):
        a, b = t.get(key, _MISSING), g.get(key, _MISSING)
        if a != b:
            diff.append({"key": key, "target": a, "golden": b})
    return diff
