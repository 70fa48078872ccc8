"""Renderers: a :class:`~analyzer.model.Profile` as text, Graphviz, ...

Each renderer is a function of a profile and options that returns its output (a
string) and also writes it to a file object when given one.
"""

from .dot import render_dot
from .flat import render_flat
from .text import render_text
from .tree import render_tree

__all__ = ["render_text", "render_dot", "render_flat", "render_tree"]
