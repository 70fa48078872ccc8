"""``python -m analyzer FILE [FILE ...]``: render saved snapshot files.

Like MLton's ``mlprof``, which reads the ``mlmon.out`` files of several runs of one
program and reports their sum, this reads files written by ``python -m sampler -o``
(or ``Snapshots.save``), checks that they are runs of the same program, sums them,
and prints Racket's text profile, a flat table, Graphviz, JSON, or any export format.

The output half (choosing and writing a format, the renderer options) is shared
with ``python -m sampler``, which imports it from here when its program has ended:
:func:`add_output_arguments`, :class:`OutputOptions` and :func:`write_output`.

Every problem the user can fix -- a file that is not ours, truncated, too new, from
another program, an unwritable output -- is a one-line message and a non-zero exit,
never a traceback: :class:`CLIError` carries it to :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import IO, Any, Callable, Mapping, Optional, Sequence

from sampler.outputfile import write_atomically

from .analyze import GRANULARITIES, WEIGHTS, analyze_samples
from .jsonform import profile_to_json
from .model import Edge, Node, Profile
from .renderers import render_dot, render_text
from .renderers.common import ORDERS, printable
from .renderers.flat import render_flat

__all__ = [
    "main", "CLIError", "OutputOptions", "add_output_arguments", "output_formats",
    "write_output", "render_output", "select_nodes", "load_and_sum", "check_writable",
    "PROFILE_FORMATS", "whole_number_argument", "format_for_path", "write_file", "FILE_ENDINGS",
    "REPORT_FORMATS", "SNAPSHOT_FORMAT",
]

PROFILE_FORMATS = {
    "text": "Racket's caller/callee text profile (the default)",
    "flat": "MLton-style flat table: function, self, total, by self time",
    "dot": "Graphviz source of the call graph: dot -Tsvg",
    "json": "the analysed profile as JSON (Racket's profile->json layout)",
    "tree": "the call tree, path by path, like pyinstrument's console output",
}
"""Formats rendered from the analysed profile; exports render the snapshots."""

SNAPSHOT_FORMAT = "stackshot"
"""The snapshots themselves, in the safe file format ``python -m analyzer`` reads."""

REPORT_FORMATS = ("text", "flat", "tree")
"""Formats written for a person to read: the only ones ``stackshot`` prints (on
standard error); every other format is a file for a program and needs ``-o``."""

FILE_ENDINGS: tuple[tuple[str, str], ...] = (
    (".stackshot", SNAPSHOT_FORMAT),
    (".pstats", "pstats"), (".prof", "pstats"),
    (".html", "html"), (".htm", "html"),
    (".speedscope.json", "speedscope"), (".json", "speedscope"),
    (".pb.gz", "pprof"), (".pprof", "pprof"),
    (".collapsed.txt", "collapsed"), (".collapsed", "collapsed"), (".folded", "collapsed"),
    (".dot", "dot"),
    (".txt", "text"),
)
"""File name endings and the format each names, as cProfile, py-spy and pyinstrument
read ``-o``: the one rule of every front end (:func:`format_for_path`)."""

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2


class CLIError(Exception):
    """A problem the user can fix, told in one line; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------
def _export_formats() -> dict[str, Any]:
    """The registry of ``analyzer.exports``; empty if that package cannot be imported."""
    try:
        from .exports import FORMATS
    except ImportError:
        return {}
    return dict(FORMATS)


def output_formats() -> dict[str, str]:
    """Every ``--format`` name with a one-line description: the profile renderers,
    then each format of the :mod:`analyzer.exports` registry, then the snapshot file."""
    out = dict(PROFILE_FORMATS)
    for name, fmt in sorted(_export_formats().items()):
        out.setdefault(name, fmt.description)
    out[SNAPSHOT_FORMAT] = "the snapshots themselves, to analyse later: python -m analyzer FILE"
    return out


