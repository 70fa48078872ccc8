"""The flame graph page, checked as text and in a real headless Chromium.

Browser tests need Debian's ``chromium``; without it they skip with that reason
(CI installs it, so there they run).  Screenshots land in each test's tmp dir; set
``STACKSHOT_SCREENSHOTS=1`` to also refresh ``scribblings/flamegraph.png``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from analyzer.exports import ExportError, to_html, write_html
from analyzer.exports.flamegraph import html_fragment
from export_browser import Browser, find_chromium
from export_builders import build, demo_app, two_threads
from export_consumers import need_program

REPO = Path(__file__).resolve().parent.parent
EVIL_NAME = '<script>alert("name")</script>'
EVIL_FILE = '"><img src=x onerror=alert("file")>.py'
EVIL_MARK = "</script><script>alert('mark')</script>"


def hostile() -> "object":
    rows = [("t<b>1</b>", ["main", (EVIL_NAME, EVIL_FILE, 1, 2)], k * 0.01, k * 0.01, ((EVIL_MARK,),))
            for k in range(4)]
    return build(rows, custom_keys=("<key>",))


# -- as text -----------------------------------------------------------------------

def test_page_needs_no_network():
    page = to_html(demo_app())
    urls = set(re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>]*", page)) - {"http://www.w3.org/2000/svg"}
    assert urls == set(), f"the page refers to the network: {urls}"
    assert not re.search(r"<(?:link|img|iframe|object|embed)\b|<script[^>]*\ssrc=", page)
    assert "default-src 'none'" in page  # and the browser is told to refuse any
    assert page.count("<script") == 2  # the data and the code, both inline


def test_hostile_names_paths_and_marks_never_appear_as_markup():
    page = to_html(hostile())
    for raw in (EVIL_NAME, EVIL_FILE, EVIL_MARK, "<b>1</b>", "<key>"):
        assert raw not in page
    assert page.count("<script") == 2
    assert "\\u003cscript\\u003ealert" in page  # carried as escaped JSON text


def test_title_is_escaped():
    page = to_html(two_threads(), title="<i>mine</i> & co")
    assert "<title>&lt;i&gt;mine&lt;/i&gt; &amp; co</title>" in page


def test_empty_profile_says_no_samples():
    page = to_html(build([]))
    assert "No samples" in page and '"rows":[]' in page


def test_fragment_is_embeddable():
    frag = html_fragment(two_threads())
    assert frag.startswith('<div class="ss-root">') and "<html" not in frag


def test_unwritable_path(tmp_path):
    (tmp_path / "f").write_text("a file, not a directory")
    with pytest.raises(ExportError) as err:
        write_html(two_threads(), tmp_path / "f" / "page.html")
    assert str(tmp_path / "f" / "page.html") in str(err.value) and "Not a directory" in str(err.value)


# -- in Chromium -----------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = find_chromium() or need_program("chromium", "chromium")
    with Browser(exe, profile_dir=str(tmp_path_factory.mktemp("chromium-profile"))) as b:
        yield b


def open_page(browser: Browser, path: Path) -> None:
    browser.events.clear()
    browser.open(path)
    assert browser.eval("document.querySelector('.ss-root').getAttribute('data-ready')") == "1"


BOXES = """Array.from(document.querySelectorAll('svg.ss-flame g.ss-box')).map(function (g) {
  var r = g.querySelector('rect').getBoundingClientRect();
  return {node: +g.getAttribute('data-node'), label: g.getAttribute('data-fn'), text: g.textContent, x: r.x, y: r.y, w: r.width,
          h: r.height, cls: g.getAttribute('class')};
})"""


def box_named(browser: Browser, prefix: str) -> dict:
    boxes = [b for b in browser.eval(BOXES) if b["label"].startswith(prefix)]
    assert boxes, f"no box labelled {prefix!r}"
    return max(boxes, key=lambda b: b["w"])


def test_page_draws_hovers_zooms_searches_and_filters(browser, tmp_path):
    path = write_html(demo_app(), tmp_path / "demo.html")
    open_page(browser, path)
    assert browser.problems() == []
    boxes = browser.eval(BOXES)
    assert len(boxes) > 10 and all(b["w"] > 0 and b["h"] > 0 for b in boxes)
    width = browser.eval("document.querySelector('svg.ss-flame').getBoundingClientRect().width")
    root = next(b for b in boxes if b["node"] == 0)
    assert root["label"] == "all threads" and root["w"] == pytest.approx(width, abs=1)
    browser.screenshot(tmp_path / "flamegraph.png")

    # hover: the details a person needs
    target = box_named(browser, "handle_checkout")
    browser.mouse("mouseMoved", target["x"] + target["w"] / 2, target["y"] + target["h"] / 2)
    tip = browser.eval("(function(){var t=document.querySelector('.ss-tip');"
                       "return {shown: getComputedStyle(t).display, text: t.innerText};})()")
    assert tip["shown"] == "block"
    for expected in ("handle_checkout", "shop/app.py:80", "self", "total", "%", "MainThread"):
        assert expected in tip["text"]

    # a click zooms: the frame takes the whole width and its children grow
    before = box_named(browser, "price_items")["w"]
    browser.click(target["x"] + target["w"] / 2, target["y"] + target["h"] / 2)
    zoomed = box_named(browser, "handle_checkout")
    assert zoomed["w"] == pytest.approx(width, abs=1)
    assert box_named(browser, "price_items")["w"] > before
    assert "Zoomed on handle_checkout" in browser.eval("document.querySelector('.ss-status').textContent")
    assert browser.eval("document.querySelector('tr.ss-node.ss-picked td.ss-name').textContent").startswith(
        "handle_checkout")  # the caller/callee table follows the click
    browser.screenshot(tmp_path / "zoomed.png")
    browser.eval("document.querySelector('.ss-reset').click()")
    assert box_named(browser, "handle_checkout")["w"] < width - 1

    # search paints matches and reports their share
    browser.eval("(function(){var s=document.querySelector('.ss-search');s.value='escape_html';"
                 "s.dispatchEvent(new Event('input'));})()")
    matched = [b for b in browser.eval(BOXES) if "ss-match" in (b["cls"] or "")]
    assert matched and all(b["label"].startswith("escape") for b in matched)
    assert re.search(r"Search matched .* \(\d+\.\d%\)", browser.eval("document.querySelector('.ss-status').textContent"))

    # thread selector: only that thread's frames remain
    browser.eval("(function(){var s=document.querySelector('.ss-thread');"
                 "s.value=Array.from(s.options).find(function(o){return o.text.indexOf('db-pool')===0;}).value;"
                 "s.dispatchEvent(new Event('change'));})()")
    labels = {b["label"] for b in browser.eval(BOXES)}
    assert "db-pool" in labels and not any(lab.startswith("handle_") for lab in labels)
    assert browser.eval("document.querySelector('tr.ss-node td.ss-name').textContent").startswith("worker_loop")

    # mark selector: one request's samples
    browser.eval("(function(){var s=document.querySelector('.ss-thread');s.value='all';"
                 "s.dispatchEvent(new Event('change'));var m=document.querySelector('.ss-mark');"
                 "m.value=Array.from(m.options).find(function(o){return o.text==='request = req-000';}).value;"
                 "m.dispatchEvent(new Event('change'));})()")
    labels = {b["label"] for b in browser.eval(BOXES)}
    assert any(lab.startswith("handle_search") for lab in labels)  # request 0 is a search
    assert not any(lab.startswith("handle_checkout") for lab in labels)

    # icicle view puts the root on top
    browser.eval("(function(){var v=document.querySelector('.ss-view');v.value='icicle';"
                 "v.dispatchEvent(new Event('change'));})()")
    tops = {b["node"]: b["y"] for b in browser.eval(BOXES)}
    assert tops[0] == min(tops.values())
    assert browser.problems() == []


def test_hostile_names_are_shown_as_text_and_never_run(browser, tmp_path):
    open_page(browser, write_html(hostile(), tmp_path / "evil.html"))
    assert browser.eval("document.scripts.length") == 2
    assert browser.eval("document.querySelectorAll('img').length") == 0
    labels = [b["label"] for b in browser.eval(BOXES)]
    assert EVIL_NAME in labels
    texts = [b["text"] for b in browser.eval(BOXES)]
    assert any(t.startswith("<script>") for t in texts)  # drawn, as text
    table = browser.eval("document.querySelector('.ss-side').textContent")
    assert EVIL_NAME in table
    marks = browser.eval("Array.from(document.querySelectorAll('.ss-mark option')).map(function(o){return o.text;})")
    assert f"<key> = {EVIL_MARK}" in marks
    target = box_named(browser, "<script>")
    browser.mouse("mouseMoved", target["x"] + target["w"] / 2, target["y"] + target["h"] / 2)
    tip = browser.eval("document.querySelector('.ss-tip').innerText")
    assert EVIL_NAME in tip and EVIL_FILE in tip and "t<b>1</b>" in tip
    assert browser.problems() == []  # no dialog opened, no error


def test_empty_profile_renders_a_no_samples_view(browser, tmp_path):
    open_page(browser, write_html(build([]), tmp_path / "empty.html"))
    shown = browser.eval("(function(){var e=document.querySelector('.ss-graph .ss-empty');"
                         "return getComputedStyle(e).display !== 'none' ? e.textContent : null;})()")
    assert shown and "No samples" in shown
    assert browser.eval("document.querySelector('svg.ss-flame').getAttribute('data-boxes')") == "0"
    assert "No samples" in browser.eval("document.querySelector('.ss-side').textContent")
    browser.screenshot(tmp_path / "empty.png")
    assert browser.problems() == []


def test_thread_with_only_idle_samples_says_so(browser, tmp_path):
    snaps = build([("busy", ["f"], 0, 0), ("busy", ["f"], 1, 1), ("sleeper", [], 0, 0), ("sleeper", [], 0, 1)])
    open_page(browser, write_html(snaps, tmp_path / "idle.html"))
    options = browser.eval("Array.from(document.querySelectorAll('.ss-thread option')).map(function(o){return o.text;})")
    assert any(o.startswith("sleeper") for o in options)
    browser.eval("(function(){var s=document.querySelector('.ss-thread');s.value='1';"
                 "s.dispatchEvent(new Event('change'));})()")
    assert "No samples for this selection" in browser.eval("document.querySelector('.ss-graph .ss-empty').textContent")
    assert browser.problems() == []


def test_readme_screenshot(browser, tmp_path):
    """The picture in the README: the demo profile, zoomed on one request handler."""
    open_page(browser, write_html(demo_app(), tmp_path / "readme.html", title="stackshot flame graph (demo)"))
    target = box_named(browser, "handle_checkout")
    browser.mouse("mouseMoved", target["x"] + target["w"] / 3, target["y"] + target["h"] / 2)
    shot = browser.screenshot(tmp_path / "readme.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("STACKSHOT_SCREENSHOTS") == "1":
        shutil.copyfile(shot, REPO / "scribblings" / "flamegraph.png")


def test_many_threads_fall_back_to_the_all_threads_table(browser, tmp_path):
    rows = [(f"t{k}", ["main", f"job{k}"], s * 0.01, s * 0.01) for s in range(2) for k in range(9)]
    open_page(browser, write_html(build(rows), tmp_path / "many.html"))
    browser.eval("(function(){var s=document.querySelector('.ss-thread');s.value='3';"
                 "s.dispatchEvent(new Event('change'));})()")
    side = browser.eval("document.querySelector('.ss-side').textContent")
    assert "Table for all threads" in side and "job8" in side
    assert {b["label"] for b in browser.eval(BOXES)} == {"t3", "main", "job3"}
    assert browser.problems() == []


def test_a_stack_thousands_of_frames_deep_is_drawn_and_searched(browser, tmp_path):
    """Issue 10, item 14: a recursive layout overflowed the call stack (RangeError) past
    ~3,000 frames and the page stayed blank."""
    deep = ["main"] + [f"level{k}" for k in range(6000)]
    snaps = build([("t", deep, s * 0.01, s * 0.01) for s in range(3)])
    open_page(browser, write_html(snaps, tmp_path / "deep.html"))
    assert browser.problems() == []
    assert browser.eval("document.querySelector('svg.ss-flame').getAttribute('data-boxes')") == "6002"
    browser.eval("(function(){var s=document.querySelector('.ss-search');s.value='level5999';"
                 "s.dispatchEvent(new Event('input'));})()")
    assert "Search matched" in browser.eval("document.querySelector('.ss-status').textContent")
    assert browser.problems() == []
