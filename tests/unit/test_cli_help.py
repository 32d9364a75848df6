"""CLI help shows plain flags as flags (README newcomer): typer's Rich help panel printed ``--json <bool>`` for
every boolean flag, as if it took a value; the CLI renders help without Rich markup, like click."""

from __future__ import annotations

from typer.testing import CliRunner

from scopekb_cli.main import app


def test_boolean_flags_show_no_value_type() -> None:
    for args in (["status", "--help"], ["source", "list", "--help"], ["search", "--help"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "<bool>" not in r.output and "--json" in r.output, (args, r.output)
