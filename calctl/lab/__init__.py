"""calctl in a labgrid lab: boards on many hosts, shared by people and CI jobs (docs/lab.md).

The optional ``lab`` extra (``pip install 'calctl[lab]'``, labgrid 26). Modules:

* :mod:`calctl.lab.board`: one calctl command for one board, here or through an SSH prefix, its report
  brought back (no labgrid needed);
* :mod:`calctl.lab.resource`, :mod:`calctl.lab.driver`: labgrid's ``CalculetBoard`` resource and
  ``CalctlDriver``;
* :mod:`calctl.lab.places`: ``calctl lab run``'s work: reserve matching places, lock, run, collect, unlock;
* :mod:`calctl.lab.pytest_plugin`: the ``calctl_board`` fixture over labgrid's ``--lg-env`` target.

Importing this package imports no labgrid; the core of calctl never imports it at all.
"""
