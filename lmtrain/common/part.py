"""What a class that a config builds declares about itself, in its own module; ``lmtrain.config`` derives the rest.

A part (an output strategy, a sampler, a data source, an encoder) names its option in its group (``name = "rff"``:
``output=rff``) and its options dataclass (``Options``: every key, its default, its range); the group comes with
the base class (``OutputLayer.group = "output"``). From these the config layer derives the part's typed schema
(``schema/GROUP/NAME`` in Hydra's ConfigStore: ``Options`` plus ``_target_``, the class's own module path), its
option ``GROUP=NAME``, and the group's list of options, so a new part is one file. ``runtime_args`` are the values
the part takes from the data and the model (``lmtrain.run.build``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lmtrain.common.ranges import Checked


@dataclass
class NoOptions(Checked):
    """The options of a part that takes none (``sampler=uniform``)."""


class Part:
    """A class a config builds (see the module docstring). A class without its own ``name`` (a base such as
    ``SampledOutput``) is no option of its group."""

    group: ClassVar[str]  # the config group: output, sampler, data, model (set by the group's base class)
    name: ClassVar[str]  # the option of the group: GROUP=NAME on the command line
    Options: ClassVar[type] = NoOptions  # its keys and their defaults (a ``Checked`` dataclass)
    runtime_args: ClassVar[tuple[str, ...]] = ()  # what it takes from the data and the model besides its options
    # the options of other groups that a config of this part comes with, e.g. an output's proposal {"sampler": "rff"}
    companions: ClassVar[dict[str, str]] = {}