def format_for_path(path: Any, given: Optional[str] = None) -> str:
    """The format to write to ``path``: ``given`` when there is one, else the one its
    name ends with (:data:`FILE_ENDINGS`, longest ending first, any case).

    The one rule behind ``stackshot -o``, ``python -m analyzer -o`` and the
    notebook's ``%sample -o``, so a file never holds something else than its name
    says.  An unknown ending is a :class:`CLIError` listing the known ones.
    """
    if given is not None:
        if given not in output_formats():
            raise CLIError(f"unknown format {given!r}; known formats: "
                           f"{', '.join(output_formats())}", EXIT_USAGE)
        return given
    name = os.path.basename(os.fspath(path)).lower()
    for ending, fmt in sorted(FILE_ENDINGS, key=lambda ef: -len(ef[0])):
        if name.endswith(ending) and len(name) > len(ending):
            return fmt
    known = ", ".join(f"{ending} ({fmt})" for ending, fmt in FILE_ENDINGS)
    raise CLIError(f"cannot tell what to write to {os.fspath(path)!r} from its name; "
                   f"name it with one of: {known}", EXIT_USAGE)


# ----------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------
def _percent(text: str) -> float:
    """``'1'``, ``'1%'`` or ``'0.5'`` (percent) as a fraction; argparse reports errors."""
    raw = text.strip().rstrip("%")
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage must be between 0 and 100, not {text}")
    return value / 100


def _regex(text: str) -> "re.Pattern[str]":
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {e}") from None


