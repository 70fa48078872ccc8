"""IPython magics: ``%load_ext stackshot`` (or its alias ``%load_ext sampler``), then
``%sample`` / ``%%sample``.

    %sample [options] STATEMENT        profile one line
    %%sample [options]                 profile the cell

Options:

    -d SECONDS   delay between samples (default 0.001)
    -t WHAT      what to sample: ``current`` (the thread running the code, default)
                 or ``all`` (every thread of the process, present and future)
    -w CLOCK     ``cpu`` (default) or ``wall``: how samples are weighted
    -f SHOW      what to display: ``html`` (flame graph, default), ``text`` (Racket's
                 report), ``none``
    -o PATH      also write the profile to PATH, in the format its name says, as
                 ``stackshot -o`` does (``.pstats``, ``.html``, ``.json``, ``.pb.gz``,
                 ``.collapsed``, ``.dot``, ``.txt``, ``.stackshot`` …)
    -e FORMAT    the format for ``-o`` when its name says none
    -k KEY       record the marks of KEY (repeatable), as ``create_sampler``'s custom keys
    -v NAME      store the snapshots in the variable NAME
    -l SECONDS   show a live view, redrawn every SECONDS while the code runs

Loading the extension (or importing :mod:`stackshot` inside IPython) also teaches
IPython to display a :class:`~sampler.snapshot.Snapshots` value as a flame graph
and, in plain text, the Racket report: the sampler package only collects, so the
display lives here rather than as methods of the snapshot value.  IPython itself is
imported only when a magic runs or the extension is loaded.
"""

from __future__ import annotations

import threading
import math
import sys
from typing import Any, Optional

from sampler.snapshot import Snapshots

from .toplevel import cell_entries, trim_snapshots

SHOW = ("html", "text", "none")


def _output_options(path: str, given: Optional[str], clock: str) -> Any:
    """How to write ``-o PATH``: the format its name says (the rule every front end
    shares, :func:`analyzer.cli.format_for_path`) or ``-e``'s; checked now, before
    the code runs, and a bad one is a usage error rather than a traceback."""
    from IPython.core.error import UsageError

    from analyzer.cli import CLIError, OutputOptions

    try:
        return OutputOptions(format=given or "text", format_given=bool(given),
                             weight=clock).for_file(path)
    except CLIError as e:
        raise UsageError(str(e).replace("--format", "-e")) from None


def _cell_runners(shell: Any) -> tuple:
    """The shell's ``run_cell`` methods (IPython's and the kernel's override)."""
    out = []
    for klass in type(shell).__mro__:
        run_cell = vars(klass).get("run_cell")
        if getattr(run_cell, "__code__", None) is not None:
            out.append(run_cell)
    return tuple(out)


def trim_cell(snapshots: Snapshots, magic_code: Any, shell: Any) -> Snapshots:
    """A magic's snapshots, starting at the user's code in the cell it ran.

    Two cuts, since the cell that holds the magic runs in ``run_code`` too (above the
    magic): first everything above the magic goes; then, below it, the shell's
    ``run_cell`` is the profiler's overhead (transforming and compiling the cell: a
    sample there is idle) until its ``run_code`` calls the user's code, where the
    profile starts. A sample in neither (the kernel's own work around the cell) is
    idle: the profile shows the user's code only.
    """
    below_magic = trim_snapshots(snapshots, (magic_code,), outside_is_idle=True)
    return trim_snapshots(below_magic, cell_entries(), overhead=_cell_runners(shell), outside_is_idle=True)


