"""Thread groups (Racket custodians) with real threads."""

import threading

import pytest

from sampler import ThreadGroup, create_sampler

from sampling_helpers import spin, wait_until


def test_threads_started_in_a_group_join_it_and_their_children_too():
    group = ThreadGroup("jobs")
    release = threading.Event()
    grandchild_started = threading.Event()

    def grandchild():
        grandchild_started.set()
        release.wait()

    def child():
        t = threading.Thread(target=grandchild, name="grandchild")
        t.start()
        release.wait()
        t.join()

    outsider = threading.Thread(target=release.wait, name="outsider")
    outsider.start()
    with group:
        assert ThreadGroup.current() is group
        c = threading.Thread(target=child, name="child")
        c.start()
    assert ThreadGroup.current() is None
    grandchild_started.wait(10)
    names = {t.name for t in group.threads()}
    assert names == {"child", "grandchild"}
    release.set()
    c.join()
    outsider.join()
    wait_until(lambda: group.threads() == [], what="dead threads to leave")


def test_groups_nest_and_tracking_a_group_samples_later_threads():
    outer = ThreadGroup("outer")
    with outer:
        inner = ThreadGroup("inner")
    assert inner.parent is outer and list(outer.subgroups()) == [inner]
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            spin(0.005)

    ctl = create_sampler(outer, 0.002)
    # started after sampling began, in a subgroup: still sampled
    with inner:
        late = threading.Thread(target=busy, name="late-inner")
        late.start()
    with outer:
        direct = threading.Thread(target=busy, name="direct")
        direct.start()
    wait_until(lambda: {t.name for t in ctl.get_snapshots().threads} >= {"late-inner", "direct"})
    stop.set()
    late.join()
    direct.join()
    ctl.stop()
    names = {t.name for t in ctl.get_snapshots().threads}
    assert names == {"late-inner", "direct"}, "only group members are sampled"


def test_add_and_bad_arguments():
    g = ThreadGroup()
    with pytest.raises(TypeError, match="threading.Thread"):
        g.add("not a thread")
    with pytest.raises(TypeError, match="parent must be a ThreadGroup"):
        ThreadGroup(parent=object())
    t = threading.Thread(target=lambda: None)
    g.add(t)
    t.start()
    t.join()
    assert g.threads() == []
    assert "ThreadGroup" in repr(g)


def test_a_thread_whose_start_fails_leaves_the_group():
    g = ThreadGroup()
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    with g:
        with pytest.raises(RuntimeError):
            t.start()  # threads can only be started once
    assert t not in g._members