def whole_number_argument(text: str, least: int, *, what: str = "a whole number",
                          least_note: str = "") -> int:
    """``text`` as an int of at least ``least``, for an argparse ``type=``.

    Shared with ``python -m sampler``'s options so that both commands word a bad
    number the same way: ``not WHAT: 'x'`` or ``must be at least LEAST, not N``
    (``least_note`` is told after ``LEAST``).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}{least_note}, not {value}")
    return value


def _truncate(text: str) -> Optional[int]:
    if text.lower() in ("0", "none", "no"):
        return None
    return whole_number_argument(text, 4, what="a number of characters",
                                 least_note=" (or 0 for no limit)")


def add_output_arguments(parser: argparse.ArgumentParser, *, selection: bool = True,
                         render_to: bool = True,
                         format_help: Optional[str] = None) -> None:
    """Add the options that choose and shape the output (both command lines share them).

    ``selection`` adds the function filters (``--thresh``, ``--keep``, ``--drop``) and
    ``--show-line``.  ``render_to`` adds ``--render-to FILE``.  ``format_help``
    replaces ``--format``'s description.
    """
    formats = output_formats()
    g = parser.add_argument_group("output")
    g.add_argument("--format", choices=list(formats), default=None, metavar="FORMAT",
                   help=format_help or ("what to print: " + ", ".join(formats) + " (default: text)"))
    if render_to:
        g.add_argument("--render-to", metavar="FILE", default=None,
                       help="write the rendered output to FILE instead of standard output")
    g.add_argument("--order", choices=ORDERS, default="topological",
                   help="order of the text profile's entries (default: topological)")
    g.add_argument("--hide-self", type=_percent, default=0.01, metavar="PCT",
                   help="hide a function whose self time is at most PCT%% of the total "
                        "(and that is negligible for its callers and callees, see "
                        "--hide-subs) (default: 1)")
    g.add_argument("--hide-subs", type=_percent, default=0.02, metavar="PCT",
                   help="a function is negligible for a caller or callee when it accounts "
                        "for at most PCT%% of that one's time (default: 2)")
    g.add_argument("--truncate-source", type=_truncate, default=50, metavar="N",
                   help="show at most the last N characters of a source location, "
                        "0 for all (default: 50)")
    g.add_argument("--weight", choices=WEIGHTS, default="cpu",
                   help="charge each sample its thread's cpu time (Racket's choice: waiting is "
                        "free) or wall time (default: cpu); for allocation profiles (--memory), "
                        "bytes allocated or bytes still live at the end")
    g.add_argument("--granularity", choices=GRANULARITIES, default="function",
                   help="one entry per function, or per line executed (default: function)")
    if selection:
        g.add_argument("--flat", action="store_true",
                       help="the MLton-style flat table (same as --format flat)")
        g.add_argument("--show-line", action="store_true",
                       help="add each function's file:line to the flat table")
        g.add_argument("--thresh", type=_percent, default=0.0, metavar="PCT",
                       help="show only functions whose total time is at least PCT%% of the "
                            "time observed")
        g.add_argument("--keep", type=_regex, action="append", default=[], metavar="REGEX",
                       help="show only functions whose name matches REGEX (repeatable)")
        g.add_argument("--drop", type=_regex, action="append", default=[], metavar="REGEX",
                       help="leave out functions whose name matches REGEX (repeatable)")


@dataclass
class OutputOptions:
    """What to print and how: the parsed output options of either command line."""

    format: str = "text"
    render_to: Optional[str] = None
    order: str = "topological"
    hide_self: float = 0.01
    hide_subs: float = 0.02
    truncate_source: Optional[int] = 50
    weight: str = "cpu"
    granularity: str = "function"
    show_line: bool = False
    thresh: float = 0.0
    keep: list = field(default_factory=list)
    drop: list = field(default_factory=list)
    format_given: bool = False  # --format was on the command line (it then beats a file's name)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "OutputOptions":
        """Read the options :func:`add_output_arguments` added, and check how they combine."""
        fmt = ns.format
        if getattr(ns, "flat", False):
            if fmt not in (None, "flat"):
                raise CLIError(f"--flat and --format {fmt} ask for two different outputs",
                               EXIT_USAGE)
            fmt = "flat"
        opts = cls(format=fmt or "text", render_to=getattr(ns, "render_to", None), order=ns.order,
                   hide_self=ns.hide_self, hide_subs=ns.hide_subs,
                   truncate_source=ns.truncate_source, weight=ns.weight,
                   granularity=ns.granularity, show_line=getattr(ns, "show_line", False),
                   thresh=getattr(ns, "thresh", 0.0), keep=list(getattr(ns, "keep", [])),
                   drop=list(getattr(ns, "drop", [])), format_given=fmt is not None)
        opts.check()
        return opts

    @property
    def is_export(self) -> bool:
        """Whether the format is rendered from the snapshots (an export registry format)."""
        return self.format in _export_formats()

    @property
    def is_binary(self) -> bool:
        return self.format == SNAPSHOT_FORMAT or (
            self.is_export and _export_formats()[self.format].binary)

    def for_file(self, path: Any, option: str = "-o") -> "OutputOptions":
        """These options for writing ``path``: its format from its name
        (:func:`format_for_path`), or ``--format`` when that was given; checked, so a
        bad name, an unwritable place or a filter the format cannot honour fails
        before a long run rather than after it."""
        fmt = format_for_path(path, self.format if self.format_given else None)
        check_writable(os.fspath(path), option)
        opts = replace(self, format=fmt, render_to=os.fspath(path))
        opts.check()
        return opts

    def check(self) -> None:
        """Refuse combinations that would silently do something else than asked."""
        if self.format not in output_formats():
            raise CLIError(f"unknown format {self.format!r}; known formats: "
                           f"{', '.join(output_formats())}", EXIT_USAGE)
        if self.format not in PROFILE_FORMATS or self.format == "tree":
            used = [name for name, on in (("--thresh", self.thresh), ("--keep", self.keep),
                                          ("--drop", self.drop),
                                          ("--granularity line", self.granularity != "function"))
                    if on]
            if used:
                verb = "shapes" if len(used) == 1 else "shape"
                raise CLIError(f"{', '.join(used)} {verb} the analysed profile "
                               f"(text, flat, dot, json), not the {self.format} export",
                               EXIT_USAGE)
        if self.is_export:
            _clock_keyword(_export_formats()[self.format].render, self.weight)
        if self.render_to is not None:
            check_writable(self.render_to, "--render-to")
        elif self.is_binary and _is_tty(sys.stdout):
            raise CLIError(f"--format {self.format} writes binary data: redirect standard "
                           f"output to a file or use --render-to FILE", EXIT_USAGE)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def check_writable(path: str, option: str) -> None:
    """Fail before a long run, not after it, when an output path cannot be written."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise CLIError(f"{option} {path}: is a directory", EXIT_USAGE)
    if not os.path.isdir(folder):
        raise CLIError(f"{option} {path}: no such directory {folder}", EXIT_USAGE)
    if not os.access(folder, os.W_OK):
        raise CLIError(f"{option} {path}: the directory {folder} is not writable", EXIT_USAGE)


