"""Every flag of every command has help text that states its default, and every command's --help ends with
examples (parsed from the parser itself: no command runs)."""

import argparse

from reskip.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_flag_has_help_with_its_default():
    missing = []
    for name, sub in _subcommands().items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[0] if action.option_strings else action.dest
            if not action.help:
                missing.append(f"{name} {flag}: no help")
            elif (action.option_strings and not action.required and action.nargs != 0
                  and "default" not in action.help):
                missing.append(f"{name} {flag}: the help does not state the default")
    assert not missing, "\n".join(missing)


def test_every_command_ends_its_help_with_examples():
    for name, sub in _subcommands().items():
        text = sub.format_help()
        assert "examples:\n  reskip" in text, name
        assert f"reskip {name}" in text.split("examples:")[1], name
