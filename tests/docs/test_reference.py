"""The generated reference (docs/hooks.py) covers what the code has: every command, every
OPDIFF_* variable described, every threshold key, every record field."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("opdiff_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_and_option_is_in_the_cli_page(hooks):
    page = hooks.cli_page()
    _, commands = hooks.subcommands()
    from opdiff.cli import COMMANDS
    assert set(COMMANDS) <= set(commands)
    for name, sub in commands.items():
        assert f"## opdiff {name}" in page
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in page, f"opdiff {name} {flag} missing from the CLI page"


def test_every_environment_variable_is_described(hooks):
    found = hooks.environment_variables()
    assert "OPDIFF_REPLAY_JOBS" in found
    missing = {name: where for name, where in found.items() if name not in hooks.ENVIRONMENT}
    assert not missing, f"describe these in docs/hooks.py's ENVIRONMENT: {missing}"
    page = hooks.environment_page()
    assert all(f"`{name}`" in page for name in found)


def test_every_threshold_key_is_in_the_page(hooks):
    from opdiff.comparison.verdicts import Thresholds
    page = hooks.thresholds_page()
    for key in Thresholds._KEYS:
        assert f"`{key}`" in page
        assert hooks.THRESHOLD_KEYS.get(key), f"describe threshold {key} in docs/hooks.py"


def test_every_record_field_is_in_the_dump_format_page(hooks):
    from opdiff.store.schema import Record
    fields = [name for name, _, _ in hooks.record_fields()]
    assert fields == list(Record.__annotations__)
    page = hooks.dump_format_page()
    assert all(f"| `{name}` |" in page for name in fields)


def test_every_schema_is_on_the_outputs_page(hooks):
    from opdiff import schemas
    page = hooks.outputs_page()
    for name in schemas.DOCUMENTS:
        assert f"## {name}" in page
    assert "| `first_divergence.location` |" in page


def test_exit_codes_page_lists_the_fail_on_options(hooks):
    page = hooks.exit_codes_page()
    assert "`--fail-on-divergence`" in page and "`opdiff check`" in page


def test_the_record_schema_names_every_record_field():
    from opdiff import schemas
    from opdiff.store.schema import Record
    properties = schemas.load("dump-record")["properties"]
    assert set(Record.__annotations__) <= set(properties)
    assert all(p.get("description") for p in properties.values())