# ----------------------------------------------------------------------------------
# Selecting functions (--thresh, --keep, --drop)
# ----------------------------------------------------------------------------------
def select_nodes(profile: Profile, keep: Callable[[Node], bool]) -> Profile:
    """A copy of ``profile`` with only the nodes ``keep`` accepts.

    Times are unchanged -- percentages stay shares of everything observed, as in
    ``mlprof`` -- and edges to a left-out node are dropped, so every renderer (and
    the JSON form, which numbers nodes) sees a consistent graph.
    """
    root = Node.make_root()
    root.total = profile.root.total
    copies: dict[Node, Node] = {profile.root: root}
    for n in profile.nodes:
        if keep(n):
            copies[n] = Node(n.id, n.src, frame=n.frame, thread_ids=n.thread_ids, total=n.total,
                             self_time=n.self)
    edges: dict[int, Edge] = {}
    for n in (profile.root, *profile.nodes):
        for e in n.callees:
            a, b = copies.get(e.caller), copies.get(e.callee)
            if a is not None and b is not None:
                edges[id(e)] = Edge(e.total, a, e.caller_time, b, e.callee_time)
    for old, new in copies.items():  # each list keeps its order: heaviest first, as analysed
        new.callers = [edges[id(e)] for e in old.callers if id(e) in edges]
        new.callees = [edges[id(e)] for e in old.callees if id(e) in edges]
    nodes = [copies[n] for n in profile.nodes if n in copies]
    out = Profile(profile.total_time, profile.cpu_time, profile.sample_number,
                  dict(profile.thread_times), nodes, root, thread_names=dict(profile.thread_names),
                  weight=profile.weight, granularity=profile.granularity,
                  interval=profile.interval, unit=profile.unit)
    out.runs = profile.runs
    return out


def _selection(opts: OutputOptions, total: float) -> Optional[Callable[[Node], bool]]:
    if not (opts.thresh or opts.keep or opts.drop):
        return None

    def keep(n: Node) -> bool:
        name = n.name
        if opts.keep and not any(p.search(name) for p in opts.keep):
            return False
        if any(p.search(name) for p in opts.drop):
            return False
        return not opts.thresh or (total > 0 and n.total / total >= opts.thresh - 1e-12)

    return keep


# ----------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------
def render_output(snapshots: Any, opts: OutputOptions) -> Any:
    """The output for ``snapshots`` as ``str`` (or ``bytes``, for binary exports)."""
    if opts.format == SNAPSHOT_FORMAT:
        import io

        buffer = io.BytesIO()
        snapshots.save(buffer)
        return buffer.getvalue()
    if opts.is_export:
        fmt = _export_formats()[opts.format]
        kwargs = _clock_keyword(fmt.render, opts.weight)
        return fmt.render(snapshots, **kwargs)
    if opts.format == "tree":  # paths need the stacks: drawn from the snapshots
        from .renderers.tree import render_tree

        return render_tree(snapshots, clock=opts.weight, hide=opts.hide_self)
    profile = analyze_samples(snapshots, weight=opts.weight, granularity=opts.granularity)
    keep = _selection(opts, profile.total_time)
    if keep is not None:
        profile = select_nodes(profile, keep)
    if opts.format == "text":
        return render_text(profile, order=opts.order, truncate_source=opts.truncate_source,
                           hide_self=opts.hide_self, hide_subs=opts.hide_subs)
    if opts.format == "dot":
        return render_dot(profile, hide_self=opts.hide_self, hide_subs=opts.hide_subs,
                          truncate_source=opts.truncate_source)
    if opts.format == "flat":
        return render_flat(profile, show_line=opts.show_line,
                           truncate_source=opts.truncate_source)
    return json.dumps(profile_to_json(profile), indent=1) + "\n"


