"""``python -m calctl.runtime.conformance SPEC``: the child process of :func:`run_suite`."""

from __future__ import annotations

import sys

from calctl.runtime.conformance.child import _child_main

if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
