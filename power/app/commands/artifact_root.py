"""`--root DIR`: where this machine keeps a plan's artifacts (verify, render, run, serve and bench share it)."""

from __future__ import annotations

from pathlib import Path

import click

root_option = click.option(
    "--root", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
    help="Look for every artifact the plan names in DIR, by its file name (where a container mounts the models), "
         "instead of at the plan's paths (relative ones are relative to the plan's folder). The sha256 still "
         "decides whether a file is the planned one.")
