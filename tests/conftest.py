import os
import sys

import pytest

# doc_examples.page_tests defines test functions: their asserts should explain a failure
pytest.register_assert_rewrite("doc_examples")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sampling_helpers import native_missing  # noqa: E402  (beside this file: on the path)


# -- both engines ----------------------------------------------------------------------
# Every test of the sampler runs once per engine: the native one (a C thread reading
# frames without the GIL) and its Python twin. The engine is chosen through the
# environment variable, so subprocesses the tests start use it too. A test that
# concerns one engine only says so with @pytest.mark.engines("python").
ENGINE_MODULE_PREFIXES = ("test_sampler_", "test_engine", "test_native", "test_toplevel", "test_docs_sampler")


def _native_built() -> bool:
    from sampler import engines

    return engines.native_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "engines(*names): run this sampler test on these engines only")


def pytest_generate_tests(metafunc):
    if "sampler_engine" not in metafunc.fixturenames:
        return
    module = metafunc.module.__name__.rpartition(".")[2]
    if not module.startswith(ENGINE_MODULE_PREFIXES):
        return
    marker = metafunc.definition.get_closest_marker("engines")
    names = marker.args if marker else ("native", "python")
    metafunc.parametrize("sampler_engine", names, indirect=True)


@pytest.fixture(autouse=True)
def sampler_engine(request, monkeypatch):
    """The engine this test runs on (None outside the sampler's tests)."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    if name == "native" and not _native_built():
        native_missing("the native engine")
    monkeypatch.setenv("STACKSHOT_ENGINE", name)
    # each engine with its own greenlet switch hook: the Python engine's tests run the
    # hook's Python twin, the native engine's its C common case (sampler.greenlets)
    if name == "python":
        monkeypatch.setenv("STACKSHOT_SWITCH_HOOK", "python")
    else:
        monkeypatch.delenv("STACKSHOT_SWITCH_HOOK", raising=False)
    yield name