def _clock_keyword(fn: Callable[..., Any], weight: str) -> dict[str, str]:
    """How this exporter is told the clock: ``clock=`` (most) or ``value=`` (collapsed)."""
    import inspect

    params: Mapping[str, Any]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    for name in ("clock", "value"):
        if name in params:
            return {name: weight}
    if weight != "cpu":
        raise CLIError(f"--weight {weight}: this export format has no clock option",
                       EXIT_USAGE)
    return {}


def write_file(snapshots: Any, opts: OutputOptions, path: Any) -> str:
    """Write ``snapshots`` to ``path`` in the format its name says, shaped by ``opts``
    (see :meth:`OutputOptions.for_file`); returns the format written."""
    file_opts = opts.for_file(path)
    write_output(snapshots, file_opts)
    return file_opts.format


def write_output(snapshots: Any, opts: OutputOptions, stdout: Optional[IO[str]] = None) -> None:
    """Render ``snapshots`` and write the result to ``--render-to`` or ``stdout``."""
    data = render_output(snapshots, opts)
    if opts.render_to is not None:
        try:  # never truncate a good file first: a failed render leaves it as it was
            write_atomically(opts.render_to, data)
        except OSError as e:
            raise CLIError(f"cannot write {opts.render_to}: {e.strerror or e}") from None
        return
    out = sys.stdout if stdout is None else stdout
    try:
        if isinstance(data, bytes):
            out.flush()
            binary: Any = getattr(out, "buffer", out)
            binary.write(data)
        else:
            if _is_tty(out):  # an export's names reach a terminal too: show, never obey
                data = "\n".join(printable(line) for line in data.split("\n"))
            out.write(_encodable(data, getattr(out, "encoding", None)))
        out.flush()
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the caller ends quietly
    except (OSError, ValueError) as e:  # ValueError: the stream was closed
        raise CLIError(f"cannot write to standard output: {e}") from None


def _encodable(text: str, encoding: Optional[str]) -> str:
    """``text`` with what ``encoding`` cannot hold (lone surrogates from undecodable file
    names, say) as backslash escapes, so writing it cannot fail half-way."""
    if not encoding:
        return text
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:
        return text


# ----------------------------------------------------------------------------------
# Reading and summing files
# ----------------------------------------------------------------------------------
def _program(run: Any) -> Optional[str]:
    extra = run.extra if isinstance(run.extra, dict) else {}
    program = extra.get("program")
    return program if isinstance(program, str) else None


def _python(run: Any) -> Optional[str]:
    """``'cpython 3.11'`` from ``'cpython 3.11.7'``: line numbers and the standard
    library differ between minor versions, so their runs do not add up."""
    parts = run.python.split()
    if len(parts) != 2:
        return None
    return f"{parts[0]} {'.'.join(parts[1].split('.')[:2])}"


def _measure(run: Any) -> str:
    """What a run's samples weigh: ``'allocations'`` (``--memory``) or ``'time'``;
    the two are never summed."""
    from .memory import is_memory_run

    return "allocations" if is_memory_run(run) else "time"


def _mismatch(snapshots: Any, ref: dict[str, tuple[str, str]]) -> Optional[str]:
    """Why this file's runs cannot be summed with the ones accepted (None if they can)."""
    for run in snapshots.runs:
        for what, value in (("program", _program(run)), ("python", _python(run)),
                            ("measure", _measure(run))):
            if value is None:
                continue
            known = ref.get(what)
            if known is not None and known[0] != value:
                noun = {"program": "a run of", "python": "ran on"}.get(what, "a profile of")
                return f"{noun} {value!r}, but {known[1]} is {noun} {known[0]!r}"
    return None


