"""stackshot's analyzer: snapshots in, call graph out (Racket's ``profile/analyzer``).

It consumes the ``sampler``'s snapshot value (or Racket's raw sampler result) and
never touches live threads, so a profile can be analysed anywhere, later, from a
file, or merged from several runs and machines.
"""

from .analyze import GRANULARITIES, INTERVALS, WEIGHTS, analyze_by_mark, analyze_samples
from .jsonform import ProfileFormatError, json_to_profile, profile_to_json
from .markfilter import Marks
from .merge import merge
from .model import Edge, Node, Profile
from .renderers import render_dot, render_flat, render_text, render_tree
from .topo import topological_layers
from .weights import sample_weights

__all__ = [
    "analyze_samples", "analyze_by_mark", "sample_weights", "merge",
    "Profile", "Node", "Edge", "Marks",
    "profile_to_json", "json_to_profile", "ProfileFormatError",
    "render_text", "render_dot", "render_flat", "render_tree", "topological_layers",
    "WEIGHTS", "GRANULARITIES", "INTERVALS",
]
