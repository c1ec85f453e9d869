"""The README's command table and the CLI cannot drift: the table lists exactly the CLI's commands, and every
option a row names is an option of that command."""

from __future__ import annotations

import re

import click

from slurm_gpushare.cli import main
from tests.conftest import ROOT
from tests.unit.docs_support import command_table


def leaf_commands(group: click.Group, path: tuple[str, ...] = ("gpushare",)) -> dict[str, click.Command]:
    found = {}
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        if isinstance(cmd, click.Group):
            found.update(leaf_commands(cmd, (*path, name)))
        else:
            found[" ".join((*path, name))] = cmd
    return found


def test_the_table_lists_every_command_and_no_other():
    table = command_table((ROOT / "README.md").read_text())
    cli = leaf_commands(main)
    assert sorted(set(cli) - set(table)) == [], "commands missing from the README's table (## Commands)"
    assert sorted(set(table) - set(cli)) == [], "the README's table names commands the CLI does not have"


def test_every_option_the_table_names_exists():
    table = command_table((ROOT / "README.md").read_text())
    cli = leaf_commands(main)
    for command, row in table.items():
        first = row.split("|")[1]
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9.-]*)", first))
        known = {opt for p in cli[command].params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        assert named <= known, f"{command}: the README names {sorted(named - known)}, not options of the command"


def test_the_table_reader_sees_a_drift():
    text = (
        "## Commands\n\n| command | what |\n|---|---|\n| `gpushare validate POLICY` | x |\n| `gpushare nosuch` | y |\n"
    )
    assert set(command_table(text)) == {"gpushare validate", "gpushare nosuch"}