def load_and_sum(paths: Sequence[str], *, tolerant: bool = False,
                 warn: Callable[[str], None] = lambda msg: None) -> Any:
    """Load every file and merge them into one :class:`~sampler.snapshot.Snapshots`.

    A file that cannot be read or is a run of another program (or Python version)
    raises :class:`CLIError`; with ``tolerant`` it is reported through ``warn`` and
    skipped instead.  At least one file must remain.
    """
    from sampler.snapshot import SnapshotError, Snapshots, merge
    from sampler.snapshot_file import LOAD_LIMIT_ENV

    accepted = []
    ref: dict[str, tuple[str, str]] = {}
    for path in paths:
        try:
            snap = Snapshots.load(path)
        except SnapshotError as e:
            problem = str(e)
        except MemoryError:  # a file within the load limit, but the machine has less
            problem = (f"{path}: not enough memory to load it (its cost was within the load "
                       f"limit: lower {LOAD_LIMIT_ENV} to refuse such files up front)")
        except IsADirectoryError:
            problem = f"{path}: is a directory"
        except OSError as e:
            problem = f"{path}: cannot read it: {e.strerror or e}"
        else:
            why = _mismatch(snap, ref)
            if why is None:
                for run in snap.runs:
                    for what, value in (("program", _program(run)), ("python", _python(run)),
                                        ("measure", _measure(run))):
                        if value is not None:
                            ref.setdefault(what, (value, path))
                accepted.append(snap)
                continue
            problem = f"{path}: {why}; runs of different programs are not summed"
        if not tolerant:
            raise CLIError(problem + ("" if len(paths) == 1 else " (--tolerant skips such files)"))
        warn(f"skipping {problem}")
    if not accepted:
        raise CLIError("no file left to analyse" if paths else "no file given")
    return accepted[0] if len(accepted) == 1 else merge(*accepted)


# ----------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------
def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog or "python -m analyzer", allow_abbrev=False,
        description="Render snapshot files saved by `python -m sampler -o FILE` (or "
                    "Snapshots.save). Several files are summed, as mlprof sums mlmon.out "
                    "files; they must be runs of the same program.",
        epilog="Percentages may be written 1, 1% or 0.5. Exit status: 0 on success, 1 when "
               "a file cannot be used, 2 for a bad command line.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="snapshot files to sum")
    parser.add_argument("-o", "--output", metavar="FILE", action="append", default=[],
                        help="write to FILE in the format its name ends with (.pstats, .html, "
                             ".json, .pb.gz, .collapsed, .dot, .txt, .stackshot, ...), as "
                             "`stackshot -o` does; repeatable. Nothing is printed then unless "
                             "--format is given")
    parser.add_argument("--tolerant", action="store_true",
                        help="skip (with a warning) files that cannot be read or are runs of "
                             "another program, instead of refusing them all")
    add_output_arguments(parser, selection=True)
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Run ``python -m analyzer`` with ``argv`` (default ``sys.argv[1:]``); returns the
    exit status."""
    parser = build_parser(prog)
    name = parser.prog.split()[-1]
    args = parser.parse_args(argv)

    def warn(msg: str) -> None:
        print(f"{name}: warning: {msg}", file=sys.stderr)

    try:
        opts = OutputOptions.from_namespace(args)
        # -o FILE: what its name says (--format names what is printed, as for stackshot)
        files = [replace(opts, format_given=False).for_file(path) for path in args.output]
        snapshots = load_and_sum(args.files, tolerant=args.tolerant, warn=warn)
        for file_opts in files:
            write_output(snapshots, file_opts)
        if not files or args.format is not None or getattr(args, "flat", False):
            write_output(snapshots, opts)
    except CLIError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return e.status
    except BrokenPipeError:  # `python -m analyzer f | head`: not an error worth a traceback
        _silence_stdout()
        return 0
    except MemoryError:  # analysing or rendering what did load
        print(f"{name}: not enough memory to analyse and render these files", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _silence_stdout() -> None:
    """After a broken pipe, stop Python from failing again while flushing at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
