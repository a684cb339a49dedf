"""Lets ``python -m pytest`` with no arguments run the suite from any folder of the checkout.

pytest applies ``testpaths`` only when started at the rootdir; started in a folder that holds no tests
(``docs/``, ``calctl/``) it would collect nothing and exit 5. Then this points it at ``tests/``. Given
paths, or started inside ``tests/``, pytest collects what it was asked to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent / "tests"


def pytest_configure(config: pytest.Config) -> None:
    here = Path(config.invocation_params.dir).resolve()
    if config.args_source is pytest.Config.ArgsSource.INVOCATION_DIR and TESTS not in (here, *here.parents):
        config.args = [str(TESTS)]