def _magics_class() -> type:
    """Build the magics class (IPython is imported here, not when ``sampler`` is)."""
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class SamplerMagics(Magics):
        """The ``%sample`` line and cell magic (see the module docstring)."""

        @line_cell_magic
        def sample(self, line: str, cell: Optional[str] = None) -> None:
            opts, statement = self.parse_options(line, "d:t:w:f:o:e:k:v:l:", list_all=True, posix=False)
            code = cell if cell is not None else statement
            if not code.strip():
                raise UsageError("%sample needs a statement to run (or use %%sample on a cell)")
            magic_code = sys._getframe().f_code  # its own work is no part of the profile
            delay = self._number(opts, "d", None)
            what = self._choice(opts, "t", "current", ("current", "all"))
            clock = self._choice(opts, "w", "cpu", ("cpu", "wall"))
            show = self._choice(opts, "f", "html", SHOW)
            output = self._last(opts, "o")
            write_opts = _output_options(output, self._last(opts, "e"), clock) if output else None
            keys = list(opts.get("k", []))
            var = self._last(opts, "v")
            live_every = self._number(opts, "l", None)

            import sampler

            target = sampler.ALL_THREADS if what == "all" else threading.current_thread()
            ctl = sampler.create_sampler(target, 0.001 if delay is None else delay, keys or None)
            shell = self.shell
            assert shell is not None  # a magic always runs inside a shell
            live = None
            try:
                if live_every is not None:
                    from analyzer.exports.notebook import LiveView

                    live = LiveView(ctl, live_every, clock=clock)
                shell.run_cell(code, store_history=False)
            finally:
                ctl("stop")
                if live is not None:
                    live.stop()
            snaps = trim_cell(ctl("get-snapshots"), magic_code, shell)
            if var:
                shell.user_ns[var] = snaps
            if write_opts is not None:
                from analyzer.cli import CLIError, write_output

                try:
                    write_output(snaps, write_opts)
                except CLIError as e:
                    raise UsageError(str(e)) from None
                print(f"stackshot: wrote {output} ({write_opts.format})")
            self._show(snaps, show, clock, shown_live=live is not None)

        # -- helpers ----------------------------------------------------------------
        def _show(self, snaps: Any, show: str, clock: str, shown_live: bool) -> None:
            if show == "none" or (shown_live and show == "html"):
                return
            if show == "text":
                from analyzer import analyze_samples, render_text

                print(render_text(analyze_samples(snaps, weight=clock)), end="")
                return
            from IPython.display import HTML, display

            from analyzer.exports.notebook import snapshots_html

            display(HTML(snapshots_html(snaps, clock=clock)))

        @staticmethod
        def _last(opts: Any, key: str) -> Optional[str]:
            values = opts.get(key)
            return values[-1] if values else None

        def _choice(self, opts: Any, key: str, default: str, valid: tuple) -> str:
            value = self._last(opts, key) or default
            if value not in valid:
                raise UsageError(f"-{key} must be one of {', '.join(valid)}, not {value!r}")
            return value

        def _number(self, opts: Any, key: str, default: Optional[float]) -> Optional[float]:
            value = self._last(opts, key)
            if value is None:
                return default
            try:
                number = float(value)
            except ValueError:
                raise UsageError(f"-{key} takes a number of seconds, not {value!r}") from None
            least = "0" if key == "d" else "more than 0"
            if not math.isfinite(number) or number < 0 or (key != "d" and number == 0):
                raise UsageError(f"-{key} takes a finite number of seconds, {least}, not {value}")
            return number

    return SamplerMagics


def register_snapshot_display(shell: Any = None) -> bool:
    """Have IPython show :class:`Snapshots` with the analyzer's HTML and text reprs.

    ``shell`` defaults to the running IPython shell, if any: importing ``stackshot``
    in a notebook is enough.  Returns whether a shell was found.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is None:
            return False
    from analyzer.exports.notebook import snapshots_html, snapshots_pretty

    formatters = shell.display_formatter.formatters
    formatters["text/html"].for_type(Snapshots, snapshots_html)
    formatters["text/plain"].for_type(Snapshots, snapshots_pretty)
    return True


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext stackshot`` (and ``%load_ext sampler``, its alias)."""
    ipython.register_magics(_magics_class())
    register_snapshot_display(ipython)
