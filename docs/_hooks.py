"""MkDocs hooks: the pages made from the code at build time.

``<!-- tfpar:cli -->`` in a page becomes the ``--help`` of ``tfpar`` and of each subcommand, from
the argparse parsers themselves (`tfpar.cli._parser`), and ``<!-- tfpar:exit-codes -->`` the table
of `tfpar.cli.EXIT_CODES`: the reference cannot drift from the command.
"""

import argparse
import os

CLI_MARK = "<!-- tfpar:cli -->"
EXIT_CODES_MARK = "<!-- tfpar:exit-codes -->"


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def cli_reference():
    """Markdown: one section per command, its ``--help`` as the argparse parser prints it."""
    from tfpar.cli import _parser

    os.environ["COLUMNS"] = "100"  # the width argparse wraps at, the same on every machine
    parser = _parser()
    sections = ["## tfpar", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser).items():
        sections += [f"## tfpar {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(sections)


def exit_codes_table():
    from tfpar.cli import EXIT_CODES

    rows = ["| code | meaning |", "|---|---|"]
    rows += [
        f"| {'128 + N' if code == 128 else code} | {meaning.removeprefix('plus N: ')} |"
        for code, meaning in EXIT_CODES.items()
    ]
    rows.append(
        "| any other | `tfpar launch`: the exit code of the task that failed first, "
        "which the launcher names |"
    )
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if EXIT_CODES_MARK in markdown:
        markdown = markdown.replace(EXIT_CODES_MARK, exit_codes_table())
    return markdown
